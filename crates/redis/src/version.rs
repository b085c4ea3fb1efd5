//! Whether the server connected to takes the commands decisions send. The compare-and-set's
//! script writes with `SET … PXAT … GET` (Redis 6.2 and later); a Redis 6.0 or 5.0, which
//! envoyproxy/ratelimit's `INCRBY` and `EXPIRE` ran on, answers `PING` and loads the script, then
//! answers every decision `ERR syntax error`: the server ran on its failure mode for good, the log
//! naming no version. Asked once connected, of a server whose `INFO server` says a Redis before
//! 6.2: the breaker's write probe runs what a decision runs (so a server saying an old version
//! that takes the commands is taken), and a syntax error is a refusal naming the version.

use std::sync::Arc;

use ratelimit_core::store::StoreError;

use crate::calls::{Calls, script_call};
use crate::cas;

/// The server's name and version as `INFO server` gives them: `Valkey 8.1.1` (Valkey also says a
/// `redis_version`, of the Redis it answers as), else `Redis 6.0.16`.
fn server_version(info: &str) -> Option<String> {
    let field = |name: &str| {
        info.lines()
            .find_map(|line| line.strip_prefix(name).map(str::trim))
    };
    field("valkey_version:")
        .map(|v| format!("Valkey {v}"))
        .or_else(|| field("redis_version:").map(|v| format!("Redis {v}")))
}

/// Whether `info` says a Redis before 6.2 (not Valkey, whose `redis_version` is 7.2).
fn before_6_2(info: &str) -> bool {
    if info.lines().any(|line| line.starts_with("valkey_version:")) {
        return false;
    }
    let Some(version) = info
        .lines()
        .find_map(|line| line.strip_prefix("redis_version:"))
    else {
        return false;
    };
    let mut parts = version.trim().split('.').map(str::parse::<u32>);
    match (parts.next(), parts.next()) {
        (Some(Ok(major)), Some(Ok(minor))) => (major, minor) < (6, 2),
        _ => false,
    }
}

/// What start-up says of a server reached as `addr` says (`RedisConfig::describe`) that answered the compare-and-set with `said`.
fn too_old(version: Option<&str>, addr: &str, said: &str) -> String {
    let server = version.unwrap_or("the Redis server (version unknown: INFO not answered)");
    format!(
        "{server} ({addr}) is too old for this server: it answers the compare-and-set \
         (`SET … PXAT … GET`, Redis 6.2 and later) with `{said}`; upgrade to Redis 7.0 or later, \
         or Valkey (envoyproxy/ratelimit's INCRBY and EXPIRE ran on older ones)"
    )
}

/// Fails with `Unavailable` (a refusal: start-up stops) if `info` (`mode::server_info`) says a
/// Redis before 6.2 and the server `calls` reach answers `probe` (`cas::write_probe`) as one
/// without the script's commands does. Any other answer, a refusal or an out-of-memory say, is
/// left to the decisions' own calls and the breaker's probes: it is not a server's version.
pub(crate) async fn check(
    calls: &Arc<Calls>,
    info: Option<&str>,
    probe: ::redis::Cmd,
    addr: &str,
) -> Result<(), StoreError> {
    if !info.is_some_and(before_6_2) {
        return Ok(());
    }
    let mut c = calls.conn();
    let refused = calls
        .quiet(async move {
            Ok(
                match script_call::<::redis::Value>(&mut c, &probe, cas::SCRIPT).await {
                    Err(e) if cas::lacks_option(&e) => Some(e.detail().unwrap_or("").to_owned()),
                    _ => None,
                },
            )
        })
        .await;
    match refused {
        Ok(Some(said)) => Err(StoreError::Unavailable(too_old(
            info.and_then(server_version).as_deref(),
            addr,
            &said,
        ))),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_version_is_valkeys_where_valkey_says_one() {
        let redis = "# Server\r\nredis_version:6.0.16\r\nredis_git_sha1:00000000\r\n";
        assert_eq!(server_version(redis).as_deref(), Some("Redis 6.0.16"));
        let valkey =
            "# Server\r\nredis_version:7.2.4\r\nserver_name:valkey\r\nvalkey_version:8.1.1\r\n";
        assert_eq!(server_version(valkey).as_deref(), Some("Valkey 8.1.1"));
        assert_eq!(server_version("# Server\r\n"), None);
    }

    #[test]
    fn only_a_redis_before_6_2_is_asked() {
        let redis = |v: &str| format!("# Server\r\nredis_version:{v}\r\nredis_mode:standalone\r\n");
        assert!(before_6_2(&redis("6.0.16")));
        assert!(before_6_2(&redis("5.0.14")));
        assert!(!before_6_2(&redis("6.2.14")));
        assert!(!before_6_2(&redis("7.0.15")));
        assert!(!before_6_2(&redis("10.0.0")));
        assert!(
            !before_6_2(&redis("unknown")),
            "a version not read is not asked"
        );
        let valkey = "redis_version:5.0.0\r\nvalkey_version:8.1.1\r\n";
        assert!(!before_6_2(valkey));
        assert!(!before_6_2("# Server\r\n"));
    }

    #[test]
    fn a_server_too_old_is_named_with_what_it_said_and_what_to_run() {
        let said = "Error running script (call to f_7a02): @user_script:12: ERR syntax error";
        let text = too_old(Some("Redis 6.0.16"), "single 127.0.0.1:6379", said);
        assert!(
            text.starts_with("Redis 6.0.16 (single 127.0.0.1:6379) is too old")
                && text.contains("ERR syntax error")
                && text.contains("Redis 7.0 or later"),
            "{text}"
        );
        assert!(too_old(None, "h:1", said).contains("version unknown"));
    }
}
