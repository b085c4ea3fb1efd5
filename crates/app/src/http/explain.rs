//! `GET /explain?domain=D&descriptor=k=v,k2=v2`: `Engine::explain` served as JSON (the typed form
//! `wire::explain::Explanation`, which `ratelimit-server explain --server` reads) — which rule one
//! descriptor matches on the live rules, each limit's algorithm and effective numbers, and the
//! state of the counter a decision would charge. With `bucket=k=v,k2=v2` instead of `descriptor`,
//! an RLQS bucket (entries in any order; `wire::explain::BucketExplanation`): the descriptor it is
//! read as, the rule and pool that govern it, and each stream's share now. Reads only: nothing is
//! charged.

use axum::Json;
use axum::extract::{Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde::Deserialize;

use std::sync::Arc;

use super::Admin;
use ratelimit_core::policy::parse_descriptor;
use ratelimit_core::quota::{Governed, Grant};
use ratelimit_core::store::Backend;
use ratelimit_core::wire::explain::{
    BucketExplanation, BucketGoverned, BucketPool, Explanation, StreamGrant, StreamShare,
};

#[derive(Debug, Deserialize)]
pub(super) struct ExplainQuery {
    domain: String,
    descriptor: Option<String>,
    bucket: Option<String>,
}

pub(super) async fn explain<B: Backend>(
    State(admin): State<Arc<Admin<B>>>,
    Query(q): Query<ExplainQuery>,
) -> Response {
    let descriptor = match (&q.descriptor, &q.bucket) {
        (Some(d), None) => d.clone(),
        (None, Some(bucket)) => return explain_bucket(&admin, &q.domain, bucket),
        _ => {
            let message = "give one of descriptor=k=v,... or bucket=k=v,...";
            return (StatusCode::BAD_REQUEST, message).into_response();
        }
    };
    let entries = match parse_descriptor(&descriptor) {
        Ok(e) => e,
        Err(message) => return (StatusCode::BAD_REQUEST, message).into_response(),
    };
    let engine = &admin.engine;
    let now = engine.now();
    match engine.explain(&q.domain, &entries, now).await {
        Ok(explained) => Json(Explanation {
            domain: q.domain,
            descriptor,
            now_unix_ns: now,
            store: B::NAME.into(),
            explained,
        })
        .into_response(),
        Err(e) => (StatusCode::SERVICE_UNAVAILABLE, e.to_string()).into_response(),
    }
}

/// `/explain?bucket=…`: how an RLQS bucket is read and what each stream holds of it.
fn explain_bucket<B: Backend>(admin: &Admin<B>, domain: &str, bucket: &str) -> Response {
    let entries = match parse_descriptor(bucket) {
        Ok(e) => e,
        Err(message) => return (StatusCode::BAD_REQUEST, message).into_response(),
    };
    let (_, mapping) = admin.engine.map_bucket(domain, &entries);
    let live = admin
        .quotas
        .as_ref()
        .and_then(|quotas| quotas.view(domain, &entries));
    // `fraction`: this instance's part of the pool (1 unless instances share it through Redis).
    let (fraction, grants) = live.map_or((None, Vec::new()), |view| {
        (Some(view.fraction), view.grants)
    });
    let streams = grants
        .into_iter()
        .map(|(stream, grant, demand_per_sec)| StreamShare {
            stream,
            demand_per_sec,
            grant: grant.map(stream_grant),
        })
        .collect();
    Json(BucketExplanation {
        domain: domain.into(),
        bucket: bucket.into(),
        descriptor: descriptor_text(&mapping.descriptor),
        governed: bucket_governed(mapping.governed),
        fraction,
        streams,
    })
    .into_response()
}

fn bucket_governed(governed: Governed) -> BucketGoverned {
    match governed {
        Governed::AllowAll(why) => BucketGoverned::AllowAll {
            why: format!("{why:?}"),
        },
        Governed::Unlimited { path, .. } => BucketGoverned::Unlimited { rule: path },
        Governed::Limited {
            path, shadow, pool, ..
        } => {
            let pool = BucketPool {
                tokens: pool.tokens,
                period_secs: pool.period_secs,
                burst: pool.burst,
                fill_interval_secs: pool.fill_interval_secs(),
            };
            if shadow {
                BucketGoverned::Shadow { rule: path, pool }
            } else {
                BucketGoverned::Shared { rule: path, pool }
            }
        }
    }
}

fn stream_grant(grant: Grant) -> StreamGrant {
    match grant {
        Grant::TokenBucket(g) => StreamGrant::TokenBucket {
            max_tokens: g.max_tokens,
            tokens_per_fill: g.tokens_per_fill,
            fill_interval_secs: g.fill_interval_secs,
        },
        Grant::DenyAll => StreamGrant::DenyAll,
    }
}

fn descriptor_text(entries: &[(String, String)]) -> String {
    entries
        .iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect::<Vec<_>>()
        .join(",")
}
