//! On Valkey 8.1 (a server with `SET … IFEQ … GET`), real server processes: the server says at
//! start-up that it found the conditional `SET`, and a one-key compare-and-set of a held key goes
//! as that plain command, one round trip and no script; instances racing on one hot key still
//! admit exactly the limit; and an older server restarted in Valkey's place (no `IFEQ`) is
//! answered by script from the first refused command on, with no error counted.

use crate::common;
use crate::redis_servers::{race_with, redis_env};

use common::metrics;
use common::process::Served;
use common::race::{fire, shared_rules};
use common::redis::RedisServer;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[cfg_attr(
    no_valkey,
    ignore = "needs valkey-server 8.1 or later (scripts/install-valkey.sh)"
)]
async fn two_instances_racing_on_valkey_admit_exactly_the_limit() {
    race_with(2, RedisServer::start_valkey, || ()).await;
}

#[tokio::test]
#[cfg_attr(
    no_valkey,
    ignore = "needs valkey-server 8.1 or later (scripts/install-valkey.sh)"
)]
async fn a_held_key_goes_as_a_conditional_set_said_at_start_up() {
    let Some(valkey) = RedisServer::start_valkey() else {
        return;
    };
    let rules = shared_rules();
    let mut server = Served::with_env(rules.path(), &redis_env(&valkey.addr()));
    let client = server.client().await;
    valkey.count_commands();
    assert_eq!(fire(client, "tb", "u".into(), 6, 1).await, 6);
    assert_eq!(
        valkey.commands_sent_with("set", "NX"),
        1,
        "the first decision expects the key absent"
    );
    assert_eq!(
        valkey.commands_sent_with("set", "IFEQ"),
        5,
        "each later one expects what the one before wrote"
    );
    assert_eq!(valkey.commands_sent(&["evalsha", "eval"]), 0, "no script");
    assert_eq!(
        server.log_lines("takes SET … IFEQ … GET"),
        1,
        "{}",
        server.log()
    );
}

#[tokio::test]
#[cfg_attr(
    no_valkey,
    ignore = "needs valkey-server 8.1 or later (scripts/install-valkey.sh)"
)]
async fn an_older_server_in_valkeys_place_is_answered_by_script() {
    let Some(mut valkey) = RedisServer::start_valkey() else {
        return;
    };
    let rules = shared_rules();
    let mut server = Served::with_env(rules.path(), &redis_env(&valkey.addr()));
    let client = server.client().await;
    assert_eq!(fire(client.clone(), "tb", "u".into(), 3, 1).await, 3);

    // Redis 7.0 on the same address, empty: the instance still expects the value it wrote.
    valkey.restart_as_redis();
    let key = "it:shared|tb=u|0.0.3600s";
    // Until the connection is made again some answers come from the failure mode; then the first
    // conditional SET is refused, sent again by script, and the key written in the new server.
    for _ in 0..200 {
        fire(client.clone(), "tb", "u".into(), 1, 1).await;
        if !valkey.keys("it:*").is_empty() {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    assert_eq!(valkey.keys("it:*"), [key], "{}", server.log());
    assert_eq!(
        server.log_lines("no longer takes SET … IFEQ"),
        1,
        "{}",
        server.log()
    );

    // From then on a held key goes by script, one round trip each, with no error counted.
    let page = metrics::scrape(&format!("{}/metrics", server.http)).await;
    let errors = metrics::labelled(&page, "ratelimit_redis_errors", "kind=\"script\"");
    valkey.count_commands();
    assert_eq!(fire(client, "tb", "u".into(), 5, 1).await, 5);
    assert_eq!(valkey.commands_sent(&["evalsha"]), 5);
    assert_eq!(valkey.commands_sent_with("set", "IFEQ"), 0);
    let page = metrics::scrape(&format!("{}/metrics", server.http)).await;
    assert_eq!(
        metrics::labelled(&page, "ratelimit_redis_errors", "kind=\"script\""),
        errors
    );
    assert_eq!(errors, 0, "the refused conditional SET is no error");
}
