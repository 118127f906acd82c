//! The Rust client's run of `client/scenarios.json`, the scenario file all
//! four first-party clients run (`client/scenarios.md` says how to read it),
//! against one three-node cluster of the test kit.

use std::collections::BTreeMap;
use std::time::Duration;

use raftlock_client::{Client, ClientOptions, Error, Guard, LeaseState, Session, SessionOptions};
use raftlock_testkit::TestCluster;
use serde_json::Value;
use tokio::task::JoinHandle;
use tokio::time::Instant;

/// How long a `lock` without a timeout may wait before the runner calls
/// the step failed (no scenario waits anywhere near this long).
const SAFETY: Duration = Duration::from_secs(60);
/// How long `describe` polls for the counts it expects.
const DESCRIBE_FOR: Duration = Duration::from_secs(10);

/// What a lock call ended with, in the file's words.
enum Outcome {
    Granted(Guard),
    NotAcquired,
    InvalidArgument(String),
    Unreachable(String),
    Other(Error),
}

impl Outcome {
    fn word(&self) -> &'static str {
        match self {
            Outcome::Granted(_) => "granted",
            Outcome::NotAcquired => "not_acquired",
            Outcome::InvalidArgument(_) => "invalid_argument",
            Outcome::Unreachable(_) => "unreachable",
            Outcome::Other(_) => "another error",
        }
    }

    /// The outcome with what it carries, for a failure message.
    fn told(&self) -> String {
        match self {
            Outcome::Granted(g) => format!("granted with fence {}", g.fence().get()),
            Outcome::NotAcquired => "not_acquired".into(),
            Outcome::InvalidArgument(m) => format!("invalid_argument: {m}"),
            Outcome::Unreachable(m) => format!("unreachable: {m}"),
            Outcome::Other(e) => format!("{e:?} ({e})"),
        }
    }
}

fn outcome(r: Result<Guard, Error>) -> Outcome {
    match r {
        Ok(g) => Outcome::Granted(g),
        Err(Error::NotAcquired(_)) => Outcome::NotAcquired,
        Err(Error::InvalidArgument(m)) => Outcome::InvalidArgument(m),
        // Nothing was sent: every node refused the connection or its name
        // did not resolve.
        Err(e) if e.is_unreachable() => Outcome::Unreachable(e.to_string()),
        Err(e) => Outcome::Other(e),
    }
}

/// One actor: a client and, once it first locks, its session.
struct Actor {
    client: Client,
    ttl: Duration,
    session: Option<Session>,
}

impl Actor {
    async fn session(&mut self) -> Result<Session, Error> {
        if let Some(s) = &self.session {
            return Ok(s.clone());
        }
        let s = self
            .client
            .session_with(SessionOptions {
                ttl: self.ttl,
                ..SessionOptions::default()
            })
            .await?;
        self.session = Some(s.clone());
        Ok(s)
    }
}

/// The lock a step asks for.
async fn take(session: Result<Session, Error>, step: &Value) -> Result<Guard, Error> {
    let session = session?;
    let name = name_of(step);
    let timeout = step
        .get("timeout_ms")
        .map(|t| Duration::from_millis(t.as_u64().expect("timeout_ms")));
    if let Some(capacity) = step.get("capacity") {
        let capacity = capacity.as_u64().expect("capacity") as u32;
        let weight = step["weight"].as_u64().expect("weight") as u32;
        let sem = session.semaphore(&name, capacity);
        return match timeout {
            None => sem.acquire(weight).await,
            Some(t) => sem.acquire_timeout(weight, t).await,
        };
    }
    let shared = match step.get("mode").and_then(Value::as_str) {
        None | Some("exclusive") => false,
        Some("shared") => true,
        Some(other) => panic!("unknown mode {other:?}"),
    };
    session.lock_with(&name, shared, timeout, Vec::new()).await
}

/// A step's `name`: a string, or `{"repeat": S, "times": N}`.
fn name_of(step: &Value) -> String {
    match &step["name"] {
        Value::String(s) => s.clone(),
        Value::Object(o) => o["repeat"]
            .as_str()
            .expect("repeat")
            .repeat(o["times"].as_u64().expect("times") as usize),
        other => panic!("bad name {other}"),
    }
}

fn str_of<'a>(step: &'a Value, key: &str) -> &'a str {
    step[key]
        .as_str()
        .unwrap_or_else(|| panic!("step needs {key}: {step}"))
}

struct Run<'a> {
    cluster: &'a mut TestCluster,
    admin: Client,
    scenario: String,
    actors: BTreeMap<String, Actor>,
    grants: BTreeMap<String, Guard>,
    background: BTreeMap<String, JoinHandle<Result<Guard, Error>>>,
}

impl Run<'_> {
    fn fail(&self, i: usize, step: &Value, what: String) -> ! {
        panic!(
            "scenario {:?}, step {}: {step}\n{what}",
            self.scenario,
            i + 1
        )
    }

    fn grant(&self, i: usize, step: &Value, key: &str) -> &Guard {
        let label = str_of(step, key);
        self.grants
            .get(label)
            .unwrap_or_else(|| self.fail(i, step, format!("no grant {label:?}")))
    }

    /// Checks a lock call's outcome against the step's `expect`, keeps a
    /// grant under its `as`, and checks `fence_above` and
    /// `message_contains`.
    fn expect(&mut self, i: usize, step: &Value, got: Outcome) {
        let want = str_of(step, "expect");
        if got.word() != want {
            self.fail(i, step, format!("expected {want}, got {}", got.told()));
        }
        match got {
            Outcome::Granted(g) => {
                if step.get("fence_above").is_some() {
                    let below = self.grant(i, step, "fence_above").fence().get();
                    if g.fence().get() <= below {
                        self.fail(
                            i,
                            step,
                            format!("fence {} is not above {below}", g.fence().get()),
                        );
                    }
                }
                if let Some(label) = step.get("as").and_then(Value::as_str) {
                    self.grants.insert(label.to_string(), g);
                }
            }
            Outcome::InvalidArgument(m) | Outcome::Unreachable(m) => {
                if let Some(part) = step.get("message_contains").and_then(Value::as_str) {
                    if !m.contains(part) {
                        self.fail(i, step, format!("message {m:?} lacks {part:?}"));
                    }
                }
            }
            Outcome::NotAcquired | Outcome::Other(_) => {}
        }
    }

    async fn step(&mut self, i: usize, step: &Value) {
        match str_of(step, "op") {
            "lock" => {
                let actor = self
                    .actors
                    .get_mut(str_of(step, "actor"))
                    .expect("a declared actor");
                let started = Instant::now();
                let session = actor.session().await;
                let got = match tokio::time::timeout(SAFETY, take(session, step)).await {
                    Ok(r) => outcome(r),
                    Err(_) => self.fail(i, step, format!("no outcome within {SAFETY:?}")),
                };
                let took = started.elapsed();
                let ms = |k: &str| step.get(k).map(|v| v.as_u64().expect("ms"));
                if let Some(min) = ms("min_elapsed_ms") {
                    if took < Duration::from_millis(min) {
                        self.fail(i, step, format!("answered after {took:?}"));
                    }
                }
                if let Some(max) = ms("max_elapsed_ms") {
                    if took > Duration::from_millis(max) {
                        self.fail(i, step, format!("answered after {took:?}"));
                    }
                }
                self.expect(i, step, got);
            }
            "start_lock" => {
                let actor = self
                    .actors
                    .get_mut(str_of(step, "actor"))
                    .expect("a declared actor");
                let session = actor.session().await;
                let step2 = step.clone();
                let task = tokio::spawn(async move { take(session, &step2).await });
                self.background.insert(str_of(step, "as").to_string(), task);
            }
            "cancel" => {
                let label = str_of(step, "grant");
                match self.background.get(label) {
                    Some(task) => task.abort(),
                    None => self.fail(i, step, format!("no background lock {label:?}")),
                }
            }
            "finish" => {
                let label = str_of(step, "grant").to_string();
                let within = Duration::from_millis(step["within_ms"].as_u64().unwrap_or(15_000));
                let task = self
                    .background
                    .remove(&label)
                    .unwrap_or_else(|| self.fail(i, step, format!("no background lock {label:?}")));
                let joined = match tokio::time::timeout(within, task).await {
                    Ok(j) => j,
                    Err(_) => self.fail(i, step, format!("no outcome within {within:?}")),
                };
                let want = str_of(step, "expect");
                match joined {
                    Err(e) if e.is_cancelled() => {
                        if want != "cancelled" {
                            self.fail(i, step, format!("expected {want}, got cancelled"));
                        }
                    }
                    Err(e) => self.fail(i, step, format!("the lock task failed: {e}")),
                    Ok(r) => {
                        let got = outcome(r);
                        // `as` of a background lock is its start_lock's.
                        let mut step = step.clone();
                        step["as"] = Value::String(label);
                        self.expect(i, &step, got);
                    }
                }
            }
            "release" => {
                let label = str_of(step, "grant");
                let guard = self
                    .grants
                    .remove(label)
                    .unwrap_or_else(|| self.fail(i, step, format!("no grant {label:?}")));
                match guard.release().await {
                    Ok(true) => {}
                    other => self.fail(i, step, format!("release answered {other:?}")),
                }
                // Later steps may still compare with its fence.
                self.grants.insert(label.to_string(), guard);
            }
            "describe" => {
                let name = name_of(step);
                let want = (
                    step["holders"].as_u64().expect("holders") as usize,
                    step["waiters"].as_u64().expect("waiters") as usize,
                );
                let deadline = Instant::now() + DESCRIBE_FOR;
                loop {
                    let got = match self.admin.describe(&name).await {
                        Ok(Some(info)) => (info.holders.len(), info.waiters.len()),
                        Ok(None) => (0, 0),
                        Err(e) => self.fail(i, step, format!("describe: {e}")),
                    };
                    if got == want {
                        break;
                    }
                    if Instant::now() > deadline {
                        self.fail(
                            i,
                            step,
                            format!("{got:?} holders and waiters after {DESCRIBE_FOR:?}"),
                        );
                    }
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            }
            "check_fence" => {
                let g = self.grant(i, step, "grant");
                let answer = self.admin.check_fence(g.name(), g.fence()).await;
                let want = step["expect"].as_bool().expect("expect");
                if !matches!(answer, Ok(a) if a == want) {
                    self.fail(i, step, format!("CheckFence answered {answer:?}"));
                }
            }
            "check_held" => {
                let g = self.grant(i, step, "grant");
                // scenarios.md: not released and not lost (jeopardy, the
                // count run out but the session not known to be gone,
                // counts as held).
                let lost = matches!(
                    *g.session().lease().borrow(),
                    LeaseState::Lost | LeaseState::Closed
                );
                let held = !g.is_released() && !lost;
                if held != step["expect"].as_bool().expect("expect") {
                    self.fail(i, step, format!("held: {held}"));
                }
            }
            "revoke" => {
                let id = self.grant(i, step, "grant").session().id().get();
                if let Err(e) = self.admin.revoke_session(id).await {
                    self.fail(i, step, format!("revoke: {e}"));
                }
            }
            "expect_lost" => {
                let within = Duration::from_millis(step["within_ms"].as_u64().expect("within_ms"));
                let session = self.grant(i, step, "grant").session().clone();
                if tokio::time::timeout(within, session.lost()).await.is_err() {
                    self.fail(i, step, format!("no lost notice within {within:?}"));
                }
                if self.grant(i, step, "grant").is_held() {
                    self.fail(i, step, "the lost grant still says held".into());
                }
            }
            "kill_leader" => {
                let leader = self.cluster.wait_for_leader().await;
                self.cluster.kill(leader).await;
            }
            op => self.fail(i, step, format!("unknown op {op:?}")),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_rust_client_runs_every_scenario() {
    let file = concat!(env!("CARGO_MANIFEST_DIR"), "/scenarios.json");
    let text = std::fs::read_to_string(file).expect("client/scenarios.json");
    let doc: Value = serde_json::from_str(&text).expect("valid JSON");
    let scenarios = doc["scenarios"].as_array().expect("scenarios");
    assert!(!scenarios.is_empty());

    let mut cluster = TestCluster::start(3).await;
    cluster.wait_for_leader().await;
    let endpoints: Vec<String> = cluster
        .running()
        .into_iter()
        .map(|id| cluster.addr(id))
        .collect();
    let admin = Client::connect(endpoints.clone()).await.expect("client");
    for scenario in scenarios {
        let name = scenario["name"].as_str().expect("name").to_string();
        let mut actors = BTreeMap::new();
        for (actor, cfg) in scenario["actors"].as_object().expect("actors") {
            let eps: Vec<String> = match cfg.get("endpoints") {
                Some(list) => list
                    .as_array()
                    .expect("endpoints")
                    .iter()
                    .map(|e| e.as_str().expect("endpoint").to_string())
                    .collect(),
                None => endpoints.clone(),
            };
            let client =
                Client::with_options(eps, ClientOptions::default()).expect("client options");
            let ttl = cfg
                .get("ttl_ms")
                .map(|t| Duration::from_millis(t.as_u64().expect("ttl_ms")))
                .unwrap_or(SessionOptions::default().ttl);
            actors.insert(
                actor.clone(),
                Actor {
                    client,
                    ttl,
                    session: None,
                },
            );
        }
        let mut run = Run {
            cluster: &mut cluster,
            admin: admin.clone(),
            scenario: name.clone(),
            actors,
            grants: BTreeMap::new(),
            background: BTreeMap::new(),
        };
        let started = Instant::now();
        for (i, step) in scenario["steps"]
            .as_array()
            .expect("steps")
            .iter()
            .enumerate()
        {
            run.step(i, step).await;
        }
        assert!(
            run.background.is_empty(),
            "scenario {name:?} left background locks unfinished"
        );
        println!("scenario {name:?}: passed in {:?}", started.elapsed());
    }
    cluster.shutdown().await;
}
