//! A decision as the answering thread leaves it for the writer: a small binary frame (the time,
//! the answer's codes, the request in protobuf, as it came over the wire), cheap to write (one
//! prost encode, no allocation) and read back whole by the writer, which turns it into the JSON
//! line. Pure.
//!
//! Layout, little-endian: `u32` length of the rest · `u64` time (Unix ns) · `i32` overall code
//! (`REFUSED` when the engine refused the request) · `u32` status count n · n × `i32` status
//! codes · the request's protobuf encoding.

use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use prost::Message;

use ratelimit_core::clock::Nanos;
use ratelimit_core::wire::record::{Answer, Decided};

/// The overall code of a refused request (no answer): not a code the protocol has.
const REFUSED: i32 = i32::MIN;

/// Appends the frame of one decision to `out`.
pub(super) fn write(
    time: Nanos,
    request: &RateLimitRequest,
    response: Option<&RateLimitResponse>,
    out: &mut Vec<u8>,
) {
    let statuses = response.map_or(&[][..], |r| &r.statuses[..]);
    let start = out.len();
    // The length is written once the request's encoding is there.
    out.extend_from_slice(&[0; 4]);
    out.extend_from_slice(&time.to_le_bytes());
    out.extend_from_slice(&response.map_or(REFUSED, |r| r.overall_code).to_le_bytes());
    out.extend_from_slice(&(statuses.len() as u32).to_le_bytes());
    for status in statuses {
        out.extend_from_slice(&status.code.to_le_bytes());
    }
    // Encoding into a Vec cannot run out of room.
    let _ = request.encode(out);
    let rest = (out.len() - start - 4) as u32;
    out[start..start + 4].copy_from_slice(&rest.to_le_bytes());
}

/// Reads the frames of `bytes` in order; each is handed to `each` as the decision it holds.
/// `request` is reused from frame to frame. A frame that does not read (which only a bug can
/// make) ends the reading and is reported, with the frames after it, as `Err(frames left)`.
pub(super) fn read_all(
    mut bytes: &[u8],
    request: &mut RateLimitRequest,
    mut each: impl FnMut(&Decided<'_>),
) -> Result<(), usize> {
    let mut left = 0;
    while !bytes.is_empty() {
        let Some((decided, rest)) = read_one(bytes, request) else {
            left += 1;
            break;
        };
        each(&Decided {
            time: decided.0,
            request,
            answer: decided.1,
        });
        bytes = rest;
    }
    if left > 0 { Err(left) } else { Ok(()) }
}

fn u32_at(bytes: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_le_bytes(bytes.get(at..at + 4)?.try_into().ok()?))
}

/// A frame's time and answer (its request is read into the caller's).
type Head = (Nanos, Option<Answer>);

/// Reads the first frame of `bytes`: its head, and the bytes after it.
fn read_one<'b>(bytes: &'b [u8], request: &mut RateLimitRequest) -> Option<(Head, &'b [u8])> {
    let len = usize::try_from(u32_at(bytes, 0)?).ok()?;
    let frame = bytes.get(4..4 + len)?;
    let time = u64::from_le_bytes(frame.get(0..8)?.try_into().ok()?);
    let code = u32_at(frame, 8)? as i32;
    let count = usize::try_from(u32_at(frame, 12)?).ok()?;
    let codes_end = 16usize.checked_add(count.checked_mul(4)?)?;
    let statuses = (0..count)
        .map(|i| u32_at(frame, 16 + 4 * i).map(|c| c as i32))
        .collect::<Option<_>>()?;
    request.clear();
    request.merge(frame.get(codes_end..)?).ok()?;
    let answer = (code != REFUSED).then_some(Answer { code, statuses });
    Some(((time, answer), &bytes[4 + len..]))
}

#[cfg(test)]
mod tests {
    use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::DescriptorStatus;

    use super::*;

    fn request(value: &str) -> RateLimitRequest {
        RateLimitRequest {
            hits_addend: 3,
            ..ratelimit_core::testing::request("edge", &[&[("remote_address", value)]])
        }
    }

    #[test]
    fn frames_read_back_as_the_decisions_written_in_order() {
        let answered = RateLimitResponse {
            overall_code: 2,
            statuses: vec![
                DescriptorStatus {
                    code: 1,
                    ..Default::default()
                },
                DescriptorStatus {
                    code: 2,
                    ..Default::default()
                },
            ],
            ..Default::default()
        };
        let written = [
            (5, request("10.0.0.1"), Some(&answered)),
            (u64::MAX, request(""), None),
            (0, RateLimitRequest::default(), Some(&answered)),
        ];
        let mut bytes = Vec::new();
        for (time, r, answer) in &written {
            write(*time, r, *answer, &mut bytes);
        }
        let mut read = Vec::new();
        let mut reused = request("stale");
        read_all(&bytes, &mut reused, |d| {
            read.push((d.time, d.request.clone(), d.answer.clone()));
        })
        .expect("whole frames");
        let expected: Vec<_> = written
            .iter()
            .map(|(t, r, a)| {
                let answer = a.map(|a| Answer {
                    code: a.overall_code,
                    statuses: a.statuses.iter().map(|s| s.code).collect(),
                });
                (*t, r.clone(), answer)
            })
            .collect();
        assert_eq!(read, expected);
    }

    #[test]
    fn a_broken_frame_ends_the_reading_and_is_reported() {
        let mut bytes = Vec::new();
        write(1, &request("a"), None, &mut bytes);
        let whole = bytes.len();
        write(2, &request("b"), None, &mut bytes);
        bytes.truncate(bytes.len() - 1);
        let mut seen = 0;
        let result = read_all(&bytes, &mut RateLimitRequest::default(), |_| seen += 1);
        assert_eq!((seen, result), (1, Err(1)));
        assert!(bytes.len() > whole);
    }
}
