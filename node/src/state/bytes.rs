//! Byte strings through serde as one blob (`#[serde(with = "bytes")]`).
//!
//! serde treats a `Vec<u8>` as a sequence of numbers: bincode then reads and
//! writes it one byte at a time. As bytes it is one length and one copy, and
//! bincode's encoding is the same either way, so this changes speed, not
//! format.

use std::fmt;

use serde::de::{SeqAccess, Visitor};
use serde::{Deserializer, Serializer};

pub(super) fn serialize<S: Serializer>(bytes: &[u8], s: S) -> Result<S::Ok, S::Error> {
    s.serialize_bytes(bytes)
}

pub(super) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<u8>, D::Error> {
    d.deserialize_byte_buf(BytesVisitor)
}

struct BytesVisitor;

impl<'de> Visitor<'de> for BytesVisitor {
    type Value = Vec<u8>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a byte string")
    }

    fn visit_bytes<E>(self, v: &[u8]) -> Result<Vec<u8>, E> {
        Ok(v.to_vec())
    }

    fn visit_byte_buf<E>(self, v: Vec<u8>) -> Result<Vec<u8>, E> {
        Ok(v)
    }

    /// Formats without a byte type (JSON) send a sequence of numbers.
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Vec<u8>, A::Error> {
        let mut out = Vec::with_capacity(seq.size_hint().unwrap_or(0).min(1 << 20));
        while let Some(b) = seq.next_element()? {
            out.push(b);
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use serde::{Deserialize, Serialize};

    #[derive(Debug, PartialEq, Serialize, Deserialize)]
    struct Plain(Vec<u8>);

    #[derive(Debug, PartialEq, Serialize, Deserialize)]
    struct Blob(#[serde(with = "super")] Vec<u8>);

    #[test]
    fn bincode_bytes_are_the_same_as_a_plain_vec() {
        let data: Vec<u8> = (0..=255).collect();
        let plain = bincode::serialize(&Plain(data.clone())).expect("encode");
        let blob = bincode::serialize(&Blob(data.clone())).expect("encode");
        assert_eq!(plain, blob);
        let back: Blob = bincode::deserialize(&plain).expect("decode");
        assert_eq!(back.0, data);
        // JSON still round-trips (as a list of numbers).
        let json = serde_json::to_string(&Blob(vec![1, 2, 3])).expect("json");
        let back: Blob = serde_json::from_str(&json).expect("json back");
        assert_eq!(back.0, vec![1, 2, 3]);
        let truncated = &plain[..plain.len() - 1];
        assert!(bincode::deserialize::<Blob>(truncated).is_err());
    }
}
