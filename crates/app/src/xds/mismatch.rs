//! TLS on one side only, between this server and its management server. A plaintext client at a
//! TLS server sees its connection closed (`Unknown: transport error`, said with no cause); a TLS
//! client at a plaintext gRPC server sees a TLS error. After a failure before any response, a
//! connection of the client's own asks the server what it speaks (`ratelimit_remote::speaks`),
//! and the log line says which setting to change.

use std::time::Duration;

use ratelimit_remote::speaks;

/// How long the question may take.
const ASK_WITHIN: Duration = Duration::from_secs(1);

/// The host and port of `CONFIG_GRPC_XDS_SERVER_URL`'s `host:port` (an IPv6 host in brackets).
fn host_port(authority: &str) -> Option<(&str, u16)> {
    let (host, port) = authority.rsplit_once(':')?;
    let host = host
        .strip_prefix('[')
        .and_then(|h| h.strip_suffix(']'))
        .unwrap_or(host);
    Some((host, port.parse().ok()?))
}

/// What to change, if the management server at `authority` speaks otherwise than this server
/// connects to it (`tls`: with TLS); `None` if it does not, or it cannot be asked.
pub(super) async fn tls_mismatch(authority: &str, tls: bool) -> Option<String> {
    let (host, port) = host_port(authority)?;
    if !tls && speaks::speaks_tls(host, port, ASK_WITHIN).await {
        return Some(format!(
            "the xDS server at {authority} speaks TLS, and this server connects in plaintext: set \
             CONFIG_GRPC_XDS_SERVER_USE_TLS=true, with CONFIG_GRPC_XDS_SERVER_TLS_CACERT (its CA) \
             and, where it asks for a client certificate as Envoy Gateway's does, \
             CONFIG_GRPC_XDS_CLIENT_TLS_CERT and CONFIG_GRPC_XDS_CLIENT_TLS_KEY"
        ));
    }
    if tls && speaks::speaks_plaintext_http2(host, port, ASK_WITHIN).await {
        return Some(format!(
            "the xDS server at {authority} answers in plaintext HTTP/2, and this server connects \
             with TLS: set CONFIG_GRPC_XDS_SERVER_USE_TLS=false, or serve TLS there"
        ));
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_host_and_port_are_read_from_the_url_setting() {
        assert_eq!(
            host_port("envoy-gateway:18001"),
            Some(("envoy-gateway", 18001))
        );
        assert_eq!(host_port("[::1]:18001"), Some(("::1", 18001)));
        assert_eq!(host_port("no-port"), None);
        assert_eq!(host_port("h:x"), None);
    }
}
