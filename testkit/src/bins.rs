//! Binaries of other workspace packages, for tests that run them as
//! processes. Cargo gives a test `CARGO_BIN_EXE_<name>` only for its own
//! package's binaries; another package's is found beside them (in
//! `target/<profile>/`, where `cargo test --workspace` builds every
//! binary) or, when it is not there (`cargo test -p <package>` on a fresh
//! target directory), built there with cargo, once per test process.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

/// Binary `name` of workspace package `package`: the path in environment
/// variable `env_override` if it is set; else the one in the profile
/// directory of `beside` (a binary of the calling test's own package, from
/// its `CARGO_BIN_EXE_*`), built with `cargo build -p package --bin name`
/// first unless `fresh_build` is false and it is already there.
/// `fresh_build`: always ask cargo (a no-op when it is up to date), so a
/// test never runs a stale binary of code it is about.
pub fn workspace_bin(
    package: &str,
    name: &str,
    beside: &Path,
    env_override: &str,
    fresh_build: bool,
) -> PathBuf {
    static FOUND: Mutex<BTreeMap<String, PathBuf>> = Mutex::new(BTreeMap::new());
    if let Some(p) = std::env::var_os(env_override) {
        return PathBuf::from(p);
    }
    let mut found = FOUND.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(p) = found.get(name) {
        return p.clone();
    }
    let profile_dir = beside.parent().expect("a binary has a directory");
    let bin = profile_dir.join(name);
    if fresh_build || !bin.is_file() {
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
        let mut cmd = std::process::Command::new(cargo);
        cmd.args(["build", "-p", package, "--bin", name])
            .current_dir(env!("CARGO_MANIFEST_DIR"));
        if profile_dir.file_name().and_then(|n| n.to_str()) == Some("release") {
            cmd.arg("--release");
        }
        if let Some(target_dir) = profile_dir.parent() {
            cmd.env("CARGO_TARGET_DIR", target_dir);
        }
        let status = cmd.status().expect("cargo runs");
        assert!(status.success(), "building {name} failed");
        assert!(bin.is_file(), "{name} missing at {}", bin.display());
    }
    found.insert(name.to_string(), bin.clone());
    bin
}
