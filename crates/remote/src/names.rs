//! How a remote backend is named to operators, all from its `Backend::NAME` (`redis`): its metric
//! series (`ratelimit_redis_…`, the `to="redis"` switch label), the word in logs and help texts
//! (`Redis`), and the prefix of its settings (`REDIS_FAILURE_MODE`, `REDIS_TIMEOUT`). So a second
//! remote backend gets its own names without an edit here.

/// A remote backend's names, derived once from its `Backend::NAME`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct RemoteName {
    /// In metric names and label values: `redis`.
    pub series: &'static str,
    /// In prose: `Redis`.
    pub title: String,
    /// Its settings' prefix, and the word shouted in a warning: `REDIS`.
    pub upper: String,
}

impl RemoteName {
    /// The names of the backend called `name` (lower case, as `Backend::NAME`).
    pub(crate) fn of(name: &'static str) -> RemoteName {
        let mut chars = name.chars();
        let title = chars
            .next()
            .map(|first| first.to_ascii_uppercase().to_string() + chars.as_str())
            .unwrap_or_default();
        RemoteName {
            series: name,
            title,
            upper: name.to_ascii_uppercase(),
        }
    }

    /// `template` with `{name}`, `{Name}` and `{NAME}` replaced by this backend's names.
    pub(crate) fn fill(&self, template: &str) -> String {
        template
            .replace("{name}", self.series)
            .replace("{Name}", &self.title)
            .replace("{NAME}", &self.upper)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_come_from_the_backend_name() {
        let name = RemoteName::of("redis");
        assert_eq!(name.title, "Redis");
        assert_eq!(name.upper, "REDIS");
        assert_eq!(
            name.fill("ratelimit_{name}_calls: {Name} is gone, {NAME}_TIMEOUT"),
            "ratelimit_redis_calls: Redis is gone, REDIS_TIMEOUT"
        );
    }
}
