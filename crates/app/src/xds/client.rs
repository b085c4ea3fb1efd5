//! The ADS client task: connect (TLS if asked), open `StreamAggregatedResources`, subscribe, and
//! for each response validate and swap the rules through the reloader, then ACK or NACK; when the
//! stream ends, keep the rules in force, wait (backoff) and resubscribe from the last ACKed
//! version. Every request and response is logged at info: the exchange is the audit trail. A
//! stream that goes unanswered is reported ([`Silence`]).

use std::sync::Arc;
use std::time::Duration;

use envoy_types::pb::envoy::service::discovery::v3::aggregated_discovery_service_client::AggregatedDiscoveryServiceClient;
use envoy_types::pb::envoy::service::discovery::v3::{DiscoveryRequest, DiscoveryResponse};
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;
use tokio_rustls::TlsConnector;
use tokio_stream::wrappers::ReceiverStream;
use tonic::transport::{Channel, Endpoint, Uri};
use tonic_health::pb::health_check_response::ServingStatus;

use super::backoff::{self, Backoff};
use super::convert;
use super::mismatch;
use super::protocol::{Subscription, Verdict};
use super::settings::XdsConfig;
use super::silence::{Silence, XdsMetrics};
use crate::health::HealthReporter;
use crate::reload::{Origin, Reloader};
use crate::status::ServerStatus;

/// How long one connection attempt may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// HTTP/2 pings on the stream, so a management server that vanished is noticed.
const KEEPALIVE: Duration = Duration::from_secs(30);

/// What the client works on.
pub(crate) struct XdsClient {
    pub(crate) config: XdsConfig,
    pub(crate) reloader: Arc<Reloader>,
    pub(crate) status: Arc<ServerStatus>,
    pub(crate) health: HealthReporter,
    pub(crate) metrics: XdsMetrics,
}

/// How a stream ended.
enum Ended {
    Shutdown,
    /// Lost (why), and whether a response had come on it.
    Lost(String, bool),
}

fn describe(request: &DiscoveryRequest) -> String {
    let kind = match (&request.error_detail, request.response_nonce.is_empty()) {
        (Some(_), _) => "NACK",
        (None, true) => "subscribe",
        (None, false) => "ACK",
    };
    let mut line = format!(
        "xDS -> DiscoveryRequest ({kind}) version_info={:?} response_nonce={:?}",
        request.version_info, request.response_nonce
    );
    if let Some(detail) = &request.error_detail {
        line.push_str(&format!(" error_detail={:?}", detail.message));
    }
    line
}

/// A wait around `interval`, ± 50% (the reference's linear backoff with jitter).
fn around(interval: Duration) -> Duration {
    let spread = Backoff {
        initial: interval,
        max: interval.saturating_mul(2),
        random_factor: 0.5,
        jitter: true,
    };
    spread.delay(0, backoff::draw())
}

impl XdsClient {
    /// Runs until `shutdown` turns true.
    pub(crate) fn spawn(self, shutdown: watch::Receiver<bool>) -> JoinHandle<()> {
        tokio::spawn(self.run(shutdown))
    }

    async fn run(self, mut shutdown: watch::Receiver<bool>) {
        let url = self.config.authority.clone();
        let mut subscription = Subscription::new(self.config.node.clone());
        let mut failures = 0u32;
        tracing::info!(
            server = %url,
            node = %self.config.node.id,
            tls = self.config.tls.is_some(),
            "rules from xDS: subscribing to {}", convert::TYPE_URL
        );
        loop {
            let wait = match self.connect().await {
                Err(e) => {
                    let wait = around(self.config.connect_retry);
                    let error = self.with_mismatch(e).await;
                    tracing::warn!(server = %url, %error, ?wait, "cannot connect to the xDS management server; the rules in force stay");
                    wait
                }
                Ok(channel) => {
                    tracing::info!(server = %url, "connected to the xDS management server");
                    match self.stream(channel, &mut subscription, &mut shutdown).await {
                        Ended::Shutdown => return,
                        Ended::Lost(why, answered) => {
                            let why = match answered {
                                true => {
                                    failures = 0;
                                    why
                                }
                                false => self.with_mismatch(why).await,
                            };
                            let wait = self.config.backoff.delay(failures, backoff::draw());
                            failures = failures.saturating_add(1);
                            tracing::warn!(
                                server = %url,
                                error = %why,
                                ?wait,
                                acked_version = subscription.acked_version(),
                                "xDS stream lost; the rules in force stay, resubscribing"
                            );
                            wait
                        }
                    }
                }
            };
            tokio::select! {
                _ = tokio::time::sleep(wait) => {}
                _ = shutdown.wait_for(|s| *s) => return,
            }
        }
    }

    /// `error`, with which setting to change where the management server speaks TLS and this
    /// server connects in plaintext, or the reverse (`mismatch`).
    async fn with_mismatch(&self, error: String) -> String {
        let tls = self.config.tls.is_some();
        match mismatch::tls_mismatch(&self.config.authority, tls).await {
            Some(change) => format!("{error}: {change}"),
            None => error,
        }
    }

    async fn connect(&self) -> Result<Channel, String> {
        let authority = self.config.authority.clone();
        let endpoint = Endpoint::from_shared(format!("http://{authority}"))
            .map_err(|e| format!("CONFIG_GRPC_XDS_SERVER_URL: {e}"))?
            .connect_timeout(CONNECT_TIMEOUT)
            .tcp_nodelay(true)
            .http2_keep_alive_interval(KEEPALIVE)
            .keep_alive_while_idle(true);
        let Some(tls) = &self.config.tls else {
            return endpoint.connect().await.map_err(|e| error_chain(&e));
        };
        // Read each time: rotated certificates are picked up on the next connection.
        let connector = TlsConnector::from(tls.client_config()?);
        let name = tls.server_name()?;
        endpoint
            .connect_with_connector(tower::service_fn(move |_: Uri| {
                let (connector, name, authority) =
                    (connector.clone(), name.clone(), authority.clone());
                async move {
                    let tcp = TcpStream::connect(authority.as_str()).await?;
                    let _ = tcp.set_nodelay(true);
                    let stream = connector.connect(name, tcp).await?;
                    Ok::<_, std::io::Error>(TokioIo::new(stream))
                }
            }))
            .await
            .map_err(|e| error_chain(&e))
    }

    async fn stream(
        &self,
        channel: Channel,
        subscription: &mut Subscription,
        shutdown: &mut watch::Receiver<bool>,
    ) -> Ended {
        let mut client = AggregatedDiscoveryServiceClient::new(channel)
            .max_decoding_message_size(self.config.max_message_bytes);
        let (tx, rx) = mpsc::channel::<DiscoveryRequest>(4);
        let mut request = tonic::Request::new(ReceiverStream::new(rx));
        for (name, value) in &self.config.headers {
            request.metadata_mut().insert(name.clone(), value.clone());
        }
        let first = subscription.subscribe();
        tracing::info!("{}", describe(&first));
        if tx.send(first).await.is_err() {
            return Ended::Lost("the request stream closed".into(), false);
        }
        let server = self.config.authority.as_str();
        let mut silence = Silence::new(&self.metrics, self.config.answer_wait);
        let open = client.stream_aggregated_resources(request);
        tokio::pin!(open);
        // A server that never sends its response headers is as silent as one that sends no message.
        let opened = loop {
            tokio::select! {
                opened = &mut open => break opened,
                _ = shutdown.wait_for(|s| *s) => return Ended::Shutdown,
                _ = tokio::time::sleep_until(silence.deadline()), if silence.watching() => {
                    silence.expired(server);
                }
            }
        };
        let mut inbound = match opened {
            Ok(response) => response.into_inner(),
            Err(status) => return Ended::Lost(status_text(&status), false),
        };
        let mut answered = false;
        loop {
            let message = tokio::select! {
                message = inbound.message() => message,
                _ = shutdown.wait_for(|s| *s) => return Ended::Shutdown,
                _ = tokio::time::sleep_until(silence.deadline()), if silence.watching() => {
                    silence.expired(server);
                    continue;
                }
            };
            let response = match message {
                Ok(Some(response)) => response,
                Ok(None) => return Ended::Lost("the server ended the stream".into(), answered),
                Err(status) => return Ended::Lost(status_text(&status), answered),
            };
            answered = true;
            silence.answered(server);
            tracing::info!(
                "xDS <- DiscoveryResponse version_info={:?} nonce={:?} resources={}",
                response.version_info,
                response.nonce,
                response.resources.len()
            );
            let verdict = self.apply(&response);
            let answer = subscription.answer(&response, &verdict);
            tracing::info!("{}", describe(&answer));
            if tx.send(answer).await.is_err() {
                return Ended::Lost("the request stream closed".into(), answered);
            }
        }
    }

    /// Validates and installs a response's rules; what to answer.
    fn apply(&self, response: &DiscoveryResponse) -> Verdict {
        let origin = Origin::Xds {
            version: response.version_info.clone(),
            nonce: response.nonce.clone(),
        };
        if let Some(why) = Subscription::unexpected_type(response) {
            self.reloader.refuse(vec![why.clone()], &origin);
            return Verdict::Nack(why);
        }
        let documents = match convert::decode(&response.resources) {
            Ok(documents) => documents,
            Err(errors) => {
                let why = errors.join("; ");
                self.reloader.refuse(errors, &origin);
                return Verdict::Nack(why);
            }
        };
        let texts = convert::texts(&documents);
        let explain = |e: &_| convert::describe_all(e, &documents);
        match self.reloader.load_documents(&texts, &origin, &explain) {
            Ok(_) => {
                if self.status.is_awaiting_rules() {
                    self.status.set_awaiting_rules(false);
                    if !self.status.is_draining() {
                        self.health.set(ServingStatus::Serving);
                    }
                    tracing::info!("first rules from xDS in force: health is SERVING");
                }
                Verdict::Ack
            }
            Err(errors) => Verdict::Nack(errors.join("; ")),
        }
    }
}

fn status_text(status: &tonic::Status) -> String {
    if status.code() == tonic::Code::Unimplemented {
        return "Unimplemented: the server does not serve xDS's aggregated stream (ADS); is \
                CONFIG_GRPC_XDS_SERVER_URL the management server's address?"
            .to_owned();
    }
    format!("{:?}: {}", status.code(), status.message())
}

/// An error with its causes, for a connection failure's log line; a cause whose text the line
/// already ends with (hyper's and the socket's "Connection reset by peer") is not said twice.
fn error_chain(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        let cause = s.to_string();
        if !text.ends_with(&cause) {
            text.push_str(": ");
            text.push_str(&cause);
        }
        source = s.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug)]
    struct Layer(&'static str, Option<Box<Layer>>);

    impl std::fmt::Display for Layer {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str(self.0)
        }
    }

    impl std::error::Error for Layer {
        fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
            self.1.as_deref().map(|l| l as _)
        }
    }

    #[test]
    fn a_cause_is_said_once() {
        let reset = || {
            Some(Box::new(Layer(
                "Connection reset by peer (os error 104)",
                None,
            )))
        };
        let e = Layer(
            "transport error",
            Some(Box::new(Layer(
                "Connection reset by peer (os error 104)",
                reset(),
            ))),
        );
        assert_eq!(
            error_chain(&e),
            "transport error: Connection reset by peer (os error 104)"
        );
        let e = Layer(
            "transport error",
            Some(Box::new(Layer("dns error", reset()))),
        );
        assert_eq!(
            error_chain(&e),
            "transport error: dns error: Connection reset by peer (os error 104)"
        );
    }

    #[test]
    fn unimplemented_says_the_server_is_not_an_xds_server() {
        let text = status_text(&tonic::Status::unimplemented(""));
        assert!(text.contains("does not serve xDS"), "{text}");
        assert_eq!(
            status_text(&tonic::Status::unavailable("down")),
            "Unavailable: down"
        );
    }
}
