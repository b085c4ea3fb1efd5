//! The quota API's calls on Redis, beside the decisions: a page of one domain's counter keys
//! (`SCAN … MATCH`, never `KEYS`: it walks the keyspace a page at a time without blocking Redis),
//! a counter reset (`DEL`), and the overrides every instance reads: each override one key holding
//! its JSON with a TTL to its expiry, listed in one set, all under one hash tag
//! (`{<prefix>%overrides}`) so they are written and read together even on a cluster, beside a
//! count of their changes that each change increments (`%version`: instances read the set again
//! only when it moved). Plain commands, bounded by `REDIS_TIMEOUT`, not counted as the counters'
//! calls.

use ratelimit_core::config::Algorithm;
use ratelimit_core::limiter::State;
use ratelimit_core::overrides::Override;
use ratelimit_core::store::StoreError;

use crate::backend::RedisBackend;
use crate::cas::decode;
use crate::key::{ParsedKey, TextKey};

/// One counter key found by a scan.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScannedCounter {
    pub key: TextKey,
    /// The entries as counted (`None`: hashed in the key, being long).
    pub entries: Option<Vec<(String, String)>>,
    pub slot: usize,
    pub algorithm: Algorithm,
    pub period: u64,
    /// Its state when read (`None`: gone between the scan and the read).
    pub state: Option<State>,
}

/// One step of a scan: Redis's next cursor (0: the walk is over) and what it found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScanStep {
    pub next: u64,
    pub counters: Vec<ScannedCounter>,
}

impl RedisBackend {
    /// One `SCAN` step from `cursor` over the counter keys of `domain` whose entries start with
    /// `start` (see `TextKeyBuilder::counters_pattern`), asking Redis to look at about `count`
    /// keys, and the states of those found (one `MGET`). Not on a Redis Cluster (each master has
    /// its own keyspace to walk).
    pub async fn scan_counters(
        &self,
        domain: &str,
        start: &[(String, Option<String>)],
        cursor: u64,
        count: usize,
    ) -> Result<ScanStep, StoreError> {
        if self.calls().is_cluster() {
            return Err(StoreError::Unavailable(
                "listing counters is not supported on a Redis Cluster".into(),
            ));
        }
        let keys = self.keys();
        let pattern = keys.counters_pattern(domain, start);
        let mut scan = ::redis::cmd("SCAN");
        scan.arg(cursor)
            .arg("MATCH")
            .arg(pattern)
            .arg("COUNT")
            .arg(count);
        let calls = self.calls();
        let mut c = calls.conn();
        let (next, found): (u64, Vec<String>) = calls
            .quiet(async move { scan.query_async(&mut c).await })
            .await?;
        let values: Vec<Option<Vec<u8>>> = if found.is_empty() {
            Vec::new()
        } else {
            let mut mget = ::redis::cmd("MGET");
            for key in &found {
                mget.arg(key);
            }
            let mut c = calls.conn();
            calls
                .quiet(async move { mget.query_async(&mut c).await })
                .await?
        };
        let counters = found
            .into_iter()
            .zip(values)
            .filter_map(|(key, value)| {
                let ParsedKey {
                    entries,
                    slot,
                    algorithm,
                    period,
                } = keys.parse_counter(domain, &key)?;
                let algorithm = *Algorithm::ALL.get(usize::from(algorithm))?;
                Some(ScannedCounter {
                    key: TextKey::from_text(key),
                    entries,
                    slot,
                    algorithm,
                    period,
                    state: value.as_deref().and_then(decode),
                })
            })
            .collect();
        Ok(ScanStep { next, counters })
    }

    /// Deletes a counter's key; whether it existed.
    pub(crate) async fn delete(&self, key: &TextKey) -> Result<bool, StoreError> {
        let calls = self.calls();
        let mut c = calls.conn();
        let del = ::redis::cmd("DEL").arg(key.as_str()).clone();
        let deleted: i64 = calls
            .bounded(async move { del.query_async(&mut c).await })
            .await?;
        Ok(deleted > 0)
    }

    /// Stores `o` for every instance, its key expiring in `ttl_ms`.
    pub async fn put_override(&self, o: &Override, ttl_ms: u64) -> Result<(), StoreError> {
        let keys = self.keys();
        let key = keys.override_key(&o.domain, &o.entries);
        let value = serde_json::to_string(o)
            .map_err(|e| StoreError::Unavailable(format!("cannot write an override: {e}")))?;
        let mut pipe = ::redis::pipe();
        pipe.atomic()
            .cmd("SET")
            .arg(key.as_str())
            .arg(value)
            .arg("PX")
            .arg(ttl_ms.max(1))
            .ignore()
            .cmd("SADD")
            .arg(keys.overrides_key().as_str())
            .arg(key.as_str())
            .ignore()
            .cmd("INCR")
            .arg(keys.overrides_version_key().as_str())
            .ignore();
        self.quiet_pipe(pipe).await
    }

    /// Removes the override of a descriptor; whether there was one.
    pub async fn delete_override(
        &self,
        domain: &str,
        entries: &[(String, String)],
    ) -> Result<bool, StoreError> {
        let keys = self.keys();
        let key = keys.override_key(domain, entries);
        let mut pipe = ::redis::pipe();
        pipe.atomic()
            .cmd("DEL")
            .arg(key.as_str())
            .cmd("SREM")
            .arg(keys.overrides_key().as_str())
            .arg(key.as_str())
            .ignore()
            .cmd("INCR")
            .arg(keys.overrides_version_key().as_str())
            .ignore();
        let calls = self.calls();
        let mut c = calls.conn();
        let (deleted,): (i64,) = calls
            .quiet(async move { pipe.query_async(&mut c).await })
            .await?;
        Ok(deleted > 0)
    }

    /// The count of the overrides' changes (0 before the first, or once Redis lost it): the set
    /// needs reading again only when it moved. One `GET`.
    pub async fn overrides_version(&self) -> Result<u64, StoreError> {
        let calls = self.calls();
        let mut c = calls.conn();
        let get = ::redis::cmd("GET")
            .arg(self.keys().overrides_version_key().as_str())
            .clone();
        let version: Option<u64> = calls
            .quiet(async move { get.query_async(&mut c).await })
            .await?;
        Ok(version.unwrap_or(0))
    }

    /// Every override stored (their keys' TTLs have not run out); the keys of those that have are
    /// taken out of the set. A value that does not read as an override is left out.
    pub async fn overrides(&self) -> Result<Vec<Override>, StoreError> {
        let keys = self.keys();
        let index = keys.overrides_key();
        let calls = self.calls();
        let mut c = calls.conn();
        let members = ::redis::cmd("SMEMBERS").arg(index.as_str()).clone();
        let names: Vec<String> = calls
            .quiet(async move { members.query_async(&mut c).await })
            .await?;
        if names.is_empty() {
            return Ok(Vec::new());
        }
        let mut mget = ::redis::cmd("MGET");
        for name in &names {
            mget.arg(name);
        }
        let mut c = calls.conn();
        let values: Vec<Option<String>> = calls
            .quiet(async move { mget.query_async(&mut c).await })
            .await?;
        let mut found = Vec::with_capacity(values.len());
        let mut gone = Vec::new();
        for (name, value) in names.into_iter().zip(values) {
            match value {
                Some(v) => found.extend(serde_json::from_str::<Override>(&v).ok()),
                None => gone.push(name),
            }
        }
        if !gone.is_empty() {
            // Best effort: a key left in the set is taken out by the next read.
            let mut srem = ::redis::cmd("SREM");
            srem.arg(index.as_str()).arg(gone);
            let mut c = calls.conn();
            let _ = calls
                .quiet(async move { srem.query_async::<i64>(&mut c).await })
                .await;
        }
        Ok(found)
    }

    async fn quiet_pipe(&self, pipe: ::redis::Pipeline) -> Result<(), StoreError> {
        let calls = self.calls();
        let mut c = calls.conn();
        calls
            .quiet(async move { pipe.query_async::<()>(&mut c).await })
            .await
    }
}
