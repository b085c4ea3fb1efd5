//! The one Redis script, compare-and-set, and the text of a stored state. The arithmetic is never
//! in Lua: the caller decides in Rust on the values it expects, and the script writes only if every
//! key still holds them (else it writes nothing and returns what they hold). Every value written
//! carries its writer's tag (`state;writer.seq`), so a call sent again after its reply was lost is
//! recognised when its first attempt landed, and not charged twice.

use smallvec::SmallVec;

use crate::key::TextKey;
use ratelimit_core::clock::Nanos;
use ratelimit_core::limiter::State;

/// Kept past the instant a state equals no state, so an instance whose clock is up to this much
/// behind Redis's (or another instance's) still reads it.
pub(crate) const EXPIRY_GRACE_MS: u64 = 1000;

/// KEYS = the keys; ARGV = per key (expected value, '' = absent; new value, '' = leave, '-' =
/// delete; PXAT in ms). Writes only if every key holds what the caller expected, and returns 1;
/// else writes nothing and returns the keys' current values (nil for an absent key), so the caller
/// can decide again without reading them. With no new values it only verifies. A call sent again
/// whose first attempt landed finds every value it sets already there (each is tagged with its
/// writer and call, so no other call writes it): it returns 1 without writing.
pub(super) const SCRIPT: &str = r"
local cur = {}
local same = true
for i = 1, #KEYS do
  cur[i] = redis.call('GET', KEYS[i])
  local want = ARGV[3*i-2]
  if want == '' then
    if cur[i] then same = false end
  elseif cur[i] ~= want then
    same = false
  end
end
if not same then
  local landed = false
  for i = 1, #KEYS do
    local new = ARGV[3*i-1]
    if new ~= '' and new ~= '-' then
      if cur[i] ~= new then return cur end
      landed = true
    end
  end
  if landed then return 1 end
  return cur
end
for i = 1, #KEYS do
  local new = ARGV[3*i-1]
  if new == '-' then
    redis.call('DEL', KEYS[i])
  elseif new ~= '' then
    redis.call('SET', KEYS[i], new, 'PXAT', ARGV[3*i])
  end
end
return 1
";

/// The script (its hash names it in `EVALSHA`).
fn script() -> &'static ::redis::Script {
    static SCRIPT_: std::sync::LazyLock<::redis::Script> =
        std::sync::LazyLock::new(|| ::redis::Script::new(SCRIPT));
    &SCRIPT_
}

/// Raw values of keys, `None` for an absent key.
pub(super) type Raw = SmallVec<[Option<Vec<u8>>; 4]>;

/// The states of raw values (anything unreadable counts as no state).
pub(crate) fn states(raw: &[Option<Vec<u8>>]) -> SmallVec<[Option<State>; 4]> {
    raw.iter().map(|v| v.as_deref().and_then(decode)).collect()
}

/// A state as stored.
pub(crate) fn encode(state: &State) -> String {
    if state.b == 0 {
        state.a.to_string()
    } else {
        format!("{}:{}", state.a, state.b)
    }
}

/// A stored value as a state (anything unreadable counts as no state). The writer's tag after `;`
/// is not part of the state.
pub(crate) fn decode(value: &[u8]) -> Option<State> {
    let text = std::str::from_utf8(value).ok()?;
    let text = text.split_once(';').map_or(text, |(state, _)| state);
    let (a, b) = text.split_once(':').unwrap_or((text, "0"));
    Some(State {
        a: a.parse().ok()?,
        b: b.parse().ok()?,
    })
}

/// When Redis may drop a key holding `state` (ms since the epoch, for PXAT).
pub(super) fn pxat(state: &State) -> u64 {
    state.expires_at().div_ceil(1_000_000) + EXPIRY_GRACE_MS
}

/// What one compare-and-set asks: per key, the value expected and the value to leave.
pub(super) struct Call<'a> {
    pub(crate) keys: &'a [TextKey],
    pub(crate) expected: &'a [Option<Vec<u8>>],
    /// `None`: leave the key as it is; a state that has expired by `now`: delete the key.
    pub(crate) new: &'a [Option<State>],
    pub(crate) now: Nanos,
    /// This call's tag, unique to it (see [`Tag`]).
    pub(crate) tag: Tag,
}

/// Who wrote a value: the writer (one per store, random) and its call's number. Stored after the
/// state (`state;writer.seq`, hex), it makes every value written unique to its call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Tag {
    pub(crate) writer: u64,
    pub(crate) seq: u64,
}

/// A state's text as a call tagged `tag` stores it.
fn tagged(state: &State, tag: Tag) -> String {
    format!("{};{:x}.{:x}", encode(state), tag.writer, tag.seq)
}

/// What each key holds if a call succeeds (`None` for an absent key), per key.
pub(super) type Written = Raw;

impl Call<'_> {
    /// The script call (`EVALSHA`; see [`load`] for a Redis that does not know the script), and
    /// what each key holds if it succeeds.
    pub(super) fn command(&self) -> (::redis::Cmd, Written) {
        let mut cmd = ::redis::cmd("EVALSHA");
        cmd.arg(script().get_hash()).arg(self.keys.len());
        for key in self.keys {
            cmd.arg(key.as_str());
        }
        let mut written = Written::new();
        for (expected, new) in self.expected.iter().zip(self.new) {
            cmd.arg(expected.as_deref().unwrap_or(b""));
            match new {
                None => {
                    written.push(expected.clone());
                    cmd.arg("").arg(0)
                }
                Some(s) if s.expires_at() <= self.now => {
                    written.push(None);
                    cmd.arg("-").arg(0)
                }
                Some(s) => {
                    let text = tagged(s, self.tag);
                    cmd.arg(&text).arg(pxat(s));
                    written.push(Some(text.into_bytes()));
                    &mut cmd
                }
            };
        }
        (cmd, written)
    }
}

/// `SCRIPT LOAD` of the script, for a Redis that answered a call with `NOSCRIPT` (a restarted or
/// new server, a failed-over replica).
pub(super) fn load() -> ::redis::Cmd {
    let mut cmd = ::redis::cmd("SCRIPT");
    cmd.arg("LOAD").arg(SCRIPT);
    cmd
}

/// Whether a reply says Redis does not know the script.
pub(super) fn unknown_script(value: &::redis::Value) -> bool {
    matches!(value, ::redis::Value::ServerError(e) if e.code() == "NOSCRIPT")
}

/// A reply of the script: `Ok(None)` it wrote, `Ok(Some(current))` it did not (the keys hold
/// `current`), `Err` a reply the script never gives.
pub(super) fn reply(value: ::redis::Value, keys: usize) -> Result<Option<Raw>, String> {
    match value {
        ::redis::Value::Int(1) => Ok(None),
        ::redis::Value::Array(current) if current.len() == keys => Ok(Some(
            current
                .into_iter()
                .map(|value| match value {
                    ::redis::Value::BulkString(v) => Some(v),
                    _ => None,
                })
                .collect(),
        )),
        other => Err(format!("unexpected compare-and-set reply: {other:?}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn states_round_trip_through_their_text() {
        for s in [
            State { a: 0, b: 0 },
            State {
                a: 1_767_225_600_000_000_000,
                b: 0,
            },
            State {
                a: u64::MAX,
                b: u64::MAX,
            },
            State { a: 5, b: 7 },
        ] {
            assert_eq!(decode(encode(&s).as_bytes()), Some(s));
        }
        assert_eq!(encode(&State { a: 12, b: 3 }), "12:3");
        assert_eq!(decode(b"junk"), None);
        assert_eq!(decode(b"1:x"), None);
    }

    #[test]
    fn a_tagged_value_decodes_to_its_state() {
        let s = State { a: 12, b: 3 };
        let tag = Tag {
            writer: 0xab,
            seq: 7,
        };
        assert_eq!(tagged(&s, tag), "12:3;ab.7");
        assert_eq!(decode(tagged(&s, tag).as_bytes()), Some(s));
        assert_eq!(decode(b"5;x"), Some(State { a: 5, b: 0 }));
    }
}
