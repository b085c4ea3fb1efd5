//! From certificate, key and CA files to a rustls `ServerConfig`: what a listener's TLS is made of
//! ([`TlsSpec`]), reading its files (bounded in size), and building the config (a certificate
//! outside its validity is refused like a broken one), with every error naming the setting at
//! fault. Client certificates, when required, are checked against the CA and,
//! if a SAN is required, for that SAN ([`SanVerifier`]).

use std::io::Read;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls::client::danger::HandshakeSignatureValid;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use rustls::server::WebPkiClientVerifier;
use rustls::server::danger::{ClientCertVerified, ClientCertVerifier};
use rustls::{
    CertificateError, DigitallySignedStruct, DistinguishedName, RootCertStore, ServerConfig,
    SignatureScheme,
};

use super::expiry::Validity;

/// Largest certificate, key or CA file read; a larger one is an error (a PEM chain is a few KiB).
pub(super) const MAX_PEM_BYTES: u64 = 1 << 20;

/// The setting names of one listener's TLS, for error messages and logs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct SettingNames {
    /// "gRPC" or "admin", as in the listeners' log lines and the metrics' `listener` label.
    pub(crate) listener: &'static str,
    pub(crate) cert: &'static str,
    pub(crate) key: &'static str,
    pub(crate) client_ca: &'static str,
    pub(crate) client_san: &'static str,
}

pub(super) const GRPC_SETTINGS: SettingNames = SettingNames {
    listener: "gRPC",
    cert: "GRPC_SERVER_TLS_CERT",
    key: "GRPC_SERVER_TLS_KEY",
    client_ca: "GRPC_CLIENT_TLS_CACERT",
    client_san: "GRPC_CLIENT_TLS_SAN",
};

pub(super) const ADMIN_SETTINGS: SettingNames = SettingNames {
    listener: "admin",
    cert: "ADMIN_TLS_CERT",
    key: "ADMIN_TLS_KEY",
    client_ca: "ADMIN_CLIENT_TLS_CACERT",
    client_san: "ADMIN_CLIENT_TLS_SAN",
};

/// A TLS setting that cannot be used; the message starts with the setting's name.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TlsError {
    #[error("{setting} is required when {because}")]
    Missing {
        setting: &'static str,
        because: String,
    },
    #[error("{setting} ({path}): {message}")]
    File {
        setting: String,
        path: PathBuf,
        message: String,
    },
    #[error("{setting}: {message}")]
    Invalid { setting: String, message: String },
}

/// One listener's TLS: where its files are and what it asks of clients.
#[derive(Debug, Clone)]
pub struct TlsSpec {
    pub(crate) names: SettingNames,
    pub(crate) cert: PathBuf,
    pub(crate) key: PathBuf,
    /// Clients must present a certificate signed by a CA in this file.
    pub(crate) client_ca: Option<PathBuf>,
    /// ...and that certificate must carry this DNS name or IP address as a SAN.
    pub(crate) client_san: Option<ServerName<'static>>,
    /// ALPN protocols offered, most preferred first.
    pub(crate) alpn: Vec<Vec<u8>>,
}

/// The bytes of a spec's files as read at one moment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PemFiles {
    pub(crate) cert: Vec<u8>,
    pub(crate) key: Vec<u8>,
    pub(crate) client_ca: Option<Vec<u8>>,
}

/// A SAN setting's value as a name a certificate can be checked for.
pub(super) fn parse_san(setting: &str, text: &str) -> Result<ServerName<'static>, TlsError> {
    ServerName::try_from(text.trim().to_owned()).map_err(|_| TlsError::Invalid {
        setting: setting.to_owned(),
        message: format!("'{text}' is neither a DNS name nor an IP address"),
    })
}

fn read_pem(setting: &str, path: &Path) -> Result<Vec<u8>, TlsError> {
    read_capped(path).map_err(|message| TlsError::File {
        setting: setting.to_owned(),
        path: path.to_owned(),
        message,
    })
}

/// A certificate, key or CA file's bytes, at most [`MAX_PEM_BYTES`] of them (our listeners' and
/// the xDS client's); the error says what went wrong, not which file.
pub(crate) fn read_capped(path: &Path) -> Result<Vec<u8>, String> {
    let file = std::fs::File::open(path).map_err(|e| format!("cannot open: {e}"))?;
    let mut bytes = Vec::new();
    file.take(MAX_PEM_BYTES + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| format!("cannot read: {e}"))?;
    if bytes.len() as u64 > MAX_PEM_BYTES {
        return Err(format!("larger than {MAX_PEM_BYTES} bytes"));
    }
    Ok(bytes)
}

impl TlsSpec {
    /// Reads the cert, key and CA files.
    pub fn read(&self) -> Result<PemFiles, TlsError> {
        Ok(PemFiles {
            cert: read_pem(self.names.cert, &self.cert)?,
            key: read_pem(self.names.key, &self.key)?,
            client_ca: match &self.client_ca {
                Some(path) => Some(read_pem(self.names.client_ca, path)?),
                None => None,
            },
        })
    }

    fn file_error(&self, setting: &str, path: &Path, message: impl Into<String>) -> TlsError {
        TlsError::File {
            setting: setting.to_owned(),
            path: path.to_owned(),
            message: message.into(),
        }
    }

    fn certificates(
        &self,
        setting: &str,
        path: &Path,
        pem: &[u8],
    ) -> Result<Vec<CertificateDer<'static>>, TlsError> {
        let certs = CertificateDer::pem_slice_iter(pem)
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| self.file_error(setting, path, format!("bad PEM: {e}")))?;
        if certs.is_empty() {
            return Err(self.file_error(setting, path, "no CERTIFICATE in it"));
        }
        Ok(certs)
    }

    /// A server config from `files` at `now` (Unix seconds): the certificate chain, every
    /// certificate of which must be valid now, and its key (which must match), and the client
    /// verifier if client certificates are required. With the config, when the chain is valid.
    pub fn build(&self, files: &PemFiles, now: i64) -> Result<Built, Refusal> {
        let names = self.names;
        let chain = self.certificates(names.cert, &self.cert, &files.cert)?;
        for (i, cert) in chain.iter().enumerate() {
            webpki::EndEntityCert::try_from(cert).map_err(|e| {
                self.file_error(names.cert, &self.cert, format!("certificate #{i}: {e}"))
            })?;
        }
        let validity = Validity::of_chain(&chain, now).map_err(|invalid| Refusal {
            error: self.file_error(names.cert, &self.cert, invalid.message),
            valid_from: invalid.valid_from,
        })?;
        let key = PrivateKeyDer::from_pem_slice(&files.key).map_err(|e| {
            self.file_error(names.key, &self.key, format!("no usable private key: {e}"))
        })?;
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let builder = ServerConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()
            .map_err(|e| TlsError::Invalid {
                setting: names.cert.to_owned(),
                message: e.to_string(),
            })?;
        let builder = match (&self.client_ca, &files.client_ca) {
            (Some(path), Some(pem)) => {
                let mut roots = RootCertStore::empty();
                for cert in self.certificates(names.client_ca, path, pem)? {
                    roots.add(cert).map_err(|e| {
                        self.file_error(names.client_ca, path, format!("unusable CA: {e}"))
                    })?;
                }
                let verifier =
                    WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider)
                        .build()
                        .map_err(|e| self.file_error(names.client_ca, path, e.to_string()))?;
                let verifier = match &self.client_san {
                    Some(san) => Arc::new(SanVerifier {
                        inner: verifier,
                        san: san.clone(),
                    }),
                    None => verifier,
                };
                builder.with_client_cert_verifier(verifier)
            }
            _ => builder.with_no_client_auth(),
        };
        let mut config = builder.with_single_cert(chain, key).map_err(|e| {
            let message = match e {
                rustls::Error::InconsistentKeys(_) => {
                    "the private key does not match the certificate".to_owned()
                }
                other => other.to_string(),
            };
            TlsError::Invalid {
                setting: format!("{} and {}", names.cert, names.key),
                message,
            }
        })?;
        config.alpn_protocols = self.alpn.clone();
        Ok(Built {
            config: Arc::new(config),
            validity,
        })
    }
}

/// A config built from a listener's files, and when its certificate chain is valid.
#[derive(Debug, Clone)]
pub struct Built {
    pub(crate) config: Arc<ServerConfig>,
    pub(crate) validity: Validity,
}

/// Files that cannot be served: the error, and for a chain not valid yet, when it will be.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    pub(crate) error: TlsError,
    pub(crate) valid_from: Option<i64>,
}

impl From<TlsError> for Refusal {
    fn from(error: TlsError) -> Refusal {
        Refusal {
            error,
            valid_from: None,
        }
    }
}

/// The CA's verdict, and then: the client certificate must carry `san` as a DNS or IP SAN.
#[derive(Debug)]
pub(super) struct SanVerifier {
    inner: Arc<dyn ClientCertVerifier>,
    san: ServerName<'static>,
}

impl ClientCertVerifier for SanVerifier {
    fn offer_client_auth(&self) -> bool {
        self.inner.offer_client_auth()
    }

    fn client_auth_mandatory(&self) -> bool {
        true
    }

    fn root_hint_subjects(&self) -> &[DistinguishedName] {
        self.inner.root_hint_subjects()
    }

    fn verify_client_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        now: UnixTime,
    ) -> Result<ClientCertVerified, rustls::Error> {
        let verified = self
            .inner
            .verify_client_cert(end_entity, intermediates, now)?;
        let cert = webpki::EndEntityCert::try_from(end_entity)
            .map_err(|_| rustls::Error::InvalidCertificate(CertificateError::BadEncoding))?;
        cert.verify_is_valid_for_subject_name(&self.san)
            .map_err(|_| rustls::Error::InvalidCertificate(CertificateError::NotValidForName))?;
        Ok(verified)
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.inner.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.inner.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.inner.supported_verify_schemes()
    }
}
