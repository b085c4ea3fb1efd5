//! The command line: `serve`, `check`, `explain`, `query` and `replay`, each a thin call into the
//! library.

mod explain;
mod replay;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use clap::{Parser, Subcommand};
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::RateLimit;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::rate_limit::Unit;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;

use crate::clock::SystemClock;
use crate::policy::Policy;
use crate::policy::parse_descriptor;
use crate::rules_dir::{SizeCaps, load_rules_dir_saying};
use crate::settings::{DefaultsArgs, RulesFilesArgs, ServeSettings};

#[derive(Debug, Parser)]
#[command(
    name = "ratelimit-server",
    version = crate::metrics::long_version(),
    about = "An Envoy-compatible external rate-limit service"
)]
pub struct Cli {
    /// With no command, `serve` from the environment alone (as the reference's binary does).
    #[command(subcommand)]
    pub command: Option<Command>,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Serve RateLimitService over gRPC and the admin endpoints over HTTP.
    Serve(Box<ServeSettings>),
    /// Validate a rules directory; print every error; exit 1 on any.
    Check {
        /// The rules directory.
        dir: PathBuf,
        #[command(flatten)]
        rules_files: RulesFilesArgs,
    },
    /// Show which rule each descriptor matches and why, each limit's algorithm and effective
    /// rate, burst and window, and (with --server) the current state of its key on a server.
    Explain {
        /// The rules directory.
        dir: PathBuf,
        #[arg(long)]
        domain: String,
        /// A running server's admin HTTP address (e.g. http://127.0.0.1:8080): also show what
        /// its live rules match and each limit's current state there.
        #[arg(long)]
        server: Option<String>,
        #[command(flatten)]
        defaults: DefaultsArgs,
        /// Read each argument as an RLQS bucket (Envoy's rate_limit_quota filter: entries in any
        /// order): the descriptor it is read as, its rule and pool, and (with --server) each
        /// Envoy stream's share.
        #[arg(long)]
        bucket: bool,
        /// Descriptors as key=value[,key2=value2]; one argument per descriptor.
        #[arg(required = true)]
        descriptors: Vec<String>,
    },
    /// Send one ShouldRateLimit request to a running server and print the answer.
    Query {
        /// The server's gRPC address: `host:port` (as in Envoy's configs) or a URL
        /// (`http://host:port`, `https://host:port`).
        #[arg(long, default_value = "127.0.0.1:8081")]
        server: String,
        #[arg(long)]
        domain: String,
        /// Hits to add (0 means 1, as in the protocol).
        #[arg(long, default_value_t = 0)]
        hits: u32,
        /// Send the request this many times.
        #[arg(long, default_value_t = 1)]
        repeat: u32,
        /// Descriptors as key=value[,key2=value2]; one argument per descriptor.
        #[arg(required = true)]
        descriptors: Vec<String>,
    },
    /// Run recorded requests (`serve --record`, or Envoy access logs) through a rules directory
    /// on their recorded times and report per rule what those rules would have done.
    Replay(Box<replay::ReplayArgs>),
}

/// Runs a command; returns the process exit code.
pub async fn run(cli: Cli) -> i32 {
    let command = cli
        .command
        .unwrap_or_else(|| Command::Serve(Box::new(ServeSettings::from_env())));
    match command {
        Command::Serve(settings) => {
            match crate::server::run(&settings, Arc::new(SystemClock)).await {
                Ok(()) => 0,
                Err(e) => {
                    eprintln!("error: {e}");
                    1
                }
            }
        }
        Command::Check { dir, rules_files } => {
            check(&dir, rules_files.caps(), rules_files.merge_domain_config)
        }
        Command::Explain {
            dir,
            domain,
            server,
            defaults,
            bucket,
            descriptors,
        } => {
            explain::explain(
                &dir,
                &domain,
                server.as_deref(),
                &defaults.limit_defaults(),
                &descriptors,
                bucket,
            )
            .await
        }
        Command::Query {
            server,
            domain,
            hits,
            repeat,
            descriptors,
        } => query(&server, &domain, hits, repeat, &descriptors).await,
        Command::Replay(args) => replay::run(*args).await,
    }
}

fn check(dir: &Path, caps: SizeCaps, merge_domains: bool) -> i32 {
    match load_rules_dir_saying(dir, caps, merge_domains, |w| eprintln!("warning: {w}")) {
        Ok(configs) => {
            for warning in configs.iter().flat_map(|c| &c.warnings) {
                eprintln!("warning: {warning}");
            }
            let rules: usize = Policy::new(&configs)
                .domains()
                .iter()
                .map(|d| d.rules().len())
                .sum();
            println!(
                "{}: OK ({} domains, {} rules)",
                dir.display(),
                configs.len(),
                rules
            );
            0
        }
        Err(errors) => {
            for e in &errors.0 {
                println!("{e}");
            }
            eprintln!("{}: {} error(s)", dir.display(), errors.0.len());
            1
        }
    }
}

async fn query(server: &str, domain: &str, hits: u32, repeat: u32, descriptors: &[String]) -> i32 {
    let mut request = RateLimitRequest {
        domain: domain.to_owned(),
        hits_addend: hits,
        ..Default::default()
    };
    for text in descriptors {
        match parse_descriptor(text) {
            Ok(entries) => request.descriptors.push(RateLimitDescriptor {
                entries: entries
                    .into_iter()
                    .map(|(key, value)| Entry { key, value })
                    .collect(),
                ..Default::default()
            }),
            Err(e) => {
                eprintln!("error: {e}");
                return 2;
            }
        }
    }
    let endpoint = server_url(server);
    let mut client = match RateLimitServiceClient::connect(endpoint.clone()).await {
        Ok(c) => c,
        Err(e) => {
            eprintln!("error: cannot connect to {endpoint}: {}", error_chain(&e));
            return 1;
        }
    };
    for _ in 0..repeat {
        match client.should_rate_limit(request.clone()).await {
            Ok(response) => {
                let r = response.into_inner();
                let code = |c: i32| Code::try_from(c).map_or("UNKNOWN", |c| c.as_str_name());
                println!("overall: {}", code(r.overall_code));
                for (text, s) in descriptors.iter().zip(&r.statuses) {
                    let limit = s
                        .current_limit
                        .as_ref()
                        .map_or("no limit".to_owned(), describe_limit);
                    println!(
                        "  {text}: {} ({limit}), remaining {}, reset in {}s",
                        code(s.code),
                        s.limit_remaining,
                        s.duration_until_reset.as_ref().map_or(0, |d| d.seconds)
                    );
                }
                for h in &r.response_headers_to_add {
                    println!("  header {}: {}", h.key, h.value);
                }
            }
            Err(status) => {
                eprintln!(
                    "error: {}: {}",
                    status.code(),
                    error_chain(&status).trim_start_matches("status: ")
                );
                return 1;
            }
        }
    }
    0
}

/// The URL of a `--server` (gRPC or admin): `host:port` gets `http://`, a URL is kept as it is.
fn server_url(server: &str) -> String {
    if server.contains("://") {
        server.to_owned()
    } else {
        format!("http://{server}")
    }
}

/// An error and its causes, `outer: inner: …` (tonic's "transport error" alone says nothing).
fn error_chain(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(cause) = source {
        let cause_text = cause.to_string();
        if !text.ends_with(&cause_text) {
            text.push_str(": ");
            text.push_str(&cause_text);
        }
        source = cause.source();
    }
    text
}

/// A status's limit as people say it: "1000 per minute", "5 per second, name 'burst'".
fn describe_limit(l: &RateLimit) -> String {
    let unit = Unit::try_from(l.unit).map_or_else(
        |_| format!("unit {}", l.unit),
        |u| u.as_str_name().to_ascii_lowercase(),
    );
    let mut text = format!("{} per {unit}", l.requests_per_unit);
    if !l.name.is_empty() {
        text.push_str(&format!(", name '{}'", l.name));
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_port_gets_a_scheme_and_urls_are_kept() {
        assert_eq!(server_url("127.0.0.1:8081"), "http://127.0.0.1:8081");
        assert_eq!(server_url("rls.local:8081"), "http://rls.local:8081");
        assert_eq!(server_url("http://[::1]:8081"), "http://[::1]:8081");
        assert_eq!(server_url("https://rls:443"), "https://rls:443");
    }

    #[test]
    fn limits_print_unit_names() {
        let limit = |requests_per_unit, unit: Unit, name: &str| RateLimit {
            name: name.into(),
            requests_per_unit,
            unit: unit as i32,
        };
        assert_eq!(
            describe_limit(&limit(1000, Unit::Minute, "")),
            "1000 per minute"
        );
        assert_eq!(
            describe_limit(&limit(5, Unit::Second, "burst")),
            "5 per second, name 'burst'"
        );
        assert_eq!(describe_limit(&limit(1, Unit::Week, "")), "1 per week");
        let odd = RateLimit {
            unit: 42,
            ..limit(1, Unit::Day, "")
        };
        assert_eq!(describe_limit(&odd), "1 per unit 42");
    }

    #[test]
    fn error_chain_names_the_cause() {
        #[derive(Debug)]
        struct Outer(std::io::Error);
        impl std::fmt::Display for Outer {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("transport error")
            }
        }
        impl std::error::Error for Outer {
            fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
                Some(&self.0)
            }
        }
        let e = Outer(std::io::Error::other("Connection refused (os error 111)"));
        assert_eq!(
            error_chain(&e),
            "transport error: Connection refused (os error 111)"
        );
    }
}
