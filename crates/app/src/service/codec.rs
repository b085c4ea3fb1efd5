//! The ShouldRateLimit codec: prost for the response; for the request, a scan of the protobuf wire
//! format that refuses more descriptors or entries than the request bounds allow *before* anything
//! is allocated for them, then prost. Malformed bytes are the caller's fault: INVALID_ARGUMENT,
//! not INTERNAL.

use bytes::Buf;
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use prost::Message;
use prost::encoding::{WireType, decode_key, decode_varint};
use tonic::Status;
use tonic::codec::{Codec, DecodeBuf, Decoder};
use tonic_prost::ProstEncoder;

use ratelimit_core::engine::{InvalidRequest, RequestBounds};

/// `RateLimitRequest.descriptors` and `RateLimitDescriptor.entries` field numbers.
const DESCRIPTORS_FIELD: u32 = 2;
const ENTRIES_FIELD: u32 = 1;

pub(crate) struct RequestCodec {
    bounds: RequestBounds,
}

impl RequestCodec {
    pub(crate) fn new(bounds: RequestBounds) -> Self {
        RequestCodec { bounds }
    }
}

impl Codec for RequestCodec {
    type Encode = RateLimitResponse;
    type Decode = RateLimitRequest;
    type Encoder = ProstEncoder<RateLimitResponse>;
    type Decoder = RequestDecoder;

    fn encoder(&mut self) -> Self::Encoder {
        ProstEncoder::default()
    }

    fn decoder(&mut self) -> Self::Decoder {
        RequestDecoder {
            bounds: self.bounds,
        }
    }
}

pub(crate) struct RequestDecoder {
    bounds: RequestBounds,
}

impl Decoder for RequestDecoder {
    type Item = RateLimitRequest;
    type Error = Status;

    fn decode(&mut self, buf: &mut DecodeBuf<'_>) -> Result<Option<RateLimitRequest>, Status> {
        // A message is buffered whole before it is decoded, so `chunk` is all of it.
        if buf.chunk().len() == buf.remaining() {
            check_counts(buf.chunk(), &self.bounds)
                .map_err(|e| Status::invalid_argument(e.to_string()))?;
        }
        RateLimitRequest::decode(buf)
            .map(Some)
            .map_err(|e| Status::invalid_argument(format!("malformed RateLimitRequest: {e}")))
    }
}

/// Counts descriptors and each descriptor's entries on the wire, without decoding. Wire errors
/// are left for prost to report.
pub(super) fn check_counts(message: &[u8], bounds: &RequestBounds) -> Result<(), InvalidRequest> {
    let mut descriptors = 0;
    let mut rest = message;
    while let Some((field, body)) = next_field(&mut rest) {
        if field != DESCRIPTORS_FIELD {
            continue;
        }
        let Some(mut descriptor) = body else { continue };
        if descriptors == bounds.max_descriptors {
            return Err(InvalidRequest::TooManyDescriptors {
                count: descriptors + 1 + count_field(rest, DESCRIPTORS_FIELD),
                max: bounds.max_descriptors,
            });
        }
        let mut entries = 0;
        while let Some((field, _)) = next_field(&mut descriptor) {
            if field == ENTRIES_FIELD {
                entries += 1;
            }
        }
        if entries > bounds.max_entries {
            return Err(InvalidRequest::TooManyEntries {
                index: descriptors,
                count: entries,
                max: bounds.max_entries,
            });
        }
        descriptors += 1;
    }
    Ok(())
}

/// How many times `field` occurs at the top level of `rest`.
fn count_field(mut rest: &[u8], field: u32) -> usize {
    let mut count = 0;
    while let Some((f, _)) = next_field(&mut rest) {
        count += usize::from(f == field);
    }
    count
}

/// Reads one field: its number and, for length-delimited fields, its bytes. `None` at the end of
/// the input or at the first malformed byte.
fn next_field<'a>(rest: &mut &'a [u8]) -> Option<(u32, Option<&'a [u8]>)> {
    if rest.is_empty() {
        return None;
    }
    let (field, wire_type) = decode_key(rest).ok()?;
    let body = match wire_type {
        WireType::Varint => {
            decode_varint(rest).ok()?;
            None
        }
        WireType::SixtyFourBit => {
            take(rest, 8)?;
            None
        }
        WireType::ThirtyTwoBit => {
            take(rest, 4)?;
            None
        }
        WireType::LengthDelimited => {
            let len = usize::try_from(decode_varint(rest).ok()?).ok()?;
            Some(take(rest, len)?)
        }
        WireType::StartGroup | WireType::EndGroup => return None,
    };
    Some((field, body))
}

fn take<'a>(rest: &mut &'a [u8], len: usize) -> Option<&'a [u8]> {
    if rest.len() < len {
        return None;
    }
    let (head, tail) = rest.split_at(len);
    *rest = tail;
    Some(head)
}

#[cfg(test)]
mod tests {
    use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
    use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;

    use super::*;

    fn request(descriptors: usize, entries: usize) -> Vec<u8> {
        RateLimitRequest {
            domain: "d".into(),
            descriptors: (0..descriptors)
                .map(|_| RateLimitDescriptor {
                    entries: (0..entries)
                        .map(|i| Entry {
                            key: format!("k{i}"),
                            value: "v".into(),
                        })
                        .collect(),
                    ..Default::default()
                })
                .collect(),
            hits_addend: 3,
        }
        .encode_to_vec()
    }

    #[test]
    fn counts_within_bounds_pass() {
        let bounds = RequestBounds::default();
        assert_eq!(check_counts(&request(64, 32), &bounds), Ok(()));
        assert_eq!(check_counts(&[], &bounds), Ok(()));
    }

    #[test]
    fn too_many_descriptors_are_refused_with_their_count() {
        let bounds = RequestBounds::default();
        assert_eq!(
            check_counts(&request(65, 1), &bounds),
            Err(InvalidRequest::TooManyDescriptors { count: 65, max: 64 })
        );
        // Two million empty descriptors: refused from the wire, with the same message as the
        // engine's own check.
        let empty = [0x12u8, 0x00].repeat(2_000_000);
        assert_eq!(
            check_counts(&empty, &bounds),
            Err(InvalidRequest::TooManyDescriptors {
                count: 2_000_000,
                max: 64
            })
        );
    }

    #[test]
    fn too_many_entries_are_refused_with_the_descriptor_index() {
        let bounds = RequestBounds::default();
        assert_eq!(
            check_counts(&request(2, 33), &bounds),
            Err(InvalidRequest::TooManyEntries {
                index: 0,
                count: 33,
                max: 32
            })
        );
    }

    #[test]
    fn malformed_bytes_are_left_to_prost_and_decode_as_invalid_argument() {
        let bounds = RequestBounds::default();
        for garbage in [
            &[0xffu8, 0xff, 0xff][..],
            &[0x12, 0x10, 0x01][..], // a descriptor longer than the message
            &[0x0a, 0x02, 0xc3, 0x28][..], // a domain that is not UTF-8
            &[0x0b][..],             // a group start
        ] {
            assert_eq!(check_counts(garbage, &bounds), Ok(()));
            assert!(RateLimitRequest::decode(garbage).is_err(), "{garbage:?}");
        }
    }
}
