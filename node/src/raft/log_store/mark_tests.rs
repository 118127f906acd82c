//! The mark ([`super::mark`]): its file's slots, its rules, and the store
//! refusing a log that lost what it had made durable, on both disks: sled
//! with its file cut short or a byte flipped, the simulated disk with its
//! newest durable writes taken back.

use std::os::unix::fs::FileExt as _;

use openraft::storage::RaftLogStorage;

use super::mark::{Mark, SLOT};
use super::tests::{append, blank};
use super::*;

#[test]
fn a_mark_file_keeps_the_newest_intact_slot() {
    let a = Mark::of(Some((7, b"seven")), Some(vec![1, 2]));
    let b = Mark::of(Some((9, b"nine")), None);
    let mut file = a.to_slot(4);
    file.extend(b.to_slot(5));
    assert_eq!(Mark::from_file(&file), Ok(Some((5, b.clone()))));
    // A torn write of the newer slot leaves the older one.
    file[SLOT + 20] ^= 0x10;
    assert_eq!(Mark::from_file(&file), Ok(Some((4, a.clone()))));
    // Zeros: nothing marked yet (a file just created).
    assert_eq!(Mark::from_file(&vec![0; 2 * SLOT]), Ok(None));
    assert_eq!(Mark::from_file(&[]), Ok(None));
    // Both damaged: refused.
    file[20] ^= 0x01;
    let err = Mark::from_file(&file).expect_err("no intact slot");
    assert!(err.contains("no slot"), "{err}");
}

#[test]
fn only_a_write_that_removes_or_replaces_the_marked_entry_lowers_the_mark() {
    let mark = Mark::of(Some((10, b"ten")), Some(vec![9]));
    let entry = |i: u64| (i == 4).then(|| b"four".to_vec());
    let lowered = Some(Mark::of(Some((4, b"four")), Some(vec![9])));
    // A truncation from 5 on, or a purge up to 10, takes entry 10.
    let truncate = Write::Remove {
        from: 5,
        to: u64::MAX,
    };
    assert_eq!(mark.before(&truncate, entry), lowered);
    let purge = Write::Remove { from: 0, to: 10 };
    assert_eq!(
        mark.before(&purge, entry),
        Some(Mark::of(None, Some(vec![9])))
    );
    // Entries written over it from 5 on.
    let over = Write::Log(vec![(5, vec![1])]);
    assert_eq!(mark.before(&over, entry), lowered);
    // Neither an append past it, a purge below it, nor a meta key.
    for write in [
        Write::Log(vec![(11, vec![1])]),
        Write::Remove { from: 0, to: 9 },
        Write::Meta(KEY_COMMITTED, vec![1]),
    ] {
        assert_eq!(mark.before(&write, entry), None, "{write:?}");
    }
}

#[test]
fn a_log_is_checked_against_its_mark() {
    let vote = |term, node| crate::codec::to_vec(&Vote::new(term, node));
    let mark = Mark::of(Some((10, b"ten")), Some(vote(3, 1)));
    let log = |i: u64| Ok((i == 10).then(|| b"ten".to_vec()));
    assert_eq!(mark.check(Some(&vote(3, 1)), 0, log), Ok(()));
    assert_eq!(
        mark.check(Some(&vote(4, 2)), 0, log),
        Ok(()),
        "a newer vote"
    );
    for older in [Some(vote(2, 1)), Some(vote(2, 5)), None] {
        let err = mark
            .check(older.as_deref(), 0, log)
            .expect_err("older vote");
        assert!(err.contains("vote"), "{err}");
    }
    let gone = mark
        .check(Some(&vote(3, 1)), 0, |_| Ok(None))
        .expect_err("entry gone");
    assert!(gone.contains("entry 10") && gone.contains("gone"), "{gone}");
    let other = mark
        .check(Some(&vote(3, 1)), 0, |_| Ok(Some(b"TEN".to_vec())))
        .expect_err("another entry");
    assert!(other.contains("not the one"), "{other}");
    // Purged past it: nothing to look for.
    assert_eq!(mark.check(Some(&vote(3, 1)), 11, |_| Ok(None)), Ok(()));
}

/// What a log holds when the tests damage it: 210 entries and a vote,
/// synced as a node does.
async fn fill(store: &mut LogStore) {
    append(store, 1..=200).await;
    store.save_vote(&Vote::new(2, 1)).await.expect("vote");
    append(store, 201..=210).await;
}

fn assert_refused(opened: Result<LogStore, String>, what: &str) {
    match opened {
        Ok(_) => panic!("{what}: a log that lost what it had made durable was opened"),
        // The mark's refusal, or sled's own when it sees the damage.
        Err(e) => assert!(
            (e.contains("the log lost data it had made durable") || e.contains("are damaged"))
                && e.contains("replace it"),
            "{what}: {e}"
        ),
    }
}

/// Where sled's data in `dir/db` ends (the file is longer: sled grows
/// it by whole segments).
fn data_end(db: &std::path::Path) -> u64 {
    let bytes = std::fs::read(db).expect("read db");
    bytes.iter().rposition(|b| *b != 0).expect("data") as u64 + 1
}

fn reopen_sled(dir: &std::path::Path) -> Result<LogStore, String> {
    let db = open_db(dir).map_err(|e| e.to_string())?;
    LogStore::new(db, dir).map_err(|e| format!("{e:#}"))
}

/// sled opens a damaged file without an error and keeps only what came
/// before the damage; the mark refuses the shorter log. Each damage on a
/// fresh log: the file cut short, or a byte flipped, near its end or
/// further in.
#[tokio::test]
async fn sled_damaged_at_rest_is_refused() {
    type Damage = fn(&std::fs::File, u64);
    // Without the mark, sled opened each of these with no error and kept
    // entries 1..=200, or none.
    let damages: [(&str, Damage); 4] = [
        ("cut to 95 %", |f, end| {
            f.set_len(end * 95 / 100).expect("cut")
        }),
        ("cut to 25 %", |f, end| f.set_len(end / 4).expect("cut")),
        ("a byte flipped at 95 %", |f, end| flip(f, end * 95 / 100)),
        ("a byte flipped in the middle", |f, end| flip(f, end / 2)),
    ];
    for (what, damage) in damages {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut store = reopen_sled(dir.path()).expect("open");
        fill(&mut store).await;
        drop(store);
        let path = dir.path().join("db");
        let end = data_end(&path);
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(&path)
            .expect("db");
        damage(&file, end);
        drop(file);
        assert_refused(reopen_sled(dir.path()), what);
    }
}

fn flip(file: &std::fs::File, at: u64) {
    let mut byte = [0u8];
    file.read_exact_at(&mut byte, at).expect("read");
    byte[0] ^= 0x20;
    file.write_all_at(&byte, at).expect("write");
}

/// The simulated disk's damage at rest: its newest durable writes taken
/// back, the mark kept.
#[tokio::test]
async fn a_simulated_disk_that_lost_its_newest_writes_is_refused() {
    for lost in [1, 3] {
        let disk = MemDisk::new();
        let mut store = LogStore::in_memory(disk.clone()).expect("open");
        fill(&mut store).await;
        drop(store);
        assert_eq!(disk.lose_newest(lost), lost);
        let opened = LogStore::in_memory(disk.clone()).map_err(|e| e.to_string());
        assert_refused(opened, &format!("{lost} write(s) lost"));
    }
}

/// A truncation lowers the mark before it, so a crash at any point of it
/// (the removal kept or not) leaves a log that opens; and after it the
/// mark follows the new entries.
#[tokio::test]
async fn a_truncation_cut_short_by_a_crash_is_not_taken_for_damage() {
    for keep in [0, 1] {
        let disk = MemDisk::new();
        let mut store = LogStore::in_memory(disk.clone()).expect("open");
        append(&mut store, 1..=10).await;
        // The removal is written, then the crash comes before its sync.
        store
            .disk
            .write(Write::Remove {
                from: 6,
                to: u64::MAX,
            })
            .expect("remove");
        drop(store);
        disk.crash(keep);
        let mut store = LogStore::in_memory(disk.clone()).expect("a crashed truncation opens");
        // As openraft goes on: the truncation again, then new entries (of
        // a later term) in place of the old.
        store
            .truncate_after(Some(blank(5).log_id))
            .await
            .expect("truncate");
        store.write_for_tests((6..=8).map(|i| Entry {
            log_id: crate::raft::log_id(2, 1, i),
            payload: crate::raft::EntryPayload::Blank,
        }));
        store.flush().await.expect("sync");
        drop(store);
        LogStore::in_memory(disk.clone()).expect("opens after the new entries");
        assert_eq!(disk.lose_newest(1), 1);
        assert_refused(
            LogStore::in_memory(disk.clone()).map_err(|e| e.to_string()),
            "the new entries lost",
        );
    }
    // On sled, through the store's own truncation.
    let dir = tempfile::tempdir().expect("tempdir");
    let mut store = reopen_sled(dir.path()).expect("open");
    append(&mut store, 1..=10).await;
    store
        .truncate_after(Some(blank(5).log_id))
        .await
        .expect("truncate");
    drop(store);
    let mut store = reopen_sled(dir.path()).expect("a truncated log opens");
    append(&mut store, 6..=7).await;
    drop(store);
    reopen_sled(dir.path()).expect("and after new entries");
}

/// A data directory from before the mark (no mark file) opens, and is
/// marked from its first sync on.
#[tokio::test]
async fn a_log_without_a_mark_file_opens_and_is_marked() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut store = reopen_sled(dir.path()).expect("open");
    append(&mut store, 1..=3).await;
    drop(store);
    std::fs::remove_file(dir.path().join(MARK_FILE)).expect("remove mark");
    let mut store = reopen_sled(dir.path()).expect("no mark: opens");
    append(&mut store, 4..=4).await;
    drop(store);
    let (_, found) = super::mark::MarkFile::open(dir.path()).expect("mark");
    assert_eq!(found.and_then(|m| m.last).map(|(i, _)| i), Some(4));
}

/// The whole-log read at open goes chunk by chunk past the first chunk,
/// from the purge point on.
#[tokio::test]
async fn a_log_longer_than_a_read_chunk_opens() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut store = reopen_sled(dir.path()).expect("open");
    let last = 2 * READ_CHUNK + 10;
    append(&mut store, 1..=last).await;
    store.purge(blank(100).log_id).await.expect("purge");
    drop(store);
    let mut store = reopen_sled(dir.path()).expect("a long log opens");
    let state = store.get_log_state().await.expect("state");
    assert_eq!(state.last_log_id.map(|l| l.index), Some(last));
}
