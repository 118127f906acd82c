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

const RULE_TESTS: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../deploy/prometheus/raftlock-alerts.test.yml"
);

const DASHBOARD: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../deploy/grafana/raftlock-dashboard.json"
);

/// `promtool test rules`: the unit tests of the alerts (made-up series,
/// the alerts that must and must not fire) pass.
#[test]
fn promtool_unit_tests_of_the_alerts_pass() {
    let Some(()) = servers::require("promtool", promtool()) else {
        return;
    };
    let out = Command::new("promtool")
        .args(["test", "rules"])
        .arg(RULE_TESTS)
        .output()
        .expect("promtool runs");
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "promtool test rules failed:\n{said}");
    assert!(said.contains("SUCCESS"), "{said}");
}

/// The left side of an expression's last top-level comparison (`a > 5`
/// gives `a`, `sum(x > bool 5) >= floor(y)` gives `sum(x > bool 5)`): the
/// part of an alert that must have data whether or not the alert fires.
fn left_of_comparison(expr: &str) -> &str {
    let bytes = expr.as_bytes();
    let (mut depth, mut quoted, mut cut) = (0i32, false, None);
    let mut i = 0;
    while i < bytes.len() {
        let c = bytes[i];
        match c {
            b'"' => quoted = !quoted,
            _ if quoted => {}
            b'(' | b'[' | b'{' => depth += 1,
            b')' | b']' | b'}' => depth -= 1,
            b'>' | b'<' | b'=' | b'!' if depth == 0 => {
                let two = bytes.get(i + 1) == Some(&b'=');
                if c != b'=' && c != b'!' || two {
                    cut = Some(i);
                }
                if two {
                    i += 1;
                }
            }
            _ => {}
        }
        i += 1;
    }
    cut.map_or(expr, |at| expr[..at].trim())
}

/// Every expression of the rules and the dashboard.
fn all_expressions() -> Vec<(String, String)> {
    let mut exprs = Vec::new();
    let rules = std::fs::read_to_string(RULES).expect("rules file");
    let mut alert = String::new();
    for line in rules.lines() {
        let line = line.trim_start();
        if let Some(name) = line.strip_prefix("- alert:") {
            alert = name.trim().to_string();
        } else if let Some(expr) = line.strip_prefix("expr:") {
            exprs.push((
                format!("rule {alert}"),
                left_of_comparison(expr.trim()).to_string(),
            ));
        }
    }
    let dashboard: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(DASHBOARD).expect("dashboard file"))
            .expect("dashboard JSON");
    for panel in dashboard["panels"].as_array().expect("panels") {
        for target in panel["targets"].as_array().expect("targets") {
            exprs.push((
                format!("panel {:?}", panel["title"].as_str().unwrap_or("")),
                target["expr"].as_str().expect("expr").to_string(),
            ));
        }
    }
    exprs
}

#[test]
fn the_left_side_of_a_comparison_is_what_must_have_data() {
    assert_eq!(
        left_of_comparison("up{job=\"raftlock\"} == 0"),
        "up{job=\"raftlock\"}"
    );
    assert_eq!(
        left_of_comparison("sum by (job) (x > bool 5) >= floor(count by (job) (x) / 2)"),
        "sum by (job) (x > bool 5)"
    );
    assert_eq!(
        left_of_comparison("histogram_quantile(0.99, sum(rate(a{m!~\"A|B\"}[5m]))) > 0.1"),
        "histogram_quantile(0.99, sum(rate(a{m!~\"A|B\"}[5m])))"
    );
    assert_eq!(left_of_comparison("a / b"), "a / b");
}

fn url_encode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// Kills the child when dropped.
struct Reaped(std::process::Child);

impl Drop for Reaped {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A real Prometheus (Debian's `prometheus`) scrapes a live 3-node cluster
/// under a small load with one follower killed; every expression of the
/// dashboard, and of every alert the part before its threshold, returns
/// at least one series.
#[test]
fn every_dashboard_and_rule_expression_has_data_from_a_live_cluster() {
    let Some(()) = servers::require("promtool", promtool()) else {
        return;
    };
    let Some(prometheus) = servers::require(
        "prometheus",
        servers::debian_tool("prometheus", "prometheus"),
    ) else {
        return;
    };
    let exprs = all_expressions();
    assert!(exprs.len() > 30, "{exprs:?}");
    let runtime = tokio::runtime::Runtime::new().expect("runtime");
    runtime.block_on(async move {
        use std::time::Duration;
        let mut cluster = TestCluster::start(3).await;
        let leader = cluster.wait_for_leader().await;
        let client = cluster.client().await;
        // Load: a wait that ends in a grant, a hold that ends, a grant and
        // a wait still live, a revoke, an expiry.
        let a = client.session(Duration::from_secs(30)).await.expect("a");
        let b = client.session(Duration::from_secs(30)).await.expect("b");
        let held = a.lock("app/x").await.expect("a locks");
        let waiting = tokio::spawn(async move {
            let g = b.lock("app/x").await;
            (b, g)
        });
        raftlock_testkit::eventually("b queued", Duration::from_secs(10), || async {
            let info = client.describe("app/x").await.ok().flatten()?;
            (info.waiters.len() == 1).then_some(())
        })
        .await;
        held.release().await.expect("release");
        let (b, granted) = waiting.await.expect("task");
        let _b_holds = granted.expect("b granted");
        let c = client.session(Duration::from_secs(30)).await.expect("c");
        let c_waits = tokio::spawn(async move {
            let g = c.lock("app/x").await;
            (c, g)
        });
        let d = client.session(Duration::from_secs(30)).await.expect("d");
        let _d_holds = d.lock("jobs/nightly").await.expect("d locks");
        client.revoke_session(d.id().get()).await.expect("revoke");

        let dir = tempfile::tempdir().expect("dir");
        let targets: Vec<String> = (1..=3)
            .map(|id| format!("\"{}\"", cluster.metrics_addr(id)))
            .collect();
        let config = dir.path().join("prometheus.yml");
        std::fs::write(
            &config,
            format!(
                "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\nscrape_configs:\n  \
                 - job_name: raftlock\n    static_configs:\n      - targets: [{}]\n",
                targets.join(", ")
            ),
        )
        .expect("config");
        let port = raftlock_testkit::ports::free_port();
        let web = format!("127.0.0.1:{port}");
        let _prom = Reaped(
            Command::new(&prometheus)
                .arg(format!("--config.file={}", config.display()))
                .arg(format!(
                    "--storage.tsdb.path={}",
                    dir.path().join("tsdb").display()
                ))
                .arg(format!("--web.listen-address={web}"))
                .stdout(Stdio::null())
                .stderr(std::fs::File::create(dir.path().join("prometheus.log")).expect("log"))
                .spawn()
                .expect("prometheus starts"),
        );
        let query = |expr: String| {
            let web = web.clone();
            async move {
                let path = format!("/api/v1/query?query={}", url_encode(&expr));
                let (code, body) = raftlock_testkit::http(&web, "GET", &path, &[]).await?;
                let v: serde_json::Value = serde_json::from_str(&body).ok()?;
                (code == 200).then_some(v)
            }
        };
        // A few scrapes of the healthy cluster, then a follower dies.
        raftlock_testkit::eventually("three scrapes", Duration::from_secs(60), || async {
            let v = query("count_over_time(up{job=\"raftlock\"}[1m])".into()).await?;
            let n = v["data"]["result"].as_array()?.len();
            let samples = v["data"]["result"][0]["value"][1]
                .as_str()?
                .parse::<f64>()
                .ok()?;
            (n == 3 && samples >= 3.0).then_some(())
        })
        .await;
        let follower = (1..=3).find(|id| *id != leader).expect("a follower");
        cluster.kill(follower).await;
        for (what, expr) in &exprs {
            raftlock_testkit::eventually(
                &format!("{what}: {expr} has data"),
                Duration::from_secs(60),
                || async {
                    let v = query(expr.clone()).await?;
                    let result = &v["data"]["result"];
                    let has = match v["data"]["resultType"].as_str() {
                        Some("vector") | Some("matrix") => {
                            result.as_array().is_some_and(|r| !r.is_empty())
                        }
                        Some("scalar") => true,
                        _ => false,
                    };
                    has.then_some(())
                },
            )
            .await;
        }
        drop((b, c_waits));
        cluster.shutdown().await;
    });
}

/// Every alert has a runbook row in the operations guide's monitoring
/// page (its "Runbooks" section, up to the next section).
#[test]
fn every_alert_has_a_runbook() {
    let rules = std::fs::read_to_string(RULES).expect("rules file");
    let guide = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../docs/operations/monitoring.md"
    ))
    .expect("docs/operations/monitoring.md");
    let runbooks = guide
        .split("\n## Runbooks\n")
        .nth(1)
        .expect("a `## Runbooks` section in docs/operations/monitoring.md");
    let runbooks = runbooks.split("\n## ").next().unwrap_or(runbooks);
    let alerts: Vec<&str> = rules
        .lines()
        .filter_map(|l| l.trim_start().strip_prefix("- alert:"))
        .map(str::trim)
        .collect();
    assert!(alerts.len() >= 20, "{alerts:?}");
    for alert in alerts {
        assert!(
            runbooks
                .lines()
                .any(|l| l.starts_with('|') && l.contains(&format!("`{alert}`"))),
            "no runbook row for {alert} in docs/operations/monitoring.md"
        );
    }
}
