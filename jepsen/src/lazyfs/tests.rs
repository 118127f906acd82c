//! The FUSE layer mounted for real: unsynced writes are undone, synced ones kept.

use super::*;
use std::io::Write;

/// The layer keeps what was synced and drops what was not, in place
/// (overwrites), at the end (appends) and in new files; and a slow
/// sync is slow.
#[test]
fn synced_data_survives_and_unsynced_data_is_lost() {
    if !available() {
        eprintln!("SKIPPED: no /dev/fuse on this machine");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (backing, mnt) = (dir.path().join("disk"), dir.path().join("mnt"));
    let m = mount(&backing, &mnt).expect("mount");

    let mut a = OpenOptions::new()
        .create(true)
        .truncate(false)
        .read(true)
        .write(true)
        .open(mnt.join("a"))
        .unwrap();
    a.write_all(b"hello, world").unwrap();
    a.sync_data().unwrap();
    // Unsynced: an overwrite in the middle, an append, a new file.
    a.write_all_at(b"HELLO", 0).unwrap();
    a.write_all_at(b" and more", 12).unwrap();
    std::fs::write(mnt.join("b"), b"never synced").unwrap();
    std::fs::create_dir(mnt.join("sub")).unwrap();
    let mut c = File::create(mnt.join("sub/c")).unwrap();
    c.write_all(b"synced too").unwrap();
    c.sync_all().unwrap();
    // Until the power goes, everything reads back as written.
    assert_eq!(
        std::fs::read(mnt.join("a")).unwrap(),
        b"HELLO, world and more"
    );
    assert_eq!(std::fs::read(mnt.join("b")).unwrap(), b"never synced");

    let lost = m.control.lose_unsynced().unwrap();
    assert_eq!(lost, 2, "a and b lost writes");
    assert_eq!(std::fs::read(mnt.join("a")).unwrap(), b"hello, world");
    assert_eq!(std::fs::read(backing.join("a")).unwrap(), b"hello, world");
    assert_eq!(std::fs::read(mnt.join("b")).unwrap(), b"");
    assert_eq!(std::fs::read(mnt.join("sub/c")).unwrap(), b"synced too");

    // A truncation is a change like any other.
    a.set_len(3).unwrap();
    assert_eq!(std::fs::read(mnt.join("a")).unwrap(), b"hel");
    m.control.lose_unsynced().unwrap();
    assert_eq!(std::fs::read(mnt.join("a")).unwrap(), b"hello, world");

    // Renamed after writing: the loss follows the file.
    std::fs::write(mnt.join("t.tmp"), b"temp").unwrap();
    std::fs::rename(mnt.join("t.tmp"), mnt.join("t")).unwrap();
    m.control.lose_unsynced().unwrap();
    assert_eq!(std::fs::read(mnt.join("t")).unwrap(), b"");

    m.control.set_fsync_delay(Duration::from_millis(300));
    let started = std::time::Instant::now();
    a.sync_data().unwrap();
    assert!(started.elapsed() >= Duration::from_millis(300));
    m.control.set_fsync_delay(Duration::ZERO);
}
