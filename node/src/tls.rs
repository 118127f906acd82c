//! TLS for client and peer traffic (rustls).
//!
//! One certificate per node serves both roles: it is the server identity on
//! the node's ports and the client identity when the node dials its peers.
//! Peers are verified against the configured CA; with `client_auth`, every
//! connection (clients and peers alike) must present a certificate signed
//! by that CA (mTLS).
//!
//! The node terminates TLS itself, with the server configuration in force
//! when each connection arrives ([`NodeTls`]): a reload (`SIGHUP`) applies
//! to every connection made after it, as etcd's per-connection reload
//! does; connections already open keep the certificate they got. A reload
//! passes the same checks as a start ([`TlsOptions::check`]) or changes
//! nothing.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock};

use rustls::pki_types::pem::PemObject as _;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use tonic::transport::{Certificate, ClientTlsConfig, Identity};

/// A node's TLS material, PEM-encoded.
#[derive(Clone, Debug)]
pub struct TlsOptions {
    /// The node's certificate chain.
    pub cert_pem: Vec<u8>,
    /// The node's private key.
    pub key_pem: Vec<u8>,
    /// The CA that signs node (and, with `client_auth`, client)
    /// certificates. May hold several (a CA rotation's bundle).
    pub ca_pem: Vec<u8>,
    /// Require a certificate from every connecting client and peer.
    pub client_auth: bool,
}

impl TlsOptions {
    /// The server side, as rustls takes it: this node's certificate and
    /// key; with `client_auth`, client certificates verified against the
    /// CA; HTTP/2 by ALPN.
    pub fn server_config(&self) -> Result<Arc<rustls::ServerConfig>, String> {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(&self.cert_pem)
            .collect::<Result<_, _>>()
            .map_err(|e| format!("tls_cert: {e}"))?;
        let key =
            PrivateKeyDer::from_pem_slice(&self.key_pem).map_err(|e| format!("tls_key: {e}"))?;
        let verifier = if self.client_auth {
            rustls::server::WebPkiClientVerifier::builder_with_provider(
                Arc::new(self.roots()?),
                provider.clone(),
            )
            .build()
            .map_err(|e| format!("tls_ca: {e}"))?
        } else {
            rustls::server::WebPkiClientVerifier::no_client_auth()
        };
        let mut config = rustls::ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|e| e.to_string())?
            .with_client_cert_verifier(verifier)
            .with_single_cert(chain, key)
            .map_err(|e| format!("tls_cert/tls_key: {e}"))?;
        config.alpn_protocols = vec![b"h2".to_vec()];
        Ok(Arc::new(config))
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

    /// The CA certificates in `ca_pem`.
    fn roots(&self) -> Result<rustls::RootCertStore, String> {
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
        Ok(roots)
    }
}

/// A node's TLS in force, replaceable while it runs.
pub struct NodeTls {
    /// The hosts the node is dialled at; every certificate must name them.
    hosts: Vec<String>,
    current: RwLock<Arc<Loaded>>,
    /// Bumped by every reload (peer channels made before it are redialled).
    generation: AtomicU64,
}

/// One checked set of TLS material, ready to use.
struct Loaded {
    options: TlsOptions,
    server: Arc<rustls::ServerConfig>,
    peer_client: ClientTlsConfig,
}

impl Loaded {
    fn new(options: TlsOptions, hosts: &[String]) -> Result<Loaded, String> {
        let hosts: Vec<&str> = hosts.iter().map(String::as_str).collect();
        options.check(&hosts)?;
        Ok(Loaded {
            server: options.server_config()?,
            peer_client: options.peer_client_config(),
            options,
        })
    }
}

impl NodeTls {
    /// `options`, checked ([`TlsOptions::check`]) for `hosts`.
    pub fn new(options: TlsOptions, hosts: Vec<String>) -> Result<NodeTls, String> {
        let loaded = Loaded::new(options, &hosts)?;
        Ok(NodeTls {
            hosts,
            current: RwLock::new(Arc::new(loaded)),
            generation: AtomicU64::new(0),
        })
    }

    /// Replaces the TLS material for connections made from now on, if
    /// `options` passes the start-up checks; otherwise nothing changes.
    /// Whether client certificates are required cannot change.
    pub fn reload(&self, options: TlsOptions) -> Result<(), String> {
        if options.client_auth != self.client_auth() {
            return Err("tls_client_auth cannot change without a restart".into());
        }
        let loaded = Loaded::new(options, &self.hosts)?;
        *self.current.write().expect("tls lock poisoned") = Arc::new(loaded);
        self.generation.fetch_add(1, Ordering::SeqCst);
        Ok(())
    }

    fn loaded(&self) -> Arc<Loaded> {
        self.current.read().expect("tls lock poisoned").clone()
    }

    /// The server configuration for a connection arriving now.
    pub fn server_config(&self) -> Arc<rustls::ServerConfig> {
        self.loaded().server.clone()
    }

    /// The configuration to dial peers with now, and the reload it belongs
    /// to.
    pub fn peer_client_config(&self) -> (u64, ClientTlsConfig) {
        let loaded = self.loaded();
        (
            self.generation.load(Ordering::SeqCst),
            loaded.peer_client.clone(),
        )
    }

    /// Whether client certificates are required (mTLS).
    pub fn client_auth(&self) -> bool {
        self.loaded().options.client_auth
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
        use rustls::pki_types::{ServerName, UnixTime};
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
        let roots = std::sync::Arc::new(self.roots()?);
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
                 -extfile): peers refuse it; reissue it with v3 extensions (see the \
                 recipe in docs/operations/tls-and-acl.md)"
                    .into()
            }
            _ => "tls_cert would be refused by peers".into(),
        },
        _ => "tls_cert would be refused by peers".into(),
    };
    format!("{what} ({e})")
}
