//! A minimal DER reader: just enough to find a certificate's subject CN.
//! It reads what the TLS layer has already verified, but must still never
//! panic or loop on any bytes (see the property tests below).

/// Reads one DER element at the front of `input`: (tag, contents, rest).
fn der_element(input: &[u8]) -> Option<(u8, &[u8], &[u8])> {
    let (&tag, rest) = input.split_first()?;
    let (&first, rest) = rest.split_first()?;
    let (len, rest) = if first < 0x80 {
        (usize::from(first), rest)
    } else {
        let n = usize::from(first & 0x7f);
        if n == 0 || n > 4 || rest.len() < n {
            return None;
        }
        let len = rest[..n]
            .iter()
            .fold(0usize, |acc, &b| (acc << 8) | usize::from(b));
        (len, &rest[n..])
    };
    if rest.len() < len {
        return None;
    }
    Some((tag, &rest[..len], &rest[len..]))
}

const SEQUENCE: u8 = 0x30;
const SET: u8 = 0x31;
const OID: u8 = 0x06;
/// 2.5.4.3, id-at-commonName.
const OID_COMMON_NAME: &[u8] = &[0x55, 0x04, 0x03];

/// The first common name (CN) in a DER certificate's subject.
pub fn subject_common_name(cert: &[u8]) -> Option<String> {
    let (SEQUENCE, certificate, _) = der_element(cert)? else {
        return None;
    };
    let (SEQUENCE, tbs, _) = der_element(certificate)? else {
        return None;
    };
    let mut rest = tbs;
    // Optional [0] version, then serial, signature, issuer, validity, subject.
    let (tag, _, after) = der_element(rest)?;
    if tag == 0xa0 {
        rest = after;
    }
    for _ in 0..4 {
        rest = der_element(rest)?.2;
    }
    let (SEQUENCE, mut subject, _) = der_element(rest)? else {
        return None;
    };
    while !subject.is_empty() {
        let (SET, mut rdn, next) = der_element(subject)? else {
            return None;
        };
        subject = next;
        while !rdn.is_empty() {
            let (SEQUENCE, attribute, next) = der_element(rdn)? else {
                return None;
            };
            rdn = next;
            let (OID, oid, value) = der_element(attribute)? else {
                return None;
            };
            if oid == OID_COMMON_NAME {
                let (tag, text, _) = der_element(value)?;
                // UTF8String, PrintableString, IA5String.
                if matches!(tag, 0x0c | 0x13 | 0x16) {
                    return String::from_utf8(text.to_vec()).ok();
                }
                return None;
            }
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    fn certificate(common_name: Option<&str>, key: &rcgen::KeyPair) -> Vec<u8> {
        let mut params = rcgen::CertificateParams::new(vec!["localhost".into()]).expect("params");
        params.distinguished_name = rcgen::DistinguishedName::new();
        params
            .distinguished_name
            .push(rcgen::DnType::OrganizationName, "acme");
        if let Some(cn) = common_name {
            params
                .distinguished_name
                .push(rcgen::DnType::CommonName, cn);
        }
        params.self_signed(key).expect("cert").der().to_vec()
    }

    #[test]
    fn the_subject_common_name_is_read_from_a_certificate() {
        let key = rcgen::KeyPair::generate().expect("key");
        let der = certificate(Some("billing-worker"), &key);
        assert_eq!(subject_common_name(&der).as_deref(), Some("billing-worker"));
        // No CN at all.
        let der = certificate(None, &key);
        assert_eq!(subject_common_name(&der), None);
        // Every truncation is refused, without a panic.
        for cut in 0..der.len() {
            assert_eq!(subject_common_name(&der[..cut]), None, "cut at {cut}");
        }
        // A length that claims more than there is.
        assert_eq!(
            subject_common_name(&[0x30, 0x84, 0xff, 0xff, 0xff, 0xff]),
            None
        );
        assert_eq!(subject_common_name(&[]), None);
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]

        /// Any common name survives the trip through a real certificate.
        #[test]
        fn any_common_name_is_read_back(cn in "[a-zA-Z0-9 ._@:/-]{1,64}") {
            let key = rcgen::KeyPair::generate().expect("key");
            let der = certificate(Some(&cn), &key);
            prop_assert_eq!(subject_common_name(&der), Some(cn));
        }

        /// Arbitrary bytes never panic; whatever comes back is text that
        /// was in the input.
        #[test]
        fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
            if let Some(cn) = subject_common_name(&bytes) {
                prop_assert!(bytes.windows(cn.len()).any(|w| w == cn.as_bytes()));
            }
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(256))]

        /// A real certificate with some of its bytes changed (lengths and
        /// tags included) never panics.
        #[test]
        fn corrupted_certificates_never_panic(
            edits in proptest::collection::vec((any::<proptest::sample::Index>(), any::<u8>()), 1..8),
        ) {
            static DER: std::sync::OnceLock<Vec<u8>> = std::sync::OnceLock::new();
            let der = DER.get_or_init(|| {
                certificate(Some("billing-worker"), &rcgen::KeyPair::generate().expect("key"))
            });
            let mut bytes = der.clone();
            for (at, value) in edits {
                let i = at.index(bytes.len());
                bytes[i] = value;
            }
            let _ = subject_common_name(&bytes);
        }
    }
}
