//! `raftlockd restore` (a backup placed in a new node's data directory)
//! checks the fence bump against the fence bound before it writes
//! anything: at the bound it is taken, one past it is refused.

use std::process::Command;

use raftlock_node::state::limits::MAX_FENCE;
use raftlock_node::state::LockTable;

fn restore(
    backup: &std::path::Path,
    data_dir: &std::path::Path,
    bump: u64,
) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_raftlockd"))
        .arg("restore")
        .arg(backup)
        .arg("--data-dir")
        .arg(data_dir)
        .arg("--fence-bump")
        .arg(bump.to_string())
        .output()
        .expect("raftlockd runs")
}

#[test]
fn a_fence_bump_past_the_bound_is_refused_before_anything_is_written() {
    let dir = tempfile::tempdir().expect("dir");
    let backup = dir.path().join("backup.bin");
    // An empty table: its fence counter is 0.
    std::fs::write(&backup, LockTable::new().to_snapshot()).expect("backup");

    let refused_dir = dir.path().join("refused");
    let out = restore(&backup, &refused_dir, MAX_FENCE + 1);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "bump past the bound was taken");
    assert!(
        stderr.contains("largest fence"),
        "the error names the bound: {stderr}"
    );
    assert!(!refused_dir.exists(), "a refused restore wrote nothing");

    let taken_dir = dir.path().join("taken");
    let out = restore(&backup, &taken_dir, MAX_FENCE);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "bump to exactly the bound: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains(&MAX_FENCE.to_string()), "{stdout}");
    assert!(taken_dir.join(raftlock_node::node::RESTORE_FILE).exists());
}
