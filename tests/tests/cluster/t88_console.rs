//! The operator's console at `/ui` on the metrics listener: its JSON, its
//! access control, and the page itself in a real (headless) Chromium.

use std::time::Duration;

use raftlock_client::{Client, ClientOptions, Guard, Session};
use raftlock_testkit::servers::{debian_tool, require};
use raftlock_testkit::{eventually, http, TestCluster};
use serde_json::Value;
use tokio::task::JoinHandle;

/// A holder of `name` and a second session queued behind it.
struct Queue {
    holder: Session,
    held: Guard,
    waiter_id: u64,
    waiting: JoinHandle<(Session, raftlock_client::Result<Guard>)>,
}

/// The holder's ttl: a revoke ends its session when the lease its last
/// keep-alive earned runs out, at most this long after the revoke.
const HOLDER_TTL: Duration = Duration::from_secs(3);

async fn holder_and_waiter(client: &Client, name: &'static str) -> Queue {
    // A session only its ttl ends: the page's checks of `held` come seconds
    // later, on a machine busy with a browser, and the default grace's
    // count (0.675 s from each answered keep-alive) would make them a
    // figure of the machine.
    let holder = client
        .session_with(raftlock_client::SessionOptions {
            ttl: HOLDER_TTL,
            end_on_disconnect: None,
            ..Default::default()
        })
        .await
        .expect("holder session");
    let held = holder.lock(name).await.expect("holder locks");
    let waiter = client
        .session(Duration::from_secs(30))
        .await
        .expect("waiter session");
    let waiter_id = waiter.id().get();
    let waiting = tokio::spawn(async move {
        let g = waiter.lock(name).await;
        (waiter, g)
    });
    eventually("the waiter queued", Duration::from_secs(10), || async {
        let info = client.describe(name).await.ok().flatten()?;
        (info.waiters.len() == 1).then_some(())
    })
    .await;
    Queue {
        holder,
        held,
        waiter_id,
        waiting,
    }
}

async fn get_json(addr: &str, path: &str, headers: &[(&str, &str)]) -> (u16, Value) {
    let (code, body) = http(addr, "GET", path, headers)
        .await
        .unwrap_or_else(|| panic!("no answer from {addr}{path}"));
    let value = serde_json::from_str(&body).unwrap_or_else(|e| panic!("{path}: {e}: {body}"));
    (code, value)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_console_shows_holders_waiters_sessions_and_events_and_revokes() {
    let cluster = TestCluster::start(3).await;
    let client = cluster.client().await;
    let q = holder_and_waiter(&client, "con/x").await;
    let leader = cluster.leader().await;
    let metrics = cluster.metrics_addr(leader);

    // The page is compiled in and served without credentials (it holds no
    // data).
    let (code, page) = http(&metrics, "GET", "/ui", &[]).await.expect("page");
    assert_eq!(code, 200);
    assert!(page.contains("raftlock console"), "{page}");
    assert!(
        !page.contains("http://") && !page.contains("https://"),
        "no CDN"
    );

    let (code, s) = get_json(&metrics, "/ui/api/state?prefix=con%2F", &[]).await;
    assert_eq!(code, 200, "{s}");
    assert_eq!(s["node"]["id"], leader);
    assert_eq!(s["node"]["role"], "leader");
    assert!(s["node"]["clock"]
        .as_str()
        .is_some_and(|c| c.contains(&format!("node {leader}"))));
    assert_eq!(s["members"].as_array().map(Vec::len), Some(3));
    // Followers, as the leader sees them.
    eventually(
        "both followers following",
        Duration::from_secs(5),
        || async {
            let (_, s) = get_json(&metrics, "/ui/api/state", &[]).await;
            let following = s["members"]
                .as_array()?
                .iter()
                .filter(|m| m["health"] == "following" && m["lag_entries"].is_u64())
                .count();
            (following == 2).then_some(())
        },
    )
    .await;
    let locks = s["locks"].as_array().expect("locks");
    assert_eq!(locks.len(), 1, "{s}");
    let lock = &locks[0];
    assert_eq!(lock["name"], "con/x");
    assert_eq!(lock["kind"], "lock");
    let h = &lock["holders"][0];
    assert_eq!(h["session"], q.holder.id().get());
    assert_eq!(h["fence"], q.held.fence().get());
    assert!(h["since_unix_ms"].as_u64().is_some_and(|t| t > 0), "{h}");
    assert!(h["held_ms"].is_u64(), "{h}");
    let w = &lock["waiters"][0];
    assert_eq!(
        (w["position"].as_u64(), w["session"].as_u64()),
        (Some(1), Some(q.waiter_id))
    );
    assert!(w["waited_ms"].is_u64(), "{w}");
    let holder_row = s["sessions"]
        .as_array()
        .expect("sessions")
        .iter()
        .find(|r| r["id"] == q.holder.id().get())
        .expect("the holder's session")
        .clone();
    assert_eq!(holder_row["holds"], serde_json::json!(["con/x"]));
    assert_eq!(holder_row["ttl_ms"], HOLDER_TTL.as_millis() as u64);
    assert!(holder_row["since_keepalive_ms"]
        .as_u64()
        .is_some_and(|ms| ms <= HOLDER_TTL.as_millis() as u64));
    // The events come from the console's side table, a moment behind the
    // applied state: polled until both are there.
    let kinds = eventually(
        "the console's events show the grant and the wait",
        Duration::from_secs(10),
        || async {
            let (_, s) = get_json(&metrics, "/ui/api/state", &[]).await;
            let kinds: Vec<_> = s["events"]
                .as_array()?
                .iter()
                .filter(|e| e["name"] == "con/x")
                .map(|e| e["kind"].as_str().unwrap_or("").to_string())
                .collect();
            (kinds.len() >= 2).then_some(kinds)
        },
    )
    .await;
    assert_eq!(kinds, vec!["granted", "queued"]);

    // The metrics see the same queue: the longest queue is 1, the oldest
    // grant and wait are timed, and a leader was learned of.
    let metric = |text: &str, series: &str| -> Option<f64> {
        text.lines()
            .find_map(|l| l.strip_prefix(series)?.strip_prefix(' '))
            .and_then(|v| v.parse().ok())
    };
    let (_, text) = http(&metrics, "GET", "/metrics", &[])
        .await
        .expect("metrics");
    assert_eq!(metric(&text, "raftlock_longest_queue"), Some(1.0), "{text}");
    assert!(metric(&text, "raftlock_oldest_grant_seconds").is_some_and(|s| s > 0.0));
    assert!(metric(&text, "raftlock_oldest_wait_seconds").is_some_and(|s| s > 0.0));
    // At least the one election that made this leader (more only if the
    // leadership moved meanwhile).
    assert!(metric(&text, "raftlock_leader_changes_total").is_some_and(|n| n >= 1.0));
    assert!(metric(&text, "raftlock_keepalive_answer_seconds_count").is_some());

    // A follower serves what it has applied, and says it is a follower;
    // it refuses a revoke with the leader's hint.
    let follower = cluster
        .running()
        .into_iter()
        .find(|id| *id != leader)
        .expect("a follower");
    let faddr = cluster.metrics_addr(follower);
    let (code, fs) = get_json(&faddr, "/ui/api/state", &[]).await;
    assert_eq!(code, 200);
    assert_eq!(fs["node"]["role"], "follower");
    let path = format!("/ui/api/revoke?session={}", q.holder.id().get());
    let (code, body) = http(&faddr, "POST", &path, &[]).await.expect("answer");
    assert_eq!(code, 503, "{body}");
    assert!(body.contains("UNAVAILABLE"), "{body}");

    // Bad input: a clear error, nothing revoked.
    for bad in [
        "/ui/api/revoke?session=abc",
        "/ui/api/revoke",
        "/ui/api/revoke?session=0",
    ] {
        let (code, body) = http(&metrics, "POST", bad, &[]).await.expect("answer");
        assert_eq!(code, 400, "{bad}: {body}");
        assert!(body.contains("INVALID_ARGUMENT"), "{body}");
    }
    let (code, body) = http(&metrics, "POST", "/ui/api/revoke?session=999999999", &[])
        .await
        .expect("answer");
    assert_eq!(code, 404, "{body}");
    assert!(q.held.is_held());

    // The revoke: the waiter gets the lock with a larger fence.
    let (code, body) = http(&metrics, "POST", &path, &[]).await.expect("answer");
    assert_eq!(code, 200, "{body}");
    let answer: Value = serde_json::from_str(&body).expect("json");
    assert_eq!(answer["released"], 1);
    let (_w, got) = tokio::time::timeout(Duration::from_secs(10), q.waiting)
        .await
        .expect("the waiter is granted")
        .expect("task");
    // Kept to the end: dropping the guard would release the lock.
    let got = got.expect("granted");
    assert!(got.fence() > q.held.fence());
    let (_, s) = get_json(&metrics, "/ui/api/state?prefix=con%2F", &[]).await;
    assert_eq!(s["locks"][0]["holders"][0]["session"], q.waiter_id);
    // One revoke, one timed wait (the waiter's) and one timed hold (the
    // revoked grant), under the name's prefix label; no expiry. The
    // timings are taken by a task that follows the applied events, so
    // poll until it has seen the revoke.
    let text = eventually(
        "the revoke in the metrics",
        Duration::from_secs(5),
        || async {
            let (_, text) = http(&metrics, "GET", "/metrics", &[]).await?;
            (metric(&text, "raftlock_lock_hold_seconds_count{prefix=\"con/\"}").is_some())
                .then_some(text)
        },
    )
    .await;
    assert_eq!(
        metric(&text, "raftlock_sessions_revoked_total"),
        Some(1.0),
        "{text}"
    );
    assert_eq!(metric(&text, "raftlock_expiries_total"), Some(0.0));
    assert_eq!(
        metric(&text, "raftlock_lock_wait_seconds_count{prefix=\"con/\"}"),
        Some(1.0),
        "{text}"
    );
    assert_eq!(
        metric(&text, "raftlock_lock_hold_seconds_count{prefix=\"con/\"}"),
        Some(1.0),
        "{text}"
    );
    assert_eq!(metric(&text, "raftlock_longest_queue"), Some(0.0));
    assert!(got.is_held());
    // The events come from the console's side table, which follows the
    // applied events a moment behind (CI on a loaded machine read the
    // state before it had the revoke): polled.
    let holder = q.holder.id().get();
    eventually(
        "the console's events show the revoke",
        Duration::from_secs(10),
        || async {
            let (_, s) = get_json(&metrics, "/ui/api/state?prefix=con%2F", &[]).await;
            s["events"]
                .as_array()?
                .iter()
                .any(|e| e["kind"] == "revoked" && e["session"] == holder)
                .then_some(())
        },
    )
    .await;
    cluster.shutdown().await;
}

const ACL: &str = r#"
peer_token = "test-peer-token-0123456789"

[[token]]
identity = "app"
token = "tok-app"

[[token]]
identity = "auditor"
token = "tok-auditor"

[[token]]
identity = "ops"
token = "tok-ops"

[[rule]]
identity = "app"
allow = "lock"
prefix = "con/"

[[rule]]
identity = "auditor"
allow = "read"
prefix = ""

[[rule]]
identity = "ops"
allow = "admin"
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_console_needs_read_to_look_and_admin_to_revoke() {
    let cluster = TestCluster::start_acl(3, ACL, None).await;
    let app = Client::with_options(
        cluster.addrs(),
        ClientOptions {
            token: Some("tok-app".into()),
            retry_deadline: Duration::from_secs(10),
            ..ClientOptions::default()
        },
    )
    .expect("client");
    // Short: a revoke answers when the lease of its last keep-alive ends.
    let s = app.session(HOLDER_TTL).await.expect("session");
    let g = s.lock("con/acl").await.expect("lock");
    let metrics = cluster.metrics_addr(cluster.leader().await);
    let bearer = |t: &str| format!("Bearer {t}");

    let (code, _) = get_json(&metrics, "/ui/api/state", &[]).await;
    assert_eq!(code, 401);
    let (code, _) = get_json(
        &metrics,
        "/ui/api/state",
        &[("Authorization", "Bearer nope")],
    )
    .await;
    assert_eq!(code, 401);
    // `lock` on con/ is not `read` on every name.
    let (code, body) = get_json(
        &metrics,
        "/ui/api/state",
        &[("Authorization", &bearer("tok-app"))],
    )
    .await;
    assert_eq!(code, 403, "{body}");
    let (code, st) = get_json(
        &metrics,
        "/ui/api/state",
        &[("Authorization", &bearer("tok-auditor"))],
    )
    .await;
    assert_eq!(code, 200, "{st}");
    let row = st["sessions"]
        .as_array()
        .expect("sessions")
        .iter()
        .find(|r| r["id"] == s.id().get())
        .expect("the session")
        .clone();
    assert_eq!(row["owner"], "app", "the identity that opened it");

    let path = format!("/ui/api/revoke?session={}", s.id().get());
    let (code, body) = http(
        &metrics,
        "POST",
        &path,
        &[("Authorization", &bearer("tok-auditor"))],
    )
    .await
    .expect("answer");
    assert_eq!(code, 403, "{body}");
    assert!(body.contains("PERMISSION_DENIED"), "{body}");
    let (code, _) = http(&metrics, "POST", &path, &[]).await.expect("answer");
    assert_eq!(code, 401);
    assert!(app.check_fence("con/acl", g.fence()).await.expect("check"));

    let (code, body) = http(
        &metrics,
        "POST",
        &path,
        &[("Authorization", &bearer("tok-ops"))],
    )
    .await
    .expect("answer");
    assert_eq!(code, 200, "{body}");
    // The console's side table learns of the revoke from the applied
    // events, a moment after the call answered (the campaign under load
    // once read the state before it had: 1 of 10 runs).
    eventually(
        "the console shows the revoke by ops",
        Duration::from_secs(10),
        || async {
            let (_, st) = get_json(
                &metrics,
                "/ui/api/state",
                &[("Authorization", &bearer("tok-ops"))],
            )
            .await;
            st["events"]
                .as_array()?
                .iter()
                .any(|e| e["kind"] == "revoked" && e["revoked_by"] == "ops")
                .then_some(())
        },
    )
    .await;
    cluster.shutdown().await;
}

/// Runs headless Chromium on `url`: the DOM after the page's scripts ran
/// (`--dump-dom`, with virtual time so its fetches finish), or a
/// screenshot into `screenshot`.
async fn chromium(
    bin: &std::path::Path,
    url: &str,
    screenshot: Option<&std::path::Path>,
) -> String {
    let profile = tempfile::tempdir().expect("profile dir");
    let mut cmd = tokio::process::Command::new(bin);
    cmd.args([
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-dev-shm-usage",
        "--no-first-run",
        "--window-size=1400,900",
        "--virtual-time-budget=5000",
    ])
    .arg(format!("--user-data-dir={}", profile.path().display()));
    match screenshot {
        Some(path) => cmd.arg(format!("--screenshot={}", path.display())),
        None => cmd.arg("--dump-dom"),
    };
    cmd.arg(url).kill_on_drop(true);
    let out = tokio::time::timeout(Duration::from_secs(60), cmd.output())
        .await
        .expect("chromium finished within 60 s")
        .expect("chromium runs");
    assert!(
        out.status.success(),
        "chromium failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_console_page_in_chromium_shows_the_queue_and_revokes_after_confirmation() {
    let Some(bin) = require("Chromium", debian_tool("chromium", "chromium")) else {
        return;
    };
    let cluster = TestCluster::start(3).await;
    let client = cluster.client().await;
    let q = holder_and_waiter(&client, "web/x").await;
    let metrics = cluster.metrics_addr(cluster.leader().await);
    let holder = q.holder.id().get();
    let fence = q.held.fence().get();

    let dom = chromium(&bin, &format!("http://{metrics}/ui?prefix=web%2F"), None).await;
    assert!(dom.contains("web/x"), "{dom}");
    assert!(
        dom.contains(&format!(
            "session {holder} (exclusive), fence {fence}, since "
        )),
        "the holder, its fence and since when: {dom}"
    );
    assert!(dom.contains(", held "), "{dom}");
    assert!(
        dom.contains(&format!("#1 session {} (exclusive), waited ", q.waiter_id)),
        "the waiter and how long it waited: {dom}"
    );
    let shot = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("raftlock-console.png");
    let _ = std::fs::remove_file(&shot);
    chromium(
        &bin,
        &format!("http://{metrics}/ui?prefix=web%2F"),
        Some(&shot),
    )
    .await;
    let png = std::fs::read(&shot).expect("a screenshot was written");
    assert!(png.starts_with(b"\x89PNG"), "not a PNG");
    eprintln!("console screenshot: {}", shot.display());

    // Asking without confirming opens the dialog and revokes nothing.
    let dom = chromium(
        &bin,
        &format!("http://{metrics}/ui?prefix=web%2F&revoke={holder}"),
        None,
    )
    .await;
    assert!(dom.contains(&format!("Revoke session {holder}?")), "{dom}");
    assert!(q.held.is_held());
    assert!(client
        .check_fence("web/x", q.held.fence())
        .await
        .expect("check"));

    // Confirming revokes: the waiter gets the lock with a larger fence.
    let dom = chromium(
        &bin,
        &format!(
            "http://{metrics}/ui?prefix=web%2F&revoke={holder}&confirm={}",
            raftlock_node::console::confirm_token()
        ),
        None,
    )
    .await;
    assert!(
        dom.contains(&format!("revoked session {holder}: 1 grants ended")),
        "{dom}"
    );
    let (_w, got) = tokio::time::timeout(Duration::from_secs(10), q.waiting)
        .await
        .expect("the waiter is granted")
        .expect("task");
    let got = got.expect("granted");
    assert!(got.fence() > q.held.fence());
    assert!(!client
        .check_fence("web/x", q.held.fence())
        .await
        .expect("check"));
    cluster.shutdown().await;
}
