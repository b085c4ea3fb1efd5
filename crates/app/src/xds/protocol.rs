//! The State-of-the-World exchange for the one resource type we subscribe to, as a pure state
//! machine: the request that opens a stream (carrying the last ACKed version, so a reconnect
//! resumes where it was), the ACK of an applied response (its version and nonce), and the NACK of
//! a refused one (the previous good version, the response's nonce, and `error_detail`).

use envoy_types::pb::envoy::config::core::v3::Node;
use envoy_types::pb::envoy::service::discovery::v3::{DiscoveryRequest, DiscoveryResponse};
use envoy_types::pb::google::rpc::Status;

use super::convert::TYPE_URL;

/// `google.rpc.Code.INVALID_ARGUMENT`, the code of a NACK's `error_detail`.
const INVALID_ARGUMENT: i32 = 3;

/// What was done with a response.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Verdict {
    /// Applied: the rules in force are the response's.
    Ack,
    /// Refused, with why: the previous rules stay in force.
    Nack(String),
}

/// One client's subscription: who we are and what we last accepted.
#[derive(Debug, Clone)]
pub(super) struct Subscription {
    node: Node,
    /// `version_info` of the last response ACKed ("" before any).
    acked_version: String,
}

impl Subscription {
    pub(super) fn new(node: Node) -> Subscription {
        Subscription {
            node,
            acked_version: String::new(),
        }
    }

    /// The version of the rules in force ("" before any came).
    pub(super) fn acked_version(&self) -> &str {
        &self.acked_version
    }

    fn request(&self, nonce: &str) -> DiscoveryRequest {
        DiscoveryRequest {
            version_info: self.acked_version.clone(),
            node: Some(self.node.clone()),
            type_url: TYPE_URL.to_owned(),
            response_nonce: nonce.to_owned(),
            ..Default::default()
        }
    }

    /// The first request of a new stream: every resource of the type (no names, SotW), with the
    /// version already held and no nonce (nonces are per stream).
    pub(super) fn subscribe(&self) -> DiscoveryRequest {
        self.request("")
    }

    /// A response of another type than the one subscribed to is refused without looking inside.
    pub(super) fn unexpected_type(response: &DiscoveryResponse) -> Option<String> {
        (response.type_url != TYPE_URL).then(|| {
            format!(
                "unexpected resource type '{}': subscribed to {TYPE_URL} only",
                response.type_url
            )
        })
    }

    /// The answer to `response` once `verdict` was reached: an ACK moves the version on; a NACK
    /// repeats the last good version and says why.
    pub(super) fn answer(
        &mut self,
        response: &DiscoveryResponse,
        verdict: &Verdict,
    ) -> DiscoveryRequest {
        match verdict {
            Verdict::Ack => {
                self.acked_version = response.version_info.clone();
                self.request(&response.nonce)
            }
            Verdict::Nack(why) => DiscoveryRequest {
                error_detail: Some(Status {
                    code: INVALID_ARGUMENT,
                    message: why.clone(),
                    details: Vec::new(),
                }),
                ..self.request(&response.nonce)
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node() -> Node {
        Node {
            id: "envoy-ratelimit".into(),
            ..Default::default()
        }
    }

    fn response(version: &str, nonce: &str) -> DiscoveryResponse {
        DiscoveryResponse {
            version_info: version.into(),
            nonce: nonce.into(),
            type_url: TYPE_URL.into(),
            ..Default::default()
        }
    }

    #[test]
    fn the_first_request_asks_for_every_resource_with_no_version() {
        let r = Subscription::new(node()).subscribe();
        assert_eq!(r.type_url, TYPE_URL);
        assert_eq!(r.node.map(|n| n.id).as_deref(), Some("envoy-ratelimit"));
        assert!(r.version_info.is_empty() && r.response_nonce.is_empty());
        assert!(r.resource_names.is_empty() && r.error_detail.is_none());
    }

    #[test]
    fn an_ack_carries_the_response_version_and_nonce() {
        let mut s = Subscription::new(node());
        let ack = s.answer(&response("v1", "n1"), &Verdict::Ack);
        assert_eq!(
            (ack.version_info.as_str(), ack.response_nonce.as_str()),
            ("v1", "n1")
        );
        assert!(ack.error_detail.is_none());
        assert_eq!(s.acked_version(), "v1");
    }

    #[test]
    fn a_nack_keeps_the_last_good_version_and_says_why() {
        let mut s = Subscription::new(node());
        s.answer(&response("v1", "n1"), &Verdict::Ack);
        let nack = s.answer(&response("v2", "n2"), &Verdict::Nack("bad unit".into()));
        assert_eq!(nack.version_info, "v1");
        assert_eq!(nack.response_nonce, "n2");
        let detail = nack.error_detail.unwrap();
        assert_eq!((detail.code, detail.message.as_str()), (3, "bad unit"));
        assert_eq!(s.acked_version(), "v1");
        // A NACK before any ACK has no version to repeat.
        let mut fresh = Subscription::new(node());
        let nack = fresh.answer(&response("v1", "n1"), &Verdict::Nack("x".into()));
        assert_eq!(nack.version_info, "");
    }

    #[test]
    fn a_new_stream_resumes_from_the_acked_version_without_a_nonce() {
        let mut s = Subscription::new(node());
        s.answer(&response("v7", "n3"), &Verdict::Ack);
        s.answer(&response("v8", "n4"), &Verdict::Nack("x".into()));
        let again = s.subscribe();
        assert_eq!(again.version_info, "v7");
        assert!(again.response_nonce.is_empty() && again.error_detail.is_none());
    }

    #[test]
    fn another_type_is_refused() {
        let mut r = response("v1", "n1");
        assert_eq!(Subscription::unexpected_type(&r), None);
        r.type_url = "type.googleapis.com/envoy.config.listener.v3.Listener".into();
        assert!(
            Subscription::unexpected_type(&r)
                .unwrap()
                .contains("Listener")
        );
    }
}
