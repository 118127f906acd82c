//! Records the commit the simulator is built from (and whether the code it
//! simulates had uncommitted changes), for its failure reports: a report
//! names the code that ran, not the checkout's HEAD when it was printed.

use std::process::Command;

fn git(args: &[&str]) -> Option<String> {
    let out = Command::new("git").args(args).output().ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).trim().to_string())
}

fn main() {
    let head = git(&["rev-parse", "HEAD"]).unwrap_or_else(|| "unknown".into());
    // The crates a run executes: the simulator and what it builds on.
    let dirty = git(&[
        "status",
        "--porcelain",
        "--",
        "../../node",
        "../../client",
        "../../proto",
        "../../testkit",
        ".",
    ])
    .is_some_and(|s| !s.is_empty());
    let commit = if dirty {
        format!("{head} (with uncommitted changes)")
    } else {
        head
    };
    println!("cargo:rustc-env=RAFTLOCK_SIM_COMMIT={commit}");
    // Again when the checkout moves or any simulated source changes.
    for path in [
        "../../.git/HEAD",
        "../../.git/index",
        "../../node/src",
        "../../client/src",
        "../../proto",
        "../../testkit/src",
        "src",
    ] {
        println!("cargo:rerun-if-changed={path}");
    }
}
