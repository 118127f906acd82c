//! Test certificates: a CA, a node certificate for 127.0.0.1/localhost and
//! client certificates, generated afresh (rcgen) for each test; and
//! certificates with one flaw each, for the tests of what refuses them.

use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DnType, ExtendedKeyUsagePurpose, IsCa,
    KeyPair, SigningKey as _,
};

/// A certificate authority.
pub struct Ca {
    issuer: CertifiedIssuer<'static, KeyPair>,
}

/// A certificate and its key, PEM.
#[derive(Clone)]
pub struct Leaf {
    /// Certificate.
    pub cert_pem: Vec<u8>,
    /// Private key.
    pub key_pem: Vec<u8>,
}

/// One thing wrong with a certificate.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Flaw {
    /// Nothing: a v3 certificate with the names as SANs.
    None,
    /// Its validity ended in 2020.
    Expired,
    /// An X.509 v1 certificate (no extensions at all), as `openssl x509
    /// -req` makes without `-extfile`.
    V1,
    /// Extended key usage serverAuth only (no clientAuth).
    ServerAuthOnly,
}

impl Ca {
    /// A new self-signed CA named `name`.
    pub fn new(name: &str) -> Ca {
        let mut params = CertificateParams::new(Vec::<String>::new()).expect("params");
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.distinguished_name.push(DnType::CommonName, name);
        let key = KeyPair::generate().expect("key");
        Ca {
            issuer: CertifiedIssuer::self_signed(params, key).expect("CA"),
        }
    }

    /// The CA certificate, PEM.
    pub fn pem(&self) -> Vec<u8> {
        self.issuer.pem().into_bytes()
    }

    /// A certificate for `names` (DNS names or IPs) with common name
    /// `cn`, signed by this CA.
    pub fn issue(&self, cn: &str, names: &[&str]) -> Leaf {
        self.issue_flawed(cn, names, Flaw::None)
    }

    /// Like [`issue`](Self::issue), with `flaw`.
    pub fn issue_flawed(&self, cn: &str, names: &[&str], flaw: Flaw) -> Leaf {
        let names: Vec<String> = names.iter().map(|s| s.to_string()).collect();
        let mut params = CertificateParams::new(names).expect("params");
        params.distinguished_name.push(DnType::CommonName, cn);
        match flaw {
            Flaw::Expired => {
                params.not_before = rcgen::date_time_ymd(2019, 1, 1);
                params.not_after = rcgen::date_time_ymd(2020, 1, 1);
            }
            Flaw::ServerAuthOnly => {
                params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
            }
            Flaw::None | Flaw::V1 => {}
        }
        let key = KeyPair::generate().expect("key");
        let cert = params.signed_by(&key, &self.issuer).expect("sign");
        let cert_pem = match flaw {
            Flaw::V1 => pem("CERTIFICATE", &self.v1(cert.der())),
            _ => cert.pem(),
        };
        Leaf {
            cert_pem: cert_pem.into_bytes(),
            key_pem: key.serialize_pem().into_bytes(),
        }
    }

    /// `v3` (DER) made an X.509 v1 certificate: the same fields without
    /// the version and the extensions, signed again by this CA.
    fn v1(&self, v3: &[u8]) -> Vec<u8> {
        let (_, cert, _) = der(v3);
        let (_, tbs, rest) = der(cert);
        let (_, _, sig_alg_rest) = der(rest);
        let sig_alg = &rest[..rest.len() - sig_alg_rest.len()];
        let mut fields = Vec::new();
        let mut at = tbs;
        while !at.is_empty() {
            let (tag, _, next) = der(at);
            // [0] version and [3] extensions go.
            if tag != 0xa0 && tag != 0xa3 {
                fields.extend_from_slice(&at[..at.len() - next.len()]);
            }
            at = next;
        }
        let tbs = tlv(0x30, &fields);
        let signature = self.issuer.key().sign(&tbs).expect("sign");
        let mut bits = vec![0u8];
        bits.extend_from_slice(&signature);
        let mut body = tbs;
        body.extend_from_slice(sig_alg);
        body.extend_from_slice(&tlv(0x03, &bits));
        tlv(0x30, &body)
    }

    /// Node TLS settings with a certificate for `names` from this CA.
    pub fn node_tls(&self, names: &[&str], client_auth: bool) -> raftlock_node::tls::TlsOptions {
        self.node_tls_with(self.issue("raftlock node", names), client_auth)
    }

    /// Node TLS settings with `leaf` and this CA.
    pub fn node_tls_with(&self, leaf: Leaf, client_auth: bool) -> raftlock_node::tls::TlsOptions {
        raftlock_node::tls::TlsOptions {
            cert_pem: leaf.cert_pem,
            key_pem: leaf.key_pem,
            ca_pem: self.pem(),
            client_auth,
        }
    }
}

/// One DER element at the front of `input`: (tag, contents, rest).
fn der(input: &[u8]) -> (u8, &[u8], &[u8]) {
    let tag = input[0];
    let (len, header) = match input[1] {
        n if n < 0x80 => (usize::from(n), 2),
        n => {
            let k = usize::from(n & 0x7f);
            let len = input[2..2 + k]
                .iter()
                .fold(0usize, |acc, b| (acc << 8) | usize::from(*b));
            (len, 2 + k)
        }
    };
    (tag, &input[header..header + len], &input[header + len..])
}

/// A DER element.
fn tlv(tag: u8, contents: &[u8]) -> Vec<u8> {
    let mut out = vec![tag];
    let len = contents.len();
    if len < 0x80 {
        out.push(len as u8);
    } else {
        let bytes: Vec<u8> = len
            .to_be_bytes()
            .into_iter()
            .skip_while(|b| *b == 0)
            .collect();
        out.push(0x80 | bytes.len() as u8);
        out.extend_from_slice(&bytes);
    }
    out.extend_from_slice(contents);
    out
}

fn pem(label: &str, der: &[u8]) -> String {
    const B64: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut text = String::new();
    for chunk in der.chunks(3) {
        let b = [
            chunk[0],
            *chunk.get(1).unwrap_or(&0),
            *chunk.get(2).unwrap_or(&0),
        ];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        for i in 0..4 {
            if i <= chunk.len() {
                text.push(B64[((n >> (18 - 6 * i)) & 63) as usize] as char);
            } else {
                text.push('=');
            }
        }
    }
    let mut out = format!("-----BEGIN {label}-----\n");
    for line in text.as_bytes().chunks(64) {
        out.push_str(std::str::from_utf8(line).expect("ascii"));
        out.push('\n');
    }
    out.push_str(&format!("-----END {label}-----\n"));
    out
}
