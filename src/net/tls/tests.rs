use std::path::Path;

use rcgen::{CertificateParams, KeyPair};

use super::*;

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
    let source = TlsSource::load(spec(dir.path()), TlsMetrics::unregistered()).unwrap();
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
    let source = TlsSource::load(spec(dir.path()), TlsMetrics::unregistered()).unwrap();
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
    let e = s.build(&s.read().unwrap()).unwrap_err().to_string();
    assert!(e.contains("no CERTIFICATE"), "{e}");
}

#[test]
fn sans_are_dns_names_or_ip_addresses() {
    assert!(parse_san("GRPC_CLIENT_TLS_SAN", "client.example").is_ok());
    assert!(parse_san("GRPC_CLIENT_TLS_SAN", "10.0.0.1").is_ok());
    let e = parse_san("GRPC_CLIENT_TLS_SAN", "spiffe://x/y").unwrap_err();
    assert!(e.to_string().starts_with("GRPC_CLIENT_TLS_SAN: "), "{e}");
}
