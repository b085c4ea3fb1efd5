//! What a server writes, unasked, on a fresh connection. Redis writes nothing, except on one it
//! turns away as it opens: `-DENIED …` (protected mode: no password and a client from outside the
//! loopback) or `-ERR max number of clients reached`, then it closes. redis-rs writes its first
//! command before it reads, so such a refusal reaches the store as a broken pipe or a reset,
//! Redis's words unread; and a server that is not Redis at all (a database's port given as
//! `REDIS_URL`) as a parse error. After such an error the store opens a plain connection of its
//! own to the same address, sends nothing, and reads what comes (`refusal::turned_away`,
//! `refusal::not_redis`). Plain TCP and Unix sockets only: over TLS the words come after a
//! handshake this does not make.

use std::time::Duration;

use ::redis::ConnectionAddr;
use tokio::io::{AsyncRead, AsyncReadExt};

/// The most bytes of a greeting read (Redis's protected-mode text is about 1,000).
const MAX_GREETING: usize = 4096;

/// What a server wrote unasked on a fresh connection.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Greeting {
    /// A Redis error line (without its `-` and line end): Redis turning the connection away.
    Error(String),
    /// Bytes that are no Redis reply (shown escaped, the first [`SHOWN`] of them): not Redis.
    Foreign(String),
}

/// How many bytes of a foreign greeting are shown.
const SHOWN: usize = 48;

/// What the server at one of `addrs` wrote unasked on a fresh connection, read within `within` in
/// all; `None` if nothing came in time (Redis served the connection, or nobody answered).
pub(crate) async fn greeting<'a>(
    addrs: impl IntoIterator<Item = &'a ConnectionAddr>,
    within: Duration,
) -> Option<Greeting> {
    let addrs: Vec<&ConnectionAddr> = addrs.into_iter().collect();
    tokio::time::timeout(within, async move {
        for addr in addrs {
            if let Some(said) = read_greeting(addr).await {
                return Some(said);
            }
        }
        None
    })
    .await
    .ok()
    .flatten()
}

async fn read_greeting(addr: &ConnectionAddr) -> Option<Greeting> {
    match addr {
        ConnectionAddr::Tcp(host, port) => {
            let stream = tokio::net::TcpStream::connect((host.as_str(), *port))
                .await
                .ok()?;
            first_words(stream).await
        }
        ConnectionAddr::Unix(path) => {
            first_words(tokio::net::UnixStream::connect(path).await.ok()?).await
        }
        // TLS (its words come after a handshake), or a kind this does not know.
        _ => None,
    }
}

/// Reads what comes first: an error line whole (up to its line end, the end of the stream or
/// `MAX_GREETING` bytes), anything else as soon as it comes.
async fn first_words(mut stream: impl AsyncRead + Unpin) -> Option<Greeting> {
    let mut read = Vec::new();
    let mut buf = [0u8; 512];
    loop {
        match stream.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => read.extend_from_slice(&buf[..n]),
        }
        if read.first() != Some(&b'-') || read.contains(&b'\n') || read.len() >= MAX_GREETING {
            break;
        }
    }
    sorted(&read)
}

/// `bytes` as a greeting: a Redis error line, or foreign bytes; `None` for nothing.
fn sorted(bytes: &[u8]) -> Option<Greeting> {
    if let Some(line) = bytes.strip_prefix(b"-") {
        let end = line.iter().position(|&b| b == b'\r' || b == b'\n');
        let text = String::from_utf8_lossy(&line[..end.unwrap_or(line.len())]);
        let text = text.trim();
        return (!text.is_empty()).then(|| Greeting::Error(text.to_owned()));
    }
    (!bytes.is_empty())
        .then(|| Greeting::Foreign(bytes[..bytes.len().min(SHOWN)].escape_ascii().to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_error_line_is_read_to_its_end_and_anything_else_is_foreign() {
        let error = |text: &str| Some(Greeting::Error(text.into()));
        assert_eq!(
            sorted(b"-ERR max number of clients reached\r\n"),
            error("ERR max number of clients reached")
        );
        assert_eq!(sorted(b"-DENIED cut"), error("DENIED cut"));
        assert_eq!(sorted(b""), None);
        assert_eq!(sorted(b"-\r\n"), None);
        // MariaDB's handshake, as it greets every client.
        assert_eq!(
            sorted(b"J\0\0\0\n5.5.5-10.11.19-MariaDB"),
            Some(Greeting::Foreign(
                "J\\x00\\x00\\x00\\n5.5.5-10.11.19-MariaDB".into()
            ))
        );
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
        let said = greeting([info.get_connection_info().addr()], Duration::from_secs(60)).await;
        assert_eq!(
            said,
            Some(Greeting::Error("ERR max number of clients reached".into()))
        );
        // Redis served the connection the test holds all along.
        let pong: String = ::redis::cmd("PING").query(&mut held).unwrap();
        assert_eq!(pong, "PONG");
    }

    #[tokio::test]
    async fn a_server_that_says_nothing_or_no_server_gives_nothing() {
        let silent = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = silent.local_addr().unwrap().port();
        let addr = ConnectionAddr::Tcp("127.0.0.1".into(), port);
        assert_eq!(greeting([&addr], Duration::from_millis(50)).await, None);
        drop(silent);
        assert_eq!(greeting([&addr], Duration::from_secs(60)).await, None);
    }
}
