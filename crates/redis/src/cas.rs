//! The compare-and-set (one Redis script; for one key expected absent, the plain command
//! `SET … NX … GET`, [`Group::plain`]) and the text of a stored state. The arithmetic is never
//! in Lua: the caller decides in Rust on the values it expects, and the script writes only if every
//! key still holds them (else it writes nothing and returns what they hold). One script call
//! carries one compare-and-set or several (each all-or-nothing on its own keys: Redis's cost of a
//! script call is mostly its set-up, paid once for all of them). Every value written carries its
//! writer's tag and its expiry (`state;writer.seq;pxat`): the tag so a call sent again after its
//! reply was lost is recognised when its first attempt landed, and not charged twice; the expiry so
//! a one-key compare-and-set, a single `SET … GET`, can put back a value it should not have
//! replaced exactly as it was.

use smallvec::SmallVec;

use crate::key::TextKey;
use ratelimit_core::clock::Nanos;
use ratelimit_core::limiter::State;

/// Kept past the instant a state equals no state, so an instance whose clock is up to this much
/// behind Redis's (or another instance's) still reads it.
pub(crate) const EXPIRY_GRACE_MS: u64 = 1000;

/// Several compare-and-sets in one call. KEYS = the keys of each compare-and-set, one after the
/// other; ARGV[1] = per compare-and-set its number of keys (two bytes each, big-endian); then per
/// key: the value expected ('' = absent, or held empty: no instance writes an empty value, so a
/// key holding one, a foreign writer's, holds no state and is written over as an absent one is),
/// the new value ('' = leave, '-' = delete) and its PXAT in ms. Each compare-and-set is
/// all-or-nothing on its own keys, as if called alone: it writes only
/// if every key of it holds what was expected (with no new values it only verifies), else it
/// writes nothing and its part of the reply is its keys' current values (nil for an absent key),
/// so the caller can decide again without reading them. Returns 1 when every one of them wrote,
/// else per compare-and-set 1 or its keys' values. A compare-and-set sent again whose first
/// attempt landed finds every value it sets already there (each is tagged with its writer and
/// call, so no other call writes it): 1, without writing. No Lua table is made unless one did not
/// write (a table and its reply cost Redis about as much as the `GET` and `SET` of a key).
///
/// A compare-and-set of one key with a state to write (what most decisions send) costs one
/// command, not a `GET` and a `SET`: `SET … PXAT … GET` writes and returns what the key held
/// (each `redis.call` crossing from Lua into Redis costs a few µs of Redis's CPU). If that was
/// neither the value expected nor this call's own (its first attempt landed), the script puts it
/// back before anything else runs: with the expiry its text carries (`state;writer.seq;pxat`,
/// [`tagged`]); a value without one (an older version's, a foreign writer's) with no expiry, so
/// that no key put back expires earlier than before (an early expiry would read as a fresh
/// bucket); an absent key is deleted again. Other compare-and-sets `GET` each key, then `SET` or
/// `DEL` each changed one.
pub(super) const SCRIPT: &str = r"
local sizes = ARGV[1]
local out
local k = 0
for g = 1, #sizes / 2 do
  local hi, lo = string.byte(sizes, 2 * g - 1, 2 * g)
  local n = hi * 256 + lo
  local r = 1
  local new = ARGV[3 * k + 3]
  if n == 1 and new ~= '' and new ~= '-' then
    local key, want = KEYS[k + 1], ARGV[3 * k + 2]
    local v = redis.call('SET', key, new, 'PXAT', ARGV[3 * k + 4], 'GET')
    local same
    if want == '' then same = not v or v == '' else same = v == want end
    if not same and v ~= new then
      -- Not ours to write: put back what was there, as it was.
      if not v then
        redis.call('DEL', key)
      else
        local px = string.match(v, '^[^;]*;[^;]*;([1-9]%d*)$')
        if px and #px < 16 then
          redis.call('SET', key, v, 'PXAT', px)
        else
          redis.call('SET', key, v)
        end
      end
      r = {v}
    end
  else
    local same = true
    for i = k + 1, k + n do
      local v = redis.call('GET', KEYS[i])
      local want = ARGV[3 * i - 1]
      if want == '' then
        if v and v ~= '' then same = false break end
      elseif v ~= want then
        same = false break
      end
    end
    if same then
      for i = k + 1, k + n do
        local new = ARGV[3 * i]
        if new == '-' then
          redis.call('DEL', KEYS[i])
        elseif new ~= '' then
          redis.call('SET', KEYS[i], new, 'PXAT', ARGV[3 * i + 1])
        end
      end
    else
      -- Nothing of it written: its keys' values, unless its first attempt landed.
      local cur, landed = {}, false
      for i = k + 1, k + n do cur[i - k] = redis.call('GET', KEYS[i]) end
      for i = k + 1, k + n do
        local new = ARGV[3 * i]
        if new ~= '' and new ~= '-' then
          if cur[i - k] ~= new then landed = false break end
          landed = true
        end
      end
      if not landed then r = cur end
    end
  end
  if r ~= 1 and not out then
    out = {}
    for j = 1, g - 1 do out[j] = 1 end
  end
  if out then out[g] = r end
  k = k + n
end
if not out then return 1 end
return out
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

/// A state as stored (before its tag).
#[cfg(test)]
fn encode(state: &State) -> String {
    if state.b == 0 {
        state.a.to_string()
    } else {
        format!("{}:{}", state.a, state.b)
    }
}

/// A stored value as a state (anything unreadable counts as no state). The writer's tag after `;`
/// is not part of the state. (On bytes, in one pass: each decision reads one, and splitting it
/// first and parsing each number as a `str` took ~1,100 instructions of a decision's ~62,000; an
/// ASCII value, as every one written is, skips the UTF-8 check.)
pub(crate) fn decode(value: &[u8]) -> Option<State> {
    if !value.is_ascii() {
        std::str::from_utf8(value).ok()?;
    }
    let (a, rest) = number(value)?;
    let (b, rest) = match rest.split_first() {
        Some((b':', after)) => number(after)?,
        _ => (0, rest),
    };
    matches!(rest.first(), None | Some(b';')).then_some(State { a, b })
}

/// The decimal `u64` that `text` starts with, as `str::parse` reads one (an optional `+`, then
/// digits, no overflow), and the rest of `text`.
fn number(text: &[u8]) -> Option<(u64, &[u8])> {
    let digits = text.strip_prefix(b"+").unwrap_or(text);
    let end = digits
        .iter()
        .position(|c| !c.is_ascii_digit())
        .unwrap_or(digits.len());
    if end == 0 {
        return None;
    }
    let mut n: u64 = 0;
    for &c in &digits[..end] {
        n = n.checked_mul(10)?.checked_add(u64::from(c - b'0'))?;
    }
    Some((n, &digits[end..]))
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

/// A state's text as a call tagged `tag` stores it: `state;writer.seq;pxat` (hex, hex, decimal ms),
/// the last part the key's expiry ([`pxat`]), which the script needs to put the value back as it
/// was after a `SET … GET` that should not have written.
#[cfg(test)]
fn tagged(state: &State, tag: Tag) -> String {
    let mut text = Vec::new();
    push_tagged(&mut text, state, tag, pxat(state));
    String::from_utf8(text).expect("ASCII")
}

/// Appends [`tagged`]'s text, whose expiry is `pxat`: by hand, not by `format!`, as every
/// decision on Redis writes one (callgrind: `format!` and `to_string` took ~2,000 instructions
/// of a decision's ~90,000).
fn push_tagged(out: &mut Vec<u8>, state: &State, tag: Tag, pxat: u64) {
    let mut decimal = itoa::Buffer::new();
    out.extend_from_slice(decimal.format(state.a).as_bytes());
    if state.b != 0 {
        out.push(b':');
        out.extend_from_slice(decimal.format(state.b).as_bytes());
    }
    out.push(b';');
    push_hex(out, tag.writer);
    out.push(b'.');
    push_hex(out, tag.seq);
    out.push(b';');
    out.extend_from_slice(decimal.format(pxat).as_bytes());
}

/// Appends `n` in lower-case hex without leading zeros (as `{:x}` writes it): its digits written
/// into a buffer on the stack, then appended at once (not one `push`, each checking the
/// capacity, per digit).
fn push_hex(out: &mut Vec<u8>, n: u64) {
    let digits = (64 - n.leading_zeros()).div_ceil(4).max(1) as usize;
    let mut text = [0u8; 16];
    for (i, digit) in text[..digits].iter_mut().rev().enumerate() {
        *digit = b"0123456789abcdef"[(n >> (4 * i) & 0xf) as usize];
    }
    out.extend_from_slice(&text[..digits]);
}

/// What each key holds if a call succeeds (`None` for an absent key), per key.
pub(super) type Written = Raw;

/// Most keys in one compare-and-set (its count is two bytes in the script's arguments).
pub(super) const MAX_KEYS: usize = u16::MAX as usize;

/// One compare-and-set as the script takes it: its keys, and per key its three arguments
/// (expected, new, PXAT), end to end in one buffer.
#[derive(Debug, Clone)]
pub(super) struct Group {
    pub(super) keys: SmallVec<[TextKey; 4]>,
    args: Vec<u8>,
    /// Where each argument ends in `args` (three per key).
    ends: SmallVec<[u32; 12]>,
    /// Whether a key is expected to hold an empty value (a foreign writer's): only the script
    /// tells that from an absent key (`SET … NX` and a plain `GET` would not match it, ever).
    expects_empty: bool,
}

impl Group {
    fn push(&mut self, arg: &[u8]) {
        self.push_with(|args| args.extend_from_slice(arg));
    }

    /// Appends the argument `write` writes; returns it.
    fn push_with(&mut self, write: impl FnOnce(&mut Vec<u8>)) -> &[u8] {
        let start = self.args.len();
        write(&mut self.args);
        self.ends.push(self.args.len() as u32);
        &self.args[start..]
    }

    /// Its arguments, three per key, in order.
    pub(super) fn args(&self) -> impl Iterator<Item = &[u8]> {
        let mut start = 0;
        self.ends.iter().map(move |&end| {
            let arg = &self.args[start as usize..end as usize];
            start = end;
            arg
        })
    }
}

#[cfg(test)]
impl Group {
    /// For tests: the compare-and-set of a call tagged `tag` writing key `name`, expected absent,
    /// a state that lasts a minute.
    pub(super) fn writing_absent(name: &str, tag: Tag) -> Group {
        use ratelimit_core::clock::{Clock, SystemClock};
        let now = SystemClock.now();
        let keys = [TextKey::from_text(name.to_owned())];
        let new = [Some(State {
            a: now + 60_000_000_000,
            b: 1,
        })];
        let call = Call {
            keys: &keys,
            expected: &[None],
            new: &new,
            now,
            tag,
        };
        call.group().expect("one key").0
    }
}

impl Call<'_> {
    /// The compare-and-set as the script takes it, and what each key holds if it succeeds.
    /// `Err` when it has more keys than the script can count ([`MAX_KEYS`]).
    pub(super) fn group(&self) -> Result<(Group, Written), String> {
        if self.keys.len() > MAX_KEYS {
            return Err(format!(
                "a compare-and-set on {} keys (at most {MAX_KEYS})",
                self.keys.len()
            ));
        }
        let mut group = Group {
            keys: self.keys.iter().cloned().collect(),
            args: Vec::with_capacity(self.keys.len() * 80),
            ends: SmallVec::new(),
            expects_empty: self
                .expected
                .iter()
                .any(|v| v.as_ref().is_some_and(Vec::is_empty)),
        };
        let mut written = Written::new();
        for (expected, new) in self.expected.iter().zip(self.new) {
            group.push(expected.as_deref().unwrap_or(b""));
            match new {
                None => {
                    written.push(expected.clone());
                    group.push(b"");
                    group.push(b"0");
                }
                Some(s) if s.expires_at() <= self.now => {
                    written.push(None);
                    group.push(b"-");
                    group.push(b"0");
                }
                Some(s) => {
                    let expiry = pxat(s);
                    let text = group.push_with(|args| push_tagged(args, s, self.tag, expiry));
                    written.push(Some(text.to_vec()));
                    group.push(itoa::Buffer::new().format(expiry).as_bytes());
                }
            };
        }
        Ok((group, written))
    }
}

impl Group {
    /// This compare-and-set as one plain command, when it can go without the script: one key,
    /// and either only checked (a denial writes nothing: `GET key`, compared here) or with a state
    /// to write, expected absent (`SET key new NX PXAT pxat GET`, Redis 7.0) or, on a server with
    /// a conditional `SET` (`conditional_set`: Valkey 8.1), expected to hold a value (`SET key new
    /// IFEQ expected PXAT pxat GET`). Each writes only if the key holds what was expected and
    /// returns what it held, so a mismatch writes nothing and needs nothing put back; each costs
    /// the server about a third of a script call carrying it (no Lua set-up, no crossing from Lua
    /// into Redis). Read its reply with [`plain_reply`]. (A delete still goes by script, and so
    /// does a key expected to hold an empty value: see [`SCRIPT`].)
    pub(super) fn plain(&self, conditional_set: bool) -> Option<::redis::Cmd> {
        let [key] = self.keys.as_slice() else {
            return None;
        };
        if self.expects_empty {
            return None;
        }
        let mut args = self.args();
        let (expected, new, pxat) = (args.next()?, args.next()?, args.next()?);
        // Each command is built in buffers sized for it (arguments, bytes), not grown: a
        // decision's command grew them four times, each a reallocation.
        if new.is_empty() {
            let mut cmd = ::redis::Cmd::with_capacity(2, 3 + key.len());
            cmd.arg("GET").arg(key.as_str());
            return Some(cmd);
        }
        if new == b"-" || !(expected.is_empty() || conditional_set) {
            return None;
        }
        // The words: SET, NX or IFEQ, PXAT, GET (14 bytes at most).
        let bytes = 14 + key.len() + new.len() + expected.len() + pxat.len();
        let mut cmd = ::redis::Cmd::with_capacity(8, bytes);
        cmd.arg("SET").arg(key.as_str()).arg(new);
        if expected.is_empty() {
            cmd.arg("NX");
        } else {
            cmd.arg("IFEQ").arg(expected);
        }
        cmd.arg("PXAT").arg(pxat).arg("GET");
        Some(cmd)
    }

    /// The value this compare-and-set expects in its first key (`b""`: absent).
    fn first_expected(&self) -> &[u8] {
        self.args().next().unwrap_or_default()
    }

    /// The value this compare-and-set writes into its first key (`b""` for none).
    fn first_new(&self) -> &[u8] {
        self.args().nth(1).unwrap_or_default()
    }
}

/// The reply to [`Group::plain`]'s command as the script would have given it: 1 when it wrote or
/// checked (the key held what was expected: nothing, or the value expected) or its first attempt
/// had written (the key holds this call's own value, which no other call writes); else what the
/// key holds (nil: absent); anything else (an error) as it came. A check of a key expected absent
/// that holds an empty value matches, as in the script; a `SET … NX` did not write over one, so
/// that is what the key holds (the next attempt, expecting it, goes by script).
pub(super) fn plain_reply(value: ::redis::Value, group: &Group) -> ::redis::Value {
    use ::redis::Value;
    let (expected, new) = (group.first_expected(), group.first_new());
    // An empty text is no value here: the key expected absent, or nothing to write.
    let as_expected = |held: &[u8]| {
        if expected.is_empty() {
            new.is_empty() && held.is_empty()
        } else {
            held == expected
        }
    };
    let own = |held: &[u8]| !new.is_empty() && held == new;
    match value {
        Value::Nil if expected.is_empty() => Value::Int(1),
        Value::BulkString(held) if as_expected(&held) || own(&held) => Value::Int(1),
        Value::Nil => Value::Array(vec![Value::Nil]),
        Value::BulkString(held) => Value::Array(vec![Value::BulkString(held)]),
        other => other,
    }
}

/// Whether a plain command's reply says the server lacks its option (`ERR syntax error`: `IFEQ`
/// on a Valkey before 8.1, e.g. one failed over to or restarted as an older version; `NX` with
/// `GET` on a Redis before 7.0): the compare-and-set is then sent again by script.
pub(super) fn no_conditional_set(value: &::redis::Value) -> bool {
    matches!(value, ::redis::Value::ServerError(e)
        if e.code() == "ERR" && e.details().is_some_and(|d| d.contains("syntax")))
}

/// [`no_conditional_set`] of a command's error; also the script's own error on a Redis before
/// 6.2, whose `SET` has neither `PXAT` nor `GET` (`version`).
pub(super) fn lacks_option(e: &::redis::RedisError) -> bool {
    e.code() == Some("ERR") && e.detail().is_some_and(|d| d.contains("syntax"))
}

/// The probe of a conditional `SET` that returns what the key held (`SET … IFEQ … GET`), on
/// `probe_key`, a key no compare-and-set writes, left absent: it asks for every answer the
/// compare-and-set relies on, so a server whose `IFEQ` answers otherwise (one that returns nil
/// when the condition fails, say) is not taken for one that has it ([`conditional_set_answers`]).
pub(super) fn conditional_set_probe(probe_key: &str) -> ::redis::Pipeline {
    let mut pipe = ::redis::pipe();
    pipe.cmd("SET")
        .arg(probe_key)
        .arg("a")
        .arg("PX")
        .arg(60_000);
    // Not the value expected: nothing written, the value held returned.
    pipe.cmd("SET")
        .arg(probe_key)
        .arg("b")
        .arg("IFEQ")
        .arg("x")
        .arg("GET");
    // The value expected: written, the value held returned.
    pipe.cmd("SET")
        .arg(probe_key)
        .arg("c")
        .arg("IFEQ")
        .arg("a")
        .arg("GET");
    pipe.cmd("GET").arg(probe_key);
    pipe.cmd("DEL").arg(probe_key);
    // An absent key: nil, and not created.
    pipe.cmd("SET")
        .arg(probe_key)
        .arg("d")
        .arg("IFEQ")
        .arg("x")
        .arg("GET");
    pipe.cmd("EXISTS").arg(probe_key);
    pipe
}

/// Whether the replies to [`conditional_set_probe`] are those of a conditional `SET` this store
/// can use.
pub(super) fn conditional_set_answers(replies: &[::redis::Value]) -> bool {
    use ::redis::Value::{BulkString, Int, Nil};
    let held = |v: &::redis::Value, want: &[u8]| matches!(v, BulkString(b) if b == want);
    matches!(replies, [_, refused, written, now, _, Nil, Int(0)]
        if held(refused, b"a") && held(written, b"a") && held(now, b"c"))
}

/// One script call carrying `groups`, in order (`EVALSHA`; see [`load`] and
/// [`crate::calls::script_call`] for a Redis that does not know the script). Each group has at
/// most [`MAX_KEYS`] keys.
pub(super) fn command<'a>(groups: impl Iterator<Item = &'a Group> + Clone) -> ::redis::Cmd {
    let (keys, bytes) = groups.clone().fold((0, 0), |(keys, bytes), g| {
        let text: usize = g.keys.iter().map(TextKey::len).sum();
        (keys + g.keys.len(), bytes + text + g.args.len() + 2)
    });
    // EVALSHA, the hash, the key count, then per key its name and three arguments, then the
    // groups' sizes (two bytes each): sized for them, not grown.
    let mut cmd = ::redis::Cmd::with_capacity(3 + keys * 4 + 1, 7 + 40 + 20 + bytes);
    cmd.arg("EVALSHA").arg(script().get_hash()).arg(keys);
    for group in groups.clone() {
        for key in &group.keys {
            cmd.arg(key.as_str());
        }
    }
    let sizes: Vec<u8> = groups
        .clone()
        .flat_map(|g| (g.keys.len() as u16).to_be_bytes())
        .collect();
    cmd.arg(sizes);
    for group in groups {
        for arg in group.args() {
            cmd.arg(arg);
        }
    }
    cmd
}

/// What the breaker's probe sends (off a cluster): the script writing `key`, a key no counter
/// has, with the expiry `pxat_ms`, as a compare-and-set of one key expected absent; it always
/// runs the script's `SET` (a value already there is its own or put back). So a Redis that
/// answers `PING` but refuses the counters' commands (out of memory under `noeviction`, a
/// read-only replica, an ACL without `EVALSHA`) fails the probe as it fails every decision.
pub(super) fn write_probe(key: &str, pxat_ms: u64) -> ::redis::Cmd {
    let mut cmd = ::redis::cmd("EVALSHA");
    cmd.arg(script().get_hash())
        .arg(1)
        .arg(key)
        .arg(&1u16.to_be_bytes()[..])
        .arg("")
        .arg(PROBE_VALUE)
        .arg(pxat_ms);
    cmd
}

/// What [`write_probe`] writes: no state (it decodes to none) and no writer's tag.
const PROBE_VALUE: &str = "probe";

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

/// A script call's reply split per compare-and-set: `groups` values in order (1 for each when
/// every one wrote), or `Err` with the reply as it came when it is not one per compare-and-set (an
/// error, or a reply the script never gives).
pub(super) fn split(
    value: ::redis::Value,
    groups: usize,
) -> Result<Vec<::redis::Value>, ::redis::Value> {
    match value {
        ::redis::Value::Int(1) => Ok(vec![::redis::Value::Int(1); groups]),
        ::redis::Value::Array(replies) if replies.len() == groups => Ok(replies),
        other => Err(other),
    }
}

/// One compare-and-set's part of the script's reply: `Ok(None)` it wrote, `Ok(Some(current))` it
/// did not (the keys hold `current`), `Err` a reply the script never gives.
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
        // The key's expiry last: 12 ns rounded up to 1 ms, plus the grace.
        assert_eq!(pxat(&s), 1 + EXPIRY_GRACE_MS);
        assert_eq!(
            tagged(&s, tag),
            format!("12:3;ab.7;{}", 1 + EXPIRY_GRACE_MS)
        );
        assert_eq!(decode(tagged(&s, tag).as_bytes()), Some(s));
        // Without the expiry (an older version's value), or without the tag: the same state.
        assert_eq!(decode(b"12:3;ab.7"), Some(s));
        assert_eq!(decode(b"5;x"), Some(State { a: 5, b: 0 }));
    }

    /// The one-pass reading agrees with splitting the value at `;` and `:` and parsing each
    /// number with `str::parse`, on values written and on malformed ones.
    #[test]
    fn decoding_reads_what_str_parse_reads() {
        fn by_str(value: &[u8]) -> Option<State> {
            let text = std::str::from_utf8(value).ok()?;
            let state = text.split(';').next().unwrap_or(text);
            let (a, b) = state.split_once(':').unwrap_or((state, "0"));
            Some(State {
                a: a.parse().ok()?,
                b: b.parse().ok()?,
            })
        }
        let max = u64::MAX.to_string();
        let over = "18446744073709551616";
        let mut values: Vec<String> = [
            "",
            ";",
            ":",
            "+",
            "-1",
            "0",
            "7",
            "+7",
            "007",
            "12:3",
            "12:+3",
            "12:",
            ":3",
            "12:3:4",
            "12::3",
            "12;3",
            "12:3;ab.7;1001",
            "12;ab:7",
            "1 2",
            " 12",
            "12 ",
            "12x",
            "12:3x",
            "x12",
            "5;x",
            "1:x",
            "12:3;\u{e9}",
            "\u{e9}",
        ]
        .map(String::from)
        .to_vec();
        values.extend([
            max.clone(),
            format!("{max}:{max}"),
            over.to_owned(),
            format!("1:{over}"),
            format!("{max}0"),
        ]);
        for value in &values {
            assert_eq!(
                decode(value.as_bytes()),
                by_str(value.as_bytes()),
                "{value:?}"
            );
        }
        assert_eq!(decode(b"12:3;\xff"), None, "not UTF-8");
        assert_eq!(decode(b"12:3"), Some(State { a: 12, b: 3 }));
    }

    #[test]
    fn hex_is_written_as_format_writes_it() {
        for n in [0, 1, 0xf, 0x10, 0xab, 0x7fff_ffff, 1 << 63, u64::MAX] {
            let mut out = b"x".to_vec();
            push_hex(&mut out, n);
            assert_eq!(out, format!("x{n:x}").into_bytes(), "{n}");
        }
    }

    fn key(name: &str) -> TextKey {
        TextKey::from_text(name.to_owned())
    }

    #[test]
    fn a_compare_and_set_sends_per_key_expected_new_and_pxat() {
        let keys = [key("a"), key("b"), key("c")];
        let kept = State {
            a: 3_000_000_000,
            b: 0,
        };
        let gone = State { a: 5, b: 0 };
        let call = Call {
            keys: &keys,
            expected: &[Some(b"1;x.1".to_vec()), None, Some(b"2;x.2".to_vec())],
            new: &[Some(kept), None, Some(gone)],
            now: 1_000_000_000,
            tag: Tag {
                writer: 0xab,
                seq: 9,
            },
        };
        let (group, written) = call.group().unwrap();
        let args: Vec<&[u8]> = group.args().collect();
        let pxat = (3_000 + EXPIRY_GRACE_MS).to_string();
        let text = format!("3000000000;ab.9;{pxat}");
        assert_eq!(
            args,
            [
                &b"1;x.1"[..],
                text.as_bytes(),
                pxat.as_bytes(),
                b"",
                b"",
                b"0",
                b"2;x.2",
                b"-",
                b"0"
            ]
        );
        assert_eq!(written.as_slice(), [Some(text.into_bytes()), None, None]);
    }

    #[test]
    fn one_script_call_carries_each_compare_and_set_keys_first_then_sizes_then_arguments() {
        let group = |names: &[&str]| {
            let keys: Vec<TextKey> = names.iter().map(|n| key(n)).collect();
            let expected = vec![None; keys.len()];
            let new = vec![None; keys.len()];
            Call {
                keys: &keys,
                expected: &expected,
                new: &new,
                now: 0,
                tag: Tag { writer: 1, seq: 1 },
            }
            .group()
            .unwrap()
            .0
        };
        let (one, two) = (group(&["a"]), group(&["b", "c"]));
        let cmd = command([&one, &two].into_iter());
        let args: Vec<Vec<u8>> = cmd
            .args_iter()
            .map(|a| match a {
                ::redis::Arg::Simple(b) => b.to_vec(),
                _ => Vec::new(),
            })
            .collect();
        assert_eq!(args[0], b"EVALSHA");
        assert_eq!(args[2], b"3", "three keys in all");
        assert_eq!(args[3..6], [b"a".to_vec(), b"b".to_vec(), b"c".to_vec()]);
        assert_eq!(args[6], [0, 1, 0, 2], "one key, then two");
        assert_eq!(args.len(), 7 + 3 * 3);
    }

    #[test]
    fn a_reply_splits_per_compare_and_set() {
        use ::redis::Value;
        let ones = split(Value::Int(1), 3).unwrap();
        assert_eq!(ones, vec![Value::Int(1); 3], "1: every one wrote");
        let current = Value::Array(vec![Value::BulkString(b"7".to_vec()), Value::Nil]);
        let parts = split(Value::Array(vec![Value::Int(1), current.clone()]), 2).unwrap();
        assert_eq!(parts, [Value::Int(1), current.clone()]);
        assert_eq!(
            reply(parts[1].clone(), 2),
            Ok(Some([Some(b"7".to_vec()), None].into_iter().collect()))
        );
        assert_eq!(reply(parts[0].clone(), 2), Ok(None));
        // Not one per compare-and-set: the reply as it came, for the caller to refuse.
        assert!(split(Value::Array(vec![Value::Int(1)]), 2).is_err());
        assert!(split(Value::Int(0), 1).is_err());
    }
}

/// The script itself, run by a redis-server of the test's own: what a compare-and-set leaves in
/// Redis, value and expiry, when it writes and when it must not.
#[cfg(test)]
mod script_tests {
    use super::*;
    use crate::test_redis::TestRedis;
    use ::redis::Value;

    /// A redis-server of the test's own and a connection to it, the script loaded.
    struct Server {
        con: ::redis::Connection,
        _redis: TestRedis,
    }

    /// A fresh server with the script loaded; `None` (said loudly) where there is no
    /// redis-server and `CI` is unset, as the root package's tests do.
    fn server() -> Option<Server> {
        serve(TestRedis::start()?)
    }

    /// [`server`] on Valkey, which has `SET … IFEQ`.
    fn valkey() -> Option<Server> {
        serve(TestRedis::start_valkey()?)
    }

    fn serve(redis: TestRedis) -> Option<Server> {
        let mut con = redis.connection().unwrap();
        load().query::<String>(&mut con).unwrap();
        Some(Server { con, _redis: redis })
    }

    impl Server {
        fn run(&mut self, cmd: &::redis::Cmd) -> Value {
            cmd.query(&mut self.con).unwrap()
        }

        fn get(&mut self, key: &str) -> Option<Vec<u8>> {
            self.run(::redis::cmd("GET").arg(key)).into_bytes()
        }

        /// The key's expiry (ms since the epoch; -1 none, -2 no key).
        fn expiry(&mut self, key: &str) -> i64 {
            ::redis::cmd("PEXPIRETIME")
                .arg(key)
                .query(&mut self.con)
                .unwrap()
        }

        fn pttl(&mut self, key: &str) -> i64 {
            ::redis::cmd("PTTL").arg(key).query(&mut self.con).unwrap()
        }

        /// Writes `value` as a foreign writer would, with `pxat` if given.
        fn set(&mut self, key: &str, value: &[u8], pxat: Option<u64>) {
            let mut cmd = ::redis::cmd("SET");
            cmd.arg(key).arg(value);
            if let Some(at) = pxat {
                cmd.arg("PXAT").arg(at);
            }
            self.run(&cmd);
        }
    }

    trait Bytes {
        fn into_bytes(self) -> Option<Vec<u8>>;
    }

    impl Bytes for Value {
        fn into_bytes(self) -> Option<Vec<u8>> {
            match self {
                Value::BulkString(v) => Some(v),
                _ => None,
            }
        }
    }

    /// Now, by the wall clock (Redis's clock decides expiry).
    fn now() -> Nanos {
        use ratelimit_core::clock::{Clock, SystemClock};
        SystemClock.now()
    }

    /// A state that Redis keeps for `secs` more seconds (plus the grace).
    fn state(secs: u64, b: u64) -> State {
        State {
            a: now() + secs * 1_000_000_000,
            b,
        }
    }

    /// One compare-and-set's group: `expected` and `new` per key.
    fn group(
        names: &[&str],
        expected: &[Option<&[u8]>],
        new: &[Option<State>],
        seq: u64,
    ) -> (Group, Written) {
        let keys: Vec<TextKey> = names
            .iter()
            .map(|n| TextKey::from_text((*n).to_owned()))
            .collect();
        let expected: Vec<Option<Vec<u8>>> =
            expected.iter().map(|e| e.map(<[u8]>::to_vec)).collect();
        Call {
            keys: &keys,
            expected: &expected,
            new,
            now: now(),
            tag: Tag { writer: 0xa, seq },
        }
        .group()
        .unwrap()
    }

    /// One script call carrying `groups`, its reply split per compare-and-set.
    fn call(redis: &mut Server, groups: &[&Group]) -> Vec<Value> {
        let value = redis.run(&command(groups.iter().copied()));
        split(value, groups.len()).unwrap()
    }

    /// What a key holds and when it expires, and how long it has left then.
    fn held(redis: &mut Server, key: &str) -> (Option<Vec<u8>>, i64, i64) {
        (redis.get(key), redis.expiry(key), redis.pttl(key))
    }

    /// The same value, the same expiry instant, and no more time left than before.
    fn assert_as_before(before: &(Option<Vec<u8>>, i64, i64), after: &(Option<Vec<u8>>, i64, i64)) {
        assert_eq!(after.0, before.0, "value");
        assert_eq!(after.1, before.1, "expiry instant (PEXPIRETIME)");
        assert!(
            after.2 <= before.2,
            "PTTL {} after, {} before",
            after.2,
            before.2
        );
        if before.1 >= 0 {
            assert!(after.2 > 0, "still alive: PTTL {}", after.2);
        }
    }

    #[test]
    fn one_key_writes_with_its_expiry_in_the_value() {
        let Some(mut redis) = server() else { return };
        let s = state(60, 2);
        let (g, written) = group(&["k"], &[None], &[Some(s)], 1);
        assert_eq!(call(&mut redis, &[&g]), [Value::Int(1)]);
        let (value, expiry, _) = held(&mut redis, "k");
        assert_eq!(value, written[0]);
        assert_eq!(expiry, pxat(&s) as i64);
        let text = String::from_utf8(value.unwrap()).unwrap();
        assert_eq!(text, format!("{}:2;a.1;{}", s.a, pxat(&s)));
        // The next one expecting it writes too.
        let t = state(90, 3);
        let (g, written) = group(&["k"], &[Some(text.as_bytes())], &[Some(t)], 2);
        assert_eq!(call(&mut redis, &[&g]), [Value::Int(1)]);
        assert_eq!(redis.get("k"), written[0]);
        assert_eq!(redis.expiry("k"), pxat(&t) as i64);
    }

    #[test]
    fn a_mismatch_puts_the_other_writers_value_back_with_its_expiry() {
        let Some(mut redis) = server() else { return };
        // Writer A writes the key.
        let s = state(60, 2);
        let (a, written) = group(&["k"], &[None], &[Some(s)], 1);
        assert_eq!(call(&mut redis, &[&a]), [Value::Int(1)]);
        let before = held(&mut redis, "k");
        assert_eq!(before.0, written[0]);
        // Writer B, expecting the key absent (it never saw A's write), then expecting a value
        // it last saw there (older than A's): each writes nothing and gets A's value back.
        let stale = b"1:0;b.1;99999999999".as_slice();
        for (seq, expected) in [(7, None), (8, Some(stale))] {
            let (b, _) = group(&["k"], &[expected], &[Some(state(120, 9))], seq);
            let reply = call(&mut redis, &[&b]);
            assert_eq!(
                reply,
                [Value::Array(vec![Value::BulkString(
                    written[0].clone().unwrap()
                )])]
            );
            assert_eq!(reply_of(reply), Some(written[0].clone()));
            assert_as_before(&before, &held(&mut redis, "k"));
        }
        // A's call sent again (its reply lost) finds its own value: 1, unchanged.
        assert_eq!(call(&mut redis, &[&a]), [Value::Int(1)]);
        assert_as_before(&before, &held(&mut redis, "k"));
    }

    /// The PXAT a value's text carries (its last part).
    fn expiry_in(value: &[u8]) -> Option<i64> {
        std::str::from_utf8(value)
            .ok()?
            .rsplit(';')
            .next()?
            .parse()
            .ok()
    }

    /// One compare-and-set's part of the reply as the writer reads it: `Some(current)` (one key)
    /// when it did not write.
    fn reply_of(parts: Vec<Value>) -> Option<Option<Vec<u8>>> {
        let part = parts.into_iter().next().unwrap();
        reply(part, 1).unwrap().map(|raw| raw[0].clone())
    }

    /// One compare-and-set sent as its plain command, the reply as the script would give it.
    fn plain_call(redis: &mut Server, group: &Group) -> Vec<Value> {
        let cmd = group.plain(false).expect("a plain command");
        vec![plain_reply(redis.run(&cmd), group)]
    }

    /// [`plain_call`] on a server with a conditional `SET`.
    fn conditional_call(redis: &mut Server, group: &Group) -> Vec<Value> {
        let cmd = group.plain(true).expect("a plain command");
        vec![plain_reply(redis.run(&cmd), group)]
    }

    #[test]
    fn one_key_held_goes_as_a_plain_command_only_where_the_server_has_a_conditional_set() {
        let s = state(60, 1);
        let held = group(&["k"], &[Some(b"1;a.1;5")], &[Some(s)], 1).0;
        assert!(held.plain(false).is_none());
        let cmd = held.plain(true).expect("SET … IFEQ");
        let args: Vec<Vec<u8>> = cmd
            .args_iter()
            .map(|a| match a {
                ::redis::Arg::Simple(bytes) => bytes.to_vec(),
                _ => Vec::new(),
            })
            .collect();
        assert_eq!(args[0], b"SET");
        assert_eq!(args[3..5], [b"IFEQ".to_vec(), b"1;a.1;5".to_vec()]);
        assert_eq!(args.last().unwrap(), b"GET");
        // Absent still goes as NX, and what needs the script still does.
        assert!(
            group(&["k"], &[None], &[Some(s)], 1)
                .0
                .plain(true)
                .is_some()
        );
        let gone = State { a: 1, b: 0 };
        assert!(
            group(&["k"], &[Some(b"1")], &[Some(gone)], 1)
                .0
                .plain(true)
                .is_none(),
            "a delete"
        );
        let two = group(&["k", "l"], &[Some(b"1"), None], &[Some(s), Some(s)], 1).0;
        assert!(two.plain(true).is_none());
    }

    /// On Valkey (8.1: `SET … IFEQ … GET`) a one-key compare-and-set of a held key answers as the
    /// script does: it writes when the key holds what it expects (same value and expiry as the
    /// script's write), leaves another value exactly as it was and returns it, leaves an absent
    /// key absent and says so, and a resend whose first attempt landed answers 1.
    #[test]
    fn a_conditional_compare_and_set_answers_and_leaves_what_the_script_would() {
        let Some(mut redis) = valkey() else { return };
        let old = b"3:1;b.4;99999999999";
        let s = state(60, 2);
        redis.set("s", old, None);
        redis.set("c", old, None);
        let (by_script, script_written) = group(&["s"], &[Some(old)], &[Some(s)], 1);
        let (conditional, written) = group(&["c"], &[Some(old)], &[Some(s)], 1);
        assert_eq!(call(&mut redis, &[&by_script]), [Value::Int(1)]);
        assert_eq!(conditional_call(&mut redis, &conditional), [Value::Int(1)]);
        assert_eq!(redis.get("s"), script_written[0]);
        assert_eq!(redis.get("c"), written[0]);
        assert_eq!(redis.expiry("c"), redis.expiry("s"));
        assert_eq!(redis.expiry("c"), pxat(&s) as i64);
        // Sent again (its reply lost): its own value found, 1, nothing changed.
        let before = held(&mut redis, "c");
        assert_eq!(conditional_call(&mut redis, &conditional), [Value::Int(1)]);
        assert_as_before(&before, &held(&mut redis, "c"));
        // Another writer expecting what is no longer there: nothing written, the value returned.
        let (other, _) = group(&["c"], &[Some(old)], &[Some(state(120, 9))], 7);
        let reply = conditional_call(&mut redis, &other);
        assert_eq!(reply_of(reply), Some(written[0].clone()));
        assert_as_before(&before, &held(&mut redis, "c"));
        // An absent key stays absent, and the reply says it is.
        let (absent, _) = group(&["a"], &[Some(old)], &[Some(s)], 8);
        let reply = conditional_call(&mut redis, &absent);
        assert_eq!(reply, call(&mut redis, &[&absent]), "as the script answers");
        assert_eq!(reply_of(reply), Some(None));
        assert_eq!(held(&mut redis, "a"), (None, -2, -2));
    }

    /// A one-key compare-and-set that writes nothing (a denial: only checked) is a plain `GET`,
    /// on any server, answered as the script answers it: 1 when the key holds what was expected
    /// (nothing, or the value), else what it holds, nil included; a foreign empty value holds no
    /// state, as an absent key. Nothing is written either way.
    #[test]
    fn a_check_of_one_key_is_a_plain_get_answered_as_the_script_would() {
        let Some(mut redis) = server() else { return };
        for conditional_set in [false, true] {
            let cmd = group(&["k"], &[Some(b"1")], &[None], 1)
                .0
                .plain(conditional_set);
            let cmd = cmd.expect("a plain command");
            assert_eq!(cmd.args_iter().count(), 2, "GET k");
        }
        let old: &[u8] = b"3:1;b.4;99999999999";
        redis.set("held", old, None);
        redis.set("empty", b"", None);
        let cases: [(&str, Option<&[u8]>); 6] = [
            ("held", Some(old)),
            ("held", Some(b"3:1;b.4;1")),
            ("held", None),
            ("absent", None),
            ("absent", Some(old)),
            ("empty", None),
        ];
        for (i, (key, expected)) in cases.into_iter().enumerate() {
            let (check, _) = group(&[key], &[expected], &[None], i as u64);
            let before = held(&mut redis, key);
            let by_script = call(&mut redis, &[&check]);
            let plain = plain_call(&mut redis, &check);
            assert_eq!(plain, by_script, "{key} expecting {expected:?}");
            assert_as_before(&before, &held(&mut redis, key));
        }
        let (check, _) = group(&["held"], &[Some(old)], &[None], 9);
        assert_eq!(plain_call(&mut redis, &check), [Value::Int(1)]);
        let (check, _) = group(&["empty"], &[None], &[None], 9);
        assert_eq!(plain_call(&mut redis, &check), [Value::Int(1)]);
    }

    /// The probe tells a conditional `SET` apart and leaves nothing behind.
    #[test]
    fn the_probe_tells_a_conditional_set_apart_and_leaves_nothing() {
        let key = "p%conditional-set-probe";
        let probe = conditional_set_probe(key);
        let Some(mut redis) = server() else { return };
        let answer = probe.query::<Vec<Value>>(&mut redis.con);
        assert!(answer.is_err(), "Redis 7.0 has no SET … IFEQ: {answer:?}");
        let Some(mut valkey) = valkey() else { return };
        let replies: Vec<Value> = probe.query(&mut valkey.con).unwrap();
        assert!(conditional_set_answers(&replies), "{replies:?}");
        assert_eq!(held(&mut valkey, key), (None, -2, -2));
        // A server whose IFEQ answered nil where the condition failed would not pass, nor one
        // that created the absent key.
        let mut otherwise = replies.clone();
        otherwise[1] = Value::Nil;
        assert!(!conditional_set_answers(&otherwise));
        let mut created = replies;
        created[6] = Value::Int(1);
        assert!(!conditional_set_answers(&created));
    }

    #[test]
    fn only_one_key_expected_absent_with_a_state_to_write_or_only_checked_goes_as_a_plain_command()
    {
        let s = state(60, 1);
        assert!(
            group(&["k"], &[None], &[Some(s)], 1)
                .0
                .plain(false)
                .is_some()
        );
        assert!(
            group(&["k"], &[Some(b"1;a.1;5")], &[Some(s)], 1)
                .0
                .plain(false)
                .is_none()
        );
        let gone = State { a: 1, b: 0 };
        assert!(
            group(&["k"], &[None], &[Some(gone)], 1)
                .0
                .plain(false)
                .is_none(),
            "a delete"
        );
        let two = group(&["k", "l"], &[None, None], &[Some(s), Some(s)], 1).0;
        assert!(two.plain(false).is_none());
    }

    /// The plain command answers as the script does: it writes an absent key with the same value
    /// and expiry, leaves a held one exactly as it was and returns it, and a resend whose first
    /// attempt landed answers 1.
    #[test]
    fn a_plain_compare_and_set_answers_and_leaves_what_the_script_would() {
        let Some(mut redis) = server() else { return };
        let s = state(60, 2);
        let (by_script, script_written) = group(&["s"], &[None], &[Some(s)], 1);
        let (plain, written) = group(&["p"], &[None], &[Some(s)], 1);
        assert_eq!(call(&mut redis, &[&by_script]), [Value::Int(1)]);
        assert_eq!(plain_call(&mut redis, &plain), [Value::Int(1)]);
        assert_eq!(redis.get("s"), script_written[0]);
        assert_eq!(redis.get("p"), written[0]);
        assert_eq!(redis.expiry("p"), redis.expiry("s"));
        assert_eq!(redis.expiry("p"), pxat(&s) as i64);
        // Sent again (its reply lost): its own value found, 1, nothing changed.
        let before = held(&mut redis, "p");
        assert_eq!(plain_call(&mut redis, &plain), [Value::Int(1)]);
        assert_as_before(&before, &held(&mut redis, "p"));
        // Another writer expecting it absent: nothing written, the value held returned.
        let (other, _) = group(&["p"], &[None], &[Some(state(120, 9))], 7);
        let reply = plain_call(&mut redis, &other);
        assert_eq!(reply_of(reply), Some(written[0].clone()));
        assert_as_before(&before, &held(&mut redis, "p"));
        // A foreign value without an expiry keeps none.
        redis.set("f", b"junk", None);
        let (other, _) = group(&["f"], &[None], &[Some(state(1, 1))], 8);
        assert_eq!(
            reply_of(plain_call(&mut redis, &other)),
            Some(Some(b"junk".to_vec()))
        );
        assert_eq!(held(&mut redis, "f"), (Some(b"junk".to_vec()), -1, -1));
        // A foreign empty value: `SET … NX` does not write over it and returns it; the next
        // attempt, expecting it, goes by script, which writes over it as over an absent key.
        redis.set("e", b"", None);
        let (other, _) = group(&["e"], &[None], &[Some(state(1, 1))], 9);
        assert_eq!(
            reply_of(plain_call(&mut redis, &other)),
            Some(Some(Vec::new()))
        );
        assert_eq!(held(&mut redis, "e"), (Some(Vec::new()), -1, -1));
        let s = state(60, 1);
        let (again, written) = group(&["e"], &[Some(b"")], &[Some(s)], 10);
        assert!(again.plain(false).is_none() && again.plain(true).is_none());
        assert_eq!(call(&mut redis, &[&again]), [Value::Int(1)]);
        assert_eq!(held(&mut redis, "e").0, written[0]);
        assert_eq!(redis.expiry("e"), pxat(&s) as i64);
    }

    /// A key holding an empty value (no instance writes one) matches a compare-and-set that
    /// expects it absent, in each branch of the script: a check, and two keys written together.
    #[test]
    fn the_script_takes_an_empty_value_for_an_absent_key() {
        let Some(mut redis) = server() else { return };
        redis.set("e1", b"", None);
        redis.set("e2", b"", None);
        let (check, _) = group(&["e1"], &[None], &[None], 1);
        assert_eq!(call(&mut redis, &[&check]), [Value::Int(1)]);
        assert_eq!(redis.get("e1"), Some(Vec::new()), "a check writes nothing");
        let (both, written) = group(
            &["e1", "e2"],
            &[Some(b""), None],
            &[Some(state(60, 1)), Some(state(60, 2))],
            2,
        );
        assert_eq!(call(&mut redis, &[&both]), [Value::Int(1)]);
        assert_eq!(redis.get("e1"), written[0]);
        assert_eq!(redis.get("e2"), written[1]);
    }

    #[test]
    fn the_write_probe_writes_its_key_until_its_expiry_and_leaves_a_foreign_value_as_it_was() {
        let Some(mut redis) = server() else { return };
        let later = now() / 1_000_000 + 60_000;
        let probe = write_probe("p", later);
        for _ in 0..2 {
            assert_eq!(redis.run(&probe), Value::Int(1));
            assert_eq!(
                held(&mut redis, "p").0.as_deref(),
                Some(PROBE_VALUE.as_bytes())
            );
            assert_eq!(redis.expiry("p"), later as i64);
        }
        assert_eq!(decode(PROBE_VALUE.as_bytes()), None, "no state");
        // Written, so a Redis refusing writes refuses it; what it replaced is put back.
        redis.set("p", b"theirs", None);
        let theirs = Value::Array(vec![Value::BulkString(b"theirs".to_vec())]);
        assert_eq!(redis.run(&probe), Value::Array(vec![theirs]));
        assert_eq!(held(&mut redis, "p"), (Some(b"theirs".to_vec()), -1, -1));
    }

    #[test]
    fn a_mismatch_on_an_absent_key_leaves_it_absent() {
        let Some(mut redis) = server() else { return };
        let (b, _) = group(
            &["k"],
            &[Some(b"5;a.1;99999999999")],
            &[Some(state(60, 1))],
            1,
        );
        let reply = call(&mut redis, &[&b]);
        assert_eq!(reply, [Value::Array(vec![Value::Nil])]);
        assert_eq!(reply_of(reply), Some(None));
        assert_eq!(held(&mut redis, "k"), (None, -2, -2));
    }

    #[test]
    fn a_value_without_its_expiry_is_put_back_never_to_expire_earlier() {
        let Some(mut redis) = server() else { return };
        let later = now() / 1_000_000 + 3_600_000;
        // An older version's value (no expiry in it) with a TTL; another with none; foreign
        // values whose last part is no usable PXAT (zero, too long, not digits).
        let cases: [(&[u8], Option<u64>); 6] = [
            (b"5:1;ab.7", Some(later)),
            (b"5:1;ab.7", None),
            (b"5:1;ab.7;0", Some(later)),
            (b"5:1;ab.7;1234567890123456", Some(later)),
            (b"5:1;ab.7;12x", Some(later)),
            (b"junk", Some(later)),
        ];
        for (i, (value, ttl)) in cases.into_iter().enumerate() {
            let key = format!("legacy{i}");
            redis.set(&key, value, ttl);
            let (b, _) = group(&[&key], &[None], &[Some(state(1, 1))], i as u64);
            let reply = call(&mut redis, &[&b]);
            assert_eq!(reply_of(reply), Some(Some(value.to_vec())), "{key}");
            let (after, expiry, _) = held(&mut redis, &key);
            assert_eq!(after.as_deref(), Some(value), "{key}");
            // No expiry at all: never earlier than before. The next compare-and-set on it that
            // writes gives it one.
            assert_eq!(expiry, -1, "{key}");
        }
        let (b, written) = group(&["legacy0"], &[Some(b"5:1;ab.7")], &[Some(state(60, 1))], 9);
        assert_eq!(call(&mut redis, &[&b]), [Value::Int(1)]);
        assert_eq!(redis.get("legacy0"), written[0]);
        assert!(redis.expiry("legacy0") > 0);
    }

    #[test]
    fn compare_and_sets_sharing_a_call_stay_each_all_or_nothing() {
        let Some(mut redis) = server() else { return };
        let s = state(60, 1);
        let (first, held_x) = group(&["x"], &[None], &[Some(s)], 1);
        assert_eq!(call(&mut redis, &[&first]), [Value::Int(1)]);
        let before_x = held(&mut redis, "x");
        // One key that mismatches, one that writes, two keys (the GET-then-SET path) of which one
        // mismatches, two keys that write, and a verify-only one that holds.
        let (bad, _) = group(&["x"], &[None], &[Some(state(90, 2))], 2);
        let (good, good_written) = group(&["y"], &[None], &[Some(state(90, 3))], 2);
        let (pair_bad, _) = group(
            &["x", "z"],
            &[Some(b"1;b.1;99999999999"), None],
            &[Some(state(90, 4)), Some(state(90, 4))],
            2,
        );
        let (pair, pair_written) = group(
            &["p", "q"],
            &[None, None],
            &[Some(state(90, 5)), Some(state(90, 5))],
            2,
        );
        let (check, _) = group(&["x"], &[held_x[0].as_deref()], &[None], 2);
        let reply = call(&mut redis, &[&bad, &good, &pair_bad, &pair, &check]);
        let x = Value::BulkString(held_x[0].clone().unwrap());
        assert_eq!(
            reply,
            [
                Value::Array(vec![x.clone()]),
                Value::Int(1),
                Value::Array(vec![x, Value::Nil]),
                Value::Int(1),
                Value::Int(1),
            ]
        );
        assert_as_before(&before_x, &held(&mut redis, "x"));
        assert_eq!(redis.get("y"), good_written[0]);
        assert_eq!(held(&mut redis, "z"), (None, -2, -2));
        assert_eq!(redis.get("p"), pair_written[0]);
        assert_eq!(redis.get("q"), pair_written[1]);
        for key in ["y", "p", "q"] {
            let (value, expiry, _) = held(&mut redis, key);
            assert_eq!(Some(expiry), value.as_deref().and_then(expiry_in), "{key}");
        }
    }
}
