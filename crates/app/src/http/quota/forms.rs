//! The quota API's JSON bodies and query strings, read and checked before anything changes: a
//! descriptor's entries as in `/json` (`[{"key": K, "value": V}, …]`), an override's limit and
//! TTL, a listing's prefix. Unknown fields are refused, so a typo is a 400, not a silent default.

use serde::Deserialize;

use ratelimit_core::overrides::{self, OverrideUnit};

/// One entry as `/json` writes it.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct EntryForm {
    key: String,
    #[serde(default)]
    value: String,
}

/// `{"domain", "entries"}`: `POST /v1/reset`, `DELETE /v1/overrides`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct DescriptorForm {
    pub(super) domain: String,
    entries: Vec<EntryForm>,
}

/// `PUT /v1/overrides`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct OverrideForm {
    pub(super) domain: String,
    entries: Vec<EntryForm>,
    pub(super) limit: LimitForm,
    pub(super) ttl_seconds: u64,
}

/// `{"unit": "minute", "requests_per_unit": N}`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct LimitForm {
    pub(super) unit: OverrideUnit,
    pub(super) requests_per_unit: u32,
}

fn pairs(entries: &[EntryForm]) -> Vec<(String, String)> {
    entries
        .iter()
        .map(|e| (e.key.clone(), e.value.clone()))
        .collect()
}

/// A body that names a descriptor: its entries, checked (`max_len`: the server's
/// `MAX_STRING_LEN`).
pub(super) trait WithEntries {
    fn entries(&self, max_len: usize) -> Result<Vec<(String, String)>, String>;
}

impl WithEntries for DescriptorForm {
    fn entries(&self, max_len: usize) -> Result<Vec<(String, String)>, String> {
        let entries = pairs(&self.entries);
        overrides::check(&self.domain, &entries, None, max_len)?;
        Ok(entries)
    }
}

impl WithEntries for OverrideForm {
    /// The entries, checked with the TTL.
    fn entries(&self, max_len: usize) -> Result<Vec<(String, String)>, String> {
        let entries = pairs(&self.entries);
        overrides::check(&self.domain, &entries, Some(self.ttl_seconds), max_len)?;
        Ok(entries)
    }
}

/// Reads a JSON body as `T`; the message says where it is wrong.
pub(super) fn read<'a, T: Deserialize<'a>>(body: &'a [u8]) -> Result<T, String> {
    serde_json::from_slice(body).map_err(|e| format!("invalid body: {e}"))
}

/// A listing's `prefix`: a descriptor written as `/explain` writes it (`k=v,k2=v2`) whose last
/// value may be cut short (`k=v,k2=va` lists `k2=va…`), or whose last part is a key cut short
/// (`k=v,k2` or `ten`). Empty: every counter of the domain.
pub(super) fn prefix(text: &str) -> Result<Vec<(String, Option<String>)>, String> {
    if text.is_empty() {
        return Ok(Vec::new());
    }
    let parts: Vec<&str> = text.split(',').collect();
    let last = parts.len() - 1;
    parts
        .iter()
        .enumerate()
        .map(|(i, part)| match part.split_once('=') {
            Some((k, v)) => Ok((k.to_owned(), Some(v.to_owned()))),
            None if i == last => Ok(((*part).to_owned(), None)),
            None => Err(format!(
                "'{part}' is not key=value (in prefix '{text}'; only the last part may be a key \
                 alone)"
            )),
        })
        .collect()
}

/// Whether entries `entries` (as counted) begin with `start` ([`prefix`]'s form).
pub(super) fn starts_with(
    entries: &[(String, String)],
    start: &[(String, Option<String>)],
) -> bool {
    if start.len() > entries.len() {
        return false;
    }
    let last = start.len().saturating_sub(1);
    start
        .iter()
        .zip(entries)
        .enumerate()
        .all(|(i, ((k, v), (ek, ev)))| {
            if i < last {
                v.as_deref() == Some(ev.as_str()) && k == ek
            } else {
                match v {
                    Some(v) => k == ek && ev.starts_with(v.as_str()),
                    None => ek.starts_with(k.as_str()),
                }
            }
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn e(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    #[test]
    fn prefixes_match_whole_entries_then_a_cut_short_value_or_key() {
        let entries = e(&[("tenant", "acme"), ("user", "u1")]);
        for yes in [
            "",
            "ten",
            "tenant",
            "tenant=",
            "tenant=ac",
            "tenant=acme,us",
            "tenant=acme,user=u1",
        ] {
            assert!(starts_with(&entries, &prefix(yes).unwrap()), "{yes}");
        }
        for no in [
            "user",
            "tenant=b",
            "tenant=ac,user",
            "tenant=acme,user=u2",
            "tenant=acme,user=u1,x",
        ] {
            assert!(!starts_with(&entries, &prefix(no).unwrap()), "{no}");
        }
        assert!(prefix("tenant,user=x").is_err());
    }

    #[test]
    fn bodies_are_read_strictly() {
        let ok: OverrideForm = read(
            br#"{"domain":"d","entries":[{"key":"k","value":"v"}],"limit":{"unit":"MINUTE","requests_per_unit":5},"ttl_seconds":60}"#,
        )
        .unwrap();
        assert_eq!(ok.entries(100).unwrap(), e(&[("k", "v")]));
        for bad in [
            &br#"{"domain":"d","entries":[],"limit":{"unit":"minute","requests_per_unit":5},"ttl_seconds":60}"#[..],
            br#"{"domain":"d","entries":[{"key":"k"}],"limit":{"unit":"fortnight","requests_per_unit":5},"ttl_seconds":60}"#,
            br#"{"domain":"d","entries":[{"key":"k"}],"limit":{"unit":"minute","requests_per_unit":-1},"ttl_seconds":60}"#,
            br#"{"domain":"d","entries":[{"key":"k"}],"limit":{"unit":"minute","requests_per_unit":5},"ttl_seconds":0}"#,
            br#"{"domain":"d","entries":[{"key":"k"}],"limit":{"unit":"minute","requests_per_unit":5}}"#,
            br#"{"domain":"d","entries":[{"key":"k"}],"limit":{"unit":"minute","requests_per_unit":5},"ttl_seconds":60,"x":1}"#,
            b"not json",
        ] {
            let form: Result<OverrideForm, String> = read(bad);
            let checked = form.and_then(|f| f.entries(100));
            assert!(checked.is_err(), "{}", String::from_utf8_lossy(bad));
        }
        let reset: DescriptorForm =
            read(br#"{"domain":"d","entries":[{"key":"k","value":"v"}]}"#).unwrap();
        assert_eq!(reset.entries(100).unwrap(), e(&[("k", "v")]));
    }
}
