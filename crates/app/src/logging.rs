//! Logging setup: `RUST_LOG` (a full filter) or `LOG_LEVEL` (default info) and
//! `LOG_FORMAT=json|text`.

use std::io::IsTerminal;

use tracing_subscriber::EnvFilter;

pub fn init() {
    let filter = std::env::var("RUST_LOG")
        .or_else(|_| {
            std::env::var("LOG_LEVEL").map(|l| level_filter(&crate::reference_env::log_level(&l)))
        })
        .ok()
        .and_then(|f| EnvFilter::try_new(f).ok())
        .unwrap_or_else(|| EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::stderr().is_terminal())
        .with_writer(std::io::stderr);
    let json = std::env::var("LOG_FORMAT").is_ok_and(|f| f.eq_ignore_ascii_case("json"));
    let _ = if json {
        builder.json().try_init()
    } else {
        builder.try_init()
    };
}

/// The filter for a `LOG_LEVEL`: `debug` and `trace` are the server's own (libraries stay at
/// `info`: HTTP/2 frame dumps are not what an operator turning on debug logs asks for); lower
/// levels apply to everything. `RUST_LOG` sets any filter.
fn level_filter(level: &str) -> String {
    match level {
        "debug" | "trace" => format!("info,ratelimit_server={level}"),
        other => other.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::level_filter;

    #[test]
    fn debug_levels_are_the_servers_own_and_lower_levels_apply_to_all() {
        assert_eq!(level_filter("debug"), "info,ratelimit_server=debug");
        assert_eq!(level_filter("trace"), "info,ratelimit_server=trace");
        assert_eq!(level_filter("warn"), "warn");
        assert_eq!(level_filter("error"), "error");
    }
}
