//! The log and snapshot encodings, byte for byte: every kind of command,
//! and a busy table's snapshot, as the code of 2026-11-25 wrote them
//! (`golden/commands.hex`; `golden/snapshot-v4.hex`, lock-table format 4,
//! `golden/snapshot-v5.hex`, format 5, and `golden/snapshot-v6.hex`, format
//! 6, written 2026-11-30). A change of the Rust types that
//! changes a byte breaks old logs and snapshots; this test catches it.
//! `RAFTLOCK_WRITE_GOLDEN=1` rewrites the files of today's formats (only
//! for a deliberate, versioned format change; new commands append lines).

use super::*;

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// One command of every kind, with every field set.
fn commands() -> Vec<Command> {
    let s = SessionId(3072);
    vec![
        Command::OpenSessionV0(cmd::OpenSessionV0 {
            ttl_ms: 10_000,
            lock_delay_ms: 250,
            nonce: 77,
            owner: "app".into(),
        }),
        Command::CloseSession(cmd::CloseSession {
            session: s,
            seq: 9,
            caller: "app".into(),
        }),
        Command::Acquire(cmd::Acquire {
            session: s,
            seq: 4,
            name: LockName::new("jobs/nightly").expect("valid name"),
            mode: Mode::Semaphore {
                weight: 2,
                capacity: 5,
            },
            timeout_ms: 30_000,
            value: b"leader-a".to_vec(),
            caller: "app".into(),
        }),
        Command::Release(cmd::Release {
            session: s,
            seq: 5,
            name: LockName::new("jobs/nightly").expect("valid name"),
            fence: Fence(12),
            caller: "app".into(),
        }),
        Command::ExpireSession(cmd::ExpireSession { session: s }),
        Command::TimeoutWait(cmd::TimeoutWait {
            session: s,
            name: LockName::new("x").expect("valid name"),
            seq: 6,
        }),
        Command::EndLockDelay(cmd::EndLockDelay {
            name: LockName::new("x").expect("valid name"),
            since: 4096,
        }),
        Command::RestorePart(cmd::RestorePart {
            restore: 99,
            part: 1,
            parts: 3,
            bytes: vec![1, 2, 3],
            fence_bump: 1 << 32,
        }),
        Command::Cancel(cmd::Cancel {
            session: s,
            seq: 7,
            name: LockName::new("y").expect("valid name"),
            caller: "app".into(),
        }),
        Command::OpenSession(cmd::OpenSession {
            ttl_ms: 30_000,
            lock_delay_ms: 0,
            nonce: 78,
            owner: "app".into(),
            end_on_disconnect_ms: 300,
        }),
        Command::Lock(cmd::Lock {
            open: cmd::OpenSession {
                ttl_ms: 10_000,
                lock_delay_ms: 0,
                nonce: 79,
                owner: "app".into(),
                end_on_disconnect_ms: 0,
            },
            name: LockName::new("z").expect("valid name"),
            mode: Mode::Shared,
            timeout_ms: WAIT,
            value: Vec::new(),
        }),
        Command::SetTtl(cmd::SetTtl {
            session: s,
            seq: 8,
            ttl_ms: 2_000,
            caller: "app".into(),
        }),
        Command::Upgrade(cmd::Upgrade {
            session: s,
            seq: 11,
            name: LockName::new("doc/7").expect("valid name"),
            fence: Fence(13),
            timeout_ms: 2_500,
            caller: "app".into(),
        }),
        Command::Downgrade(cmd::Downgrade {
            session: s,
            seq: 12,
            name: LockName::new("doc/7").expect("valid name"),
            fence: Fence(14),
            caller: "app".into(),
        }),
        Command::AcquireAll(cmd::AcquireAll {
            session: s,
            seq: 13,
            locks: vec![
                (
                    LockName::new("order/1").expect("valid name"),
                    Mode::Exclusive,
                ),
                (LockName::new("stock/9").expect("valid name"), Mode::Shared),
                (
                    LockName::new("pool").expect("valid name"),
                    Mode::Semaphore {
                        weight: 1,
                        capacity: 4,
                    },
                ),
            ],
            timeout_ms: 5_000,
            value: b"w".to_vec(),
            caller: "app".into(),
        }),
        Command::RevokeSession(cmd::RevokeSession {
            session: s,
            by: "ops".into(),
            at_unix_ms: 1_764_115_200_000,
        }),
    ]
}

fn check(file: &str, text: String) {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("src/state/tests/golden")
        .join(file);
    if std::env::var("RAFTLOCK_WRITE_GOLDEN").is_ok_and(|v| v == "1") {
        std::fs::write(&path, &text).expect("write golden file");
    }
    let golden = std::fs::read_to_string(&path).expect("golden file");
    assert_eq!(text, golden, "the encoding of {file} changed");
}

#[test]
fn every_command_encodes_as_it_always_did() {
    let text: String = commands()
        .iter()
        .map(|c| hex(&crate::codec::encode(c).expect("encodes")) + "\n")
        .collect();
    check("commands.hex", text);
    // And each line decodes back to its command.
    for (line, command) in include_str!("golden/commands.hex").lines().zip(commands()) {
        let bytes: Vec<u8> = (0..line.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&line[i..i + 2], 16).expect("hex"))
            .collect();
        assert_eq!(
            crate::codec::decode::<Command>(&bytes).expect("decodes"),
            command
        );
    }
}

#[test]
fn a_busy_tables_snapshot_encodes_as_it_always_did() {
    let mut h = Harness::new();
    let a = h.open();
    let b = h.open_with(6_000, 100);
    h.grant(a, "x", X);
    h.queue(b, "x", SH);
    h.grant(b, "s", sem(2, 3));
    let c = h.open();
    h.close(c);
    h.apply(Command::SetTtl(cmd::SetTtl {
        session: a,
        seq: h.seq + 1,
        ttl_ms: 4_000,
        caller: String::new(),
    }));
    let bytes = h.table.to_snapshot();
    check("snapshot-v6.hex", hex(&bytes) + "\n");
    assert_eq!(LockTable::from_snapshot(&bytes).expect("decodes"), h.table);
    // The same table in format 5, as the code before the restore record
    // wrote it.
    let v5 = read("snapshot-v5.hex");
    assert_eq!(v5[0], crate::state::view::SNAPSHOT_VERSION_5);
    assert_eq!(LockTable::from_snapshot(&v5).expect("decodes"), h.table);
    // The same table in format 4, as the code before upgrades wrote it.
    let v4 = read("snapshot-v4.hex");
    assert_eq!(v4[0], crate::state::view::SNAPSHOT_VERSION_4);
    assert_eq!(LockTable::from_snapshot(&v4).expect("decodes"), h.table);
}

fn read(file: &str) -> Vec<u8> {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("src/state/tests/golden")
        .join(file);
    let line = std::fs::read_to_string(&path).expect("golden file");
    let line = line.trim();
    (0..line.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&line[i..i + 2], 16).expect("hex"))
        .collect()
}
