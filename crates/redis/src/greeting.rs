//! What Redis writes, unasked, on a connection it turns away as it opens: `-DENIED …` (protected
//! mode: no password and a client from outside the loopback) or `-ERR max number of clients
//! reached`, then it closes. redis-rs writes its first command before it reads, so such a
//! refusal reaches the store as a broken pipe or a reset, Redis's words unread. After such an
//! error the store opens a plain connection of its own to the same address, sends nothing, and
//! reads them, so the log says what Redis said (`refusal::said`). Plain TCP and Unix sockets only:
//! over TLS the words come after a handshake this does not make.

use std::time::Duration;

use ::redis::ConnectionAddr;
use tokio::io::{AsyncRead, AsyncReadExt};

/// The most bytes of a greeting read (Redis's protected-mode text is about 1,000).
const MAX_GREETING: usize = 4096;

/// The first error line Redis wrote unasked on a fresh connection to one of `addrs` (without its
/// `-` and line end), read within `within` in all; `None` if none wrote one in time (Redis
/// served the connection, or nobody answered).
pub(crate) async fn refusal_said<'a>(
    addrs: impl IntoIterator<Item = &'a ConnectionAddr>,
    within: Duration,
) -> Option<String> {
    let addrs: Vec<&ConnectionAddr> = addrs.into_iter().collect();
    tokio::time::timeout(within, async move {
        for addr in addrs {
            if let Some(said) = read_refusal(addr).await {
                return Some(said);
            }
        }
        None
    })
    .await
    .ok()
    .flatten()
}

async fn read_refusal(addr: &ConnectionAddr) -> Option<String> {
    match addr {
        ConnectionAddr::Tcp(host, port) => {
            let stream = tokio::net::TcpStream::connect((host.as_str(), *port))
                .await
                .ok()?;
            error_line(stream).await
        }
        ConnectionAddr::Unix(path) => {
            error_line(tokio::net::UnixStream::connect(path).await.ok()?).await
        }
        // TLS (its words come after a handshake), or a kind this does not know.
        _ => None,
    }
}

/// Reads until a line end, the end of the stream or `MAX_GREETING` bytes; the line if it is an
/// error reply.
async fn error_line(mut stream: impl AsyncRead + Unpin) -> Option<String> {
    let mut read = Vec::new();
    let mut buf = [0u8; 512];
    while read.len() < MAX_GREETING && !read.contains(&b'\n') {
        match stream.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => read.extend_from_slice(&buf[..n]),
        }
    }
    error_reply(&read)
}

/// `bytes`' first line without its `-` and line end, if it is a RESP error reply.
fn error_reply(bytes: &[u8]) -> Option<String> {
    let line = bytes.strip_prefix(b"-")?;
    let end = line.iter().position(|&b| b == b'\r' || b == b'\n');
    let text = String::from_utf8_lossy(&line[..end.unwrap_or(line.len())]);
    let text = text.trim();
    (!text.is_empty()).then(|| text.to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_error_reply_is_read_up_to_its_line_end() {
        assert_eq!(
            error_reply(b"-ERR max number of clients reached\r\n").as_deref(),
            Some("ERR max number of clients reached")
        );
        assert_eq!(error_reply(b"-DENIED cut").as_deref(), Some("DENIED cut"));
        assert_eq!(error_reply(b"+PONG\r\n"), None);
        assert_eq!(error_reply(b""), None);
        assert_eq!(error_reply(b"-\r\n"), None);
    }

    /// A real Redis at its `maxclients`: the connection it turns away is told why.
    #[tokio::test]
    async fn what_redis_writes_as_it_turns_a_connection_away_is_read() {
        let Some(redis) = crate::test_redis::TestRedis::start() else {
            return;
        };
        let mut held = redis.connection().unwrap();
        let _: () = ::redis::cmd("CONFIG")
            .arg(&["SET", "maxclients", "1"])
            .query(&mut held)
            .unwrap();
        let info = ::redis::Client::open(redis.url()).unwrap();
        let said = refusal_said([info.get_connection_info().addr()], Duration::from_secs(60)).await;
        assert_eq!(said.as_deref(), Some("ERR max number of clients reached"));
        // Redis served the connection the test holds all along.
        let pong: String = ::redis::cmd("PING").query(&mut held).unwrap();
        assert_eq!(pong, "PONG");
    }

    #[tokio::test]
    async fn a_server_that_says_nothing_or_no_server_gives_nothing() {
        let silent = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = silent.local_addr().unwrap().port();
        let addr = ConnectionAddr::Tcp("127.0.0.1".into(), port);
        assert_eq!(refusal_said([&addr], Duration::from_millis(50)).await, None);
        drop(silent);
        assert_eq!(refusal_said([&addr], Duration::from_secs(60)).await, None);
    }
}
