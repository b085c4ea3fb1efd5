//! Credentials out of messages: an address that may carry a password (`REDIS_URL`'s
//! `redis://user:pass@host`, a reference setting echoed in a warning) is written with the password
//! replaced by `***` wherever a message repeats it. Pure.

/// What stands in for a password.
pub(crate) const HIDDEN: &str = "***";

/// `text` with the password of every `user:password@` (or bare `password@`) before a host, and
/// of a `pass=`/`password=` query parameter, replaced by `HIDDEN`; the user name is kept, it
/// helps find the setting at fault. Each comma-separated part (a cluster's seed list, a sentinel
/// list) is treated on its own. Text without credentials comes back as it is.
///
/// ```
/// use ratelimit_core::redact::credentials;
/// assert_eq!(credentials("redis://default:s3cret@h:6379/0"), "redis://default:***@h:6379/0");
/// assert_eq!(credentials("rediss://:pw@a:1,rediss://:pw@b:2"), "rediss://:***@a:1,rediss://:***@b:2");
/// assert_eq!(credentials("127.0.0.1:6379"), "127.0.0.1:6379");
/// ```
pub fn credentials(text: &str) -> String {
    text.split(',').map(part).collect::<Vec<_>>().join(",")
}

fn part(text: &str) -> String {
    let (address, query) = match text.split_once('?') {
        Some((address, query)) => (address, Some(query)),
        None => (text, None),
    };
    // Credentials sit between `scheme://` (or the start) and the last `@`; a password may hold
    // any character, `/` included, so nothing before that `@` is trusted to end them.
    let start = address.find("://").map_or(0, |i| i + 3);
    let mut out = String::with_capacity(text.len());
    match address[start..].rfind('@') {
        None => out.push_str(address),
        Some(at) => {
            let at = start + at;
            out.push_str(&address[..start]);
            if let Some((user, _)) = address[start..at].split_once(':') {
                out.push_str(user);
                out.push(':');
            }
            out.push_str(HIDDEN);
            out.push_str(&address[at..]);
        }
    }
    if let Some(query) = query {
        out.push('?');
        let params: Vec<String> = query
            .split('&')
            .map(|param| match param.split_once('=') {
                Some((name, _)) if is_password(name) => format!("{name}={HIDDEN}"),
                _ => param.to_owned(),
            })
            .collect();
        out.push_str(&params.join("&"));
    }
    out
}

/// Query parameters that carry a password (`redis+unix:///path?pass=…`).
fn is_password(name: &str) -> bool {
    ["pass", "password"]
        .iter()
        .any(|p| name.eq_ignore_ascii_case(p))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn passwords_are_hidden_and_the_rest_is_kept() {
        for (text, shown) in [
            (
                "redis://default:s3cret@bad host:6379",
                "redis://default:***@bad host:6379",
            ),
            ("redis://:pw@h:1/2", "redis://:***@h:1/2"),
            ("redis://pw@h:1", "redis://***@h:1"),
            ("u:p@ss:w0rd@h:1", "u:***@h:1"),
            ("redis://u:p/w@h:1/0", "redis://u:***@h:1/0"),
            (
                "redis+unix:///run/redis.sock?db=1&pass=s3cret",
                "redis+unix:///run/redis.sock?db=1&pass=***",
            ),
            (
                "unix:///r.sock?PASSWORD=s3cret",
                "unix:///r.sock?PASSWORD=***",
            ),
            (
                "mymaster,u:pw@s1:26379,s2:26379",
                "mymaster,u:***@s1:26379,s2:26379",
            ),
            ("h:6379", "h:6379"),
            ("", ""),
            ("@", "***@"),
        ] {
            assert_eq!(credentials(text), shown, "{text}");
            assert!(!credentials(text).contains("s3cret"));
        }
    }
}
