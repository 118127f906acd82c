//! `raftlock-jepsen`: the fault-injection harness (processes, partitions,
//! pauses, clock skew, checkers). It is built by the jepsen issue; until then
//! the binary only says so, and exits non-zero so no script mistakes it for a
//! passing run.

fn main() {
    eprintln!("raftlock-jepsen: not built yet (see the fault-injection issue)");
    std::process::exit(2);
}
