//! Calendar windows through the real server: a month in Berlin ends at midnight there (the
//! answer's `duration_until_reset` is the time to that boundary, on the test clock), `/explain`
//! names the window, and on Redis the key's expiry follows the calendar boundary too.

use ratelimit_server::calendar::{CalendarUnit, CalendarWindow, window};
use ratelimit_server::clock::NANOS_PER_SECOND as S;
use ratelimit_server::settings::BackendType;
use serde_json::Value;

use crate::common::redis::RedisServer;
use crate::common::{Code, request, start_now, start_with};

const RULES: &str = "
domain: billing
descriptors:
  - key: tenant
    rate_limit:
      unit: month
      requests_per_unit: 2
      algorithm: fixed_window
      calendar: {time_zone: Europe/Berlin}
";

/// 2026-01-31T22:59:00Z: 23:59 on the last day of January in Berlin.
const LAST_MINUTE_OF_JANUARY: u64 = 1_769_900_340 * S;

#[tokio::test]
async fn a_berlin_month_resets_at_midnight_there_with_the_reset_time_to_the_boundary() {
    let mut s = start_with(&[("billing.yaml", RULES)], |_| {}).await;
    s.clock.set(LAST_MINUTE_OF_JANUARY);
    let acme = [("tenant", "acme")];
    assert_eq!(s.hit("billing", &acme).await, (Code::Ok, 1));
    assert_eq!(s.hit("billing", &acme).await, (Code::Ok, 0));
    let over = s.call(request("billing", &[&acme])).await;
    assert_eq!(over.overall_code, Code::OverLimit as i32);
    let reset = over.statuses[0].duration_until_reset.as_ref().unwrap();
    assert_eq!(reset.seconds, 60, "a minute to midnight in Berlin");

    let url = s.http("/explain?domain=billing&descriptor=tenant=acme");
    let explained: Value = reqwest::get(&url).await.unwrap().json().await.unwrap();
    assert_eq!(
        explained["limits"][0]["window"],
        "calendar month in Europe/Berlin"
    );

    s.advance(60);
    let february = s.call(request("billing", &[&acme])).await;
    assert_eq!(february.overall_code, Code::Ok as i32, "February in Berlin");
    assert_eq!(february.statuses[0].limit_remaining, 1);
    // February 2026 in Berlin: 28 days, ending at 2026-02-28T23:00:00Z.
    let reset = february.statuses[0].duration_until_reset.as_ref().unwrap();
    assert_eq!(reset.seconds, 28 * 86_400);
}

#[tokio::test]
#[cfg_attr(no_redis, ignore = "needs redis-server (apt-get install redis-server)")]
async fn on_redis_the_keys_expiry_follows_the_calendar_boundary() {
    let Some(redis) = RedisServer::start() else {
        return;
    };
    let url = redis.url();
    let mut s = start_now(&[("billing.yaml", RULES)], move |settings| {
        settings.store.backend = BackendType::Redis;
        settings.store.redis_url = url;
        settings.store.cache_key_prefix = "cal:".into();
    })
    .await;
    let now = ratelimit_server::clock::Clock::now(&s.clock);
    assert_eq!(s.hit("billing", &[("tenant", "acme")]).await, (Code::Ok, 1));
    let keys = redis.keys("cal:*");
    assert_eq!(keys.len(), 1, "{keys:?}");
    let month = CalendarWindow::new(CalendarUnit::Month, "Europe/Berlin").unwrap();
    let (_, end) = window(month.period(), now);
    let expires_ms: u64 = redis
        .cli(&["PEXPIRETIME", &keys[0]])
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    let grace = ratelimit_redis::testing::EXPIRY_GRACE_MS;
    assert_eq!(
        expires_ms,
        end / 1_000_000 + grace,
        "the month's end in Berlin"
    );
}
