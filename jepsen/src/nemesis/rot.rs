//! The `rot` nemesis: damage at rest in the log of one stopped node, as a
//! disk that rots or a file system that loses a file's tail does (Jepsen's
//! NATS 2.12.1 analysis lost committed data this way on a minority).
//!
//! It kills one follower, then either cuts its `sled/db` short (to 30-99 %
//! of its data) or flips one byte of it, and starts it again. sled keeps
//! only what precedes damage, so the node must refuse to start on a log
//! that lost what its mark (`sled/raftlock-mark`) says it made durable,
//! and may start on one that did not. What the node should do is decided
//! here from a copy of the damaged files, opened with sled and compared
//! with the mark by this module's own reading (not the node's check). A
//! node that refused is replaced as `docs/operations/membership.md` says:
//! removed from the cluster, its data wiped, added again (a spare under
//! its old id). The `log-rot` check ([`check`]) then fails a start that
//! should have been a refusal, a refusal of an intact log, and an exit for
//! another reason.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use rand::rngs::StdRng;
use rand::RngExt;
use serde_json::{json, Value};
use tokio::sync::Mutex;

use super::{Active, Started};
use crate::cluster::Cluster;
use crate::history::{Event, Process, Recorder, Type};
use raftlock_node::raft::log_store::{Mark, MARK_FILE};

/// What a refusing node's last log line says: the mark's refusal, or
/// sled's own when it sees the damage.
const REFUSALS: [&str; 2] = ["the log lost data it had made durable", "are damaged"];

/// How long the damaged node gets to start or refuse.
const DECIDE_WITHIN: Duration = Duration::from_secs(30);

pub(super) async fn rot(
    cluster: &Arc<Mutex<Cluster>>,
    rec: &Recorder,
    members: &[u64],
    leader: Option<u64>,
    rng: &mut StdRng,
) -> anyhow::Result<Started> {
    anyhow::ensure!(
        members.len() >= 3,
        "rot needs a majority of voters besides the node it damages"
    );
    let target = members
        .iter()
        .copied()
        .find(|m| Some(*m) != leader)
        .context("no follower to damage")?;
    let sled_dir = {
        let mut c = cluster.lock().await;
        c.kill(target).await?;
        c.data_dir(target).join("sled")
    };
    let db = sled_dir.join("db");
    let end = data_end(&db)?;
    anyhow::ensure!(end > 16, "{} holds no data to damage", db.display());
    let damage = if rng.random_bool(0.5) {
        let keep = rng.random_range(end * 3 / 10..end);
        cut(&db, keep)?;
        json!({"kind": "cut", "kept": keep, "of": end})
    } else {
        let at = rng.random_range(0..end);
        let mask = 1u8 << rng.random_range(0..8);
        flip(&db, at, mask)?;
        json!({"kind": "flip", "at": at, "of": end, "mask": mask})
    };
    let expected = expected_refusal(&sled_dir).map_err(|e| e.to_string());
    let (outcome, line) = start_or_refuse(cluster, target).await?;
    let mut replaced = Value::Null;
    if outcome == "refused" {
        replaced = replace(cluster, rec, target).await;
    }
    let value = json!({
        "node": target, "damage": damage,
        "expected_refusal": match &expected {
            Ok(why) => json!(why),
            Err(e) => json!({"unknown": e}),
        },
        "outcome": outcome, "last_log_line": line, "replaced": replaced,
    });
    rec.record(Process::NEMESIS, Type::Info, "rot-outcome", value.clone());
    Ok((
        damage["kind"].as_str().unwrap_or("?").to_string(),
        vec![target],
        value,
        Active::Done,
    ))
}

/// Where the data in sled's `db` ends (sled grows the file by whole
/// segments, zero-filled).
fn data_end(db: &Path) -> anyhow::Result<u64> {
    let bytes = std::fs::read(db).with_context(|| format!("read {}", db.display()))?;
    Ok(bytes
        .iter()
        .rposition(|b| *b != 0)
        .map_or(0, |i| i as u64 + 1))
}

fn cut(db: &Path, keep: u64) -> anyhow::Result<()> {
    let f = std::fs::OpenOptions::new().write(true).open(db)?;
    f.set_len(keep)?;
    Ok(f.sync_all()?)
}

fn flip(db: &Path, at: u64, mask: u8) -> anyhow::Result<()> {
    use std::os::unix::fs::FileExt as _;
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(db)?;
    let mut byte = [0u8];
    f.read_exact_at(&mut byte, at)?;
    byte[0] ^= mask;
    f.write_all_at(&byte, at)?;
    Ok(f.sync_all()?)
}

/// Why the node must refuse its damaged log (`None`: it may start),
/// judged on a copy of its files: sled refuses them or cannot read an
/// entry kept, or the log lacks the entry the mark names (above the purge
/// point) or holds another, or its vote is older than the mark's.
fn expected_refusal(sled_dir: &Path) -> anyhow::Result<Option<String>> {
    // Beside the node's data directory (which may be the disk layer's
    // mount), removed afterwards.
    let copy = sled_dir
        .parent()
        .and_then(Path::parent)
        .context("the node's directory")?
        .join("rot-copy");
    let _ = std::fs::remove_dir_all(&copy);
    std::fs::create_dir_all(&copy)?;
    // sled panics on some damage: the node must then refuse too.
    let judged = std::panic::catch_unwind(|| judge_copy(sled_dir, &copy))
        .unwrap_or_else(|_| Ok(Some("sled panics on the damaged files".into())));
    let _ = std::fs::remove_dir_all(&copy);
    judged
}

fn judge_copy(sled_dir: &Path, copy: &Path) -> anyhow::Result<Option<String>> {
    copy_dir(sled_dir, copy)?;
    let mark_bytes = std::fs::read(copy.join(MARK_FILE)).unwrap_or_default();
    let mark = match Mark::from_file(&mark_bytes) {
        Ok(Some((_, mark))) => mark,
        Ok(None) => Mark::default(),
        Err(e) => return Ok(Some(format!("the mark file is damaged: {e}"))),
    };
    let db = match raftlock_node::raft::log_store::open_db(copy) {
        Ok(db) => db,
        Err(e) if e.to_string().contains("are damaged") => {
            return Ok(Some("sled finds its files corrupt".into()))
        }
        Err(e) => anyhow::bail!("cannot open the copy of {}: {e:#}", sled_dir.display()),
    };
    let (log, meta) = (db.open_tree("log")?, db.open_tree("meta")?);
    if let Some(marked) = &mark.vote {
        let vote = |b: &[u8]| raftlock_node::codec::decode::<raftlock_node::raft::Vote>(b).ok();
        let now = meta.get("vote")?.and_then(|v| vote(&v));
        let older = match (vote(marked), now) {
            (Some(m), Some(n)) => !matches!(
                n.partial_cmp(&m),
                Some(std::cmp::Ordering::Greater | std::cmp::Ordering::Equal)
            ),
            _ => true,
        };
        if older {
            return Ok(Some("its vote is older than the marked one".into()));
        }
    }
    let purged = meta
        .get("last_purged")?
        .and_then(|v| raftlock_node::codec::decode::<raftlock_node::raft::LogId>(&v).ok())
        .map_or(0u64, |l| l.index + 1);
    // sled finds some damage only when it reads the page: every entry kept
    // must read.
    for item in log.range(purged.to_be_bytes()..) {
        if let Err(e) = item {
            return Ok(Some(format!("sled cannot read the log: {e}")));
        }
    }
    if let Some((index, _)) = mark.last {
        if index >= purged {
            match log.get(index.to_be_bytes())? {
                None => {
                    return Ok(Some(format!(
                        "entry {index}, which the mark names, is gone"
                    )))
                }
                Some(v) if Mark::of(Some((index, &v)), None).last != mark.last => {
                    return Ok(Some(format!("entry {index} is not the one the mark names")))
                }
                Some(_) => {}
            }
        }
    }
    Ok(None)
}

fn copy_dir(from: &Path, to: &Path) -> std::io::Result<()> {
    for entry in std::fs::read_dir(from)? {
        let entry = entry?;
        let dest: PathBuf = to.join(entry.file_name());
        if entry.file_type()?.is_dir() {
            std::fs::create_dir_all(&dest)?;
            copy_dir(&entry.path(), &dest)?;
        } else {
            std::fs::copy(entry.path(), &dest)?;
        }
    }
    Ok(())
}

/// Starts the damaged node and waits until it serves ("started") or its
/// process ends ("refused" if its last log line says one of
/// [`REFUSALS`], else "exited"); held down once it has ended.
async fn start_or_refuse(
    cluster: &Arc<Mutex<Cluster>>,
    id: u64,
) -> anyhow::Result<(&'static str, String)> {
    cluster.lock().await.start_node(id)?;
    let deadline = Instant::now() + DECIDE_WITHIN;
    loop {
        {
            let mut c = cluster.lock().await;
            if !c.is_up(id) {
                let line = crate::cluster::last_log_line(&c.log_path(id));
                c.kill(id).await?;
                let refused = REFUSALS.iter().any(|r| line.contains(r));
                return Ok((if refused { "refused" } else { "exited" }, line));
            }
            if c.wait_serving(id, Duration::from_millis(200)).await.is_ok() {
                return Ok(("started", String::new()));
            }
        }
        if Instant::now() >= deadline {
            return Ok(("undecided", String::new()));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Replaces a node that refused its log (or, for `lost-disk`, its empty
/// data directory): removes it from the cluster, wipes its data and adds
/// it again. What each step answered.
pub(super) async fn replace(cluster: &Arc<Mutex<Cluster>>, rec: &Recorder, id: u64) -> Value {
    let (admin, addr) = {
        let c = cluster.lock().await;
        (c.admin().clone(), c.addr(id))
    };
    rec.record(
        Process::NEMESIS,
        Type::Invoke,
        "remove-node",
        json!({"node": id}),
    );
    let removed = tokio::time::timeout(Duration::from_secs(30), admin.remove_node(id)).await;
    let (kind, value) = super::membership::change_outcome(id, &removed);
    rec.record(Process::NEMESIS, kind, "remove-node", value.clone());
    if kind != Type::Ok {
        return json!({"removed": value});
    }
    if let Err(e) = cluster.lock().await.wipe(id).await {
        return json!({"removed": value, "wiped": e.to_string()});
    }
    rec.record(
        Process::NEMESIS,
        Type::Invoke,
        "add-node",
        json!({"node": id, "addr": addr}),
    );
    let added =
        tokio::time::timeout(Duration::from_secs(40), admin.add_node(id, &addr, false)).await;
    let (kind, added) = super::membership::change_outcome(id, &added);
    rec.record(Process::NEMESIS, kind, "add-node", added.clone());
    json!({"removed": value, "added": added})
}

/// The `log-rot` check: a node whose damaged log lost what its mark names
/// refused to start, one whose log did not started, and none exited for
/// another reason.
pub fn check(events: &[Event]) -> (Value, Vec<Value>) {
    let mut anomalies = Vec::new();
    let (mut damaged, mut refused) = (0, 0);
    for e in events
        .iter()
        .filter(|e| e.process == Process::NEMESIS && e.f == "rot-outcome")
    {
        damaged += 1;
        let v = &e.value;
        let outcome = v["outcome"].as_str().unwrap_or("?");
        refused += u64::from(outcome == "refused");
        let expected = &v["expected_refusal"];
        let problem = match (outcome, expected) {
            (_, Value::Object(_)) => None, // the copy could not be judged
            ("started", Value::String(why)) => Some(format!(
                "started on a damaged log that it must refuse ({why})"
            )),
            ("refused", Value::Null) => {
                Some("refused a damaged log that still holds what its mark names".to_string())
            }
            ("started" | "refused", _) => None,
            (other, _) => Some(format!(
                "neither started nor refused its damaged log ({other}): {}",
                v["last_log_line"].as_str().unwrap_or("")
            )),
        };
        if let Some(p) = problem {
            anomalies.push(json!({
                "checker": "log-rot",
                "message": format!("node {}: {p}", v["node"]),
                "time_ns": e.time_ns, "event": v,
            }));
        }
    }
    (
        json!({"valid": anomalies.is_empty(), "damaged": damaged, "refused": refused}),
        anomalies,
    )
}
