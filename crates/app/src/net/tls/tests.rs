use std::path::Path;
use std::sync::Arc;

use rcgen::{CertificateParams, KeyPair};

use super::*;
use files::{GRPC_SETTINGS, MAX_PEM_BYTES, parse_san};
use ratelimit_core::clock::{Clock, ManualClock, NANOS_PER_SECOND};
use reload::Polled;

/// 2026-01-01T00:00:00Z.
const NOW: i64 = 1_767_225_600;
const DAY: i64 = 86_400;

fn clock_at(seconds: i64) -> ManualClock {
    ManualClock::new(seconds as u64 * NANOS_PER_SECOND)
}

fn load(spec: TlsSpec, clock: &ManualClock) -> Result<TlsSource, TlsError> {
    let clock: Arc<dyn Clock> = Arc::new(clock.clone());
    TlsSource::load(spec, TlsMetrics::unregistered(), clock)
}

/// A self-signed certificate for localhost valid from `from` to `to` (Unix seconds), and its key.
fn valid_between(from: i64, to: i64) -> (String, String) {
    let key = KeyPair::generate().unwrap();
    let mut params = CertificateParams::new(vec!["localhost".to_owned()]).unwrap();
    params.not_before = time::OffsetDateTime::from_unix_timestamp(from).unwrap();
    params.not_after = time::OffsetDateTime::from_unix_timestamp(to).unwrap();
    let cert = params.self_signed(&key).unwrap();
    (cert.pem(), key.serialize_pem())
}

/// A self-signed certificate for localhost and its key, PEM.
fn self_signed() -> (String, String) {
    let key = KeyPair::generate().unwrap();
    let cert = CertificateParams::new(vec!["localhost".to_owned()])
        .unwrap()
        .self_signed(&key)
        .unwrap();
    (cert.pem(), key.serialize_pem())
}

fn spec(dir: &Path) -> TlsSpec {
    TlsSpec {
        names: GRPC_SETTINGS,
        cert: dir.join("tls.crt"),
        key: dir.join("tls.key"),
        client_ca: None,
        client_san: None,
        alpn: vec![b"h2".to_vec()],
    }
}

fn write(dir: &Path, (cert, key): &(String, String)) {
    std::fs::write(dir.join("tls.crt"), cert).unwrap();
    std::fs::write(dir.join("tls.key"), key).unwrap();
}

#[test]
fn a_change_is_acted_on_once_it_has_held_for_one_poll() {
    let dir = tempfile::tempdir().unwrap();
    write(dir.path(), &self_signed());
    let source = load(spec(dir.path()), &clock_at(NOW)).unwrap();
    let first = source.config();
    assert_eq!(source.poll(), Polled::Unchanged);
    // Key written, certificate not yet: seen, not acted on.
    let next = self_signed();
    std::fs::write(dir.path().join("tls.key"), &next.1).unwrap();
    assert_eq!(source.poll(), Polled::Settling);
    std::fs::write(dir.path().join("tls.crt"), &next.0).unwrap();
    assert_eq!(source.poll(), Polled::Settling);
    assert!(std::sync::Arc::ptr_eq(&first, &source.config()));
    assert_eq!(source.poll(), Polled::Reloaded);
    assert!(!std::sync::Arc::ptr_eq(&first, &source.config()));
    assert_eq!(source.poll(), Polled::Unchanged);
    assert_eq!(source.metrics().reload_successes("gRPC"), 1);
    assert_eq!(source.metrics().reload_errors("gRPC"), 0);
}

#[test]
fn a_bad_change_is_refused_once_and_the_old_config_serves_on() {
    let dir = tempfile::tempdir().unwrap();
    write(dir.path(), &self_signed());
    let source = load(spec(dir.path()), &clock_at(NOW)).unwrap();
    let first = source.config();
    std::fs::remove_file(dir.path().join("tls.key")).unwrap();
    assert_eq!(source.poll(), Polled::Settling);
    match source.poll() {
        Polled::Refused(e) => assert!(e.to_string().starts_with("GRPC_SERVER_TLS_KEY ("), "{e}"),
        other => panic!("{other:?}"),
    }
    for _ in 0..3 {
        assert_eq!(source.poll(), Polled::Unchanged);
    }
    assert_eq!(source.metrics().reload_errors("gRPC"), 1);
    assert!(std::sync::Arc::ptr_eq(&first, &source.config()));
    // Putting the same files back installs them again.
    write(dir.path(), &self_signed());
    assert_eq!(source.poll(), Polled::Settling);
    assert_eq!(source.poll(), Polled::Reloaded);
}

#[test]
fn oversized_and_empty_files_are_errors_naming_the_setting() {
    let dir = tempfile::tempdir().unwrap();
    write(dir.path(), &self_signed());
    let big = vec![b'a'; MAX_PEM_BYTES as usize + 1];
    std::fs::write(dir.path().join("tls.crt"), big).unwrap();
    let e = spec(dir.path()).read().unwrap_err().to_string();
    assert!(
        e.starts_with("GRPC_SERVER_TLS_CERT (") && e.contains("larger than"),
        "{e}"
    );
    std::fs::write(dir.path().join("tls.crt"), "").unwrap();
    let s = spec(dir.path());
    let e = s
        .build(&s.read().unwrap(), NOW)
        .unwrap_err()
        .error
        .to_string();
    assert!(e.contains("no CERTIFICATE"), "{e}");
}

#[test]
fn sans_are_dns_names_or_ip_addresses() {
    assert!(parse_san("GRPC_CLIENT_TLS_SAN", "client.example").is_ok());
    assert!(parse_san("GRPC_CLIENT_TLS_SAN", "10.0.0.1").is_ok());
    let e = parse_san("GRPC_CLIENT_TLS_SAN", "spiffe://x/y").unwrap_err();
    assert!(e.to_string().starts_with("GRPC_CLIENT_TLS_SAN: "), "{e}");
}

#[test]
fn an_expired_or_not_yet_valid_certificate_is_refused_at_start() {
    let dir = tempfile::tempdir().unwrap();
    write(dir.path(), &valid_between(NOW - 100 * DAY, NOW - DAY));
    let e = load(spec(dir.path()), &clock_at(NOW))
        .err()
        .unwrap()
        .to_string();
    assert!(
        e.starts_with("GRPC_SERVER_TLS_CERT (")
            && e.contains("certificate #0 expired at 2025-12-31T00:00:00Z"),
        "{e}"
    );
    write(dir.path(), &valid_between(NOW + DAY, NOW + 100 * DAY));
    let e = load(spec(dir.path()), &clock_at(NOW))
        .err()
        .unwrap()
        .to_string();
    assert!(
        e.contains("is not valid before 2026-01-02T00:00:00Z"),
        "{e}"
    );
}

#[test]
fn an_expired_certificate_on_rotation_is_refused_and_the_old_one_serves_on() {
    let dir = tempfile::tempdir().unwrap();
    let clock = clock_at(NOW);
    write(dir.path(), &valid_between(NOW - DAY, NOW + 90 * DAY));
    let source = load(spec(dir.path()), &clock).unwrap();
    assert_eq!(source.metrics().expiry("gRPC"), NOW + 90 * DAY);
    let first = source.config();
    write(dir.path(), &valid_between(NOW - 100 * DAY, NOW - DAY));
    assert_eq!(source.poll(), Polled::Settling);
    match source.poll() {
        Polled::Refused(e) => assert!(e.to_string().contains("expired at"), "{e}"),
        other => panic!("{other:?}"),
    }
    assert!(Arc::ptr_eq(&first, &source.config()));
    assert_eq!(source.metrics().expiry("gRPC"), NOW + 90 * DAY);
    assert_eq!(source.metrics().reload_errors("gRPC"), 1);
    assert_eq!(
        source.poll(),
        Polled::Unchanged,
        "refused once, not at every poll"
    );
}

#[test]
fn a_certificate_not_valid_yet_is_taken_once_it_is() {
    let dir = tempfile::tempdir().unwrap();
    let clock = clock_at(NOW);
    write(dir.path(), &valid_between(NOW - DAY, NOW + 90 * DAY));
    let source = load(spec(dir.path()), &clock).unwrap();
    let first = source.config();
    // Issued by a CA whose clock is a minute ahead.
    write(dir.path(), &valid_between(NOW + 60, NOW + 180 * DAY));
    assert_eq!(source.poll(), Polled::Settling);
    assert!(matches!(source.poll(), Polled::Refused(_)));
    assert_eq!(source.poll(), Polled::Unchanged);
    clock.advance(std::time::Duration::from_secs(60));
    assert_eq!(source.poll(), Polled::Reloaded);
    assert!(!Arc::ptr_eq(&first, &source.config()));
    assert_eq!(source.metrics().expiry("gRPC"), NOW + 180 * DAY);
    assert_eq!(source.validity().not_before, NOW + 60);
}
