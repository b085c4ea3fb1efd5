//! Certificate validity: the window each certificate of a chain is valid in (read with
//! x509-parser); a chain with a certificate expired or not yet valid at `now` is refused like a
//! broken one; and when the serving chain's end is near, how often to say so. Times are Unix
//! seconds, passed in. Pure.

use rustls::pki_types::CertificateDer;

use ratelimit_core::wire::time::format_second;

/// When a chain can be served: from the latest `notBefore` of its certificates to the earliest
/// `notAfter`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Validity {
    pub(crate) not_before: i64,
    pub(crate) not_after: i64,
}

/// The longest warning window: warnings start at most this long before the chain expires.
const MAX_WINDOW: i64 = 7 * 86_400;
/// Warnings inside the window repeat at most this often, at least this rarely.
const MIN_REPEAT: i64 = 60;
const MAX_REPEAT: i64 = 3_600;

/// An instant as RFC 3339 (`2025-01-01T00:00:00Z`; before 1970 as a number of seconds).
pub(super) fn instant(seconds: i64) -> String {
    u64::try_from(seconds).map_or_else(|_| format!("{seconds} s from 1970"), format_second)
}

/// Why a chain cannot be served now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Invalid {
    pub(crate) message: String,
    /// For a chain not valid yet: when it will be, so that it can be taken then.
    pub(crate) valid_from: Option<i64>,
}

impl Validity {
    /// The validity of `chain` at `now`: `Err` names the first certificate (`#0` is the
    /// server's own) that is expired, not yet valid, or cannot be read.
    pub(crate) fn of_chain(chain: &[CertificateDer<'_>], now: i64) -> Result<Validity, Invalid> {
        let invalid = |message: String| Invalid {
            message,
            valid_from: None,
        };
        let mut served = Validity {
            not_before: i64::MIN,
            not_after: i64::MAX,
        };
        for (i, cert) in chain.iter().enumerate() {
            let (_, parsed) = x509_parser::parse_x509_certificate(cert.as_ref())
                .map_err(|e| invalid(format!("certificate #{i}: cannot read its validity: {e}")))?;
            let validity = parsed.validity();
            let (from, to) = (
                validity.not_before.timestamp(),
                validity.not_after.timestamp(),
            );
            if now > to {
                return Err(invalid(format!(
                    "certificate #{i} expired at {} (valid from {}): clients would refuse it",
                    instant(to),
                    instant(from),
                )));
            }
            if now < from {
                return Err(Invalid {
                    message: format!(
                        "certificate #{i} is not valid before {} (valid to {}): clients would \
                         refuse it",
                        instant(from),
                        instant(to)
                    ),
                    valid_from: Some(from),
                });
            }
            served.not_before = served.not_before.max(from);
            served.not_after = served.not_after.min(to);
        }
        Ok(served)
    }

    /// How long before `not_after` warnings start: a third of the chain's lifetime (when
    /// cert-manager renews by default, so a warning means the renewal is late), at most 7 days.
    pub(crate) fn warning_window(&self) -> i64 {
        let lifetime = self.not_after.saturating_sub(self.not_before).max(0);
        (lifetime / 3).min(MAX_WINDOW)
    }

    /// What to say about the chain at `now`, if anything.
    pub(crate) fn state(&self, now: i64) -> Expiry {
        let left = self.not_after.saturating_sub(now);
        if left < 0 {
            Expiry::Expired
        } else if left <= self.warning_window() {
            Expiry::Near { left }
        } else {
            Expiry::Fine
        }
    }

    /// How often a warning repeats inside the window: a quarter of the window, from a minute to
    /// an hour.
    pub(crate) fn repeat_every(&self) -> i64 {
        (self.warning_window() / 4).clamp(MIN_REPEAT, MAX_REPEAT)
    }
}

/// Where the serving chain is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Expiry {
    Fine,
    /// Inside the warning window, `left` seconds to go.
    Near {
        left: i64,
    },
    /// Past `notAfter`: clients refuse it.
    Expired,
}

/// When the last expiry warning was given, so warnings repeat at [`Validity::repeat_every`]
/// and not at every poll.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(super) struct Warned {
    last: Option<(i64, bool)>,
}

impl Warned {
    /// Whether to warn now about `state` (the first time the chain is near its end or expired,
    /// when it turns from near to expired, and then every `every` seconds).
    pub(super) fn due(&mut self, state: Expiry, now: i64, every: i64) -> bool {
        let expired = match state {
            Expiry::Fine => {
                self.last = None;
                return false;
            }
            Expiry::Near { .. } => false,
            Expiry::Expired => true,
        };
        let due = match self.last {
            None => true,
            Some((at, was_expired)) => expired != was_expired || now - at >= every,
        };
        if due {
            self.last = Some((now, expired));
        }
        due
    }
}

/// `seconds` as the largest whole unit: `3 d`, `5 h`, `12 min`, `40 s`.
pub(super) fn human(seconds: i64) -> String {
    match seconds {
        s if s >= 86_400 => format!("{} d", s / 86_400),
        s if s >= 3_600 => format!("{} h", s / 3_600),
        s if s >= 60 => format!("{} min", s / 60),
        s => format!("{s} s"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const DAY: i64 = 86_400;

    fn v(not_before: i64, not_after: i64) -> Validity {
        Validity {
            not_before,
            not_after,
        }
    }

    #[test]
    fn the_window_is_a_third_of_the_lifetime_at_most_a_week() {
        assert_eq!(v(0, 90 * DAY).warning_window(), 7 * DAY);
        assert_eq!(v(0, 3_600).warning_window(), 1_200);
        assert_eq!(v(0, 3_600).repeat_every(), 300);
        assert_eq!(v(0, 90 * DAY).repeat_every(), 3_600);
        assert_eq!(v(0, 90).repeat_every(), 60);
    }

    #[test]
    fn states_follow_the_clock() {
        let chain = v(0, 90 * DAY);
        assert_eq!(chain.state(10 * DAY), Expiry::Fine);
        assert_eq!(chain.state(85 * DAY), Expiry::Near { left: 5 * DAY });
        assert_eq!(chain.state(90 * DAY), Expiry::Near { left: 0 });
        assert_eq!(chain.state(90 * DAY + 1), Expiry::Expired);
    }

    #[test]
    fn warnings_repeat_at_their_interval_and_when_the_state_turns() {
        let mut warned = Warned::default();
        let near = Expiry::Near { left: 100 };
        assert!(!warned.due(Expiry::Fine, 0, 60));
        assert!(warned.due(near, 10, 60));
        assert!(!warned.due(near, 11, 60));
        assert!(!warned.due(near, 69, 60));
        assert!(warned.due(near, 70, 60));
        assert!(
            warned.due(Expiry::Expired, 71, 60),
            "turning expired is said at once"
        );
        assert!(!warned.due(Expiry::Expired, 72, 60));
        // A renewed certificate starts over.
        assert!(!warned.due(Expiry::Fine, 80, 60));
        assert!(warned.due(near, 81, 60));
    }

    #[test]
    fn instants_read_as_rfc_3339() {
        assert_eq!(instant(1_735_689_600), "2025-01-01T00:00:00Z");
        assert_eq!(instant(-1), "-1 s from 1970");
        assert_eq!(human(3 * DAY + 5), "3 d");
        assert_eq!(human(59), "59 s");
    }
}
