//! What the operator chose for a remote backend's outages: the failure mode (`REDIS_FAILURE_MODE`
//! for Redis), the local failure mode's share of each limit, and the settings [`crate::Guarded`]
//! starts with.

/// What answers while the remote backend is unreachable (`<NAME>_FAILURE_MODE`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FailureMode {
    /// Decide from a memory store in this instance, with the same rules.
    Local,
    /// Answer OK.
    Allow,
    /// Answer OVER_LIMIT.
    Deny,
    /// Answer gRPC UNAVAILABLE (Envoy's `failure_mode_deny` decides).
    Error,
}

impl FailureMode {
    pub const ALL: [FailureMode; 4] = [Self::Local, Self::Allow, Self::Deny, Self::Error];

    pub fn name(self) -> &'static str {
        match self {
            Self::Local => "local",
            Self::Allow => "allow",
            Self::Deny => "deny",
            Self::Error => "error",
        }
    }

    /// A mode by name, any case.
    pub fn parse(text: &str) -> Option<FailureMode> {
        let text = text.trim().to_ascii_lowercase();
        Self::ALL.into_iter().find(|m| m.name() == text)
    }
}

/// How much of what each limit has left the local failure mode gives this instance
/// (`<NAME>_FAILURE_LOCAL_SHARE`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum LocalShare {
    /// One over the live instances, as the last heartbeat counted them (1 while none is known).
    Auto,
    /// This fraction (0 < share ≤ 1).
    Fixed(f64),
}

impl LocalShare {
    /// `auto` or a fraction in (0, 1].
    pub fn parse(text: &str) -> Result<LocalShare, String> {
        let text = text.trim();
        if text.eq_ignore_ascii_case("auto") {
            return Ok(LocalShare::Auto);
        }
        match text.parse::<f64>() {
            Ok(f) if f > 0.0 && f <= 1.0 => Ok(LocalShare::Fixed(f)),
            _ => Err(format!(
                "invalid share '{text}' (expected auto, or a fraction above 0 and at most 1)"
            )),
        }
    }
}

/// What the guard is told to do (from settings).
#[derive(Debug, Clone, Copy)]
pub struct GuardSettings {
    pub mode: FailureMode,
    /// Keys the local failure mode's memory backend holds.
    pub local_max_keys: usize,
    /// `LOCAL_CACHE_SIZE_IN_BYTES` (0: no over-limit cache).
    pub local_cache_bytes: usize,
    /// `<NAME>_FAILURE_LOCAL_SHARE`: the local failure mode's share of what each limit has left.
    pub local_share: LocalShare,
}
