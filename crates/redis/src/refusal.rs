//! Whether a failure to reach Redis is a refusal (Redis or its TLS answered and said no: only the
//! operator can mend it, so start-up stops) or leaves Redis merely unreachable (slow, cut, absent:
//! the server starts in the failure mode and keeps connecting). Applied to connecting and to the
//! first PING alike: a PING that times out or whose reply is cut is "unreachable", never a reason
//! to exit (in Kubernetes that would be a crash loop while Redis is only slow). A connection cut
//! as it opened is sorted by what Redis wrote on it (`greeting`, [`turned_away`]); a server that
//! greets as Redis never does is said not to be Redis ([`not_redis`]); one whose TLS or plaintext
//! is not what the store speaks (`speaks`) is a refusal that says which ([`tls_at_plaintext`],
//! [`plaintext_at_tls`]).

use ::redis::{ConnectionAddr, ErrorKind, RedisError};

use ratelimit_core::store::StoreError;

/// Server error codes that refuse this client: its password or user (`WRONGPASS`), no
/// authentication where Redis wants one (`NOAUTH`), or an ACL that denies it a command
/// (`NOPERM`).
const REFUSING_CODES: [&str; 3] = ["WRONGPASS", "NOAUTH", "NOPERM"];

/// What a Redis without cluster support answers the cluster client's first `CLUSTER SLOTS`: the
/// server is there and will never serve as a cluster node (`REDIS_TYPE=cluster` is wrong).
const NOT_A_CLUSTER: &str = "cluster support disabled";

/// The code of Redis's refusal of a client from outside the loopback while the default user has no
/// password (protected mode): the operator must set a password or bind Redis otherwise.
const PROTECTED_MODE: &str = "DENIED";

/// What a failure says about Redis.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Failure {
    /// Redis or its TLS refused us: password, user, ACL, certificate or TLS handshake. Waiting
    /// will not mend it.
    Refused(&'static str),
    /// Nobody answered in time, the connection was refused or cut, the reply was cut short:
    /// waiting may mend it.
    Unreachable,
}

/// What `e` says about Redis.
pub(crate) fn failure(e: &RedisError) -> Failure {
    if e.kind() == ErrorKind::AuthenticationFailed {
        return Failure::Refused("authentication");
    }
    match e.code() {
        Some("NOPERM") => return Failure::Refused("ACL"),
        Some(PROTECTED_MODE) => return Failure::Refused("protected mode"),
        Some(code) if REFUSING_CODES.contains(&code) => {
            return Failure::Refused("authentication");
        }
        _ => {}
    }
    if tls_failure(e) {
        return Failure::Refused("TLS");
    }
    if e.to_string().contains(NOT_A_CLUSTER) {
        return Failure::Refused(
            "REDIS_TYPE=cluster, but it is not a cluster node: set REDIS_TYPE=single, or sentinel \
             with the sentinels",
        );
    }
    Failure::Unreachable
}

/// `e`, from asking the sentinels for the master, with a refusal of our authentication said to be
/// the sentinels' (their password is `REDIS_SENTINEL_AUTH`, not the master's `REDIS_AUTH`);
/// `password_given`: whether `REDIS_SENTINEL_AUTH` is set.
pub(crate) fn by_the_sentinels(e: RedisError, password_given: bool) -> RedisError {
    if failure(&e) != Failure::Refused("authentication") {
        return e;
    }
    let given = if password_given {
        "REDIS_SENTINEL_AUTH is not the password they take"
    } else {
        "they want a password: set REDIS_SENTINEL_AUTH (REDIS_AUTH is the master's)"
    };
    RedisError::from((
        ErrorKind::AuthenticationFailed,
        "the sentinels refuse this server",
        format!("{given}; they said: {}", one_line(&e)),
    ))
}

/// Whether `e` is TLS refusing the connection: rustls' errors (a certificate not trusted either
/// way, an alert from the server, a handshake that is not TLS) reach us as I/O errors wrapping a
/// `rustls::Error`; the text is the fall-back for a wrapping this walk does not know.
fn tls_failure(e: &RedisError) -> bool {
    let mut source = std::error::Error::source(e);
    while let Some(cause) = source {
        // redis-rs holds its I/O errors behind an `Arc<dyn Error>`.
        let inner: &(dyn std::error::Error + 'static) =
            match cause.downcast_ref::<std::sync::Arc<dyn std::error::Error + Send + Sync>>() {
                Some(shared) => shared.as_ref(),
                None => cause,
            };
        let wrapped = inner
            .downcast_ref::<std::io::Error>()
            .and_then(std::io::Error::get_ref);
        if inner.is::<rustls::Error>() || wrapped.is_some_and(|w| w.is::<rustls::Error>()) {
            return true;
        }
        source = cause.source();
    }
    let text = e.to_string();
    text.contains("certificate") || text.contains("fatal alert")
}

/// `e` as the store's error: `Unavailable` for a refusal (start-up stops, saying why), else
/// `Unreachable`.
pub(crate) fn classify(e: &RedisError) -> StoreError {
    match failure(e) {
        Failure::Refused(why) => StoreError::Unavailable(format!(
            "Redis refuses this server ({why}): {}",
            one_line(e)
        )),
        Failure::Unreachable => StoreError::Unreachable(one_line(e)),
    }
}

/// Whether `e` is a connection cut by the other side (a broken pipe, a reset, an early end), as
/// Redis cuts one it turns away as it opens; not one nobody took (refused, no such socket).
pub(crate) fn cut(e: &RedisError) -> bool {
    e.is_connection_dropped() && !e.is_connection_refusal()
}

/// `e`, a connection cut as it opened, as the store's error, with the error line `said` that Redis
/// wrote on it before it closed it (`greeting`): a refusal if Redis's words are one (protected
/// mode), else unreachable (`ERR max number of clients reached`: waiting may mend it), saying them.
pub(crate) fn turned_away(e: &RedisError, said: &str) -> StoreError {
    let reply = ::redis::parse_redis_value(format!("-{said}\r\n").as_bytes());
    let words = reply.ok().and_then(|v| v.extract_error().err());
    match words.as_ref().map(failure) {
        Some(Failure::Refused(why)) => {
            StoreError::Unavailable(format!("Redis refuses this server ({why}): {said}"))
        }
        _ => StoreError::Unreachable(format!(
            "{} (Redis turned the connection away: {said})",
            one_line(e)
        )),
    }
}

/// `e`, a failed connection, as the store's error, when what answered wrote `wrote` unasked
/// (shown escaped), which Redis never does: unreachable, saying so.
pub(crate) fn not_redis(e: &RedisError, wrote: &str) -> StoreError {
    StoreError::Unreachable(format!(
        "{} (what answers there is not Redis: it wrote \"{wrote}\" unasked; is REDIS_URL the \
         Redis server's address and port?)",
        one_line(e)
    ))
}

/// Redis's plaintext port at `addr`, reached with TLS on: a refusal saying what to change.
pub(crate) fn tls_at_plaintext(addr: &ConnectionAddr) -> StoreError {
    StoreError::Unavailable(format!(
        "Redis refuses this server (TLS): {} answers in plaintext, and this server connects with \
         TLS (REDIS_TLS=true or a rediss:// URL): turn REDIS_TLS off and use redis://, or give \
         the address of Redis's TLS port (its tls-port)",
        host_port(addr)
    ))
}

/// Redis's TLS port at `addr`, reached in plaintext: a refusal saying what to change.
pub(crate) fn plaintext_at_tls(addr: &ConnectionAddr) -> StoreError {
    StoreError::Unavailable(format!(
        "Redis refuses this server (TLS): {} serves TLS, and this server connects in plaintext: \
         set REDIS_TLS=true (with REDIS_TLS_CACERT unless its certificate is from a CA the system \
         trusts) or use a rediss:// URL",
        host_port(addr)
    ))
}

/// `addr` as `host:port` (the address Redis is asked at, without redis-rs's TLS marks).
fn host_port(addr: &ConnectionAddr) -> String {
    match addr {
        ConnectionAddr::Tcp(host, port) | ConnectionAddr::TcpTls { host, port, .. } => {
            format!("{host}:{port}")
        }
        other => other.to_string(),
    }
}

/// `e`'s text on one line (redis-rs' parse errors span several: "Parse error at 1\nUnexpected
/// `0`…"), so a log line stays one line.
fn one_line(e: &RedisError) -> String {
    e.to_string().lines().collect::<Vec<_>>().join("; ")
}

/// A failed first call as the store's error: `Unavailable` only when Redis refused us (`failure`),
/// else the same message as `Unreachable`.
pub(crate) fn at_start(error: StoreError, failure: Failure) -> StoreError {
    match (error, failure) {
        (StoreError::Unavailable(message), Failure::Refused(why)) => {
            StoreError::Unavailable(format!("Redis refuses this server ({why}): {message}"))
        }
        (StoreError::Unavailable(message), Failure::Unreachable) => {
            StoreError::Unreachable(message)
        }
        (other, _) => other,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn server_error(reply: &[u8]) -> RedisError {
        ::redis::parse_redis_value(reply)
            .expect("a reply")
            .extract_error()
            .expect_err("an error reply")
    }

    fn io_error(kind: std::io::ErrorKind) -> RedisError {
        std::io::Error::from(kind).into()
    }

    #[test]
    fn authentication_and_acl_refusals_are_refusals() {
        for (reply, why) in [
            (
                &b"-WRONGPASS invalid username-password pair or user is disabled.\r\n"[..],
                "authentication",
            ),
            (
                &b"-NOAUTH Authentication required.\r\n"[..],
                "authentication",
            ),
            (
                &b"-NOPERM User u has no permissions to run the 'ping' command\r\n"[..],
                "ACL",
            ),
        ] {
            let e = server_error(reply);
            assert_eq!(failure(&e), Failure::Refused(why), "{e}");
            assert!(matches!(classify(&e), StoreError::Unavailable(m) if m.contains(why)));
        }
        let e = RedisError::from((
            ErrorKind::AuthenticationFailed,
            "Password authentication failed",
        ));
        assert_eq!(failure(&e), Failure::Refused("authentication"));
    }

    #[test]
    fn tls_refusals_are_refusals() {
        for tls in [
            rustls::Error::InvalidCertificate(rustls::CertificateError::UnknownIssuer),
            rustls::Error::AlertReceived(rustls::AlertDescription::BadCertificate),
            rustls::Error::InvalidMessage(rustls::InvalidMessage::InvalidContentType),
        ] {
            let e = RedisError::from(std::io::Error::new(std::io::ErrorKind::InvalidData, tls));
            assert_eq!(failure(&e), Failure::Refused("TLS"), "{e}");
        }
    }

    #[test]
    fn a_server_without_cluster_support_asked_as_a_cluster_is_a_refusal() {
        let e = server_error(b"-ERR This instance has cluster support disabled\r\n");
        let Failure::Refused(why) = failure(&e) else {
            panic!("a refusal");
        };
        assert!(why.contains("set REDIS_TYPE=single"), "{why}");
        assert!(matches!(
            classify(&e),
            StoreError::Unavailable(m) if m.contains("not a cluster node") && m.contains("cluster support disabled")
        ));
        // Another ERR is no refusal.
        assert_eq!(
            failure(&server_error(b"-ERR unknown command 'CLUSTER'\r\n")),
            Failure::Unreachable
        );
    }

    #[test]
    fn slow_cut_or_absent_is_unreachable() {
        use std::io::ErrorKind::*;
        for kind in [
            TimedOut,
            UnexpectedEof,
            ConnectionRefused,
            ConnectionReset,
            BrokenPipe,
            InvalidData,
        ] {
            let e = io_error(kind);
            assert_eq!(failure(&e), Failure::Unreachable, "{kind:?}");
            assert!(matches!(classify(&e), StoreError::Unreachable(_)));
        }
        // A reply cut in the middle, as the parser says it.
        let parse = RedisError::from(::redis::ParsingError::from(
            "Parse error at 3\nUnexpected end of input".to_owned(),
        ));
        assert_eq!(failure(&parse), Failure::Unreachable);
        // Redis is there but not ready, or a replica: waiting mends it.
        for reply in [
            &b"-LOADING Redis is loading the dataset in memory\r\n"[..],
            b"-MASTERDOWN Link with MASTER is down\r\n",
            b"-READONLY You can't write against a read only replica.\r\n",
        ] {
            assert_eq!(failure(&server_error(reply)), Failure::Unreachable);
        }
    }

    #[test]
    fn a_connection_turned_away_is_sorted_by_what_redis_said() {
        let cut = io_error(std::io::ErrorKind::BrokenPipe);
        assert!(super::cut(&cut));
        assert!(!super::cut(&io_error(
            std::io::ErrorKind::ConnectionRefused
        )));
        assert!(!super::cut(&io_error(std::io::ErrorKind::TimedOut)));
        let protected =
            "DENIED Redis is running in protected mode because protected mode is enabled";
        assert!(matches!(
            turned_away(&cut, protected),
            StoreError::Unavailable(m) if m.contains("(protected mode)") && m.contains(protected)
        ));
        assert!(matches!(
            turned_away(&cut, "ERR max number of clients reached"),
            StoreError::Unreachable(m) if m == "broken pipe (Redis turned the connection away: ERR max number of clients reached)"
        ));
        let denied = server_error(b"-DENIED Redis is running in protected mode\r\n");
        assert_eq!(failure(&denied), Failure::Refused("protected mode"));
    }

    #[test]
    fn a_failed_first_call_stops_start_up_only_when_refused() {
        let timed_out = || StoreError::Unavailable("Redis call timed out after 100ms".into());
        assert!(matches!(
            at_start(timed_out(), Failure::Unreachable),
            StoreError::Unreachable(m) if m.contains("timed out")
        ));
        assert!(matches!(
            at_start(timed_out(), Failure::Refused("ACL")),
            StoreError::Unavailable(m) if m.contains("refuses this server (ACL)")
        ));
    }
}
