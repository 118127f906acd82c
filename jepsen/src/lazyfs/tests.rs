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

/// A full disk refuses writes, creations and syncs with ENOSPC and lets
/// reads through; an EIO disk refuses only syncs, and what it refused to
/// sync is still lost on a power loss; both work again once healed.
#[test]
fn a_failing_disk_refuses_what_it_should_and_heals() {
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
    a.write_all(b"kept").unwrap();
    a.sync_all().unwrap();

    m.control.set_error(Some(DiskError::Full));
    let enospc = |r: std::io::Result<()>| r.unwrap_err().raw_os_error() == Some(libc::ENOSPC);
    assert!(enospc(a.write_all_at(b"more", 4)), "write");
    assert!(enospc(a.set_len(100)), "growing truncation");
    assert!(enospc(a.sync_all()), "sync");
    assert!(enospc(File::create(mnt.join("new")).map(drop)), "create");
    assert!(enospc(std::fs::create_dir(mnt.join("d"))), "mkdir");
    assert_eq!(std::fs::read(mnt.join("a")).unwrap(), b"kept", "reads work");
    assert!(m.control.refused() >= 5);

    m.control.set_error(Some(DiskError::SyncEio));
    a.write_all_at(b" and unsynced", 4).unwrap();
    let r = a.sync_data();
    assert_eq!(r.unwrap_err().raw_os_error(), Some(libc::EIO));
    m.control.lose_unsynced().unwrap();
    assert_eq!(
        std::fs::read(mnt.join("a")).unwrap(),
        b"kept",
        "a write whose sync failed is not durable"
    );

    m.control.set_error(None);
    a.write_all_at(b"!", 4).unwrap();
    a.sync_all().unwrap();
    File::create(mnt.join("new")).unwrap();
    m.control.lose_unsynced().unwrap();
    assert_eq!(std::fs::read(mnt.join("a")).unwrap(), b"kept!");
}
