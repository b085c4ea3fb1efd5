//! The wiring: load the rules (from files, or subscribe to them over xDS), build the store and
//! engine, start the gRPC and HTTP servers and the background tasks; [`start`] is the one place a
//! backend is chosen.

mod error;
mod grpc_routes;
mod listeners;
mod reporting;
mod rules;
mod running;

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use tonic_health::pb::health_check_response::ServingStatus;

use crate::front::FrontDoor;
use crate::health::{HealthReporter, HealthService};
use crate::http::{self, Admin};
use crate::reload;
use crate::rlqs;
use crate::service::RateLimitGrpc;
use crate::settings::{BackendType, ServeSettings};
use crate::status::{LoadReport, ServerStatus};
use crate::xds::{XdsClient, XdsConfig, XdsMetrics};
use ratelimit_core::clock::Clock;
use ratelimit_core::engine::Engine;
use ratelimit_core::metrics::Metrics;
use ratelimit_core::policy::Policy;
use ratelimit_core::quota::BucketLookup;
use ratelimit_core::store::memory::MemoryBackend;
use ratelimit_core::store::{Backend, Store};
use ratelimit_redis::{RedisBackend, RedisConnect};
use ratelimit_remote::{GuardSettings, Guarded, RemoteMetrics};
use tonic_health::pb::health_server::HealthServer;

pub use error::StartError;
pub use running::{Server, run};

use grpc_routes::GrpcRoutes;
use listeners::{ListenerTls, Listeners, Tasks, http2_settings};
use reporting::{metrics_mapper, recorder, register_process_metrics, start_tracing};
use rules::{first_rules, rules_reloader};

/// How often idle keys are dropped from memory.
const SWEEP_INTERVAL: Duration = Duration::from_secs(5);

/// Loads the rules and starts serving. Fails if the rules are invalid or a port is taken.
pub async fn start(settings: &ServeSettings, clock: Arc<dyn Clock>) -> Result<Server, StartError> {
    let metrics = Arc::new(Metrics::new(settings.detailed_metrics_cap));
    register_process_metrics(&metrics);
    // The remote store's series are exported whatever the backend (zeros with memory).
    let store_metrics = RemoteMetrics::unregistered(<RedisBackend as Backend>::NAME);
    store_metrics.register(metrics.registry());
    // The one place a backend is chosen: everything after runs on it, statically dispatched.
    match settings.store.backend {
        BackendType::Memory => {
            store_metrics.store_up.set(1);
            let backend = MemoryBackend::new(settings.max_keys);
            start_on(settings, clock, metrics, backend, None, None).await
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
            // Boxed: connecting is a deep future; inlined into start's callers it passed the
            // compiler's type-layout depth in the test binary.
            let backend = Box::pin(Guarded::start(
                RedisConnect::new(config),
                guard,
                store_metrics,
            ))
            .await?;
            tracing::info!(redis = %described.0, prefix = %described.1, failure_mode = mode.name(), "counters in Redis");
            // RLQS buckets are shared with the other instances through the same connections.
            let exchange: Arc<dyn rlqs::Exchange> = Arc::new(rlqs::RedisExchange {
                store: backend.clone(),
            });
            // The quota API's overrides and counter walks, through the same connections.
            let shared: Arc<dyn http::Shared> = Arc::new(http::RedisShared {
                store: backend.clone(),
            });
            start_on(
                settings,
                clock,
                metrics,
                backend,
                Some(exchange),
                Some(shared),
            )
            .await
        }
    }
}

/// Starts serving on `backend`; RLQS buckets are shared through `exchange` when there is one,
/// the quota API's overrides and counter walks through `shared`.
async fn start_on<B: Backend>(
    settings: &ServeSettings,
    clock: Arc<dyn Clock>,
    metrics: Arc<Metrics>,
    backend: B,
    exchange: Option<Arc<dyn rlqs::Exchange>>,
    shared: Option<Arc<dyn http::Shared>>,
) -> Result<Server, StartError> {
    let store = Store::new(backend);
    let token = admin_token(settings)?;
    // A store with readable keys lists them itself; the memory store's are hashes.
    let names = (token.is_some() && shared.is_none()).then_some(settings.max_keys);
    let engine = engine_on(settings, &store, &clock, &metrics, names);
    let status = Arc::new(ServerStatus::new(LoadReport::default()));
    let reloader = rules_reloader(settings, engine.clone(), &metrics, &status, &clock);
    let (xds, summary) = first_rules(settings, &reloader, &status)?;
    let recorder = recorder(settings, &engine, &metrics)?;
    let mapper = metrics_mapper(settings)?;
    let tls = ListenerTls::load(settings, &metrics, &clock)?;
    let listeners = Listeners::bind(settings).await?;
    let (grpc_addr, http_addr, debug_addr) = listeners.addrs();
    let metrics_addr = listeners.metrics_addr();
    let tracing = start_tracing(settings, &metrics)?;
    let (shutdown, shutdown_rx) = watch::channel(false);
    let watcher = match xds {
        None => Some(reload::spawn_watcher(
            reloader.clone(),
            shutdown_rx.clone(),
        )?),
        Some(_) => None,
    };
    let mut tasks = Tasks::new(settings, &metrics, shutdown_rx);
    tasks.watch_tls_files(settings, [&tls.grpc, &tls.admin]);
    let (health, health_service) = HealthReporter::new();
    if status.is_awaiting_rules() {
        health.set(ServingStatus::NotServing);
    }
    if let Some(config) = xds {
        spawn_xds_client(&mut tasks, config, &reloader, &status, &health, &metrics);
    }
    let front = Arc::new(FrontDoor::new(
        engine.clone(),
        tracing.clone(),
        recorder.clone(),
    ));
    let quotas = settings
        .rlqs_enabled
        .then(|| rlqs::table(engine.clone(), metrics.registry()));
    let grpc_routes = grpc_routes(settings, health_service, &front, &quotas, &tasks);
    if let Some(table) = &quotas {
        spawn_rlqs_tasks(&mut tasks, table, exchange);
    }
    let quota = token.map(|token| {
        let api = Arc::new(http::QuotaApi::new(
            engine.clone(),
            token,
            shared.clone(),
            settings.max_overrides,
            metrics.registry(),
        ));
        match &shared {
            Some(shared) => tasks.spawn(http::keep_shared_overrides(
                api.clone(),
                shared.clone(),
                tasks.shutdown.clone(),
            )),
            None => tasks.spawn(http::keep_overrides(engine.clone(), tasks.shutdown.clone())),
        }
        api
    });
    let admin = Arc::new(Admin {
        engine: engine.clone(),
        front,
        metrics: metrics.clone(),
        status: status.clone(),
        healthy_needs_a_domain: settings.healthy_with_at_least_one_config_loaded,
        quotas: quotas.map(|table| table as Arc<dyn BucketLookup>),
        mapper,
        renders: Default::default(),
        quota,
    });
    serve(&mut tasks, settings, listeners, tls, grpc_routes, admin)?;
    spawn_background(&mut tasks, settings, store, clock, &metrics);
    tasks.handles.extend(watcher);
    let workers = tokio::runtime::Handle::current().metrics().num_workers();
    tracing::info!(%grpc_addr, %http_addr, ?debug_addr, workers, rules = %summary, "serving");
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

/// The engine on `store`, with no rules yet, its metrics read from the store at scrape time;
/// with `names`, noting up to that many counter names for the quota API's lists.
fn engine_on<B: Backend>(
    settings: &ServeSettings,
    store: &Store<B>,
    clock: &Arc<dyn Clock>,
    metrics: &Arc<Metrics>,
    names: Option<usize>,
) -> Arc<Engine<B>> {
    metrics.read_store_stats(store.clone());
    let mut engine = Engine::new(
        Policy::default(),
        store.clone(),
        clock.clone(),
        settings.engine_settings(),
    );
    if let Some(cap) = names {
        engine = engine.with_counter_names(cap);
    }
    Arc::new(engine.with_metrics(metrics.clone()))
}

/// The quota API's token, from `--admin-token-file` (none: the API is off). An unreadable or
/// empty file stops the start.
fn admin_token(settings: &ServeSettings) -> Result<Option<Vec<u8>>, StartError> {
    let Some(path) = &settings.admin_token_file else {
        return Ok(None);
    };
    let fail = |error: String| StartError::AdminToken {
        path: path.display().to_string(),
        error,
    };
    let text = std::fs::read_to_string(path).map_err(|e| fail(e.to_string()))?;
    let token = text.trim();
    if token.is_empty() {
        return Err(fail("the file is empty".into()));
    }
    if token.chars().any(char::is_whitespace) {
        return Err(fail("the token holds whitespace".into()));
    }
    Ok(Some(token.as_bytes().to_vec()))
}

/// The xDS client task: subscribes, hands each response to the reloader, flips health.
fn spawn_xds_client(
    tasks: &mut Tasks,
    config: XdsConfig,
    reloader: &Arc<reload::Reloader>,
    status: &Arc<ServerStatus>,
    health: &HealthReporter,
    metrics: &Metrics,
) {
    let client = XdsClient {
        config,
        reloader: reloader.clone(),
        status: status.clone(),
        health: health.clone(),
        metrics: XdsMetrics::register(metrics.registry()),
    };
    tasks.handles.push(client.spawn(tasks.shutdown.clone()));
}

/// The gRPC services, routed by name: health, `ShouldRateLimit`, and RLQS when it is on.
fn grpc_routes<B: Backend>(
    settings: &ServeSettings,
    health: HealthServer<HealthService>,
    front: &Arc<FrontDoor<B>>,
    quotas: &Option<Arc<rlqs::Table<B>>>,
    tasks: &Tasks,
) -> GrpcRoutes<B> {
    GrpcRoutes {
        rate_limit: RateLimitGrpc::new(front.clone(), settings.transport.call_limits()),
        health,
        quota: quotas
            .clone()
            .map(|table| rlqs::QuotaService::server(table, tasks.shutdown.clone())),
    }
}

/// RLQS's ticker, and with `exchange` the demand exchange with the other instances.
fn spawn_rlqs_tasks<B: Backend>(
    tasks: &mut Tasks,
    table: &Arc<rlqs::Table<B>>,
    exchange: Option<Arc<dyn rlqs::Exchange>>,
) {
    tasks.spawn(rlqs::tick(table.clone(), tasks.shutdown.clone()));
    if let Some(exchange) = exchange {
        tasks.spawn(rlqs::coordinate(
            table.clone(),
            exchange,
            tasks.shutdown.clone(),
        ));
    }
}

/// Serves every listener: gRPC (and its Unix socket), debug, metrics-only, admin.
fn serve<B: Backend>(
    tasks: &mut Tasks,
    settings: &ServeSettings,
    listeners: Listeners,
    tls: ListenerTls,
    grpc_routes: GrpcRoutes<B>,
    admin: Arc<Admin<B>>,
) -> Result<(), StartError> {
    let http2 = http2_settings(settings);
    if let Some(path) = &settings.grpc_uds {
        tasks.serve_grpc_on_unix_socket(path, http2, grpc_routes.clone())?;
    }
    if let Some(listener) = listeners.debug {
        tasks.serve_debug(settings, listener, http::debug_router(admin.clone()));
    }
    if let Some(listener) = listeners.metrics {
        let router = http::metrics_router(admin.clone(), &settings.metrics_path);
        tracing::info!(addr = %listener.1, path = %settings.metrics_path, "metrics also served alone");
        tasks.serve_debug(settings, listener, router);
    }
    tasks.serve_grpc(listeners.grpc, http2, grpc_routes, tls.grpc);
    tasks.serve_admin(settings, listeners.http, http::router(admin), tls.admin);
    Ok(())
}

/// The tasks beside the listeners: the memory sweeper and, with `USE_STATSD`, the statsd sender.
fn spawn_background<B: Backend>(
    tasks: &mut Tasks,
    settings: &ServeSettings,
    store: Store<B>,
    clock: Arc<dyn Clock>,
    metrics: &Arc<Metrics>,
) {
    tasks.spawn(sweep(store, clock, tasks.shutdown.clone()));
    if settings.statsd.use_statsd {
        let sender =
            crate::statsd::spawn(&settings.statsd, metrics.clone(), tasks.shutdown.clone());
        tasks.handles.push(sender);
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
