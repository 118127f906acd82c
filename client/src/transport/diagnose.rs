//! Why a node could not be used: the record of a call's attempts, and
//! telling refused connections, unresolved names and TLS trouble apart
//! (with the TLS probes).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use raftlock_proto::NOT_LEADER_KEY;
use tonic::Status;

use super::{ClientTls, Transport, REFUSED_ROUNDS};
use crate::error::Error;

/// How long the check whether a node speaks TLS may take.
const TLS_PROBE_TIMEOUT: Duration = Duration::from_secs(1);

/// Why a node could not be used at all: nothing listens, or TLS stands in
/// the way. Retrying the same node cannot help until someone acts.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Hopeless {
    /// The connection was refused.
    Refused,
    /// The TLS handshake failed, or the node speaks TLS and this client
    /// does not.
    Tls,
}

/// The nodes a call tried, each with its last error, in the order first
/// tried.
#[derive(Default)]
pub(super) struct Tried {
    nodes: Vec<(String, String)>,
    /// Hopeless attempts in a row, per address (reset by any other
    /// outcome anywhere), and the kind of the last one.
    hopeless: BTreeMap<String, (u32, Hopeless)>,
    /// What probing each address during this call found (`None`: no TLS
    /// trouble).
    probed: BTreeMap<String, Option<String>>,
}

impl Tried {
    pub(super) fn note(&mut self, addr: &str, why: String, hopeless: Option<Hopeless>) {
        match self.nodes.iter_mut().find(|(a, _)| a == addr) {
            Some((_, last)) => *last = why,
            None => self.nodes.push((addr.to_string(), why)),
        }
        match hopeless {
            Some(kind) => {
                let entry = self.hopeless.entry(addr.to_string()).or_insert((0, kind));
                *entry = (entry.0 + 1, kind);
            }
            None => self.hopeless.clear(),
        }
    }

    /// Whether every endpoint has been hopeless [`REFUSED_ROUNDS`] times
    /// in a row; if so, whether TLS was the trouble anywhere.
    fn hopeless_everywhere(&self, endpoints: &[String]) -> Option<bool> {
        let all = endpoints.iter().all(|e| {
            self.hopeless
                .get(e)
                .is_some_and(|(n, _)| *n >= REFUSED_ROUNDS)
        });
        all.then(|| {
            endpoints.iter().any(|e| {
                self.hopeless
                    .get(e)
                    .is_some_and(|(_, k)| *k == Hopeless::Tls)
            })
        })
    }

    pub(super) fn summary(&self) -> String {
        if self.nodes.is_empty() {
            return "no attempt fitted in the deadline".into();
        }
        self.nodes
            .iter()
            .map(|(addr, why)| format!("{addr}: {why}"))
            .collect::<Vec<_>>()
            .join("; ")
    }
}

/// The errors under `status`, innermost last.
fn sources(status: &Status) -> Vec<&(dyn std::error::Error + 'static)> {
    let mut out = Vec::new();
    let mut next = std::error::Error::source(status);
    while let Some(e) = next {
        out.push(e);
        next = e.source();
    }
    out
}

/// Whether `status` is a refused TCP connection (nothing listens there).
pub(super) fn connection_refused(status: &Status) -> bool {
    sources(status).iter().any(|e| {
        e.downcast_ref::<std::io::Error>()
            .is_some_and(|io| io.kind() == std::io::ErrorKind::ConnectionRefused)
    })
}

/// Whether `status` is an address whose name did not resolve (hyper's
/// connector says "dns error", over the resolver's io error): nothing was
/// sent.
pub(super) fn name_unresolved(status: &Status) -> bool {
    sources(status).iter().any(|e| {
        let text = e.to_string();
        text.starts_with("dns error") || text.contains("failed to lookup address information")
    })
}

/// A failed TLS handshake under `status`, in words that say what to fix.
fn tls_failure(status: &Status, addr: &str) -> Option<String> {
    // tokio-rustls wraps the rustls error in an io::Error, whose `source`
    // skips it: look inside io errors too.
    let e = sources(status).into_iter().find_map(|e| {
        e.downcast_ref::<rustls::Error>().or_else(|| {
            e.downcast_ref::<std::io::Error>()
                .and_then(|io| io.get_ref())
                .and_then(|inner| inner.downcast_ref::<rustls::Error>())
        })
    })?;
    Some(format!("TLS handshake failed: {}", explain_tls(e, addr)))
}

/// What a rustls error seen while connecting to `addr` means.
fn explain_tls(e: &rustls::Error, addr: &str) -> String {
    use rustls::CertificateError as C;
    let host = addr.rsplit_once(':').map_or(addr, |(host, _)| host);
    let hint = match e {
        rustls::Error::InvalidCertificate(c) => match c {
            C::UnknownIssuer => "the node's certificate is not signed by the CA this client \
                trusts (raftlock --ca FILE or RAFTLOCK_CA; ClientTls::ca_pem): give the client \
                the CA that signed the nodes' certificates"
                .to_string(),
            C::NotValidForName | C::NotValidForNameContext { .. } => format!(
                "the node's certificate is not valid for the name dialled, {host}: dial a name \
                 it carries, or give it a subject alternative name (SAN) for {host}"
            ),
            C::Expired | C::ExpiredContext { .. } => {
                "the node's certificate has expired: renew it".to_string()
            }
            C::NotValidYet | C::NotValidYetContext { .. } => {
                "the node's certificate is not valid yet: check the clocks".to_string()
            }
            C::InvalidPurpose | C::InvalidPurposeContext { .. } => {
                "the node's certificate does not allow TLS server use (extended key usage \
                 serverAuth)"
                    .to_string()
            }
            // rustls passes webpki's verdict on a version-1 certificate
            // through as an "other" error; its text names it.
            C::Other(other) if other.to_string().contains("UnsupportedCertVersion") => {
                "the node's certificate is not an X.509 v3 certificate (openssl x509 -req made \
                 it without -extfile): reissue it with v3 extensions"
                    .to_string()
            }
            _ => "the node's certificate was refused".to_string(),
        },
        rustls::Error::AlertReceived(alert) => format!(
            "the node refused the handshake ({alert:?}): a node with --tls-client-auth needs a \
             client certificate signed by its CA (raftlock --cert FILE --key FILE; \
             ClientTls::identity)"
        ),
        _ => "the TLS handshake did not complete".to_string(),
    };
    format!("{hint} ({e})")
}

/// The rustls error inside `e`, if any (tokio-rustls wraps it in an
/// io::Error).
fn rustls_error_of(e: &std::io::Error) -> Option<&rustls::Error> {
    e.get_ref()
        .and_then(|inner| inner.downcast_ref::<rustls::Error>())
}

/// The client side of this client's TLS settings, as rustls takes them
/// (for [`tls_verdict`]); `None` if they do not parse (tonic reports that
/// itself).
fn rustls_config(tls: &ClientTls) -> Option<Arc<rustls::ClientConfig>> {
    use rustls::pki_types::pem::PemObject as _;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer};
    let mut roots = rustls::RootCertStore::empty();
    for ca in CertificateDer::pem_slice_iter(&tls.ca_pem) {
        roots.add(ca.ok()?).ok()?;
    }
    let builder = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .ok()?
    .with_root_certificates(roots);
    let mut config = match &tls.identity {
        None => builder.with_no_client_auth(),
        Some((cert, key)) => {
            let chain = CertificateDer::pem_slice_iter(cert)
                .collect::<std::result::Result<Vec<_>, _>>()
                .ok()?;
            let key = PrivateKeyDer::from_pem_slice(key).ok()?;
            builder.with_client_auth_cert(chain, key).ok()?
        }
    };
    config.alpn_protocols = vec![b"h2".to_vec()];
    Some(Arc::new(config))
}

/// What the node at `addr` makes of this client's TLS: a handshake with
/// `config`, then an HTTP/2 preface, and the node's first answer. A node
/// that refuses the client's certificate says so with an alert right
/// after the handshake (TLS 1.3), which an HTTP/2 connection may report
/// only as "connection closed". `None`: no TLS trouble seen.
async fn tls_verdict(addr: &str, config: Arc<rustls::ClientConfig>) -> Option<rustls::Error> {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    let host = addr.rsplit_once(':').map_or(addr, |(h, _)| h);
    let host = host.trim_start_matches('[').trim_end_matches(']');
    let name = rustls::pki_types::ServerName::try_from(host.to_string()).ok()?;
    let probe = async {
        let tcp = tokio::net::TcpStream::connect(addr).await.ok()?;
        let mut tls = match tokio_rustls::TlsConnector::from(config)
            .connect(name, tcp)
            .await
        {
            Ok(tls) => tls,
            Err(e) => return rustls_error_of(&e).cloned(),
        };
        // The connection preface and an empty SETTINGS frame.
        const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\0\0\0\x04\0\0\0\0\0";
        if let Err(e) = tls.write_all(PREFACE).await {
            return rustls_error_of(&e).cloned();
        }
        let mut answer = [0u8; 64];
        match tls.read(&mut answer).await {
            Err(e) => rustls_error_of(&e).cloned(),
            Ok(_) => None,
        }
    };
    tokio::time::timeout(TLS_PROBE_TIMEOUT, probe)
        .await
        .ok()
        .flatten()
}

/// What a plaintext client is told about a node that speaks TLS.
const SPEAKS_TLS: &str = "the node speaks TLS and this client has no TLS settings: give it the \
    cluster's CA (raftlock --ca FILE or RAFTLOCK_CA; ClientOptions::tls)";

/// Whether the server at `addr` answers a TLS ClientHello with a TLS
/// record: it speaks TLS. Used only after a plaintext connection failed,
/// to say why; the probe connection is dropped after the first bytes.
async fn speaks_tls(addr: &str) -> bool {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    let probe = async {
        let mut conn = tokio::net::TcpStream::connect(addr).await.ok()?;
        conn.write_all(CLIENT_HELLO).await.ok()?;
        let mut head = [0u8; 3];
        conn.read_exact(&mut head).await.ok()?;
        // A TLS record: handshake (22) or alert (21), protocol major 3.
        Some(matches!(head, [0x15 | 0x16, 0x03, _]))
    };
    tokio::time::timeout(TLS_PROBE_TIMEOUT, probe)
        .await
        .ok()
        .flatten()
        .unwrap_or(false)
}

/// A TLS 1.2 ClientHello a TLS server answers with a record of its own
/// (ServerHello or an alert): cipher suites ECDHE-ECDSA/RSA-AES128-GCM and
/// TLS_AES_128_GCM_SHA256; extensions supported groups (x25519, P-256), EC
/// point formats, signature algorithms, extended master secret.
const CLIENT_HELLO: &[u8] = &[
    0x16, 0x03, 0x01, 0x00, 0x51, // record: handshake, 81 bytes
    0x01, 0x00, 0x00, 0x4d, // ClientHello, 77 bytes
    0x03, 0x03, // TLS 1.2
    0x72, 0x61, 0x66, 0x74, 0x6c, 0x6f, 0x63, 0x6b, 0x20, 0x74, 0x6c, 0x73, 0x20, 0x70, 0x72, 0x6f,
    0x62, 0x65, 0x2c, 0x20, 0x6e, 0x6f, 0x74, 0x20, 0x72, 0x61, 0x6e, 0x64, 0x6f, 0x6d, 0x21,
    0x21, // random (32 bytes: "raftlock tls probe, not random!!")
    0x00, // no session id
    0x00, 0x06, 0xc0, 0x2b, 0xc0, 0x2f, 0x13, 0x01, // cipher suites
    0x01, 0x00, // compression: null
    0x00, 0x1e, // extensions, 30 bytes
    0x00, 0x0a, 0x00, 0x06, 0x00, 0x04, 0x00, 0x1d, 0x00, 0x17, // supported groups
    0x00, 0x0b, 0x00, 0x02, 0x01, 0x00, // EC point formats: uncompressed
    0x00, 0x0d, 0x00, 0x06, 0x00, 0x04, 0x04, 0x03, 0x08, 0x04, // signature algorithms
    0x00, 0x17, 0x00, 0x00, // extended master secret
];

/// `status` in words a person can act on: a refused connection, the
/// innermost transport error (a TLS handshake's, say), or the message.
pub(super) fn describe(status: &Status) -> String {
    if connection_refused(status) {
        return "connection refused".into();
    }
    if name_unresolved(status) {
        let inner = sources(status).last().map(|e| e.to_string());
        return format!("the name does not resolve ({})", inner.unwrap_or_default());
    }
    match sources(status).last() {
        Some(inner) => inner.to_string(),
        None => format!("{:?}: {}", status.code(), status.message()),
    }
}

impl Transport {
    /// Why `status` from `addr` is TLS trouble, if it is: the handshake
    /// failed; or, after a connection failed without saying why, a probe
    /// finds that the node speaks TLS (a plaintext client) or refuses this
    /// client's TLS (say, its certificate). A node is probed at most once
    /// a call.
    pub(super) async fn tls_trouble(
        &self,
        status: &Status,
        addr: &str,
        tried: &mut Tried,
    ) -> Option<String> {
        if let Some(why) = tls_failure(status, addr) {
            return Some(why);
        }
        let transport_failure = std::error::Error::source(status).is_some()
            && !connection_refused(status)
            && status.metadata().get(NOT_LEADER_KEY).is_none();
        if !transport_failure {
            return None;
        }
        // The probes dial TCP: over a custom transport there is no TLS
        // trouble to find that way.
        if self.state.options.connector.is_some() {
            return None;
        }
        if let Some(why) = tried.probed.get(addr) {
            return why.clone();
        }
        let why = match &self.state.options.tls {
            None => speaks_tls(addr).await.then(|| SPEAKS_TLS.to_string()),
            Some(tls) => match rustls_config(tls) {
                Some(config) => tls_verdict(addr, config)
                    .await
                    .map(|e| format!("TLS handshake failed: {}", explain_tls(&e, addr))),
                None => None,
            },
        };
        tried.probed.insert(addr.to_string(), why.clone());
        why
    }

    /// The error to give up with once every endpoint is hopeless.
    pub(super) fn give_up_if_hopeless(&self, tried: &Tried) -> Option<Error> {
        let tls = tried.hopeless_everywhere(self.endpoints())?;
        let each = if self.endpoints().len() == 1 {
            "it"
        } else {
            "each"
        };
        Some(Error::Unreachable(if tls {
            format!(
                "no node could be used: TLS stands in the way ({each} failed every attempt): {}",
                tried.summary()
            )
        } else {
            format!(
                "no node accepts connections ({each} refused or did not resolve every attempt): {}",
                tried.summary()
            )
        }))
    }
}
