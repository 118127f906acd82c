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
