//! The command line: `serve`, `check`, `explain` and `query`, each a thin call into the library.

mod explain;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use clap::{Parser, Subcommand};
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;

use crate::clock::SystemClock;
use crate::policy::Policy;
use crate::policy::parse_descriptor;
use crate::rules_dir::{SizeCaps, no_rules_warning, parse_rules, read_rules_dir};
use crate::settings::{DefaultsArgs, RulesFilesArgs, ServeSettings};

#[derive(Debug, Parser)]
#[command(
    name = "ratelimit-server",
    version,
    about = "An Envoy-compatible external rate-limit service"
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
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
        /// Descriptors as key=value[,key2=value2]; one argument per descriptor.
        #[arg(required = true)]
        descriptors: Vec<String>,
    },
    /// Send one ShouldRateLimit request to a running server and print the answer.
    Query {
        /// The server's gRPC address.
        #[arg(long, default_value = "http://127.0.0.1:8081")]
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
}

/// Runs a command; returns the process exit code.
pub async fn run(cli: Cli) -> i32 {
    match cli.command {
        Command::Serve(settings) => match crate::app::run(&settings, Arc::new(SystemClock)).await {
            Ok(()) => 0,
            Err(e) => {
                eprintln!("error: {e}");
                1
            }
        },
        Command::Check { dir, rules_files } => check(&dir, rules_files.caps()),
        Command::Explain {
            dir,
            domain,
            server,
            defaults,
            descriptors,
        } => {
            explain::explain(
                &dir,
                &domain,
                server.as_deref(),
                &defaults.limit_defaults(),
                &descriptors,
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
    }
}

fn check(dir: &Path, caps: SizeCaps) -> i32 {
    let loaded = read_rules_dir(dir, caps)
        .map_err(|e| crate::config::ConfigErrors(vec![e.into()]))
        .and_then(|files| {
            if files.is_empty() {
                eprintln!("warning: {}", no_rules_warning(dir));
            }
            parse_rules(files)
        });
    match loaded {
        Ok(configs) => {
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
    let mut client = match RateLimitServiceClient::connect(server.to_owned()).await {
        Ok(c) => c,
        Err(e) => {
            eprintln!("error: cannot connect to {server}: {e}");
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
                    let limit = s.current_limit.as_ref().map_or("no limit".to_owned(), |l| {
                        format!("{} per unit {}", l.requests_per_unit, l.unit)
                    });
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
                eprintln!("error: {}: {}", status.code(), status.message());
                return 1;
            }
        }
    }
    0
}
