//! RLQS bucket actions as Envoy reads them: a token bucket or a blanket rule with a TTL in whole
//! seconds, or abandon.

use envoy_types::pb::envoy::r#type::v3::{RateLimitStrategy, TokenBucket, rate_limit_strategy};
use envoy_types::pb::envoy::service::rate_limit_quota::v3::BucketId;
use envoy_types::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_response::BucketAction;
use envoy_types::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_response::bucket_action::{
    self, AbandonAction, QuotaAssignmentAction,
};
use envoy_types::pb::google::protobuf::{Duration, UInt32Value};

use ratelimit_core::quota::ASSIGNMENT_TTL_SECS;
use ratelimit_core::quota::{Grant, TokenGrant};

/// TTL of an allow-all assignment (no rule, `unlimited`, shadow mode).
pub(super) const ALLOW_ALL_TTL_SECS: u64 = 3600;

/// What the server tells Envoy to do with one bucket.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Action {
    AllowAll,
    Grant(Grant),
    Abandon,
}

impl Action {
    /// The metric label of this kind of action.
    pub(crate) fn kind(&self) -> &'static str {
        match self {
            Action::AllowAll => "allow_all",
            Action::Grant(Grant::TokenBucket(_)) => "token_bucket",
            Action::Grant(Grant::DenyAll) => "deny_all",
            Action::Abandon => "abandon",
        }
    }
}

fn seconds(secs: u64) -> Duration {
    Duration {
        seconds: i64::try_from(secs).unwrap_or(i64::MAX),
        nanos: 0,
    }
}

fn blanket(rule: rate_limit_strategy::BlanketRule) -> rate_limit_strategy::Strategy {
    rate_limit_strategy::Strategy::BlanketRule(rule as i32)
}

fn token_bucket(g: TokenGrant) -> rate_limit_strategy::Strategy {
    rate_limit_strategy::Strategy::TokenBucket(TokenBucket {
        max_tokens: g.max_tokens,
        tokens_per_fill: Some(UInt32Value {
            value: g.tokens_per_fill,
        }),
        fill_interval: Some(seconds(g.fill_interval_secs)),
    })
}

/// The proto of `action` for `bucket_id`.
pub(super) fn bucket_action(bucket_id: &BucketId, action: Action) -> BucketAction {
    let assign = |strategy, ttl| {
        bucket_action::BucketAction::QuotaAssignmentAction(QuotaAssignmentAction {
            assignment_time_to_live: Some(seconds(ttl)),
            rate_limit_strategy: Some(RateLimitStrategy {
                strategy: Some(strategy),
            }),
        })
    };
    let action = match action {
        Action::AllowAll => assign(
            blanket(rate_limit_strategy::BlanketRule::AllowAll),
            ALLOW_ALL_TTL_SECS,
        ),
        Action::Grant(Grant::DenyAll) => assign(
            blanket(rate_limit_strategy::BlanketRule::DenyAll),
            ASSIGNMENT_TTL_SECS,
        ),
        Action::Grant(Grant::TokenBucket(g)) => assign(token_bucket(g), ASSIGNMENT_TTL_SECS),
        Action::Abandon => bucket_action::BucketAction::AbandonAction(AbandonAction {}),
    };
    BucketAction {
        bucket_id: Some(bucket_id.clone()),
        bucket_action: Some(action),
    }
}
