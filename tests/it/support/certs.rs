//! Certificates made in the test (rcgen, ECDSA P-256): a CA, server and client certificates it
//! signs (valid for ever, or between two given instants), written as PEM files; and rustls client configs that trust a CA and may present a
//! client certificate.
#![allow(
    dead_code,
    reason = "a harness for every test module; each uses a part"
)]

use std::path::{Path, PathBuf};
use std::sync::Arc;

use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DnType, ExtendedKeyUsagePurpose, IsCa,
    KeyPair, KeyUsagePurpose,
};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::{ClientConfig, RootCertStore};

/// A certificate authority that signs leaves.
pub struct Ca {
    issuer: CertifiedIssuer<'static, KeyPair>,
}

/// A certificate and its key, PEM.
#[derive(Clone)]
pub struct Leaf {
    pub cert_pem: String,
    pub key_pem: String,
}

impl Ca {
    pub fn new(name: &str) -> Ca {
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.distinguished_name.push(DnType::CommonName, name);
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        let issuer = CertifiedIssuer::self_signed(params, KeyPair::generate().unwrap()).unwrap();
        Ca { issuer }
    }

    pub fn cert_pem(&self) -> String {
        self.issuer.pem()
    }

    fn leaf(&self, cn: &str, sans: &[&str], usage: ExtendedKeyUsagePurpose) -> Leaf {
        self.leaf_valid(cn, sans, usage, None)
    }

    fn leaf_valid(
        &self,
        cn: &str,
        sans: &[&str],
        usage: ExtendedKeyUsagePurpose,
        validity: Option<(i64, i64)>,
    ) -> Leaf {
        self.leaf_for(cn, sans, vec![usage], validity)
    }

    /// One certificate for both ends, as Envoy Gateway's `/certs/tls.crt` (the rate-limit
    /// service's server certificate and its xDS client certificate), for `localhost` and
    /// 127.0.0.1.
    pub fn server_and_client(&self, cn: &str) -> Leaf {
        let usages = vec![
            ExtendedKeyUsagePurpose::ServerAuth,
            ExtendedKeyUsagePurpose::ClientAuth,
        ];
        self.leaf_for(cn, &["localhost", "127.0.0.1"], usages, None)
    }

    fn leaf_for(
        &self,
        cn: &str,
        sans: &[&str],
        usages: Vec<ExtendedKeyUsagePurpose>,
        validity: Option<(i64, i64)>,
    ) -> Leaf {
        let sans: Vec<String> = sans.iter().map(|s| (*s).to_owned()).collect();
        let mut params = CertificateParams::new(sans).unwrap();
        params.distinguished_name.push(DnType::CommonName, cn);
        params.extended_key_usages = usages;
        if let Some((from, to)) = validity {
            params.not_before = time::OffsetDateTime::from_unix_timestamp(from).unwrap();
            params.not_after = time::OffsetDateTime::from_unix_timestamp(to).unwrap();
        }
        let key = KeyPair::generate().unwrap();
        let cert = params.signed_by(&key, &*self.issuer).unwrap();
        Leaf {
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
        }
    }

    /// A server certificate for `localhost` and 127.0.0.1.
    pub fn server(&self, cn: &str) -> Leaf {
        self.leaf(
            cn,
            &["localhost", "127.0.0.1"],
            ExtendedKeyUsagePurpose::ServerAuth,
        )
    }

    /// A server certificate for `localhost` and 127.0.0.1 valid from `from` to `to` (Unix
    /// seconds).
    pub fn server_valid(&self, cn: &str, from: i64, to: i64) -> Leaf {
        self.leaf_valid(
            cn,
            &["localhost", "127.0.0.1"],
            ExtendedKeyUsagePurpose::ServerAuth,
            Some((from, to)),
        )
    }

    /// A server certificate with the given SANs.
    pub fn server_named(&self, cn: &str, sans: &[&str]) -> Leaf {
        self.leaf(cn, sans, ExtendedKeyUsagePurpose::ServerAuth)
    }

    /// A client certificate with the given SANs.
    pub fn client(&self, sans: &[&str]) -> Leaf {
        self.leaf("client", sans, ExtendedKeyUsagePurpose::ClientAuth)
    }
}

impl Leaf {
    /// Writes `<stem>.crt` and `<stem>.key` into `dir`; returns their paths.
    pub fn write(&self, dir: &Path, stem: &str) -> (PathBuf, PathBuf) {
        let cert = dir.join(format!("{stem}.crt"));
        let key = dir.join(format!("{stem}.key"));
        std::fs::write(&cert, &self.cert_pem).unwrap();
        std::fs::write(&key, &self.key_pem).unwrap();
        (cert, key)
    }

    pub fn cert_der(&self) -> CertificateDer<'static> {
        CertificateDer::from_pem_slice(self.cert_pem.as_bytes()).unwrap()
    }
}

/// A client config trusting `ca_pem`, presenting `identity` if given, offering `alpn`.
pub fn client_config(ca_pem: &str, identity: Option<&Leaf>, alpn: &[&[u8]]) -> Arc<ClientConfig> {
    let mut roots = RootCertStore::empty();
    roots
        .add(CertificateDer::from_pem_slice(ca_pem.as_bytes()).unwrap())
        .unwrap();
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots);
    let mut config = match identity {
        Some(leaf) => builder
            .with_client_auth_cert(
                vec![leaf.cert_der()],
                PrivateKeyDer::from_pem_slice(leaf.key_pem.as_bytes()).unwrap(),
            )
            .unwrap(),
        None => builder.with_no_client_auth(),
    };
    config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
    Arc::new(config)
}
