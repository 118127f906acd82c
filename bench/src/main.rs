//! `raftlock-bench`: the side-by-side load generator. It is built by the
//! benchmark issue; until then the binary only says so and exits non-zero.

fn main() {
    eprintln!("raftlock-bench: not built yet (see the benchmark issue)");
    std::process::exit(2);
}
