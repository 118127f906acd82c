//! The alerting rules shipped in `deploy/prometheus/raftlock-alerts.yml`
//! are what Prometheus would load: `promtool check rules` (Debian's
//! `prometheus` package) accepts them, and every raftlock or process
//! metric they name is one a real node exports, so no rule watches a
//! series that never exists (an alert on a misspelt metric never fires).
//!
//! The guide used to carry the rules as a table, and its latency rule did
//! not parse (an escaped `\|` inside a PromQL string).
//!
//! Debian's package is installed when `promtool` is missing and the test
//! runs as root; elsewhere it skips saying why (and fails instead under
//! CI=true or RAFTLOCK_REQUIRE_SERVERS=1, as `.ci/run` sets).

use std::collections::BTreeSet;
use std::io::Write as _;
use std::path::Path;
use std::process::{Command, Stdio};

use raftlock_testkit::servers::{self, Unavailable};
use raftlock_testkit::TestCluster;

const RULES: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../deploy/prometheus/raftlock-alerts.yml"
);

fn has(cmd: &str) -> bool {
    Command::new("sh")
        .args(["-c", &format!("command -v {cmd}")])
        .output()
        .is_ok_and(|o| o.status.success())
}

/// `promtool`, from Debian's `prometheus` package.
fn promtool() -> Result<(), Unavailable> {
    if !has("promtool") {
        servers::apt_install(&["prometheus"])?;
    }
    Ok(())
}

#[test]
fn promtool_accepts_the_rules() {
    let Some(()) = servers::require("promtool", promtool()) else {
        return;
    };
    let out = Command::new("promtool")
        .args(["check", "rules"])
        .arg(RULES)
        .output()
        .expect("promtool runs");
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "promtool refused the rules:\n{said}");
    assert!(said.contains("SUCCESS"), "{said}");
}

/// The metric names a rule's expressions use that this project exports:
/// `raftlock_*` and `process_*` (histogram series by their family name).
fn exported_names_used(rules: &str) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    for line in rules.lines() {
        let Some(expr) = line.trim_start().strip_prefix("expr:") else {
            continue;
        };
        for word in expr.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_')) {
            if word.starts_with("raftlock_") || word.starts_with("process_") {
                let family = ["_bucket", "_sum", "_count"]
                    .iter()
                    .find_map(|s| word.strip_suffix(s))
                    .unwrap_or(word);
                names.insert(family.to_string());
            }
        }
    }
    names
}

/// The metric families in a Prometheus text exposition (`# TYPE` lines).
fn families(text: &str) -> BTreeSet<String> {
    text.lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .filter_map(|l| l.split_whitespace().next())
        .map(str::to_string)
        .collect()
}

#[test]
fn the_rules_name_only_metrics_a_node_exports() {
    assert_eq!(
        exported_names_used(
            "  expr: rate(raftlock_x_bucket[5m]) > process_y and raftlock_z_total\n  raftlock_not_expr"
        ),
        BTreeSet::from(["raftlock_x".into(), "process_y".into(), "raftlock_z_total".into()])
    );
    let rules = std::fs::read_to_string(RULES).expect("rules file");
    let used = exported_names_used(&rules);
    assert!(
        used.len() >= 5,
        "the rules watch raftlock's own metrics: {used:?}"
    );
    let runtime = tokio::runtime::Runtime::new().expect("runtime");
    let exported = runtime.block_on(async {
        let cluster = TestCluster::start(3).await;
        let leader = cluster.wait_for_leader().await;
        // A follower and the leader: per-peer series exist only on a leader.
        let follower = (1..=3).find(|id| *id != leader).expect("a follower");
        let mut exported = BTreeSet::new();
        let mut texts = Vec::new();
        for id in [leader, follower] {
            let (code, text) =
                raftlock_testkit::http(&cluster.metrics_addr(id), "GET", "/metrics", &[])
                    .await
                    .expect("metrics answer");
            assert_eq!(code, 200, "{text}");
            exported.extend(families(&text));
            texts.push(text);
        }
        (exported, texts)
    });
    let (exported, texts) = exported;
    let missing: Vec<_> = used.difference(&exported).collect();
    assert!(
        missing.is_empty(),
        "{} names metrics no node exports: {missing:?}",
        Path::new(RULES).display()
    );
    // What the nodes export is well-formed Prometheus text.
    let Some(()) = servers::require("promtool", promtool()) else {
        return;
    };
    for text in texts {
        let mut check = Command::new("promtool")
            .args(["check", "metrics"])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("promtool runs");
        check
            .stdin
            .take()
            .expect("stdin")
            .write_all(text.as_bytes())
            .expect("write");
        let out = check.wait_with_output().expect("promtool ends");
        assert!(
            out.status.success(),
            "promtool check metrics refused a node's /metrics:\n{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
}
