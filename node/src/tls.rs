//! TLS for client and peer traffic (rustls through tonic).
//!
//! One certificate per node serves both roles: it is the server identity on
//! the node's port and the client identity when the node dials its peers.
//! Peers are verified against the configured CA; with `client_auth`, every
//! connection (clients and peers alike) must present a certificate signed
//! by that CA (mTLS).

use tonic::transport::{Certificate, ClientTlsConfig, Identity, ServerTlsConfig};

/// A node's TLS material, PEM-encoded.
#[derive(Clone, Debug)]
pub struct TlsOptions {
    /// The node's certificate chain.
    pub cert_pem: Vec<u8>,
    /// The node's private key.
    pub key_pem: Vec<u8>,
    /// The CA that signs node (and, with `client_auth`, client) certificates.
    pub ca_pem: Vec<u8>,
    /// Require a certificate from every connecting client and peer.
    pub client_auth: bool,
}

impl TlsOptions {
    /// The server side.
    pub fn server_config(&self) -> ServerTlsConfig {
        let config = ServerTlsConfig::new().identity(self.identity());
        if self.client_auth {
            config.client_ca_root(Certificate::from_pem(&self.ca_pem))
        } else {
            config
        }
    }

    /// The side that dials peers: verifies them against the CA and presents
    /// this node's certificate.
    pub fn peer_client_config(&self) -> ClientTlsConfig {
        ClientTlsConfig::new()
            .ca_certificate(Certificate::from_pem(&self.ca_pem))
            .identity(self.identity())
    }

    fn identity(&self) -> Identity {
        Identity::from_pem(&self.cert_pem, &self.key_pem)
    }
}

impl TlsOptions {
    /// Refuses, naming the problem, a certificate that the node's peers or
    /// clients would refuse at the handshake: one that does not parse, a
    /// key that does not match it, a certificate that does not verify
    /// against `ca_pem` for each of `hosts` (the hosts this node advertises
    /// to clients and peers; no subject alternative name for it, not X.509
    /// v3, expired or not yet valid, signed by another CA, no serverAuth
    /// usage) and, with `client_auth` (where the node is also its peers'
    /// client), one its peers would refuse as a client certificate.
    pub fn check(&self, hosts: &[&str]) -> Result<(), String> {
        use rustls::pki_types::pem::PemObject as _;
        use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
        let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(&self.cert_pem)
            .collect::<Result<_, _>>()
            .map_err(|e| format!("tls_cert: not a PEM certificate chain: {e}"))?;
        let Some((leaf, intermediates)) = chain.split_first() else {
            return Err("tls_cert holds no certificate".into());
        };
        let key = PrivateKeyDer::from_pem_slice(&self.key_pem)
            .map_err(|e| format!("tls_key: not a PEM private key: {e}"))?;
        let provider = std::sync::Arc::new(rustls::crypto::ring::default_provider());
        let signing = provider
            .key_provider
            .load_private_key(key)
            .map_err(|e| format!("tls_key: not a usable private key: {e}"))?;
        let certified = rustls::sign::CertifiedKey::new(chain.clone(), signing);
        if let Err(rustls::Error::InconsistentKeys(rustls::InconsistentKeys::KeyMismatch)) =
            certified.keys_match()
        {
            return Err("tls_key does not match tls_cert (a key of another certificate?)".into());
        }
        let mut roots = rustls::RootCertStore::empty();
        for ca in CertificateDer::pem_slice_iter(&self.ca_pem) {
            let ca = ca.map_err(|e| format!("tls_ca: not a PEM certificate: {e}"))?;
            roots
                .add(ca)
                .map_err(|e| format!("tls_ca: not a usable CA certificate: {e}"))?;
        }
        if roots.is_empty() {
            return Err("tls_ca holds no certificate".into());
        }
        let roots = std::sync::Arc::new(roots);
        let now = UnixTime::now();
        let server = rustls::client::WebPkiServerVerifier::builder_with_provider(
            roots.clone(),
            provider.clone(),
        )
        .build()
        .map_err(|e| format!("tls_ca: {e}"))?;
        for host in hosts {
            let name = ServerName::try_from(host.to_string())
                .map_err(|e| format!("{host:?} is not a host name or IP address: {e}"))?;
            rustls::client::danger::ServerCertVerifier::verify_server_cert(
                &*server,
                leaf,
                intermediates,
                &name,
                &[],
                now,
            )
            .map_err(|e| refusal(&e, Some(host)))?;
        }
        if self.client_auth {
            let client =
                rustls::server::WebPkiClientVerifier::builder_with_provider(roots, provider)
                    .build()
                    .map_err(|e| format!("tls_ca: {e}"))?;
            rustls::server::danger::ClientCertVerifier::verify_client_cert(
                &*client,
                leaf,
                intermediates,
                now,
            )
            .map_err(|e| refusal(&e, None))?;
        }
        Ok(())
    }
}

/// Why a peer would refuse the node's certificate, in words that say what
/// to fix; `host` is the name a server certificate was checked for (`None`:
/// checked as a client certificate, for mTLS).
fn refusal(e: &rustls::Error, host: Option<&str>) -> String {
    use rustls::CertificateError as C;
    let what = match e {
        rustls::Error::InvalidCertificate(c) => match c {
            C::NotValidForName | C::NotValidForNameContext { .. } => {
                let host = host.unwrap_or("?");
                let san = if host.parse::<std::net::IpAddr>().is_ok() {
                    format!("IP:{host}")
                } else {
                    format!("DNS:{host}")
                };
                format!(
                    "tls_cert is not valid for {host}, which this node advertises: peers and \
                     clients dial that name and would refuse the handshake; add the subject \
                     alternative name {san}"
                )
            }
            C::Expired | C::ExpiredContext { .. } => "tls_cert has expired: renew it".into(),
            C::NotValidYet | C::NotValidYetContext { .. } => {
                "tls_cert is not valid yet: check the clock, or its notBefore".into()
            }
            C::UnknownIssuer => "tls_cert is not signed by the CA in tls_ca: peers verify it \
                against that CA and would refuse it"
                .into(),
            C::InvalidPurpose | C::InvalidPurposeContext { .. } => match host {
                Some(_) => "tls_cert's extended key usage lacks serverAuth: a node certificate \
                    needs serverAuth and clientAuth"
                    .into(),
                None => "tls_cert's extended key usage lacks clientAuth: with tls_client_auth \
                    a node presents it to its peers as a client certificate; a node \
                    certificate needs serverAuth and clientAuth"
                    .into(),
            },
            // rustls passes webpki's verdict on a version-1 certificate
            // through as an "other" error; its text names it.
            C::Other(other) if other.to_string().contains("UnsupportedCertVersion") => {
                "tls_cert is not an X.509 v3 certificate (openssl x509 -req made it without \
                 -extfile): peers refuse it; reissue it with v3 extensions (see the guide's \
                 recipe)"
                    .into()
            }
            _ => "tls_cert would be refused by peers".into(),
        },
        _ => "tls_cert would be refused by peers".into(),
    };
    format!("{what} ({e})")
}
