//! Concurrency leases in Redis: one sorted set per concurrency key (member: the request id,
//! score: when its lease ends, in ms on the deciding instance's clock), changed by one script
//! call, so every instance on the Redis shares one limit exactly and a slot taken through one is
//! given back through another. The script is `ratelimit_core::lease`'s rules on the set: ended
//! leases go first; an acquisition adds the id iff fewer than `max_in_flight` remain (or renews
//! its own); a release removes exactly its id. The key expires when its last lease ends, so a
//! lost release (and the key itself) never outlives its lease. Calls are idempotent (a renewed
//! acquisition, a release of a removed id), so a call sent again after a lost reply is safe.

use std::sync::{Arc, LazyLock};

use ratelimit_core::clock::Nanos;
use ratelimit_core::lease::{LeaseAnswer, LeaseOutcome};
use ratelimit_core::store::{LeaseCall, StoreError};

use crate::calls::{Calls, script_call};
use crate::key::TextKey;

const NANOS_PER_MS: u64 = 1_000_000;

/// KEYS[1]: the set. ARGV: action (`a`, `r`, `p`), request id, now (ms), lease (ms),
/// max_in_flight. Answers {outcome (`LeaseOutcome` code), leases held, leases ended, the soonest
/// lease's end in ms or -1}.
const SCRIPT: &str = r"
local key, id = KEYS[1], ARGV[2]
local now, lease, max = tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[5])
local ended = redis.call('ZREMRANGEBYSCORE', key, '-inf', string.format('%.0f', now))
local outcome = 5
if ARGV[1] == 'a' then
  local ends = string.format('%.0f', now + lease)
  if redis.call('ZSCORE', key, id) then
    redis.call('ZADD', key, ends, id)
    outcome = 1
  elseif redis.call('ZCARD', key) >= max then
    outcome = 2
  else
    redis.call('ZADD', key, ends, id)
    outcome = 0
  end
elseif ARGV[1] == 'r' then
  if redis.call('ZREM', key, id) == 1 then outcome = 3 else outcome = 4 end
end
local held = redis.call('ZCARD', key)
local first = -1
if held > 0 then
  local last = redis.call('ZRANGE', key, -1, -1, 'WITHSCORES')
  redis.call('PEXPIRE', key, string.format('%.0f', math.max(1, tonumber(last[2]) - now)))
  first = tonumber(redis.call('ZRANGE', key, 0, 0, 'WITHSCORES')[2])
end
return {outcome, held, ended, first}
";

static LEASE: LazyLock<::redis::Script> = LazyLock::new(|| ::redis::Script::new(SCRIPT));

/// Runs `call` on its key's set, bounded by `REDIS_TIMEOUT` and counted as a store call (a Redis
/// that does not know the script gets its text: [`script_call`]).
pub(crate) async fn call(
    calls: &Arc<Calls>,
    call: &LeaseCall<'_, TextKey>,
) -> Result<LeaseAnswer, StoreError> {
    let mut cmd = ::redis::cmd("EVALSHA");
    cmd.arg(LEASE.get_hash())
        .arg(1)
        .arg(call.key.as_str())
        .arg(call.action.code())
        .arg(call.id)
        .arg(call.now / NANOS_PER_MS)
        .arg((call.params.lease / NANOS_PER_MS).max(1))
        .arg(call.params.max_in_flight);
    let mut c = calls.conn();
    let reply: Vec<i64> = calls
        .bounded(async move { script_call(&mut c, &cmd, SCRIPT).await })
        .await?;
    decode(&reply).ok_or_else(|| {
        StoreError::Unavailable(format!("unexpected reply from the lease script: {reply:?}"))
    })
}

/// The script's reply as an answer.
fn decode(reply: &[i64]) -> Option<LeaseAnswer> {
    let [outcome, held, ended, first] = *reply else {
        return None;
    };
    Some(LeaseAnswer {
        outcome: LeaseOutcome::from_code(outcome)?,
        in_use: u32::try_from(held).ok()?,
        expired: u32::try_from(ended).ok()?,
        next_end: u64::try_from(first)
            .ok()
            .map(|ms| ms.saturating_mul(NANOS_PER_MS) as Nanos),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replies_decode_and_odd_ones_are_refused() {
        assert_eq!(
            decode(&[0, 2, 1, 1_500]),
            Some(LeaseAnswer {
                outcome: LeaseOutcome::Taken,
                in_use: 2,
                expired: 1,
                next_end: Some(1_500 * NANOS_PER_MS),
            })
        );
        assert_eq!(decode(&[4, 0, 0, -1]).and_then(|a| a.next_end), None);
        assert_eq!(decode(&[9, 0, 0, -1]), None);
        assert_eq!(decode(&[0, -1, 0, -1]), None);
        assert_eq!(decode(&[0, 1, 0]), None);
    }
}
