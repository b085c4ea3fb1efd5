//! A call's deadline, from its `grpc-timeout` header (gRPC over HTTP/2: at most eight digits and
//! a unit, `H` `M` `S` `m` `u` `n`; Envoy sends its filter's timeout there), and the answer of a
//! call that outlives it. A header that does not parse is ignored, as tonic's server ignores it.

use std::future::Future;
use std::time::Duration;

use tonic::Status;
use tonic::codegen::http;

/// The header's name.
const GRPC_TIMEOUT: &str = "grpc-timeout";

/// The deadline the caller asked for, if it asked for one that parses.
pub(crate) fn requested(headers: &http::HeaderMap) -> Option<Duration> {
    parse(headers.get(GRPC_TIMEOUT)?.as_bytes())
}

fn parse(value: &[u8]) -> Option<Duration> {
    let (&unit, digits) = value.split_last()?;
    if digits.is_empty() || digits.len() > 8 || !digits.iter().all(u8::is_ascii_digit) {
        return None;
    }
    let n = digits
        .iter()
        .fold(0u64, |n, digit| n * 10 + u64::from(digit - b'0'));
    Some(match unit {
        b'H' => Duration::from_secs(n * 3600),
        b'M' => Duration::from_secs(n * 60),
        b'S' => Duration::from_secs(n),
        b'm' => Duration::from_millis(n),
        b'u' => Duration::from_micros(n),
        b'n' => Duration::from_nanos(n),
        _ => return None,
    })
}

/// `call`'s response, or DEADLINE_EXCEEDED once `deadline` (if any) has passed; the call is then
/// dropped, as a call its client cancels.
///
/// A plain function returning either `call` or `call` under a timeout, not an `async fn`: an
/// `async fn` keeps its argument's slot beside the timeout it is moved into, so each call's boxed
/// future was twice the size of the call's (4,392 bytes, all copied into a fresh allocation per
/// call; docs/cost-per-decision.md "A future twice its size").
pub(crate) fn within<B: Default, E>(
    deadline: Option<Duration>,
    call: impl Future<Output = Result<http::Response<B>, E>>,
) -> impl Future<Output = Result<http::Response<B>, E>> {
    use futures_util::FutureExt;
    use futures_util::future::Either;
    match deadline {
        None => Either::Left(call),
        Some(deadline) => Either::Right(tokio::time::timeout(deadline, call).map(|outcome| {
            outcome.unwrap_or_else(|_| {
                Ok(
                    Status::deadline_exceeded("the call's deadline (grpc-timeout) passed")
                        .into_http(),
                )
            })
        })),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_unit_is_read() {
        let cases: [(&str, Duration); 6] = [
            ("2H", Duration::from_secs(7200)),
            ("3M", Duration::from_secs(180)),
            ("20S", Duration::from_secs(20)),
            ("20m", Duration::from_millis(20)),
            ("150u", Duration::from_micros(150)),
            ("99999999n", Duration::from_nanos(99_999_999)),
        ];
        for (value, expected) in cases {
            assert_eq!(parse(value.as_bytes()), Some(expected), "{value}");
        }
    }

    #[test]
    fn the_largest_value_does_not_overflow() {
        assert_eq!(
            parse(b"99999999H"),
            Some(Duration::from_secs(99_999_999 * 3600))
        );
    }

    #[test]
    fn malformed_values_are_ignored() {
        for value in [
            "",
            "m",
            "20",
            "20x",
            "-1m",
            "1.5S",
            "123456789m",
            " 20m",
            "20m ",
            "２0m",
        ] {
            assert_eq!(parse(value.as_bytes()), None, "{value:?}");
        }
    }

    #[test]
    fn the_header_is_read_from_a_request() {
        let mut headers = http::HeaderMap::new();
        assert_eq!(requested(&headers), None);
        headers.insert(GRPC_TIMEOUT, http::HeaderValue::from_static("20m"));
        assert_eq!(requested(&headers), Some(Duration::from_millis(20)));
    }

    #[tokio::test]
    async fn a_call_past_its_deadline_is_answered_deadline_exceeded() {
        let never = std::future::pending::<Result<http::Response<()>, ()>>();
        let response = within(Some(Duration::from_millis(1)), never).await.unwrap();
        let status = Status::from_header_map(response.headers()).expect("a status");
        assert_eq!(status.code(), tonic::Code::DeadlineExceeded);
    }

    #[tokio::test]
    async fn a_call_within_its_deadline_or_without_one_is_answered_as_it_ends() {
        for deadline in [None, Some(Duration::from_secs(3600))] {
            let answered = async { Ok::<_, ()>(http::Response::new(())) };
            let response = within(deadline, answered).await.unwrap();
            assert!(Status::from_header_map(response.headers()).is_none());
        }
    }

    /// The bound adds a timer to the call's future, not a second copy of the call: as an `async
    /// fn` it held the call twice (its argument's slot and the timeout's), and every call's boxed
    /// future was copied whole into a fresh allocation.
    #[tokio::test]
    async fn a_bounded_call_is_held_once() {
        let state = [0u8; 2048];
        let call = async move {
            std::future::pending::<()>().await;
            Ok::<_, ()>(http::Response::new(state.len()))
        };
        let call_size = std::mem::size_of_val(&call);
        assert!(call_size >= 2048);
        let bounded = within(Some(Duration::from_secs(1)), call);
        let size = std::mem::size_of_val(&bounded);
        assert!(
            size < call_size + 256,
            "{size} bytes for a call of {call_size}"
        );
    }
}
