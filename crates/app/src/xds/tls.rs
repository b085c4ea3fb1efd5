//! TLS to the management server: the CA its certificate must chain to (a file, or the system's
//! roots), the name it must carry, and the client certificate we present (Envoy Gateway's server
//! requires one, and TLS 1.3). Errors name the setting at fault.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use rustls::{ClientConfig, RootCertStore};

/// What the TLS settings ask for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClientTls {
    /// `CONFIG_GRPC_XDS_SERVER_TLS_CACERT`; `None`: the system's roots.
    pub(crate) ca: Option<PathBuf>,
    /// `CONFIG_GRPC_XDS_CLIENT_TLS_CERT`.
    pub(crate) cert: Option<PathBuf>,
    /// `CONFIG_GRPC_XDS_CLIENT_TLS_KEY`.
    pub(crate) key: Option<PathBuf>,
    /// `CONFIG_GRPC_XDS_SERVER_TLS_SAN`, else the URL's host.
    pub(crate) server_name: String,
}

fn read(setting: &str, path: &Path) -> Result<Vec<u8>, String> {
    crate::net::tls::read_capped(path).map_err(|m| format!("{setting} ({}): {m}", path.display()))
}

fn certificates(setting: &str, path: &Path) -> Result<Vec<CertificateDer<'static>>, String> {
    let pem = read(setting, path)?;
    let certs = CertificateDer::pem_slice_iter(&pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| format!("{setting} ({}): bad PEM: {e}", path.display()))?;
    if certs.is_empty() {
        return Err(format!(
            "{setting} ({}): no CERTIFICATE in it",
            path.display()
        ));
    }
    Ok(certs)
}

impl ClientTls {
    /// The name the server's certificate is checked for.
    pub fn server_name(&self) -> Result<ServerName<'static>, String> {
        ServerName::try_from(self.server_name.clone()).map_err(|_| {
            format!(
                "CONFIG_GRPC_XDS_SERVER_TLS_SAN: '{}' is neither a DNS name nor an IP address",
                self.server_name
            )
        })
    }

    /// Reads the files into a client config offering HTTP/2 (TLS 1.2 or 1.3, as the server
    /// chooses).
    pub fn client_config(&self) -> Result<Arc<ClientConfig>, String> {
        let mut roots = RootCertStore::empty();
        match &self.ca {
            Some(path) => {
                let setting = "CONFIG_GRPC_XDS_SERVER_TLS_CACERT";
                for cert in certificates(setting, path)? {
                    roots
                        .add(cert)
                        .map_err(|e| format!("{setting} ({}): {e}", path.display()))?;
                }
            }
            None => {
                let found = rustls_native_certs::load_native_certs();
                roots.add_parsable_certificates(found.certs);
                if roots.is_empty() {
                    return Err(
                        "CONFIG_GRPC_XDS_SERVER_TLS_CACERT is not set and the system has \
                                no CA certificates"
                            .into(),
                    );
                }
            }
        }
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let builder = ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|e| format!("TLS: {e}"))?
            .with_root_certificates(roots);
        let mut config = match (&self.cert, &self.key) {
            (Some(cert), Some(key)) => {
                let chain = certificates("CONFIG_GRPC_XDS_CLIENT_TLS_CERT", cert)?;
                let setting = "CONFIG_GRPC_XDS_CLIENT_TLS_KEY";
                let pem = read(setting, key)?;
                let key_der = PrivateKeyDer::from_pem_slice(&pem)
                    .map_err(|e| format!("{setting} ({}): {e}", key.display()))?;
                builder
                    .with_client_auth_cert(chain, key_der)
                    .map_err(|e| format!("{setting} ({}): {e}", key.display()))?
            }
            (None, None) => builder.with_no_client_auth(),
            (Some(_), None) => {
                return Err("CONFIG_GRPC_XDS_CLIENT_TLS_KEY is required with \
                            CONFIG_GRPC_XDS_CLIENT_TLS_CERT"
                    .into());
            }
            (None, Some(_)) => {
                return Err("CONFIG_GRPC_XDS_CLIENT_TLS_CERT is required with \
                            CONFIG_GRPC_XDS_CLIENT_TLS_KEY"
                    .into());
            }
        };
        config.alpn_protocols = vec![b"h2".to_vec()];
        Ok(Arc::new(config))
    }
}
