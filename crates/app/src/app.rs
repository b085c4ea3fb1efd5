//! Wiring: load the rules (from files, or subscribe to them over xDS), build the store and
//! engine, start the gRPC and HTTP servers and the sweeper, and shut them down gracefully (health
//! NOT_SERVING first, then drain in-flight calls).

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tonic::transport::server::Router;
use tonic_health::pb::health_check_response::ServingStatus;

use crate::clock::Clock;
use crate::config::ConfigErrors;
use crate::engine::{Engine, Rules};
use crate::front::FrontDoor;
pub use crate::health::HEALTH_SERVICES;
use crate::health::HealthReporter;
use crate::http::{self, Admin};
use crate::metrics::Metrics;
use crate::net::tls::{self, TlsError, TlsMetrics, TlsSource};
use crate::net::{self, Acceptor, ConnectionCaps, Listener, Timeouts};
use crate::policy::Policy;
use crate::record::{LivePolicy, Recorder};
use crate::reload::{self, Reloader};
use crate::rlqs;
use crate::rules_dir::{self, CappedReadError};
use crate::service::RateLimitGrpc;
use crate::settings::TransportArgs;
use crate::settings::{BackendType, ServeSettings};
use crate::statsd::Mapper;
use crate::status::{LoadReport, ServerStatus};
use crate::store::guard::{GuardSettings, Guarded};
use crate::store::memory::MemoryBackend;
use crate::store::{Backend, Store};
use crate::telemetry::Tracing;
use crate::xds::{XdsClient, XdsConfig, XdsMetrics};
use ratelimit_redis::RedisConnect;

/// At shutdown, how long the record writer may take to write what is queued.
const RECORD_FLUSH_WAIT: Duration = Duration::from_secs(10);

/// Largest `PROMETHEUS_MAPPER_YAML` file read (a rules file's default cap).
const MAX_MAPPER_BYTES: u64 = 8 << 20;

/// How often idle keys are dropped from memory.
const SWEEP_INTERVAL: Duration = Duration::from_secs(5);

#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error("invalid rules in {dir}:\n{errors}\nno rules are in force; refusing to start")]
    Rules { dir: String, errors: ConfigErrors },
    #[error("cannot watch the rules directory: {0}")]
    Watch(#[from] notify::Error),
    #[error("invalid setting {0}")]
    Setting(#[from] crate::settings::SettingError),
    #[error("invalid xDS setting {0}")]
    Xds(String),
    #[error("cannot use the store: {0}")]
    Store(#[from] crate::store::StoreError),
    #[error("{0}")]
    Tls(#[from] TlsError),
    #[error("{0}")]
    Tracing(#[from] crate::telemetry::TracingError),
    #[error("cannot record to {path} (RECORD_FILE): {source}")]
    Record {
        path: String,
        source: std::io::Error,
    },
    #[error("invalid PROMETHEUS_MAPPER_YAML {path}: {error}")]
    Mapper { path: String, error: String },
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        addr: SocketAddr,
        source: std::io::Error,
    },
    #[error("cannot listen on the Unix socket {path}: {source}")]
    BindUnix {
        path: String,
        source: std::io::Error,
    },
}

/// A running server: its bound addresses, its metrics, and a handle to stop it.
pub struct Server {
    pub grpc_addr: SocketAddr,
    pub http_addr: SocketAddr,
    /// The debug listener's address, when `--debug-addr` is set.
    pub debug_addr: Option<SocketAddr>,
    /// The metrics listener's address, when `--metrics-addr` is set.
    pub metrics_addr: Option<SocketAddr>,
    pub metrics: Arc<Metrics>,
    pub reloader: Arc<Reloader>,
    pub status: Arc<ServerStatus>,
    health: HealthReporter,
    shutdown: watch::Sender<bool>,
    tasks: Vec<JoinHandle<()>>,
    drain_timeout: Duration,
    shutdown_delay: Duration,
    /// Flushed once the listeners are closed.
    tracing: Option<Tracing>,
    /// `--record`: its queue is written out once the listeners are closed.
    pub recorder: Option<Arc<Recorder>>,
}

impl Server {
    /// Shuts down after the configured `SHUTDOWN_DELAY` (see [`Server::shutdown_after`]).
    pub async fn shutdown(self) {
        let delay = self.shutdown_delay;
        self.shutdown_after(delay).await;
    }

    /// Flips health to NOT_SERVING (gRPC health and HTTP `/healthcheck`) while still serving every
    /// call for `delay`, so that load balancers see it; then ends health Watch streams, stops
    /// accepting, lets in-flight calls finish (for at most `drain_timeout`; what is left is then
    /// cut), and returns.
    pub async fn shutdown_after(self, delay: Duration) {
        self.status.set_draining();
        self.health.set(ServingStatus::NotServing);
        if !delay.is_zero() {
            tracing::info!(
                ?delay,
                "health is NOT_SERVING; serving on until the shutdown delay ends"
            );
            tokio::time::sleep(delay).await;
        }
        self.health.close();
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
        if let Some(tracing) = &self.tracing {
            tracing.shutdown().await;
        }
        if let Some(recorder) = self.recorder {
            let _ = tokio::task::spawn_blocking(move || recorder.finish(RECORD_FLUSH_WAIT)).await;
        }
    }
}

async fn bind(addr: SocketAddr) -> Result<(TcpListener, SocketAddr), StartError> {
    let error = |source| StartError::Bind { addr, source };
    let listener = TcpListener::bind(addr).await.map_err(error)?;
    let bound = listener.local_addr().map_err(error)?;
    Ok((listener, bound))
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

/// A listener's TLS config, loaded now (start-up errors are fatal, an expired certificate
/// included), if it has TLS.
fn tls_source(
    spec: Option<tls::TlsSpec>,
    metrics: &TlsMetrics,
    clock: &Arc<dyn Clock>,
) -> Result<Option<Arc<TlsSource>>, TlsError> {
    spec.map(|spec| TlsSource::load(spec, metrics.clone(), clock.clone()).map(Arc::new))
        .transpose()
}

/// Resolves when `stop` turns true.
async fn stopped(mut stop: watch::Receiver<bool>) {
    let _ = stop.wait_for(|s| *s).await;
}

/// Loads the rules and starts serving. Fails if the rules are invalid or a port is taken.
pub async fn start(settings: &ServeSettings, clock: Arc<dyn Clock>) -> Result<Server, StartError> {
    let metrics = Arc::new(Metrics::new(settings.detailed_metrics_cap));
    register_process_metrics(&metrics);
    // The one place a backend is chosen: everything after runs on it, statically dispatched.
    match settings.store.backend {
        BackendType::Memory => {
            metrics.store.store_up.set(1);
            let backend = MemoryBackend::new(settings.max_keys);
            start_on(settings, clock, metrics, backend, None).await
        }
        BackendType::Redis => {
            let config = settings.store.redis_config()?;
            let mode = settings.store.redis_failure_mode;
            let described = (config.describe(), config.prefix().to_owned());
            let guard = GuardSettings {
                mode,
                local_max_keys: settings.max_keys,
                local_cache_bytes: settings.store.local_cache_size_in_bytes,
                local_share: settings.store.redis_failure_local_share,
            };
            let backend =
                Guarded::start(RedisConnect::new(config), guard, metrics.store.clone()).await?;
            tracing::info!(redis = %described.0, prefix = %described.1, failure_mode = mode.name(), "counters in Redis");
            // RLQS buckets are shared with the other instances through the same connections.
            let exchange: Arc<dyn rlqs::Exchange> = Arc::new(rlqs::RedisExchange {
                store: backend.clone(),
            });
            start_on(settings, clock, metrics, backend, Some(exchange)).await
        }
    }
}

/// The standard process metrics (`process_resident_memory_bytes`, `process_cpu_seconds_total`,
/// `process_open_fds`, `process_max_fds`, `process_start_time_seconds`, …), read from /proc at
/// scrape time. Linux only; elsewhere there are none.
fn register_process_metrics(metrics: &Metrics) {
    #[cfg(target_os = "linux")]
    {
        let collector = prometheus::process_collector::ProcessCollector::for_self();
        if let Err(e) = metrics.registry().register(Box::new(collector)) {
            tracing::warn!(error = %e, "process metrics are not exported");
        }
    }
    #[cfg(not(target_os = "linux"))]
    let _ = metrics;
}

/// Starts serving on `backend`; RLQS buckets are shared through `exchange` when there is one.
async fn start_on<B: Backend>(
    settings: &ServeSettings,
    clock: Arc<dyn Clock>,
    metrics: Arc<Metrics>,
    backend: B,
    exchange: Option<Arc<dyn rlqs::Exchange>>,
) -> Result<Server, StartError> {
    let store = Store::new(backend);
    metrics.read_store_stats(store.clone());
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
    let reloader = rules_reloader(settings, engine.clone(), &metrics, &status, &clock);
    let xds = settings.xds.config().map_err(StartError::Xds)?;
    if let Some(xds) = &xds {
        xds.check().map_err(StartError::Xds)?;
    }
    let summary = match &xds {
        None => load_first_rules(settings, &reloader)?,
        Some(xds) => xds_first_rules(settings, xds, &status),
    };
    let recorder = recorder(settings, &engine, &metrics)?;
    let mapper = metrics_mapper(settings)?;
    let tls_metrics = TlsMetrics::register(metrics.registry());
    let grpc_tls = tls_source(settings.tls.grpc()?, &tls_metrics, &clock)?;
    let admin_tls = tls_source(settings.tls.admin()?, &tls_metrics, &clock)?;
    let listeners = Listeners::bind(settings).await?;
    let (grpc_addr, http_addr, debug_addr) = listeners.addrs();
    let metrics_addr = listeners.metrics.as_ref().map(|(_, a)| *a);
    let tracing = start_tracing(settings)?;
    let (shutdown, shutdown_rx) = watch::channel(false);
    let watcher = match xds {
        None => Some(reload::spawn_watcher(
            reloader.clone(),
            shutdown_rx.clone(),
        )?),
        Some(_) => None,
    };
    let mut tasks = Tasks {
        caps: connection_caps(&settings.transport, settings.grpc_uds.is_some()),
        client_cap: settings
            .transport
            .max_connections_per_client
            .map(|n| n as usize),
        refused: net::refusal_counters(metrics.registry()),
        timeouts: settings.transport.timeouts(),
        shutdown: shutdown_rx,
        handles: Vec::new(),
    };
    tasks.watch_tls_files(settings, [&grpc_tls, &admin_tls]);
    let (health, health_service) = HealthReporter::new();
    if status.is_awaiting_rules() {
        health.set(ServingStatus::NotServing);
    }
    if let Some(config) = xds {
        let client = XdsClient {
            config,
            reloader: reloader.clone(),
            status: status.clone(),
            health: health.clone(),
            metrics: XdsMetrics::register(metrics.registry()),
        };
        tasks.handles.push(client.spawn(tasks.shutdown.clone()));
    }
    let front = Arc::new(FrontDoor::new(
        engine.clone(),
        tracing.clone(),
        recorder.clone(),
    ));
    let grpc_service = RateLimitGrpc::new(front.clone(), settings.transport.call_limits());
    let quotas = settings
        .rlqs_enabled
        .then(|| rlqs::table(engine.clone(), metrics.registry()));
    let grpc_router = grpc_server(settings)
        .add_service(health_service)
        .add_service(grpc_service)
        .add_optional_service(
            quotas
                .clone()
                .map(|table| rlqs::QuotaService::server(table, tasks.shutdown.clone())),
        );
    if let Some(table) = &quotas {
        tasks.spawn(rlqs::tick(table.clone(), tasks.shutdown.clone()));
        if let Some(exchange) = exchange {
            tasks.spawn(rlqs::coordinate(
                table.clone(),
                exchange,
                tasks.shutdown.clone(),
            ));
        }
    }
    if let Some(path) = &settings.grpc_uds {
        tasks.serve_grpc_on_unix_socket(path, grpc_router.clone())?;
    }
    let admin = Arc::new(Admin {
        engine: engine.clone(),
        front,
        metrics: metrics.clone(),
        status: status.clone(),
        healthy_needs_a_domain: settings.healthy_with_at_least_one_config_loaded,
        quotas: quotas.map(|table| table as Arc<dyn crate::quota::BucketLookup>),
        mapper,
        renders: Default::default(),
    });
    if let Some(listener) = listeners.debug {
        tasks.serve_debug(settings, listener, http::debug_router(admin.clone()));
    }
    if let Some(listener) = listeners.metrics {
        let router = http::metrics_router(admin.clone(), &settings.metrics_path);
        tracing::info!(addr = %listener.1, path = %settings.metrics_path, "metrics also served alone");
        tasks.serve_debug(settings, listener, router);
    }
    tasks.serve_grpc(listeners.grpc, grpc_router, grpc_tls);
    tasks.serve_admin(settings, listeners.http, http::router(admin), admin_tls);
    tasks.spawn(sweep(store, clock, tasks.shutdown.clone()));
    if settings.statsd.use_statsd {
        let sender =
            crate::statsd::spawn(&settings.statsd, metrics.clone(), tasks.shutdown.clone());
        tasks.handles.push(sender);
    }
    tasks.handles.extend(watcher);
    tracing::info!(%grpc_addr, %http_addr, ?debug_addr, rules = %summary, "serving");
    Ok(Server {
        grpc_addr,
        http_addr,
        debug_addr,
        metrics_addr,
        metrics,
        reloader,
        status,
        health,
        shutdown,
        tasks: tasks.handles,
        drain_timeout: settings.drain_timeout,
        shutdown_delay: settings.shutdown_delay,
        tracing,
        recorder,
    })
}

/// The `--record` writer, when asked for: the file is opened now (an error stops the start).
fn recorder<B: Backend>(
    settings: &ServeSettings,
    engine: &Arc<Engine<B>>,
    metrics: &Metrics,
) -> Result<Option<Arc<Recorder>>, StartError> {
    let Some(config) = settings.record.config()? else {
        return Ok(None);
    };
    catch_file_size_signal();
    let live = engine.clone();
    let policy: LivePolicy = Arc::new(move || live.policy());
    let file = config.file.clone();
    let recorder =
        Recorder::start(config.clone(), policy, metrics.registry()).map_err(|source| {
            StartError::Record {
                path: file.path.display().to_string(),
                source,
            }
        })?;
    tracing::info!(
        path = %file.path.display(),
        max_bytes = file.max_bytes,
        max_files = file.max_files,
        sample = config.sample,
        hash_values = config.hash_key.is_some(),
        queue = config.queue,
        "recording decisions as JSON lines; a full queue or a failed write drops lines and \
         counts them, never slowing an answer"
    );
    Ok(Some(Arc::new(recorder)))
}

/// SIGXFSZ's default action ends the process when a write passes the file size limit
/// (`ulimit -f`, RLIMIT_FSIZE); caught, the write fails with EFBIG instead, which the recorder
/// handles as it handles a full disk. The handler, once installed, stays for the process's life.
fn catch_file_size_signal() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        if let Err(e) = signal(SignalKind::from_raw(libc::SIGXFSZ)) {
            tracing::warn!(error = %e, "cannot catch SIGXFSZ: a file size limit would end the server");
        }
    }
}

/// The reloader of the rules directory, which installs each valid rule set into `engine`.
fn rules_reloader(
    settings: &ServeSettings,
    engine: Arc<dyn Rules>,
    metrics: &Arc<Metrics>,
    status: &Arc<ServerStatus>,
    clock: &Arc<dyn Clock>,
) -> Arc<Reloader> {
    let reloader = Reloader::new(
        settings.config.clone(),
        settings.rules_files.caps(),
        engine,
        metrics.clone(),
        status.clone(),
        clock.clone(),
    );
    Arc::new(reloader.with_merged_domains(settings.rules_files.merge_domain_config))
}

/// Loads the rules directory for the first time and returns the summary to log. Invalid rules
/// stop the start, unless `FORCE_START_WITHOUT_INITIAL_CONFIG` says to serve with none.
/// `PROMETHEUS_MAPPER_YAML`, read once. A file that is not there serves our names, with a warning
/// (Envoy Gateway mounts its mapping from an optional ConfigMap); one that cannot be read or
/// parsed stops start-up.
fn metrics_mapper(settings: &ServeSettings) -> Result<Option<Arc<Mapper>>, StartError> {
    let Some(path) = &settings.prometheus_mapper_yaml else {
        return Ok(None);
    };
    let error = |error: String| StartError::Mapper {
        path: path.display().to_string(),
        error,
    };
    let bytes = match rules_dir::read_file_capped(path, MAX_MAPPER_BYTES) {
        Ok(bytes) => bytes,
        Err(CappedReadError::Io(e)) if e.kind() == std::io::ErrorKind::NotFound => {
            tracing::warn!(
                file = %path.display(),
                "PROMETHEUS_MAPPER_YAML names no file: the metrics keep our names (the \
                 reference's default mapping's, with `rule`, `key1` and `key2` labels)"
            );
            return Ok(None);
        }
        Err(e) => return Err(error(e.to_string())),
    };
    let text = String::from_utf8(bytes).map_err(|e| error(format!("not UTF-8: {e}")))?;
    let mapper = Mapper::parse(&text).map_err(error)?;
    tracing::info!(
        file = %path.display(),
        ignored = ?mapper.ignored(),
        "the reference's stats are named by the statsd-exporter mapping (what it says of timers \
         and histograms is not used: only counters are mapped)"
    );
    Ok(Some(Arc::new(mapper)))
}

fn load_first_rules(settings: &ServeSettings, reloader: &Reloader) -> Result<String, StartError> {
    match reloader.reload() {
        Ok(loaded) => Ok(loaded.summary),
        // The reference's FORCE_START_WITHOUT_INITIAL_CONFIG: serve with no rules (the error is
        // logged, counted and on /rlconfig) until a reload brings valid ones.
        Err(errors) if settings.force_start_without_initial_config => {
            tracing::error!(
                dir = %settings.config.display(),
                "invalid rules; starting with none in force (FORCE_START_WITHOUT_INITIAL_CONFIG):\n{errors}"
            );
            Ok("no rules in force (the rules are invalid)".to_owned())
        }
        Err(errors) => Err(StartError::Rules {
            dir: settings.config.display().to_string(),
            errors,
        }),
    }
}

/// With rules from xDS: nothing is read now (the client task subscribes once the listeners are
/// up); without `FORCE_START_WITHOUT_INITIAL_CONFIG`, health fails until the first valid
/// response. Returns the summary to log.
fn xds_first_rules(settings: &ServeSettings, xds: &XdsConfig, status: &ServerStatus) -> String {
    status.set_last_load(LoadReport {
        summary: format!(
            "waiting for the first response of the xDS server {}",
            xds.authority
        ),
        source: "xds".into(),
        ..LoadReport::default()
    });
    if settings.force_start_without_initial_config {
        format!(
            "none yet: from the xDS server {} (serving before the first response: \
             FORCE_START_WITHOUT_INITIAL_CONFIG)",
            xds.authority
        )
    } else {
        status.set_awaiting_rules(true);
        format!(
            "none yet: from the xDS server {} (health NOT_SERVING until the first valid response)",
            xds.authority
        )
    }
}

/// The TCP listeners, bound (so a taken port fails the start before anything is spawned).
struct Listeners {
    grpc: (TcpListener, SocketAddr),
    http: (TcpListener, SocketAddr),
    debug: Option<(TcpListener, SocketAddr)>,
    metrics: Option<(TcpListener, SocketAddr)>,
}

impl Listeners {
    async fn bind(settings: &ServeSettings) -> Result<Listeners, StartError> {
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
    fn addrs(&self) -> (SocketAddr, SocketAddr, Option<SocketAddr>) {
        (
            self.grpc.1,
            self.http.1,
            self.debug.as_ref().map(|(_, a)| *a),
        )
    }
}

/// OpenTelemetry tracing, started if the settings configure it.
fn start_tracing(settings: &ServeSettings) -> Result<Option<Tracing>, StartError> {
    let Some(config) = settings.tracing.config()? else {
        return Ok(None);
    };
    let tracing = Tracing::start(&config)?;
    tracing::info!(
        endpoint = %crate::redact::credentials(&config.endpoint),
        service_name = %config.service_name,
        sampling_rate = config.sampling_rate,
        record_values = config.record_values,
        "OpenTelemetry tracing on: a span per ShouldRateLimit over OTLP/gRPC"
    );
    Ok(Some(tracing))
}

/// The gRPC server with the transport settings applied (keepalive, stream cap, connection age),
/// before any service is added.
fn grpc_server(settings: &ServeSettings) -> tonic::transport::Server {
    let t = &settings.transport;
    let mut builder = tonic::transport::Server::builder();
    if let Some(age) = settings.grpc_max_connection_age {
        builder = builder
            .max_connection_age(age)
            .max_connection_age_grace(settings.grpc_max_connection_age_grace);
    }
    builder
        .http2_keepalive_interval(Some(t.grpc_keepalive_interval))
        .http2_keepalive_timeout(Some(t.grpc_keepalive_timeout))
        .max_concurrent_streams(Some(t.grpc_max_concurrent_streams))
}

/// The server's background tasks as they are spawned, with what the listeners among them share:
/// connection caps, silence timeouts and the shutdown signal.
struct Tasks {
    caps: ConnectionCaps,
    /// `MAX_CONNECTIONS_PER_CLIENT`; `None`: each listener's default share.
    client_cap: Option<usize>,
    refused: prometheus::IntCounterVec,
    timeouts: Timeouts,
    shutdown: watch::Receiver<bool>,
    handles: Vec<JoinHandle<()>>,
}

impl Tasks {
    /// The acceptor of one listener: its cap, the per-client cap, the timeouts.
    fn acceptor<L: Listener>(&self, listener: L, cap: usize, name: &'static str) -> Acceptor<L> {
        let acceptor = Acceptor::new(listener, cap, self.timeouts, name)
            .with_refusal_counter(self.refused.with_label_values(&[name]));
        match self.client_cap {
            Some(per_client) => acceptor.with_client_cap(per_client),
            None => acceptor,
        }
    }

    fn spawn(&mut self, task: impl Future<Output = ()> + Send + 'static) {
        self.handles.push(tokio::spawn(task));
    }

    /// Resolves when shutdown is asked for.
    fn stopped(&self) -> impl Future<Output = ()> + Send + 'static {
        stopped(self.shutdown.clone())
    }

    /// Polls each listener's certificate files and swaps in what changed.
    fn watch_tls_files<'a>(
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
    fn serve_grpc_on_unix_socket(
        &mut self,
        path: &std::path::Path,
        router: Router,
    ) -> Result<(), StartError> {
        let _ = std::fs::remove_file(path);
        let listener =
            tokio::net::UnixListener::bind(path).map_err(|source| StartError::BindUnix {
                path: path.display().to_string(),
                source,
            })?;
        let stop = self.stopped();
        let acceptor = self.acceptor(listener, self.caps.uds, "gRPC (Unix socket)");
        tracing::info!(
            path = %path.display(),
            max_connections = self.caps.uds,
            "gRPC also on a Unix socket"
        );
        self.spawn(async move {
            let incoming = acceptor.into_stream();
            if let Err(e) = router.serve_with_incoming_shutdown(incoming, stop).await {
                tracing::error!(error = %e, "gRPC server on the Unix socket failed");
            }
        });
        Ok(())
    }

    /// Serves gRPC on its TCP listener, through TLS if it has it.
    fn serve_grpc(
        &mut self,
        (listener, _): (TcpListener, SocketAddr),
        router: Router,
        tls: Option<Arc<TlsSource>>,
    ) {
        let acceptor = self.acceptor(listener, self.caps.grpc, "gRPC");
        let stop = self.stopped();
        self.spawn(async move {
            let result = router
                .serve_with_incoming_shutdown(tls::incoming(acceptor, tls), stop)
                .await;
            if let Err(e) = result {
                tracing::error!(error = %e, "gRPC server failed");
            }
        });
    }

    /// Serves the admin HTTP routes, through TLS if the admin listener has it.
    fn serve_admin(
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
    fn serve_debug(
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

/// Drops idle keys from memory every [`SWEEP_INTERVAL`] until `stop` turns true.
async fn sweep<B: Backend>(
    store: Store<B>,
    clock: Arc<dyn Clock>,
    mut stop: watch::Receiver<bool>,
) {
    let mut tick = tokio::time::interval(SWEEP_INTERVAL);
    loop {
        tokio::select! {
            _ = tick.tick() => { store.sweep(clock.now()); }
            _ = stop.wait_for(|s| *s) => break,
        }
    }
}

/// Which signal asked the server to stop.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Signal {
    /// SIGTERM (an orchestrator): keep serving for `SHUTDOWN_DELAY` with health NOT_SERVING.
    Terminate,
    /// SIGINT (Ctrl-C at a terminal): stop without the delay.
    Interrupt,
}

/// Runs until SIGTERM or SIGINT, then shuts down gracefully.
pub async fn run(settings: &ServeSettings, clock: Arc<dyn Clock>) -> Result<(), StartError> {
    let server = start(settings, clock).await?;
    let signal = wait_for_signal().await;
    let delay = match signal {
        Signal::Terminate => settings.shutdown_delay,
        Signal::Interrupt => Duration::ZERO,
    };
    tracing::info!(
        ?signal,
        "shutting down: health NOT_SERVING, then draining in-flight requests"
    );
    server.shutdown_after(delay).await;
    Ok(())
}

async fn wait_for_signal() -> Signal {
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
        _ = ctrl_c => Signal::Interrupt,
        _ = term => Signal::Terminate,
    }
}
