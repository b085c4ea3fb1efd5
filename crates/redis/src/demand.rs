//! The RLQS demand exchange: one script call per bucket that writes this instance's demand into
//! the bucket's hash (field: the instance, value: `demand:ms` on Redis's clock), renews the key's
//! TTL, drops fields older than the TTL, and returns every field left with Redis's time. The
//! instances' hash (their beats) is the same call with no demand. Every key written carries a
//! TTL ([`KEY_TTL_MS`]); times are Redis's, so the instances' clocks need not agree.

use ratelimit_core::quota::fraction::{InstanceId, Peer, STALE_AFTER_MS};

use super::{RedisBackend, StoreError, TextKey};

/// A demand hash lives this long after its last write; its fields are dropped once older.
pub const KEY_TTL_MS: u64 = 2 * STALE_AFTER_MS;

/// KEYS[1]: the hash; ARGV: instance, demand, TTL in ms. Returns `now_ms, field, value, …`.
const SCRIPT: &str = r"
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local ttl = tonumber(ARGV[3])
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2] .. ':' .. now)
redis.call('PEXPIRE', KEYS[1], ttl)
local all = redis.call('HGETALL', KEYS[1])
local out = {tostring(now)}
for i = 1, #all, 2 do
  local at = tonumber(string.match(all[i + 1], ':(%d+)$'))
  if at == nil or now - at > ttl then
    redis.call('HDEL', KEYS[1], all[i])
  else
    out[#out + 1] = all[i]
    out[#out + 1] = all[i + 1]
  end
end
return out
";

/// What a bucket's hash held after this instance's write.
#[derive(Debug, Clone, PartialEq)]
pub struct Snapshot {
    /// Redis's time of the write, in ms.
    pub now_ms: u64,
    /// Every instance's entry, this one's included (unreadable fields are left out).
    pub peers: Vec<Peer>,
}

/// An instance id as a hash field.
pub fn field(instance: InstanceId) -> String {
    format!("{instance:016x}")
}

/// Reads the script's reply (`now_ms, field, value, …`).
fn parse(reply: &[String]) -> Option<Snapshot> {
    let (now, rest) = reply.split_first()?;
    let now_ms = now.parse().ok()?;
    let peers = rest
        .chunks_exact(2)
        .filter_map(|pair| {
            let instance = InstanceId::from_str_radix(&pair[0], 16).ok()?;
            let (demand, at) = pair[1].rsplit_once(':')?;
            Some(Peer {
                instance,
                demand: demand.parse().ok()?,
                at_ms: at.parse().ok()?,
            })
        })
        .collect();
    Some(Snapshot { now_ms, peers })
}

impl RedisBackend {
    /// The key of an RLQS bucket's demand hash (entries sorted by the caller).
    pub fn demand_key(&self, domain: &str, entries: &[(String, String)]) -> TextKey {
        self.inner.keys.quota_key(domain, entries)
    }

    /// The key of the instances' hash.
    pub fn instances_key(&self) -> TextKey {
        self.inner.keys.instances_key()
    }

    /// Writes `instance`'s `demand` (requests per second) into the hash at `key` and returns
    /// what it holds then; bounded by `REDIS_TIMEOUT`.
    pub async fn exchange_demand(
        &self,
        key: &TextKey,
        instance: InstanceId,
        demand: f64,
    ) -> Result<Snapshot, StoreError> {
        let demand = if demand.is_finite() && demand > 0.0 {
            demand
        } else {
            0.0
        };
        let mut cmd = ::redis::cmd("EVAL");
        cmd.arg(SCRIPT)
            .arg(1)
            .arg(key.as_str())
            .arg(field(instance))
            .arg(format!("{demand:.6}"))
            .arg(KEY_TTL_MS);
        let mut c = self.inner.conns.get();
        let reply: Vec<String> = self
            .bounded(async move { cmd.query_async(&mut c).await })
            .await?;
        parse(&reply).ok_or_else(|| {
            self.inner.metrics.error("script");
            StoreError::Unavailable("an RLQS demand reply that does not parse".into())
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replies_parse_and_unreadable_fields_are_left_out() {
        let reply: Vec<String> = [
            "1700000000123",
            &field(7),
            "2.500000:1700000000100",
            "zz",
            "1:1",
            &field(9),
            "nan-ish",
        ]
        .iter()
        .map(|s| (*s).to_owned())
        .collect();
        let snapshot = parse(&reply).unwrap();
        assert_eq!(snapshot.now_ms, 1_700_000_000_123);
        assert_eq!(
            snapshot.peers,
            vec![Peer {
                instance: 7,
                demand: 2.5,
                at_ms: 1_700_000_000_100
            }]
        );
        assert_eq!(parse(&[]), None);
        assert_eq!(parse(&["x".to_owned()]), None);
    }
}
