//! The one reader of a Prometheus `/metrics` page for every test: fetch it, read a series, sum a
//! metric over its label sets.

/// The `/metrics` page at `url`.
pub async fn scrape(url: &str) -> String {
    reqwest::get(url)
        .await
        .expect("GET /metrics")
        .text()
        .await
        .expect("a /metrics body")
}

/// The value of the sample line `series value`, where `series` is a metric name alone or a name
/// with its labels as the page writes them (`name{a="b"}`); `None` when absent.
pub fn value(page: &str, series: &str) -> Option<f64> {
    page.lines()
        .filter(|l| !l.starts_with('#'))
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' '))
        .map(|v| v.trim().parse().expect("a sample value is a number"))
}

/// `value` as a count: 0 when absent.
pub fn count(page: &str, series: &str) -> u64 {
    value(page, series).map_or(0, |v| v as u64)
}

/// The count of `name{labels}` (0 when absent).
pub fn labelled(page: &str, name: &str, labels: &str) -> u64 {
    count(page, &format!("{name}{{{labels}}}"))
}

/// The sum of a metric's samples over all its label sets (0 if absent).
pub fn sum(page: &str, name: &str) -> f64 {
    page.lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| {
            let rest = l.strip_prefix(name)?;
            (rest.starts_with(' ') || rest.starts_with('{')).then_some(l)
        })
        .filter_map(|l| l.rsplit_once(' ')?.1.parse::<f64>().ok())
        .sum()
}

/// The count of one series on the page at `url` (0 when absent).
pub async fn scrape_count(url: &str, series: &str) -> u64 {
    count(&scrape(url).await, series)
}
