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
    let caps = ConnectionCaps::fitted(10_000, 1_000, Some(256));
    assert_eq!(
        caps,
        ConnectionCaps {
            grpc: 144,
            admin: 24
        }
    );
    let caps = ConnectionCaps::fitted(10_000, 1_000, Some(1 << 20));
    assert_eq!(
        caps,
        ConnectionCaps {
            grpc: 10_000,
            admin: 1_000
        }
    );
    assert_eq!(
        ConnectionCaps::fitted(5, 5, None),
        ConnectionCaps { grpc: 5, admin: 5 }
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
