//! The byte encoding of everything raftlock stores or sends between nodes
//! outside protobuf: Raft log entries and the log store's metadata, the
//! payloads of Raft RPCs (`RaftMessage.data`), the lock table's snapshot,
//! the snapshot file around it, and the state machine's commands. All of
//! it is bincode 1 with its default options (fixed-width little-endian
//! integers, lengths as u64), and this module is the one place that calls
//! it: a change of encoding is a change here, with a new format version
//! wherever the bytes are kept (`LOG_FORMAT_VERSION` for the log store,
//! the snapshot file's and the table's version bytes).
//!
//! The functions keep bincode's signatures, so a caller decides what an
//! error means (corrupt data on disk, a bad message from a peer).

use serde::de::DeserializeOwned;
use serde::Serialize;

/// An encoding or decoding error.
pub type Error = bincode::Error;

/// `v`'s bytes.
pub fn encode<T: Serialize + ?Sized>(v: &T) -> Result<Vec<u8>, Error> {
    bincode::serialize(v)
}

/// `v`'s bytes, for the types whose encoding cannot fail: bincode fails
/// only on a sequence of unknown length or a failing writer, and every
/// type this crate stores has known lengths and goes into a `Vec`.
pub fn to_vec<T: Serialize + ?Sized>(v: &T) -> Vec<u8> {
    encode(v).expect("raftlock's stored types always encode")
}

/// Appends `v`'s bytes to `out`.
pub fn encode_into<T: Serialize + ?Sized>(out: &mut Vec<u8>, v: &T) -> Result<(), Error> {
    bincode::serialize_into(out, v)
}

/// The value `bytes` encode; bytes after it are ignored.
pub fn decode<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, Error> {
    bincode::deserialize(bytes)
}

/// The value at the start of `bytes`, which are advanced past it.
pub fn decode_from<T: DeserializeOwned>(bytes: &mut &[u8]) -> Result<T, Error> {
    bincode::deserialize_from(bytes)
}

/// [`decode`] for data read from a disk: an error is `InvalidData`.
pub fn decode_stored<T: DeserializeOwned>(bytes: &[u8]) -> std::io::Result<T> {
    decode(bytes).map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, e))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The encoding raftlock's stored bytes depend on: fixed-width
    /// little-endian integers, a length as u64 before bytes, and `decode`
    /// ignoring what follows the value while `decode_from` advances past
    /// it.
    #[test]
    fn the_encoding_is_bincode_1_fixed_width_little_endian() {
        assert_eq!(to_vec(&0x0102u16), [0x02, 0x01]);
        assert_eq!(
            to_vec(&(7u64, vec![9u8])),
            [7, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 9]
        );
        let mut out = vec![0xff];
        encode_into(&mut out, &1u32).expect("encodes");
        assert_eq!(out, [0xff, 1, 0, 0, 0]);
        let two = [to_vec(&5u32), to_vec(&6u32)].concat();
        assert_eq!(decode::<u32>(&two).expect("decodes"), 5);
        let mut rest = &two[..];
        assert_eq!(decode_from::<u32>(&mut rest).expect("decodes"), 5);
        assert_eq!(rest, to_vec(&6u32));
        let err = decode_stored::<u64>(&[1, 2]).expect_err("too short");
        assert_eq!(err.kind(), std::io::ErrorKind::InvalidData);
    }
}
