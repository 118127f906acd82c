//! Tests of the snapshot file's encoding.

use super::*;
use crate::state::{cmd, Command, LockName, Mode, SessionId};

#[test]
fn snapshot_file_is_encoded_in_place_with_the_same_bytes() {
    let mut table = LockTable::new();
    table.apply(
        1,
        Command::OpenSessionV0(cmd::OpenSessionV0 {
            ttl_ms: 10_000,
            lock_delay_ms: 0,
            nonce: 7,
            owner: String::new(),
        }),
    );
    table.apply(
        2,
        Command::Acquire(cmd::Acquire {
            session: SessionId(1),
            seq: 1,
            name: LockName::new("a").expect("valid name"),
            mode: Mode::Exclusive,
            timeout_ms: 0,
            value: b"v".to_vec(),
            caller: String::new(),
        }),
    );
    let meta = SnapshotMeta {
        last_log_id: Some(crate::raft::log_id(3, 1, 2)),
        last_membership: StoredMembership::default(),
    };
    let mut old = vec![SNAPSHOT_FILE_VERSION];
    crate::codec::encode_into(
        &mut old,
        &SnapshotFile {
            meta: meta.clone(),
            table: table.to_snapshot(),
        },
    )
    .expect("serializes");
    let crc = crc32fast::hash(&old);
    old.extend_from_slice(&crc.to_le_bytes());
    for capacity in [0, 16, 1 << 20] {
        assert_eq!(encode_snapshot_file(&meta, &table, capacity), old);
    }
    assert_eq!(decode_snapshot_meta(&old).expect("meta"), meta);
    let file = decode_snapshot(&old).expect("decodes");
    assert_eq!(LockTable::from_snapshot(&file.table).expect("table"), table);
}
