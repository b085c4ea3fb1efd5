//! The listeners: bound before anything is spawned (a taken port fails the start), then served
//! with their connection caps, silence timeouts and TLS, each as a task that ends at shutdown.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;

use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::net::tls::{self, TlsError, TlsMetrics, TlsSource};
use crate::net::{
    self, Acceptor, ConnectionAge, ConnectionCaps, Http2Settings, Listener, Timeouts, WrongProtocol,
};
use crate::settings::{ServeSettings, TransportArgs};
use ratelimit_core::clock::Clock;
use ratelimit_core::metrics::Metrics;
use ratelimit_core::store::Backend;

use super::StartError;
use super::grpc_routes::GrpcRoutes;

async fn bind(addr: SocketAddr) -> Result<(TcpListener, SocketAddr), StartError> {
    let error = |source| StartError::Bind { addr, source };
    let listener = TcpListener::bind(addr).await.map_err(error)?;
    let bound = listener.local_addr().map_err(error)?;
    Ok((listener, bound))
}

/// The TCP listeners, bound (so a taken port fails the start before anything is spawned).
pub(super) struct Listeners {
    pub(super) grpc: (TcpListener, SocketAddr),
    pub(super) http: (TcpListener, SocketAddr),
    pub(super) debug: Option<(TcpListener, SocketAddr)>,
    pub(super) metrics: Option<(TcpListener, SocketAddr)>,
}

impl Listeners {
    pub(super) async fn bind(settings: &ServeSettings) -> Result<Listeners, StartError> {
        let grpc = bind(settings.grpc_addr).await?;
        let http = bind(settings.http_addr).await?;
        let debug = match settings.debug_addr {
            Some(addr) => Some(bind(addr).await?),
            None => None,
        };
        let metrics = match settings.metrics_addr {
            Some(addr) => Some(bind(addr).await?),
            None => None,
        };
        Ok(Listeners {
            grpc,
            http,
            debug,
            metrics,
        })
    }

    /// The bound gRPC, admin and debug addresses.
    pub(super) fn addrs(&self) -> (SocketAddr, SocketAddr, Option<SocketAddr>) {
        (
            self.grpc.1,
            self.http.1,
            self.debug.as_ref().map(|(_, a)| *a),
        )
    }

    /// The bound metrics-only address, when there is one.
    pub(super) fn metrics_addr(&self) -> Option<SocketAddr> {
        self.metrics.as_ref().map(|(_, a)| *a)
    }
}

/// The gRPC and admin listeners' TLS configs, for those that have TLS.
pub(super) struct ListenerTls {
    pub(super) grpc: Option<Arc<TlsSource>>,
    pub(super) admin: Option<Arc<TlsSource>>,
}

impl ListenerTls {
    /// Loaded now: start-up errors are fatal, an expired certificate included.
    pub(super) fn load(
        settings: &ServeSettings,
        metrics: &Metrics,
        clock: &Arc<dyn Clock>,
    ) -> Result<ListenerTls, StartError> {
        let tls_metrics = TlsMetrics::register(metrics.registry());
        Ok(ListenerTls {
            grpc: tls_source(settings.tls.grpc()?, &tls_metrics, clock)?,
            admin: tls_source(settings.tls.admin()?, &tls_metrics, clock)?,
        })
    }
}

fn tls_source(
    spec: Option<tls::TlsSpec>,
    metrics: &TlsMetrics,
    clock: &Arc<dyn Clock>,
) -> Result<Option<Arc<TlsSource>>, TlsError> {
    spec.map(|spec| TlsSource::load(spec, metrics.clone(), clock.clone()).map(Arc::new))
        .transpose()
}

/// Connection caps fitted to the descriptor limit (the Unix socket, when there is one, with its
/// own share), saying so when they had to be lowered.
fn connection_caps(transport: &TransportArgs, uds: bool) -> ConnectionCaps {
    let asked = (
        transport.max_connections as usize,
        transport.max_admin_connections as usize,
    );
    let fd_limit = net::fd_limit();
    let caps = ConnectionCaps::fitted(asked.0, asked.1, uds, fd_limit);
    let lowered = caps.grpc != asked.0 || caps.admin != asked.1 || (uds && caps.uds != asked.0);
    if lowered {
        tracing::warn!(
            fd_limit,
            grpc = caps.grpc,
            grpc_uds = caps.uds,
            admin = caps.admin,
            "connection caps lowered to fit the open-file limit (raise `ulimit -n` for more)"
        );
    }
    caps
}

/// The gRPC listeners' HTTP/2 settings: keepalive, stream cap, connection age.
pub(super) fn http2_settings(settings: &ServeSettings) -> Http2Settings {
    let t = &settings.transport;
    Http2Settings {
        keepalive_interval: t.grpc_keepalive_interval,
        keepalive_timeout: t.grpc_keepalive_timeout,
        max_concurrent_streams: t.grpc_max_concurrent_streams,
        age: settings.grpc_max_connection_age.map(|max| ConnectionAge {
            max,
            grace: settings.grpc_max_connection_age_grace,
        }),
    }
}

/// Resolves when `stop` turns true.
async fn stopped(mut stop: watch::Receiver<bool>) {
    let _ = stop.wait_for(|s| *s).await;
}

/// The server's background tasks as they are spawned, with what the listeners among them share:
/// connection caps, silence timeouts and the shutdown signal.
pub(super) struct Tasks {
    caps: ConnectionCaps,
    /// `MAX_CONNECTIONS_PER_CLIENT`; `None`: each listener's default share.
    client_cap: Option<usize>,
    refused: prometheus::IntCounterVec,
    wrong_protocol: prometheus::IntCounterVec,
    timeouts: Timeouts,
    pub(super) shutdown: watch::Receiver<bool>,
    pub(super) handles: Vec<JoinHandle<()>>,
}

impl Tasks {
    /// No task yet; the listeners' caps fitted to the open-file limit.
    pub(super) fn new(
        settings: &ServeSettings,
        metrics: &Metrics,
        shutdown: watch::Receiver<bool>,
    ) -> Tasks {
        Tasks {
            caps: connection_caps(&settings.transport, settings.grpc_uds.is_some()),
            client_cap: settings
                .transport
                .max_connections_per_client
                .map(|n| n as usize),
            refused: net::refusal_counters(metrics.registry()),
            wrong_protocol: net::wrong_protocol_counters(metrics.registry()),
            timeouts: settings.transport.timeouts(),
            shutdown,
            handles: Vec::new(),
        }
    }

    /// The acceptor of one listener: its cap, the per-client cap, the timeouts.
    fn acceptor<L: Listener>(&self, listener: L, cap: usize, name: &'static str) -> Acceptor<L> {
        let acceptor = Acceptor::new(listener, cap, self.timeouts, name)
            .with_refusal_counter(self.refused.with_label_values(&[name]));
        match self.client_cap {
            Some(per_client) => acceptor.with_client_cap(per_client),
            None => acceptor,
        }
    }

    pub(super) fn spawn(&mut self, task: impl Future<Output = ()> + Send + 'static) {
        self.handles.push(tokio::spawn(task));
    }

    /// Resolves when shutdown is asked for.
    fn stopped(&self) -> impl Future<Output = ()> + Send + 'static {
        stopped(self.shutdown.clone())
    }

    /// Polls each listener's certificate files and swaps in what changed.
    pub(super) fn watch_tls_files<'a>(
        &mut self,
        settings: &ServeSettings,
        sources: impl IntoIterator<Item = &'a Option<Arc<TlsSource>>>,
    ) {
        for source in sources.into_iter().flatten() {
            let interval = settings.tls.tls_reload_interval;
            let shutdown = self.shutdown.clone();
            self.spawn(tls::watch_files(source.clone(), interval, shutdown));
        }
    }

    /// Also serves gRPC on a Unix socket (Envoy's pipe address). A stale socket file is replaced.
    pub(super) fn serve_grpc_on_unix_socket<B: Backend>(
        &mut self,
        path: &std::path::Path,
        settings: Http2Settings,
        routes: GrpcRoutes<B>,
    ) -> Result<(), StartError> {
        let _ = std::fs::remove_file(path);
        let listener =
            tokio::net::UnixListener::bind(path).map_err(|source| StartError::BindUnix {
                path: path.display().to_string(),
                source,
            })?;
        let name = "gRPC (Unix socket)";
        let acceptor = self.acceptor(listener, self.caps.uds, name);
        tracing::info!(
            path = %path.display(),
            max_connections = self.caps.uds,
            "gRPC also on a Unix socket"
        );
        let wrong = Arc::new(WrongProtocol::new(name, false, self.wrong_protocol.clone()));
        let open = move |mut stream| {
            let wrong = wrong.clone();
            async move {
                let serves = wrong.serves::<tokio::net::UnixListener>(&mut stream).await;
                serves.then_some(stream)
            }
        };
        let stop = self.stopped();
        self.spawn(net::serve_grpc(
            acceptor, open, settings, routes, stop, name,
        ));
        Ok(())
    }

    /// Serves gRPC on its TCP listener, through TLS if it has it.
    pub(super) fn serve_grpc<B: Backend>(
        &mut self,
        (listener, _): (TcpListener, SocketAddr),
        settings: Http2Settings,
        routes: GrpcRoutes<B>,
        tls: Option<Arc<TlsSource>>,
    ) {
        let name = "gRPC";
        let acceptor = self.acceptor(listener, self.caps.grpc, name);
        let wrong = Arc::new(WrongProtocol::new(
            name,
            tls.is_some(),
            self.wrong_protocol.clone(),
        ));
        let open = move |mut stream| {
            let (tls, wrong) = (tls.clone(), wrong.clone());
            async move {
                if !wrong.serves::<TcpListener>(&mut stream).await {
                    return None;
                }
                tls::open(tls, stream).await
            }
        };
        let stop = self.stopped();
        self.spawn(net::serve_grpc(
            acceptor, open, settings, routes, stop, name,
        ));
    }

    /// Serves the admin HTTP routes, through TLS if the admin listener has it.
    pub(super) fn serve_admin(
        &mut self,
        settings: &ServeSettings,
        (listener, _): (TcpListener, SocketAddr),
        router: axum::Router,
        tls: Option<Arc<TlsSource>>,
    ) {
        let acceptor = self.acceptor(listener, self.caps.admin, "admin");
        let header_timeout = settings.transport.handshake_timeout;
        let stop = self.stopped();
        self.spawn(net::serve_http(acceptor, tls, router, header_timeout, stop));
    }

    /// Serves the debug routes (or the metrics listener's), in plaintext as the reference's
    /// debug and Prometheus ports.
    pub(super) fn serve_debug(
        &mut self,
        settings: &ServeSettings,
        (listener, _): (TcpListener, SocketAddr),
        router: axum::Router,
    ) {
        let acceptor = self.acceptor(listener, self.caps.admin, "debug");
        let header_timeout = settings.transport.handshake_timeout;
        let stop = self.stopped();
        self.spawn(net::serve_http(
            acceptor,
            None,
            router,
            header_timeout,
            stop,
        ));
    }
}
