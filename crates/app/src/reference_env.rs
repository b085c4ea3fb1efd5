//! envoyproxy/ratelimit's environment, for deployments that switch by changing the image: its
//! config location (`RUNTIME_ROOT/RUNTIME_SUBDIRECTORY/RUNTIME_APPDIRECTORY`) and listeners
//! (`HOST`/`PORT`, `GRPC_HOST`/`GRPC_PORT`, `DEBUG_HOST`/`DEBUG_PORT`) become our settings when ours
//! are not set (precedence: flag > our env name > the reference's), and every reference setting
//! that is set but means nothing here gets one start-up warning. Pure: reads through `lookup`.

use std::path::PathBuf;

use ratelimit_core::redact;

/// What the reference's environment asks of us.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Translation {
    /// (our env name, value) to set, for our names the environment does not set itself.
    pub set: Vec<(&'static str, String)>,
    /// One line per reference setting we do not honour as the reference does.
    pub warnings: Vec<String>,
    /// Reference settings we honour with a difference worth an info line.
    pub notes: Vec<String>,
}

/// Reference settings that are set but not supported: (name, why). Warned about unless their
/// value is empty or `false`.
const UNSUPPORTED: &[(&str, &str)] = &[
    (
        "GRPC_SERVER_TLS_CA_CERT",
        "not read, as by the reference (Envoy Gateway sets this name; the reference reads \
         GRPC_CLIENT_TLS_CACERT): clients are not asked for certificates",
    ),
    (
        "USE_DOG_STATSD",
        "statsd is sent plain (USE_STATSD), without DogStatsD tags",
    ),
    ("DISABLE_STATS", "metrics are always on"),
    ("EXTRA_TAGS", "metrics carry no extra tags"),
    ("REDIS_PERSECOND", "one Redis serves every unit"),
    ("REDIS_PERSECOND_URL", "one Redis serves every unit"),
    ("REDIS_PIPELINE_WINDOW", "pipelining is automatic"),
    ("REDIS_PIPELINE_LIMIT", "pipelining is automatic"),
    ("REDIS_POOL_ON_EMPTY_BEHAVIOR", "the pool always waits"),
    (
        "REDIS_HEALTH_CHECK_ACTIVE_CONNECTION",
        "health does not follow Redis connections",
    ),
    (
        "PROMETHEUS_RESPONSE_TIME_AS_MILLISECONDS",
        "ratelimit_service_response_time_seconds is in seconds, as its name says (the \
         reference's default)",
    ),
    (
        "REDIS_STARTUP_MAX_ELAPSED_TIME",
        "the server never gives up on Redis at start-up: it serves by REDIS_FAILURE_MODE \
         and keeps connecting (the reference exits after this long)",
    ),
    ("MEMCACHE_HOST_PORT", "no memcached backend"),
    ("MEMCACHE_SRV", "no memcached backend"),
    (
        "EXPIRATION_JITTER_MAX_SECONDS",
        "keys expire exactly when their state is empty",
    ),
];

/// Reference settings we honour, with what they mean here (logged at info when set).
const ACCEPTED: &[(&str, &str)] = &[
    (
        "RUNTIME_WATCH_ROOT",
        "every form of update is watched (edit, rename, symlink swap)",
    ),
    ("RUNTIME_IGNOREDOTFILES", "dotfiles are always ignored"),
    (
        "REDIS_STARTUP_INITIAL_INTERVAL",
        "Redis unreachable at start-up: the server serves by REDIS_FAILURE_MODE and connects \
         again in the background (from 100 ms apart, doubling to 1 s), rather than waiting",
    ),
    (
        "REDIS_STARTUP_MAX_INTERVAL",
        "Redis unreachable at start-up: the server serves by REDIS_FAILURE_MODE and connects \
         again in the background (from 100 ms apart, doubling to 1 s), rather than waiting",
    ),
    (
        "REDIS_CLUSTER_PIPELINE_PARALLELISM",
        "a cluster's nodes are sent to side by side, each connection pipelined",
    ),
    (
        "STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT",
        "denied requests are never charged",
    ),
    (
        "USE_PROMETHEUS",
        "Prometheus metrics are always on, on the HTTP port's /metrics (and alone on \
         PROMETHEUS_ADDR when set)",
    ),
];

fn host_port(
    lookup: &dyn Fn(&str) -> Option<String>,
    host: &str,
    port: &str,
    default_port: u16,
) -> Option<String> {
    // Trimmed: a value written `"8081 "` in a manifest, or read from a file with its newline,
    // is the port it says, not a reason to listen elsewhere.
    let read = |name: &str| lookup(name).map(|v| v.trim().to_owned());
    let (h, p) = (read(host), read(port));
    if h.is_none() && p.is_none() {
        return None;
    }
    let h = h
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "0.0.0.0".into());
    let p = p.unwrap_or_else(|| default_port.to_string());
    // An IPv6 literal needs brackets in a socket address.
    Some(if h.contains(':') && !h.starts_with('[') {
        format!("[{h}]:{p}")
    } else {
        format!("{h}:{p}")
    })
}

/// The reference's command name: run as `/bin/ratelimit` (Envoy Gateway's container command, the
/// reference's image), its defaults apply where ours differ.
pub(crate) const REFERENCE_COMMAND: &str = "ratelimit";

/// Whether the binary was started under the reference's command name (`argv[0]`'s file name).
pub fn invoked_as_reference(argv0: &std::ffi::OsStr) -> bool {
    std::path::Path::new(argv0)
        .file_name()
        .is_some_and(|name| name == REFERENCE_COMMAND)
}

/// Reads the reference's settings through `lookup` (an environment). `as_reference`: the binary
/// runs as the reference's command, so the reference's defaults where ours differ (statsd on).
pub fn translate(lookup: &dyn Fn(&str) -> Option<String>, as_reference: bool) -> Translation {
    let mut reading = Reading {
        lookup,
        as_reference,
        t: Translation::default(),
        bad_addresses: Vec::new(),
    };
    if as_reference && lookup("USE_STATSD").is_none() {
        // The reference sends its stats to statsd unless told not to.
        reading.set("USE_STATSD", Some("true".into()));
    }
    let from_xds = reading.rules_source();
    reading.listeners();
    reading.backend();
    reading.prometheus();
    let Reading {
        mut t,
        bad_addresses,
        ..
    } = reading;
    t.warnings.extend(bad_addresses);
    tracing_protocol(lookup, &mut t);
    unsupported(lookup, &mut t);
    accepted(lookup, from_xds, &mut t);
    t
}

/// Whether `name`, a setting of the reference's, is read here as the reference's: translated into
/// ours, or said at start-up (a note or a warning) when set. Settings of the same name as ours
/// (`REDIS_URL`, `LOG_LEVEL` …) are our own and not listed here.
pub fn reads(name: &str) -> bool {
    const TRANSLATED: &[&str] = &[
        "CONFIG_TYPE",
        "HOST",
        "PORT",
        "GRPC_HOST",
        "GRPC_PORT",
        "DEBUG_HOST",
        "DEBUG_PORT",
        "USE_PROMETHEUS",
        "PROMETHEUS_ADDR",
        "PROMETHEUS_PATH",
        "TRACING_EXPORTER_PROTOCOL",
    ];
    RUNTIME.contains(&name)
        || TRANSLATED.contains(&name)
        || UNSUPPORTED.iter().chain(ACCEPTED).any(|(n, _)| *n == name)
}

/// The reference's variables of the rules' location.
const RUNTIME: [&str; 3] = [
    "RUNTIME_ROOT",
    "RUNTIME_SUBDIRECTORY",
    "RUNTIME_APPDIRECTORY",
];

/// A translation under way: what is set so far, and addresses that cannot be listened on.
struct Reading<'a> {
    lookup: &'a dyn Fn(&str) -> Option<String>,
    /// Run as the reference's command (`/bin/ratelimit`).
    as_reference: bool,
    t: Translation,
    bad_addresses: Vec<String>,
}

impl Reading<'_> {
    /// Sets our `ours` to `value`, unless the environment sets `ours` itself.
    fn set(&mut self, ours: &'static str, value: Option<String>) {
        if let Some(v) = value
            && (self.lookup)(ours).is_none()
        {
            self.t.set.push((ours, v));
        }
    }

    /// Where the rules come from: with xDS (`CONFIG_TYPE=GRPC_XDS_SOTW`, returns true) the
    /// reference's counting; otherwise the runtime directory, when set, as `CONFIG_DIR`. Its
    /// fixed windows for rules that name no algorithm whenever the deployment is the reference's
    /// (xDS, its runtime directory, or its command).
    fn rules_source(&mut self) -> bool {
        let lookup = self.lookup;
        let runtime_set = RUNTIME.iter().any(|n| lookup(n).is_some());
        let from_xds =
            lookup("CONFIG_TYPE").is_some_and(|t| t.eq_ignore_ascii_case("GRPC_XDS_SOTW"));
        if from_xds {
            // A RateLimitConfig cannot name an algorithm: what its sender means is the reference's
            // fixed window.
            self.set("DEFAULT_ALGORITHM", Some("fixed_window".into()));
            // Its senders (Envoy Gateway, Envoy AI Gateway) charge token costs after the response,
            // expecting the reference's counting: denied hits count.
            self.set("CHARGE_DENIED_HITS", Some("true".into()));
            // Envoy Gateway sets the runtime directory and its watch settings with xDS: unused.
            if runtime_set {
                self.t.notes.push(
                    "RUNTIME_ROOT/RUNTIME_SUBDIRECTORY: not read: the rules come from xDS \
                     (CONFIG_TYPE=GRPC_XDS_SOTW)"
                        .into(),
                );
            }
        } else if (runtime_set && lookup("CONFIG_DIR").is_none()) || self.as_reference {
            // A rules file of the reference's means its fixed windows: `{unit: minute,
            // requests_per_unit: 20}` is 20 per clock minute there, where our default (a token
            // bucket) refills one every 3 s and says another time until reset.
            if lookup("DEFAULT_ALGORITHM").is_none() {
                self.t.notes.push(
                    "rules that name no algorithm count in fixed windows, as the reference's do \
                     (deployed as the reference; DEFAULT_ALGORITHM=token_bucket for this server's \
                     default)"
                        .into(),
                );
            }
            self.set("DEFAULT_ALGORITHM", Some("fixed_window".into()));
        }
        if !from_xds && runtime_set {
            let mut dir = PathBuf::from(
                lookup("RUNTIME_ROOT").unwrap_or_else(|| "/srv/runtime_data/current".into()),
            );
            dir.push(lookup("RUNTIME_SUBDIRECTORY").unwrap_or_default());
            dir.push(lookup("RUNTIME_APPDIRECTORY").unwrap_or_else(|| "config".into()));
            self.set("CONFIG_DIR", Some(dir.display().to_string()));
        }
        from_xds
    }

    /// `HOST`/`PORT`, `GRPC_HOST`/`GRPC_PORT`, `DEBUG_HOST`/`DEBUG_PORT` → our addresses.
    fn listeners(&mut self) {
        for (ours, host, port, default) in [
            ("HTTP_ADDR", "HOST", "PORT", 8080),
            ("GRPC_ADDR", "GRPC_HOST", "GRPC_PORT", 8081),
            ("DEBUG_ADDR", "DEBUG_HOST", "DEBUG_PORT", 6070),
        ] {
            match host_port(self.lookup, host, port, default) {
                // Only an IP address and port can be listened on; a shell's own HOST (a host name)
                // must not stop the server.
                Some(a) if a.parse::<std::net::SocketAddr>().is_err() => {
                    if (self.lookup)(ours).is_none() {
                        self.bad_addresses.push(format!(
                            "{host}/{port} ignored: '{a}' is not an IP address and port; set {ours}"
                        ));
                    }
                }
                addr => self.set(ours, addr),
            }
        }
    }

    /// The reference keeps counters in Redis unless told otherwise; our default is memory. A
    /// deployment that names its Redis (Envoy Gateway's does) means Redis.
    fn backend(&mut self) {
        let lookup = self.lookup;
        if lookup("REDIS_URL").is_some_and(|u| !u.is_empty()) && lookup("BACKEND_TYPE").is_none() {
            self.set("BACKEND_TYPE", Some("redis".into()));
        }
    }

    /// The reference's Prometheus sink listens on PROMETHEUS_ADDR (`:9090` form) when on.
    fn prometheus(&mut self) {
        let lookup = self.lookup;
        if !lookup("USE_PROMETHEUS").is_some_and(|v| v.eq_ignore_ascii_case("true")) {
            return;
        }
        let path = lookup("PROMETHEUS_PATH").filter(|p| !p.is_empty());
        let Some(a) = lookup("PROMETHEUS_ADDR").filter(|a| !a.is_empty()) else {
            self.set("METRICS_ADDR", Some("0.0.0.0:9090".into()));
            self.set("METRICS_PATH", path);
            return;
        };
        let addr = match a.strip_prefix(':') {
            Some(port) => format!("0.0.0.0:{port}"),
            None => a.clone(),
        };
        if addr.parse::<std::net::SocketAddr>().is_ok() {
            self.set("METRICS_ADDR", Some(addr));
            self.set("METRICS_PATH", path);
        } else if lookup("METRICS_ADDR").is_none() {
            self.bad_addresses.push(format!(
                "PROMETHEUS_ADDR ignored: '{a}' is not an IP address and port (or :port); \
                 set METRICS_ADDR"
            ));
        }
    }
}

/// The reference's own exporter switch; ours exports over OTLP/gRPC only.
fn tracing_protocol(lookup: &dyn Fn(&str) -> Option<String>, t: &mut Translation) {
    if let Some(p) = lookup("TRACING_EXPORTER_PROTOCOL")
        && !p.eq_ignore_ascii_case("grpc")
    {
        t.warnings.push(format!(
            "TRACING_EXPORTER_PROTOCOL={p} is not supported: spans are exported over OTLP/gRPC \
             only (point OTEL_EXPORTER_OTLP_ENDPOINT at the collector's gRPC port, 4317)"
        ));
    }
}

/// A warning for each [`UNSUPPORTED`] setting that is set.
fn unsupported(lookup: &dyn Fn(&str) -> Option<String>, t: &mut Translation) {
    for (name, why) in UNSUPPORTED {
        match lookup(name) {
            // Several of these are addresses that may carry a password (REDIS_PERSECOND_URL).
            // A zero duration is the reference's default ("for ever"), as empty or false is.
            Some(v) if !v.is_empty() && !v.eq_ignore_ascii_case("false") && !is_zero(&v) => {
                t.warnings.push(format!(
                    "{name}={} is not supported: {why}",
                    redact::credentials(&v)
                ))
            }
            _ => {}
        }
    }
}

/// Whether `v` is a zero duration as Go writes one (`0`, `0s`, `0ms`).
fn is_zero(v: &str) -> bool {
    let digits = v.trim().trim_end_matches(|c: char| c.is_ascii_alphabetic());
    !digits.is_empty() && digits.chars().all(|c| c == '0' || c == '.')
}

/// A note for each [`ACCEPTED`] setting that is set (those about files: not with xDS).
fn accepted(lookup: &dyn Fn(&str) -> Option<String>, from_xds: bool, t: &mut Translation) {
    for (name, what) in ACCEPTED {
        let about_files = name.starts_with("RUNTIME_");
        if let Some(v) = lookup(name)
            && !(from_xds && about_files)
        {
            t.notes.push(format!("{name}={v}: {what}"));
        }
    }
}

/// `LOG_LEVEL` in any of the reference's spellings (logrus: `DEBUG`, `warning`, `fatal`…) as a
/// tracing filter.
pub(crate) fn log_level(level: &str) -> String {
    match level.to_ascii_lowercase().as_str() {
        "warning" => "warn".into(),
        "fatal" | "panic" => "error".into(),
        other => other.into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn run(vars: &[(&str, &str)]) -> Translation {
        let env: HashMap<String, String> = vars
            .iter()
            .map(|(k, v)| ((*k).into(), (*v).into()))
            .collect();
        translate(&|name| env.get(name).cloned(), false)
    }

    #[test]
    fn as_the_reference_s_command_statsd_is_on_unless_the_environment_says() {
        assert!(invoked_as_reference("/bin/ratelimit".as_ref()));
        assert!(invoked_as_reference("ratelimit".as_ref()));
        assert!(!invoked_as_reference(
            "/usr/local/bin/ratelimit-server".as_ref()
        ));
        let env: HashMap<&str, &str> = HashMap::new();
        let t = translate(&|name| env.get(name).map(|v| v.to_string()), true);
        assert_eq!(
            t.set,
            [
                ("USE_STATSD", "true".to_owned()),
                ("DEFAULT_ALGORITHM", "fixed_window".to_owned())
            ]
        );
        let off: HashMap<&str, &str> = [("USE_STATSD", "false"), ("DEFAULT_ALGORITHM", "x")].into();
        let t = translate(&|name| off.get(name).map(|v| v.to_string()), true);
        assert!(t.set.is_empty(), "{:?}", t.set);
        let t = translate(&|name| env.get(name).map(|v| v.to_string()), false);
        assert!(t.set.is_empty(), "{:?}", t.set);
    }

    #[test]
    fn a_reference_deployment_becomes_our_settings() {
        let t = run(&[
            ("RUNTIME_ROOT", "/data"),
            ("RUNTIME_SUBDIRECTORY", "ratelimit"),
            ("RUNTIME_WATCH_ROOT", "false"),
            ("PORT", "9080"),
            ("GRPC_PORT", "9081"),
            ("DEBUG_PORT", "9070"),
            ("USE_STATSD", "false"),
        ]);
        assert_eq!(
            t.set,
            [
                ("DEFAULT_ALGORITHM", "fixed_window".to_owned()),
                ("CONFIG_DIR", "/data/ratelimit/config".to_owned()),
                ("HTTP_ADDR", "0.0.0.0:9080".to_owned()),
                ("GRPC_ADDR", "0.0.0.0:9081".to_owned()),
                ("DEBUG_ADDR", "0.0.0.0:9070".to_owned()),
            ]
        );
        assert!(t.warnings.is_empty(), "{:?}", t.warnings);
        // RUNTIME_WATCH_ROOT's, and the fixed windows'.
        assert_eq!(t.notes.len(), 2, "{:?}", t.notes);
    }

    #[test]
    fn our_names_win_and_hosts_and_app_directory_are_read() {
        let t = run(&[
            ("CONFIG_DIR", "/mine"),
            ("RUNTIME_ROOT", "/data"),
            ("GRPC_HOST", "::1"),
            ("HOST", "127.0.0.1"),
            ("HTTP_ADDR", "127.0.0.1:1"),
        ]);
        assert_eq!(t.set, [("GRPC_ADDR", "[::1]:8081".to_owned())]);
        let t = run(&[
            ("RUNTIME_SUBDIRECTORY", "rl"),
            ("RUNTIME_APPDIRECTORY", "rules"),
        ]);
        assert_eq!(
            t.set,
            [
                ("DEFAULT_ALGORITHM", "fixed_window".to_owned()),
                (
                    "CONFIG_DIR",
                    "/srv/runtime_data/current/rl/rules".to_owned()
                )
            ]
        );
    }

    /// The reference's rules files mean its fixed windows; a switched deployment (its runtime
    /// directory, or its command) counts in them unless it names an algorithm. Found running the
    /// reference's own integration scenarios: a day limit's `duration_until_reset` grew between
    /// two hits (a token bucket's time to full) where the reference's shrinks, and the local
    /// over-limit cache (fixed windows only) never answered.
    #[test]
    fn the_reference_s_deployment_counts_in_its_fixed_windows() {
        let fixed = ("DEFAULT_ALGORITHM", "fixed_window".to_owned());
        assert!(run(&[("RUNTIME_ROOT", "/data")]).set.contains(&fixed));
        let named = run(&[
            ("RUNTIME_ROOT", "/data"),
            ("DEFAULT_ALGORITHM", "token_bucket"),
        ]);
        assert!(!named.set.iter().any(|(n, _)| *n == "DEFAULT_ALGORITHM"));
        // Our own settings: our default.
        assert!(run(&[("CONFIG_DIR", "/rules")]).set.is_empty());
        assert!(
            !run(&[("CONFIG_DIR", "/rules"), ("RUNTIME_ROOT", "/data")])
                .set
                .contains(&fixed)
        );
    }

    #[test]
    fn the_reference_s_newer_redis_settings_are_said() {
        let t = run(&[
            ("REDIS_STARTUP_MAX_ELAPSED_TIME", "0"),
            ("PROMETHEUS_RESPONSE_TIME_AS_MILLISECONDS", "false"),
        ]);
        assert!(
            t.warnings.is_empty(),
            "defaults are quiet: {:?}",
            t.warnings
        );
        let t = run(&[
            ("REDIS_STARTUP_MAX_ELAPSED_TIME", "30s"),
            ("PROMETHEUS_RESPONSE_TIME_AS_MILLISECONDS", "true"),
            ("REDIS_STARTUP_INITIAL_INTERVAL", "2s"),
        ]);
        assert_eq!(t.warnings.len(), 2, "{:?}", t.warnings);
        assert!(t.warnings[1].starts_with(
            "REDIS_STARTUP_MAX_ELAPSED_TIME=30s is not supported: the server never gives up"
        ));
        assert_eq!(t.notes.len(), 1);
        assert!(is_zero("0s") && is_zero("0") && is_zero("0.0ms") && !is_zero("10s"));
    }

    #[test]
    fn a_host_name_in_host_is_ignored_with_a_warning() {
        let t = run(&[("HOST", "myhost.local")]);
        assert!(t.set.is_empty());
        assert_eq!(
            t.warnings,
            ["HOST/PORT ignored: 'myhost.local:8080' is not an IP address and port; set HTTP_ADDR"]
        );
    }

    #[test]
    fn a_port_or_host_with_spaces_around_it_is_the_one_it_says() {
        let t = run(&[("GRPC_PORT", "18107 "), ("HOST", " 127.0.0.1\n")]);
        assert!(t.warnings.is_empty(), "{:?}", t.warnings);
        assert!(t.set.contains(&("GRPC_ADDR", "0.0.0.0:18107".to_owned())));
        assert!(t.set.contains(&("HTTP_ADDR", "127.0.0.1:8080".to_owned())));
    }

    #[test]
    fn each_set_unsupported_setting_gets_one_warning() {
        let t = run(&[
            ("USE_DOG_STATSD", "true"),
            ("MEMCACHE_HOST_PORT", "m:11211"),
            ("TRACING_ENABLED", "true"),
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c:4317"),
            ("TRACING_EXPORTER_PROTOCOL", "http"),
        ]);
        assert_eq!(
            t.warnings,
            [
                "TRACING_EXPORTER_PROTOCOL=http is not supported: spans are exported over \
                 OTLP/gRPC only (point OTEL_EXPORTER_OTLP_ENDPOINT at the collector's gRPC port, \
                 4317)",
                "USE_DOG_STATSD=true is not supported: statsd is sent plain (USE_STATSD), \
                 without DogStatsD tags",
                "MEMCACHE_HOST_PORT=m:11211 is not supported: no memcached backend",
            ]
        );
    }

    #[test]
    fn envoy_gateway_s_environment_means_xds_rules_redis_and_one_warning_for_its_ca_name() {
        let t = run(&[
            ("CONFIG_TYPE", "GRPC_XDS_SOTW"),
            ("CONFIG_GRPC_XDS_SERVER_URL", "envoy-gateway:18001"),
            ("CONFIG_GRPC_XDS_NODE_ID", "envoy-ratelimit"),
            ("GRPC_SERVER_TLS_CA_CERT", "/certs/ca.crt"),
            ("REDIS_SOCKET_TYPE", "tcp"),
            ("REDIS_URL", "redis.redis-system.svc.cluster.local:6379"),
        ]);
        assert_eq!(
            t.set,
            [
                ("DEFAULT_ALGORITHM", "fixed_window".to_owned()),
                ("CHARGE_DENIED_HITS", "true".to_owned()),
                ("BACKEND_TYPE", "redis".to_owned())
            ]
        );
        assert_eq!(t.warnings.len(), 1, "{:?}", t.warnings);
        assert!(
            t.warnings[0].starts_with("GRPC_SERVER_TLS_CA_CERT=/certs/ca.crt is not supported")
        );
        let t = run(&[("USE_PROMETHEUS", "true"), ("PROMETHEUS_ADDR", ":19001")]);
        assert_eq!(t.set, [("METRICS_ADDR", "0.0.0.0:19001".to_owned())]);
        let t = run(&[("USE_PROMETHEUS", "true"), ("PROMETHEUS_PATH", "/m")]);
        assert_eq!(
            t.set,
            [
                ("METRICS_ADDR", "0.0.0.0:9090".to_owned()),
                ("METRICS_PATH", "/m".to_owned())
            ]
        );
        assert!(run(&[("PROMETHEUS_ADDR", ":19001")]).set.is_empty());
        let t = run(&[("REDIS_URL", "r:6379"), ("BACKEND_TYPE", "memory")]);
        assert!(t.set.is_empty());
    }

    #[test]
    fn log_levels_in_the_reference_spellings() {
        assert_eq!(log_level("DEBUG"), "debug");
        assert_eq!(log_level("warning"), "warn");
        assert_eq!(log_level("Fatal"), "error");
        assert_eq!(log_level("info"), "info");
    }
}
