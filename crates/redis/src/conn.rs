//! Connections to Redis, by topology: a single server (a few multiplexed, self-reconnecting
//! connections, requests pipelined over them), a cluster (redis-rs' cluster connection: slot map,
//! MOVED/ASK and failovers handled by the client), or a master found through Sentinel.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

// tokio's monotonic time (it follows paused time in tests); decisions never read it.
use tokio::time::Instant;

use crate::refusal;

use arc_swap::ArcSwap;

use ::redis::aio::{ConnectionLike, ConnectionManager, ConnectionManagerConfig};
use ::redis::cluster::ClusterClientBuilder;
use ::redis::cluster_async::ClusterConnection;
use ::redis::cluster_routing::{MultipleNodeRoutingInfo, ResponsePolicy, RoutingInfo};
use ::redis::sentinel::{SentinelClient, SentinelClientBuilder, SentinelServerType};
use ::redis::{
    Client, Cmd, ConnectionAddr, ConnectionInfo, Pipeline, RedisFuture, RedisResult,
    TlsCertificates, TlsMode, Value,
};

/// TLS to Redis (`REDIS_TLS*`).
#[derive(Clone, Default)]
pub(crate) struct RedisTls {
    /// PEM bytes: CA bundle (else the system's roots), client certificate and key (mTLS).
    pub(crate) ca_cert: Option<Vec<u8>>,
    pub(crate) client_cert: Option<Vec<u8>>,
    pub(crate) client_key: Option<Vec<u8>>,
    pub(crate) skip_hostname_verification: bool,
}

impl std::fmt::Debug for RedisTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisTls")
            .field("ca_cert", &self.ca_cert.is_some())
            .field("client_cert", &self.client_cert.is_some())
            .field(
                "skip_hostname_verification",
                &self.skip_hostname_verification,
            )
            .finish()
    }
}

impl RedisTls {
    fn certificates(&self) -> TlsCertificates {
        TlsCertificates {
            client_tls: match (&self.client_cert, &self.client_key) {
                (Some(cert), Some(key)) => Some(::redis::ClientTlsConfig {
                    client_cert: cert.clone(),
                    client_key: key.clone(),
                }),
                _ => None,
            },
            root_cert: self.ca_cert.clone(),
        }
    }
}

/// Where Redis is.
#[derive(Debug, Clone)]
pub(crate) enum Topology {
    Single(ConnectionInfo),
    /// Seed nodes.
    Cluster(Vec<ConnectionInfo>),
    /// The master's name and the sentinels' addresses.
    Sentinel {
        master: String,
        sentinels: Vec<ConnectionInfo>,
    },
}

/// Everything the Redis store needs to connect (built and checked by `settings`).
#[derive(Debug, Clone)]
pub struct RedisConfig {
    pub(crate) topology: Topology,
    /// `REDIS_AUTH`: (user, password).
    pub(crate) auth: Option<(Option<String>, String)>,
    /// `REDIS_SENTINEL_AUTH`: (user, password) for the sentinels themselves.
    pub(crate) sentinel_auth: Option<(Option<String>, String)>,
    /// `REDIS_TLS`: on (with these certificates) or off. A `rediss://` URL turns it on too.
    pub(crate) tls: Option<RedisTls>,
    /// Multiplexed connections to a single server / master.
    pub(crate) pool_size: usize,
    /// Bound on every call, connecting included.
    pub(crate) timeout: Duration,
    /// `CACHE_KEY_PREFIX`.
    pub(crate) prefix: String,
}

impl RedisConfig {
    /// Where Redis is, for logs (addresses only: no credentials).
    pub fn describe(&self) -> String {
        let addrs = |infos: &[ConnectionInfo]| {
            infos
                .iter()
                .map(|i| i.addr().to_string())
                .collect::<Vec<_>>()
                .join(",")
        };
        let tls = if self.tls.is_some() { " (TLS)" } else { "" };
        match &self.topology {
            Topology::Single(info) => format!("single {}{tls}", info.addr()),
            Topology::Cluster(seeds) => format!("cluster seeded by {}{tls}", addrs(seeds)),
            Topology::Sentinel { master, sentinels } => {
                format!("master '{master}' via sentinels {}{tls}", addrs(sentinels))
            }
        }
    }

    /// The same, its keys under `prefix` (`CACHE_KEY_PREFIX`; no braces).
    pub fn with_prefix(mut self, prefix: impl Into<String>) -> RedisConfig {
        self.prefix = prefix.into();
        self
    }

    /// The prefix of every key.
    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    /// The addresses a connection starts at: the server, the cluster's seeds, or the sentinels.
    pub(crate) fn first_addrs(&self) -> Vec<&ConnectionAddr> {
        match &self.topology {
            Topology::Single(info) => vec![info.addr()],
            Topology::Cluster(infos)
            | Topology::Sentinel {
                sentinels: infos, ..
            } => infos.iter().map(ConnectionInfo::addr).collect(),
        }
    }
}

/// One connection to send a command on.
pub(super) enum Conn {
    Single(ConnectionManager),
    Cluster(ClusterConnection),
}

impl ConnectionLike for Conn {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match self {
            Conn::Single(c) => c.req_packed_command(cmd),
            Conn::Cluster(c) => c.req_packed_command(cmd),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        match self {
            Conn::Single(c) => c.req_packed_commands(pipeline, offset, count),
            Conn::Cluster(c) => c.req_packed_commands(pipeline, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Conn::Single(c) => c.get_db(),
            Conn::Cluster(c) => c.get_db(),
        }
    }
}

impl Conn {
    /// Whether Redis answers: a `PING`; on a cluster, to every master, answered once one of them
    /// answers (redis-rs's default for `PING` there is every master answering, so one dead
    /// master would make the whole cluster look down; each master's keys have their own breaker).
    pub(super) async fn ping(&mut self) -> RedisResult<()> {
        let ping = ::redis::cmd("PING");
        match self {
            Conn::Cluster(c) => {
                let anyone = RoutingInfo::MultiNode((
                    MultipleNodeRoutingInfo::AllMasters,
                    Some(ResponsePolicy::OneSucceeded),
                ));
                c.route_command(ping, anyone).await.map(drop)
            }
            Conn::Single(_) => ping.query_async::<String>(self).await.map(drop),
        }
    }
}

pub(super) enum Conns {
    Single {
        pool: Vec<ConnectionManager>,
        next: AtomicUsize,
    },
    Cluster(ClusterConnection),
    Sentinel(Box<SentinelConns>),
}

/// A master found through Sentinel, asked again when calls to it fail (a failover made it a
/// replica, or it is gone): the pool then moves to the new master.
pub(super) struct SentinelConns {
    sentinel: tokio::sync::Mutex<SentinelClient>,
    pool: ArcSwap<Vec<ConnectionManager>>,
    master: ArcSwap<String>,
    next: AtomicUsize,
    config: RedisConfig,
    /// When the sentinels were last asked (at most every [`SENTINEL_REFRESH`]).
    asked: std::sync::Mutex<Instant>,
}

/// Shortest time between two questions to the sentinels.
const SENTINEL_REFRESH: Duration = Duration::from_millis(500);
/// Shortest time between two questions after the master said it is a replica (`READONLY`): that
/// reply says the pool is on the wrong server, so the sentinels are asked again at once rather
/// than up to [`SENTINEL_REFRESH`] later (each call meanwhile would go to the failure mode).
const SENTINEL_REFRESH_READONLY: Duration = Duration::from_millis(20);

impl SentinelConns {
    /// Asks the sentinels for the master again, unless they were asked less than `spacing` ago;
    /// moves the pool if it changed.
    async fn refresh(&self, spacing: Duration) {
        {
            let mut asked = self
                .asked
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            if asked.elapsed() < spacing {
                return;
            }
            *asked = Instant::now();
        }
        let Ok(mut sentinel) = self.sentinel.try_lock() else {
            return; // another call is asking
        };
        let client = match sentinel.async_get_client().await {
            Ok(client) => client,
            Err(e) => {
                tracing::warn!(error = %e, "sentinels did not name a master");
                return;
            }
        };
        let addr = client.get_connection_info().addr().to_string();
        if *self.master.load_full() == addr {
            return;
        }
        match pool(client, &self.config).await {
            Ok(Conns::Single { pool, .. }) => {
                tracing::warn!(old = %self.master.load(), new = %addr, "Redis master moved (Sentinel)");
                self.pool.store(std::sync::Arc::new(pool));
                self.master.store(std::sync::Arc::new(addr));
            }
            Ok(_) => {}
            Err(e) => tracing::warn!(error = %e, master = %addr, "cannot reach the new master"),
        }
    }
}

/// `info` with the auth of `config` (unless the URL carried its own).
fn with_auth(info: ConnectionInfo, config: &RedisConfig) -> ConnectionInfo {
    let Some((user, password)) = &config.auth else {
        return info;
    };
    let mut redis = info.redis_settings().clone();
    if redis.password().is_none() {
        redis = redis.set_password(password);
        if let Some(user) = user {
            redis = redis.set_username(user);
        }
    }
    info.set_redis_settings(redis)
}

/// `info` with TCP_NODELAY: a decision is a small request waiting for a small answer, and Nagle
/// would hold it for the previous one's ACK.
fn with_nodelay(info: ConnectionInfo) -> ConnectionInfo {
    let tcp = info.tcp_settings().clone().set_nodelay(true);
    info.set_tcp_settings(tcp)
}

/// `info` over TLS when `config` asks for it.
fn with_tls_addr(info: ConnectionInfo, config: &RedisConfig) -> ConnectionInfo {
    match (info.addr().clone(), &config.tls) {
        (ConnectionAddr::Tcp(host, port), Some(_)) => info.set_addr(ConnectionAddr::TcpTls {
            host,
            port,
            insecure: false,
            tls_params: None,
        }),
        _ => info,
    }
}

/// A client for one server, with TLS certificates and hostname checking as configured.
fn client(info: ConnectionInfo, config: &RedisConfig) -> RedisResult<Client> {
    let info = with_nodelay(with_tls_addr(with_auth(info, config), config));
    let is_tls = matches!(info.addr(), ConnectionAddr::TcpTls { .. });
    if !is_tls {
        return Client::open(info);
    }
    let tls = config.tls.clone().unwrap_or_default();
    let client = Client::build_with_tls(info, tls.certificates())?;
    if !tls.skip_hostname_verification {
        return Ok(client);
    }
    let info = client.get_connection_info().clone();
    let mut addr = info.addr().clone();
    addr.set_danger_accept_invalid_hostnames(true);
    Client::open(info.set_addr(addr))
}

/// Round trips a new connection may take before it can carry a call: TCP's handshake, TLS's two,
/// and the client's set-up commands (authentication, client name). Each is a call bounded by
/// `REDIS_TIMEOUT`, so a connection is given that many: a Redis 25 ms away with a 100 ms timeout
/// is reached.
pub(super) const CONNECT_ROUND_TRIPS: u32 = 4;

/// The bound on setting up one connection.
pub(super) fn connect_bound(config: &RedisConfig) -> Duration {
    config.timeout * CONNECT_ROUND_TRIPS
}

/// The bound on the whole set-up (asking the sentinels, then the pool, connected side by side):
/// a safety net above the per-connection bounds.
pub(crate) fn set_up_bound(config: &RedisConfig) -> Duration {
    connect_bound(config) * 3
}

/// First wait before a dropped connection's next connection attempt fails and is tried again
/// (doubling): a cut connection is replaced in ~5 ms, not the client's default.
const RECONNECT_MIN_DELAY: Duration = Duration::from_millis(5);

/// No response timeout of redis-rs's own: every call is bounded by ours (`io::within`), which
/// takes a reply already in the socket when its timer expired beside it; redis-rs's, racing it,
/// would fail such a call whenever both expired in one wake-up (the workers busy past
/// `REDIS_TIMEOUT`) and redis-rs's was polled first. Connecting keeps its bound.
fn manager_config(config: &RedisConfig) -> ConnectionManagerConfig {
    ConnectionManagerConfig::new()
        .set_connection_timeout(Some(connect_bound(config)))
        .set_response_timeout(None)
        .set_number_of_retries(2)
        .set_min_delay(RECONNECT_MIN_DELAY)
        .set_exponent_base(2.0)
        .set_max_delay(Duration::from_secs(1))
}

/// The pool's connections, made side by side (one after the other, `REDIS_POOL_SIZE` set-ups
/// added up).
async fn pool(client: Client, config: &RedisConfig) -> RedisResult<Conns> {
    let connections = (0..config.pool_size.max(1))
        .map(|_| ConnectionManager::new_with_config(client.clone(), manager_config(config)));
    let pool = futures_util::future::try_join_all(connections).await?;
    Ok(Conns::Single {
        pool,
        next: AtomicUsize::new(0),
    })
}

impl Conns {
    pub(super) async fn connect(config: &RedisConfig) -> RedisResult<Conns> {
        match &config.topology {
            Topology::Single(info) => pool(client(info.clone(), config)?, config).await,
            Topology::Cluster(seeds) => {
                let seeds: Vec<ConnectionInfo> = seeds
                    .iter()
                    .map(|s| with_nodelay(with_tls_addr(s.clone(), config)))
                    .collect();
                let tls = seeds
                    .iter()
                    .any(|s| matches!(s.addr(), ConnectionAddr::TcpTls { .. }));
                let mut builder = ClusterClientBuilder::new(seeds)
                    .connection_timeout(connect_bound(config))
                    .response_timeout(config.timeout);
                if let Some((user, password)) = &config.auth {
                    builder = builder.password(password);
                    if let Some(user) = user {
                        builder = builder.username(user);
                    }
                }
                if tls {
                    let t = config.tls.clone().unwrap_or_default();
                    builder = builder
                        .tls(TlsMode::Secure)
                        .certs(t.certificates())
                        .danger_accept_invalid_hostnames(t.skip_hostname_verification);
                }
                let conn = builder.build()?.get_async_connection().await?;
                Ok(Conns::Cluster(conn))
            }
            Topology::Sentinel { master, sentinels } => {
                // The sentinels are spoken to as the master is: over TLS when it is (as the
                // reference does since its #1015), with their own password (`REDIS_SENTINEL_AUTH`).
                let addrs: Vec<ConnectionAddr> = sentinels
                    .iter()
                    .map(|s| with_tls_addr(s.clone(), config).addr().clone())
                    .collect();
                let mut builder =
                    SentinelClientBuilder::new(addrs, master.clone(), SentinelServerType::Master)?;
                if let Some((user, password)) = &config.auth {
                    builder = builder.set_client_to_redis_password(password);
                    if let Some(user) = user {
                        builder = builder.set_client_to_redis_username(user);
                    }
                }
                if let Some((user, password)) = &config.sentinel_auth {
                    builder = builder.set_client_to_sentinel_password(password);
                    if let Some(user) = user {
                        builder = builder.set_client_to_sentinel_username(user);
                    }
                }
                if let Some(t) = &config.tls {
                    let mode = if t.skip_hostname_verification {
                        TlsMode::Insecure
                    } else {
                        TlsMode::Secure
                    };
                    builder = builder
                        .set_client_to_redis_tls_mode(mode)
                        .set_client_to_redis_certificates(t.certificates())
                        .set_client_to_sentinel_tls_mode(mode)
                        .set_client_to_sentinel_certificates(t.certificates());
                }
                let mut sentinel = builder.build()?;
                let master_client = sentinel
                    .async_get_client()
                    .await
                    .map_err(|e| refusal::by_the_sentinels(e, config.sentinel_auth.is_some()))?;
                let master = master_client.get_connection_info().addr().to_string();
                let Conns::Single { pool, .. } = pool(master_client, config).await? else {
                    unreachable!("pool() builds a single-server pool")
                };
                Ok(Conns::Sentinel(Box::new(SentinelConns {
                    sentinel: tokio::sync::Mutex::new(sentinel),
                    pool: ArcSwap::from_pointee(pool),
                    master: ArcSwap::from_pointee(master),
                    next: AtomicUsize::new(0),
                    config: config.clone(),
                    asked: std::sync::Mutex::new(
                        Instant::now()
                            .checked_sub(SENTINEL_REFRESH)
                            .unwrap_or_else(Instant::now),
                    ),
                })))
            }
        }
    }

    /// A connection to send on (round robin over the pool).
    pub(super) fn get(&self) -> Conn {
        match self {
            Conns::Single { pool, next } => {
                let i = next.fetch_add(1, Ordering::Relaxed) % pool.len();
                Conn::Single(pool[i].clone())
            }
            Conns::Cluster(c) => Conn::Cluster(c.clone()),
            Conns::Sentinel(s) => {
                let pool = s.pool.load();
                let i = s.next.fetch_add(1, Ordering::Relaxed) % pool.len();
                Conn::Single(pool[i].clone())
            }
        }
    }

    pub(super) fn is_sentinel(&self) -> bool {
        matches!(self, Conns::Sentinel(_))
    }

    pub(super) fn is_cluster(&self) -> bool {
        matches!(self, Conns::Cluster(_))
    }

    /// The cluster connection (`None` for a single server or Sentinel).
    pub(super) fn cluster(&self) -> Option<ClusterConnection> {
        match self {
            Conns::Cluster(c) => Some(c.clone()),
            _ => None,
        }
    }

    /// With Sentinel, asks the sentinels for the master every second until `alive` fails, so a
    /// failover is followed even before a call fails.
    pub(super) async fn watch(alive: impl Fn() -> Option<std::sync::Arc<Self>>) {
        loop {
            tokio::time::sleep(Duration::from_secs(1)).await;
            let Some(conns) = alive() else { return };
            match &*conns {
                Conns::Sentinel(s) => s.refresh(SENTINEL_REFRESH).await,
                _ => return,
            }
        }
    }

    /// A call failed (`error`; None for a timeout): with Sentinel, if the master may have moved
    /// (read-only replica, connection refused or dropped, no answer), asks the sentinels again.
    pub(super) async fn failed(&self, error: Option<&::redis::RedisError>) {
        let Conns::Sentinel(s) = self else { return };
        if error.is_some_and(|e| e.code() == Some("READONLY")) {
            s.refresh(SENTINEL_REFRESH_READONLY).await;
            return;
        }
        let moved = error.is_none_or(|e| {
            e.is_io_error() || e.is_connection_refusal() || e.is_connection_dropped()
        });
        if moved {
            s.refresh(SENTINEL_REFRESH).await;
        }
    }
}
