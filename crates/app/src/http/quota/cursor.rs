//! A listing's cursor: where the next page starts, opaque to clients (hex of a small JSON, which
//! they must pass back as it is). For the memory store, the last counter of the page; for Redis,
//! the `SCAN` cursor of the step the page ended in and the last key taken from that step (a step
//! is read again from its cursor and what came before that key skipped).

use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "s", rename_all = "snake_case")]
pub(super) enum Cursor {
    /// Memory: after this counter (entries as counted, slot, algorithm code, period).
    Memory {
        after: (Vec<(String, String)>, usize, u8, u64),
    },
    /// Redis: from this `SCAN` cursor, after this key of its step (none: from its start).
    Redis { scan: u64, after: Option<String> },
}

impl Cursor {
    pub(super) fn encode(&self) -> String {
        let json = serde_json::to_vec(self).unwrap_or_default();
        let mut out = String::with_capacity(json.len() * 2);
        for b in json {
            out.push_str(&format!("{b:02x}"));
        }
        out
    }

    pub(super) fn decode(text: &str) -> Result<Cursor, String> {
        let bad =
            || "invalid cursor: pass back the next_cursor of the previous page as it is".to_owned();
        if !text.len().is_multiple_of(2) || !text.is_ascii() {
            return Err(bad());
        }
        let bytes: Option<Vec<u8>> = (0..text.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&text[i..i + 2], 16).ok())
            .collect();
        serde_json::from_slice(&bytes.ok_or_else(bad)?).map_err(|_| bad())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cursor_reads_back_and_garbage_is_refused() {
        for c in [
            Cursor::Redis {
                scan: 17,
                after: Some("rl:d|k=v|0.1.60s".into()),
            },
            Cursor::Memory {
                after: (vec![("k".into(), "ü".into())], 1, 2, 60),
            },
        ] {
            assert_eq!(Cursor::decode(&c.encode()), Ok(c));
        }
        for bad in ["", "zz", "7b", "7b7d", "é"] {
            assert!(Cursor::decode(bad).is_err(), "{bad}");
        }
    }
}
