//! Wildcard values: `*` matches zero or more characters, at any position, as in envoyproxy/ratelimit.

/// A compiled wildcard pattern such as `/v1/*`, `*.example.com` or `/a/*/b`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pattern {
    text: String,
    parts: Vec<String>,
}

impl Pattern {
    /// Whether a configured value is a wildcard pattern.
    pub(crate) fn is_pattern(value: &str) -> bool {
        value.contains('*')
    }

    pub(crate) fn new(text: &str) -> Pattern {
        Pattern {
            text: text.to_owned(),
            parts: text.split('*').map(str::to_owned).collect(),
        }
    }

    pub fn as_str(&self) -> &str {
        &self.text
    }

    /// Whether `value` matches: the text between stars must appear in order, the first part as a
    /// prefix and the last as a suffix. Linear in the value's length per part; no backtracking.
    pub(crate) fn matches(&self, value: &str) -> bool {
        let (first, rest) = match self.parts.split_first() {
            Some(split) => split,
            None => return value.is_empty(),
        };
        let Some(mut remaining) = value.strip_prefix(first.as_str()) else {
            return false;
        };
        let Some((last, middle)) = rest.split_last() else {
            return remaining.is_empty();
        };
        for part in middle {
            match remaining.find(part.as_str()) {
                Some(at) => remaining = &remaining[at + part.len()..],
                None => return false,
            }
        }
        remaining.len() >= last.len() && remaining.ends_with(last.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn m(p: &str, v: &str) -> bool {
        Pattern::new(p).matches(v)
    }

    #[test]
    fn trailing_leading_and_inner_stars() {
        assert!(m("/v1/*", "/v1/search"));
        assert!(m("/v1/*", "/v1/"));
        assert!(!m("/v1/*", "/v2/search"));
        assert!(m("*.example.com", "api.example.com"));
        assert!(!m("*.example.com", "example.org"));
        assert!(m("/a/*/b", "/a/x/y/b"));
        assert!(!m("/a/*/b", "/a/b"));
        assert!(m("*", ""));
        assert!(m("a*b*c", "abc"));
        assert!(m("a*b*c", "a-b-b-c"));
        assert!(!m("a*b*c", "acb"));
        assert!(!m("ab*ba", "aba"), "prefix and suffix may not overlap");
    }
}
