//! Wiring: load the rules, build the store and engine, start the gRPC and HTTP servers and the
//! sweeper, and shut them down gracefully (health NOT_SERVING first, then drain in-flight calls).

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio_stream::wrappers::TcpListenerStream;

use crate::clock::Clock;
use crate::config::ConfigErrors;
use crate::engine::Engine;
use crate::http::{self, Admin};
use crate::metrics::Metrics;
use crate::policy::Policy;
use crate::reload::{self, Reloader};
use crate::service::RateLimitGrpc;
use crate::settings::ServeSettings;
use crate::status::{LoadReport, ServerStatus};
use crate::store::MemoryStore;

/// gRPC health service names we report: the whole server and the reference's "ratelimit".
pub const HEALTH_SERVICES: [&str; 2] = ["", "ratelimit"];

/// How often idle keys are dropped from memory.
const SWEEP_INTERVAL: Duration = Duration::from_secs(5);

#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error("invalid rules in {dir}:\n{errors}")]
    Rules { dir: String, errors: ConfigErrors },
    #[error("cannot watch the rules directory: {0}")]
    Watch(#[from] notify::Error),
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        addr: SocketAddr,
        source: std::io::Error,
    },
}

/// A running server: its bound addresses, its engine, and a handle to stop it.
pub struct Server {
    pub grpc_addr: SocketAddr,
    pub http_addr: SocketAddr,
    pub engine: Arc<Engine<MemoryStore>>,
    pub reloader: Arc<Reloader>,
    pub status: Arc<ServerStatus>,
    shutdown: watch::Sender<bool>,
    tasks: Vec<JoinHandle<()>>,
    drain_timeout: Duration,
}

impl Server {
    /// Flips health to NOT_SERVING, stops accepting, lets in-flight calls finish (for at most
    /// `drain_timeout`; streams such as health watches are then cut), then returns.
    pub async fn shutdown(self) {
        self.status.set_draining();
        let _ = self.shutdown.send(true);
        let drain_timeout = self.drain_timeout;
        for mut task in self.tasks {
            if tokio::time::timeout(drain_timeout, &mut task)
                .await
                .is_err()
            {
                tracing::warn!(
                    ?drain_timeout,
                    "drain timeout: closing remaining connections"
                );
                task.abort();
            }
        }
    }
}

/// The tonic server settings every gRPC listener of ours uses (also the load benchmark's baseline).
pub fn grpc_server() -> tonic::transport::Server {
    tonic::transport::Server::builder().tcp_nodelay(true)
}

async fn bind(addr: SocketAddr) -> Result<TcpListener, StartError> {
    TcpListener::bind(addr)
        .await
        .map_err(|source| StartError::Bind { addr, source })
}

/// Loads the rules and starts serving. Fails if the rules are invalid or a port is taken.
pub async fn start(settings: &ServeSettings, clock: Arc<dyn Clock>) -> Result<Server, StartError> {
    let metrics = Arc::new(Metrics::new(settings.detailed_metrics_cap));
    let store = Arc::new(MemoryStore::new(settings.max_keys));
    let engine = Arc::new(
        Engine::new(
            Policy::default(),
            store.clone(),
            clock.clone(),
            settings.engine_settings(),
        )
        .with_metrics(metrics.clone()),
    );
    let status = Arc::new(ServerStatus::new(LoadReport::default()));
    let reloader = Arc::new(Reloader::new(
        settings.config.clone(),
        engine.clone(),
        metrics.clone(),
        status.clone(),
        clock.clone(),
    ));
    let loaded = reloader.reload().map_err(|errors| StartError::Rules {
        dir: settings.config.display().to_string(),
        errors,
    })?;
    let grpc_listener = bind(settings.grpc_addr).await?;
    let http_listener = bind(settings.http_addr).await?;
    let grpc_addr = grpc_listener
        .local_addr()
        .map_err(|source| StartError::Bind {
            addr: settings.grpc_addr,
            source,
        })?;
    let http_addr = http_listener
        .local_addr()
        .map_err(|source| StartError::Bind {
            addr: settings.http_addr,
            source,
        })?;
    let (shutdown, shutdown_rx) = watch::channel(false);
    let watcher = reload::spawn_watcher(reloader.clone(), shutdown_rx.clone())?;

    let (health, health_service) = tonic_health::server::health_reporter();
    for name in HEALTH_SERVICES {
        health
            .set_service_status(name, tonic_health::ServingStatus::Serving)
            .await;
    }
    let grpc = {
        let mut stop = shutdown_rx.clone();
        let engine = engine.clone();
        tokio::spawn(async move {
            let drained = async move {
                let _ = stop.wait_for(|s| *s).await;
                for name in HEALTH_SERVICES {
                    health
                        .set_service_status(name, tonic_health::ServingStatus::NotServing)
                        .await;
                }
            };
            let result = grpc_server()
                .add_service(health_service)
                .add_service(RateLimitGrpc::server(engine))
                .serve_with_incoming_shutdown(TcpListenerStream::new(grpc_listener), drained)
                .await;
            if let Err(e) = result {
                tracing::error!(error = %e, "gRPC server failed");
            }
        })
    };
    let http = {
        let mut stop = shutdown_rx.clone();
        let admin = Arc::new(Admin {
            engine: engine.clone(),
            metrics,
            status: status.clone(),
        });
        tokio::spawn(async move {
            let result = axum::serve(http_listener, http::router(admin))
                .with_graceful_shutdown(async move {
                    let _ = stop.wait_for(|s| *s).await;
                })
                .await;
            if let Err(e) = result {
                tracing::error!(error = %e, "HTTP server failed");
            }
        })
    };
    let sweeper = {
        let mut stop = shutdown_rx;
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(SWEEP_INTERVAL);
            loop {
                tokio::select! {
                    _ = tick.tick() => { store.sweep(clock.now()); }
                    _ = stop.wait_for(|s| *s) => break,
                }
            }
        })
    };
    tracing::info!(%grpc_addr, %http_addr, rules = %loaded.summary, "serving");
    Ok(Server {
        grpc_addr,
        http_addr,
        engine,
        reloader,
        status,
        shutdown,
        tasks: vec![grpc, http, sweeper, watcher],
        drain_timeout: settings.drain_timeout,
    })
}

/// Runs until SIGTERM or SIGINT, then shuts down gracefully.
pub async fn run(settings: &ServeSettings, clock: Arc<dyn Clock>) -> Result<(), StartError> {
    let server = start(settings, clock).await?;
    wait_for_signal().await;
    tracing::info!("shutting down: health NOT_SERVING, draining in-flight requests");
    server.shutdown().await;
    Ok(())
}

async fn wait_for_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        _ = ctrl_c => {},
        _ = term => {},
    }
}
