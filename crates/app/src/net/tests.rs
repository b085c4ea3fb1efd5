use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use super::*;

const SHORT: Timeouts = Timeouts {
    handshake: Duration::from_millis(50),
    idle: Duration::from_millis(50),
};

async fn acceptor(cap: usize, timeouts: Timeouts) -> Acceptor {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    Acceptor::new(listener, cap, timeouts, "test")
}

#[tokio::test]
async fn accepted_connections_have_nodelay_set() {
    let acceptor = acceptor(4, SHORT).await;
    let addr = acceptor.local_addr().unwrap();
    let _client = TcpStream::connect(addr).await.unwrap();
    let (server_side, _) = acceptor.accept().await;
    assert!(server_side.get_ref().nodelay().unwrap());
}

#[tokio::test]
async fn a_peer_that_sends_nothing_is_closed_after_the_handshake_timeout() {
    let acceptor = acceptor(4, SHORT).await;
    let addr = acceptor.local_addr().unwrap();
    let _client = TcpStream::connect(addr).await.unwrap();
    let (mut server_side, _) = acceptor.accept().await;
    let err = server_side.read(&mut [0u8; 64]).await.unwrap_err();
    assert_eq!(err.kind(), std::io::ErrorKind::TimedOut);
    assert!(err.to_string().contains("handshake"), "{err}");
}

#[tokio::test]
async fn a_peer_that_trickles_bytes_does_not_extend_the_handshake() {
    let acceptor = acceptor(4, SHORT).await;
    let addr = acceptor.local_addr().unwrap();
    let mut client = TcpStream::connect(addr).await.unwrap();
    let (mut server_side, _) = acceptor.accept().await;
    let mut received = 0;
    let err = loop {
        client.write_all(b"P").await.unwrap();
        match server_side.read(&mut [0u8; 64]).await {
            Ok(n) => received += n,
            Err(e) => break e,
        }
        assert!(received < 33, "the guard let the trickle through");
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    assert!(err.to_string().contains("handshake"), "{err}");
}

#[tokio::test]
async fn after_the_handshake_a_silent_connection_is_closed_as_idle() {
    let acceptor = acceptor(4, SHORT).await;
    let addr = acceptor.local_addr().unwrap();
    let mut client = TcpStream::connect(addr).await.unwrap();
    let (mut server_side, _) = acceptor.accept().await;
    client.write_all(&[b'x'; 33]).await.unwrap();
    let mut buf = [0u8; 33];
    server_side.read_exact(&mut buf).await.unwrap();
    let err = server_side.read(&mut buf).await.unwrap_err();
    assert_eq!(err.kind(), std::io::ErrorKind::TimedOut);
    assert!(err.to_string().contains("idle"), "{err}");
}

#[tokio::test]
async fn a_listener_at_its_cap_accepts_again_when_a_connection_closes() {
    let long = Timeouts {
        handshake: Duration::from_secs(60),
        idle: Duration::from_secs(60),
    };
    let acceptor = acceptor(1, long).await;
    let addr = acceptor.local_addr().unwrap();
    let _c1 = TcpStream::connect(addr).await.unwrap();
    let (first, _) = acceptor.accept().await;
    let _c2 = TcpStream::connect(addr).await.unwrap();
    let mut second = Box::pin(acceptor.accept());
    assert!(
        tokio::time::timeout(Duration::from_millis(100), &mut second)
            .await
            .is_err(),
        "a second connection was accepted past the cap of 1"
    );
    drop(first);
    let (_second, _) = second.await;
}

#[test]
fn caps_fit_the_descriptor_limit() {
    let caps = ConnectionCaps::fitted(10_000, 1_000, false, Some(256));
    assert_eq!(
        caps,
        ConnectionCaps {
            grpc: 144,
            uds: 0,
            admin: 24
        }
    );
    // A Unix socket takes half of gRPC's share: neither can starve the other.
    let caps = ConnectionCaps::fitted(10_000, 1_000, true, Some(256));
    assert_eq!(
        caps,
        ConnectionCaps {
            grpc: 72,
            uds: 72,
            admin: 24
        }
    );
    let caps = ConnectionCaps::fitted(10_000, 1_000, true, Some(1 << 20));
    assert_eq!(
        caps,
        ConnectionCaps {
            grpc: 10_000,
            uds: 10_000,
            admin: 1_000
        }
    );
    assert_eq!(
        ConnectionCaps::fitted(5, 5, false, None),
        ConnectionCaps {
            grpc: 5,
            uds: 0,
            admin: 5
        }
    );
}

#[test]
fn the_descriptor_limit_is_read_from_proc_limits() {
    let text = "Limit                     Soft Limit           Hard Limit           Units     \n\
                Max open files            1024                 524288               files     \n";
    assert_eq!(parse_fd_limit(text), Some(1024));
    let unlimited = "Max open files            unlimited            unlimited            files\n";
    assert_eq!(parse_fd_limit(unlimited), None);
    assert!(fd_limit().is_some_and(|n| n > 0));
}

async fn connect_from(source: &str, addr: std::net::SocketAddr) -> TcpStream {
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.bind(format!("{source}:0").parse().unwrap()).unwrap();
    socket.connect(addr).await.unwrap()
}

#[tokio::test]
async fn a_client_at_its_cap_has_new_connections_closed_while_others_are_taken() {
    let long = Timeouts {
        handshake: Duration::from_secs(60),
        idle: Duration::from_secs(60),
    };
    let acceptor = acceptor(8, long).await.with_client_cap(2);
    let addr = acceptor.local_addr().unwrap();
    let _a1 = connect_from("127.0.0.1", addr).await;
    let _a2 = connect_from("127.0.0.1", addr).await;
    let mut a3 = connect_from("127.0.0.1", addr).await;
    let _b1 = connect_from("127.0.0.2", addr).await;
    let mut taken = Vec::new();
    for _ in 0..3 {
        taken.push(acceptor.accept().await);
    }
    let peers: Vec<_> = taken
        .iter()
        .map(|(_, peer)| peer.unwrap().to_string())
        .collect();
    assert_eq!(peers, ["127.0.0.1", "127.0.0.1", "127.0.0.2"]);
    // The third from 127.0.0.1 was closed as soon as it was accepted.
    assert_eq!(a3.read(&mut [0u8; 1]).await.unwrap(), 0);
    // A slot it gives back is its again.
    taken.remove(0);
    let _a4 = connect_from("127.0.0.1", addr).await;
    let (_, peer) = acceptor.accept().await;
    assert_eq!(peer.unwrap().to_string(), "127.0.0.1");
}

#[tokio::test]
async fn a_unix_socket_gets_the_same_guards() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s.sock");
    let listener = tokio::net::UnixListener::bind(&path).unwrap();
    let acceptor = Acceptor::new(listener, 1, SHORT, "test");
    let _client = tokio::net::UnixStream::connect(&path).await.unwrap();
    let (mut server_side, peer) = acceptor.accept().await;
    assert_eq!(peer, None);
    let err = server_side.read(&mut [0u8; 64]).await.unwrap_err();
    assert!(err.to_string().contains("handshake"), "{err}");
    // At its cap of 1, a second connection waits until the first is closed.
    let _second = tokio::net::UnixStream::connect(&path).await.unwrap();
    let mut next = Box::pin(acceptor.accept());
    assert!(
        tokio::time::timeout(Duration::from_millis(100), &mut next)
            .await
            .is_err()
    );
    drop(server_side);
    let _ = next.await;
}
