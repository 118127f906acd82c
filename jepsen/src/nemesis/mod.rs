//! The nemesis: faults on a seeded timeline.
//!
//! One fault at a time: a quiet spell, then a fault chosen from the enabled
//! kinds, held for a while, then healed. Kinds are dealt like a shuffled
//! deck: every enabled kind comes once, in a random order, before any comes
//! again, so a short run still sees each. Every choice (kind, variant,
//! duration, which node when "random") comes from the run's seed; which
//! node is the leader comes from the cluster, so a replay with the same
//! seed makes the same choices wherever the cluster behaves the same.
//!
//! Each fault is recorded in the history as a `start-KIND` and a
//! `stop-KIND` event of process `"nemesis"` (membership changes as
//! `add-node` / `remove-node` operations), and returned as a [`Window`]
//! for the report.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use rand::rngs::StdRng;
use rand::seq::{IndexedRandom, SliceRandom};
use rand::{RngExt, SeedableRng};
use serde::Serialize;
use serde_json::{json, Value};
use tokio::sync::Mutex;
use tokio::time::Instant;

mod disk;
pub mod hostile;
mod links;
pub mod lost_disk;
mod membership;
mod partitions;
mod restart;
mod restore;
pub mod rot;

use membership::membership;
pub use partitions::partition_links;
use restore::{restore, Backup};

use crate::cluster::Cluster;
use crate::history::{Process, Recorder, Type};

/// The kinds of fault.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum NemesisKind {
    /// SIGKILL and restart.
    Kill,
    /// SIGSTOP and SIGCONT.
    Pause,
    /// Cut links.
    Partition,
    /// libfaketime clock rates.
    Clock,
    /// Add and remove nodes.
    Membership,
    /// Back up, restore into a fresh cluster, move the workers there.
    Restore,
    /// Kill nodes and drop what their disks had not synced (power loss).
    LoseUnsynced,
    /// Make syncs slow on some nodes.
    SlowDisk,
    /// `kill -9` and start again within 10-200 ms (inside the followers'
    /// lease, so a leader comes back in its old term).
    RestartFast,
    /// A full disk (ENOSPC) or failing syncs (EIO) for a while.
    DiskError,
    /// Faults on the links between the client workers and the nodes.
    ClientLink,
    /// Malformed and adversarial Raft messages from outside the cluster.
    HostilePeer,
    /// A partition held for [`LONG_PARTITION_MS`]: longer than the HTTP/2
    /// keep-alive timeouts of peers and clients, so dead connections are
    /// found by keep-alive pings, never by a reset. Not part of `all`
    /// (one fault would fill a 30 s run): name it.
    LongPartition,
    /// Damage at rest in a stopped follower's log (`sled/db` cut short or
    /// a byte flipped); a node that refuses it is replaced. Not part of
    /// `all` (each one replaces a node): name it. See [`rot`].
    Rot,
    /// A follower's whole data directory lost; it comes back empty under
    /// its old id and must refuse to take part; then it is replaced. Not
    /// part of `all` (each one replaces a node): name it. See
    /// [`lost_disk`].
    LostDisk,
}

/// How long a `long-partition` holds its partition (ms). A peer channel pings
/// after 10 s of silence and gives up 20 s later; a client after 5 s and
/// 5 s: past 30 s both have had to notice.
pub const LONG_PARTITION_MS: std::ops::RangeInclusive<u64> = 35_000..=45_000;

/// Every kind `all` means, in its order (all but `long-partition`).
pub const ALL_KINDS: [NemesisKind; 12] = [
    NemesisKind::Kill,
    NemesisKind::Pause,
    NemesisKind::Partition,
    NemesisKind::Clock,
    NemesisKind::Membership,
    NemesisKind::Restore,
    NemesisKind::LoseUnsynced,
    NemesisKind::SlowDisk,
    NemesisKind::RestartFast,
    NemesisKind::DiskError,
    NemesisKind::ClientLink,
    NemesisKind::HostilePeer,
];

impl NemesisKind {
    /// Parses `kill,pause,...` (`all` = every kind, `none` = no faults,
    /// `disk` = `lose-unsynced` and `slow-disk`).
    pub fn parse_list(s: &str) -> anyhow::Result<Vec<NemesisKind>> {
        let mut out = BTreeSet::new();
        for part in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            match part {
                "disk" => out.extend([NemesisKind::LoseUnsynced, NemesisKind::SlowDisk]),
                "all" => out.extend(ALL_KINDS),
                "none" => {}
                "long-partition" => {
                    out.insert(NemesisKind::LongPartition);
                }
                "rot" => {
                    out.insert(NemesisKind::Rot);
                }
                "lost-disk" => {
                    out.insert(NemesisKind::LostDisk);
                }
                other => match ALL_KINDS.iter().find(|k| k.name() == other) {
                    Some(k) => {
                        out.insert(*k);
                    }
                    None => anyhow::bail!(
                        "unknown nemesis {other:?} (expected {}, long-partition, rot, lost-disk, \
                         disk, all or none)",
                        ALL_KINDS.map(NemesisKind::name).join(", ")
                    ),
                },
            }
        }
        Ok(out.into_iter().collect())
    }

    /// The kind's name on the command line and in the history.
    pub fn name(self) -> &'static str {
        match self {
            NemesisKind::Kill => "kill",
            NemesisKind::Pause => "pause",
            NemesisKind::Partition => "partition",
            NemesisKind::Clock => "clock",
            NemesisKind::Membership => "membership",
            NemesisKind::Restore => "restore",
            NemesisKind::LoseUnsynced => "lose-unsynced",
            NemesisKind::SlowDisk => "slow-disk",
            NemesisKind::RestartFast => "restart-fast",
            NemesisKind::DiskError => "disk-error",
            NemesisKind::ClientLink => "client-link",
            NemesisKind::HostilePeer => "hostile-peer",
            NemesisKind::LongPartition => "long-partition",
            NemesisKind::Rot => "rot",
            NemesisKind::LostDisk => "lost-disk",
        }
    }

    /// True for the kinds that need the disk-fault layer.
    pub fn needs_disk_layer(self) -> bool {
        matches!(
            self,
            NemesisKind::LoseUnsynced | NemesisKind::SlowDisk | NemesisKind::DiskError
        )
    }
}

/// How partitions cut connections.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum CutMode {
    /// Black hole: hold bytes, stall new connections.
    Stall,
    /// Also reset existing connections.
    Reset,
    /// Choose per partition.
    Mixed,
}

/// One fault, for the report and results.json.
#[derive(Clone, Debug, Serialize)]
pub struct Window {
    /// Fault kind.
    pub kind: NemesisKind,
    /// Variant (`leader`, `majority`, `halves`, `x2.0` ...).
    pub variant: String,
    /// Nodes affected.
    pub nodes: Vec<u64>,
    /// Details (cut links, clock rates, outcome).
    pub detail: Value,
    /// Start, ns since the run started.
    pub start_ns: u64,
    /// End (healed), ns since the run started.
    pub end_ns: u64,
}

/// Nemesis settings.
#[derive(Clone, Debug)]
pub struct NemesisOptions {
    /// Enabled kinds; empty = no faults.
    pub kinds: Vec<NemesisKind>,
    /// The run's seed.
    pub seed: u64,
    /// Session ttl of the workload (pauses last longer).
    pub ttl: Duration,
    /// How partitions cut.
    pub cut_mode: CutMode,
    /// Initial voter count (membership grows it by one and back).
    pub nodes: u64,
    /// The run directory (restored clusters live in `restore-N/` in it).
    pub out: std::path::PathBuf,
    /// Where the workers learn the client addresses of the cluster they
    /// must move to after a restore.
    pub addrs: Option<Arc<tokio::sync::watch::Sender<crate::clientlink::ClusterAddrs>>>,
    /// The client links, for the client-link nemesis.
    pub links: Option<Arc<crate::clientlink::ClientLinks>>,
}

/// What a fault did, to be healed.
enum Active {
    Killed(Vec<u64>),
    Paused(Vec<u64>),
    Cut,
    Clock(Vec<u64>),
    SlowDisk(Vec<u64>),
    DiskError(Vec<u64>),
    ClientLinks,
    Done,
}

/// Runs faults until `until`, then returns the windows. Leaves the cluster
/// healed.
pub async fn run(
    cluster: Arc<Mutex<Cluster>>,
    rec: Recorder,
    opts: NemesisOptions,
    until: Instant,
) -> Vec<Window> {
    let mut rng = StdRng::seed_from_u64(opts.seed ^ 0x006e_656d_6573_6973);
    let mut windows = Vec::new();
    let mut backups: Vec<Backup> = Vec::new();
    if opts.kinds.is_empty() {
        return windows;
    }
    let mut deck: Vec<NemesisKind> = Vec::new();
    // The first fault comes after a short calm, so the history starts with
    // a healthy baseline.
    let mut quiet = Duration::from_millis(rng.random_range(2000..=4000));
    loop {
        let fault_len = Duration::from_millis(rng.random_range(3000..=8000));
        if Instant::now() + quiet + Duration::from_secs(2) >= until {
            break;
        }
        tokio::time::sleep(quiet).await;
        let kind = match deck.pop() {
            Some(k) => k,
            None => {
                deck = opts.kinds.clone();
                deck.shuffle(&mut rng);
                deck.pop().expect("kinds is not empty")
            }
        };
        let start_ns = rec.now_ns();
        let (variant, nodes, detail, active) =
            match start(&cluster, &rec, &opts, kind, &mut rng, &mut backups).await {
                Ok(x) => x,
                Err(e) => {
                    rec.record(
                        Process::NEMESIS,
                        Type::Info,
                        &format!("start-{}", kind.name()),
                        json!({"error": e.to_string()}),
                    );
                    quiet = Duration::from_secs(1);
                    continue;
                }
            };
        let hold = match kind {
            // Longer than the ttl, so leases run out on the clock of a
            // cluster that has moved on.
            NemesisKind::Pause => opts.ttl + Duration::from_millis(rng.random_range(1000..=3000)),
            NemesisKind::Kill | NemesisKind::LoseUnsynced => {
                Duration::from_millis(rng.random_range(1000..=5000))
            }
            NemesisKind::Membership
            | NemesisKind::Restore
            | NemesisKind::RestartFast
            | NemesisKind::Rot => Duration::ZERO,
            // A moment to see what the messages did.
            NemesisKind::HostilePeer => Duration::from_millis(rng.random_range(1000..=3000)),
            NemesisKind::LongPartition => {
                Duration::from_millis(rng.random_range(LONG_PARTITION_MS))
            }
            _ => fault_len,
        };
        let hold_until = (Instant::now() + hold).min(until.max(Instant::now()));
        tokio::time::sleep_until(hold_until).await;
        let healed = heal(&cluster, &active, opts.links.as_deref()).await;
        let end_ns = rec.now_ns();
        // Faults that heal themselves record their end too (membership
        // and restore record their own operations instead).
        if !matches!(active, Active::Done)
            || !matches!(kind, NemesisKind::Membership | NemesisKind::Restore)
        {
            rec.record(
                Process::NEMESIS,
                Type::Info,
                &format!("stop-{}", kind.name()),
                json!({"variant": variant, "nodes": nodes, "healed": healed.is_ok(),
                       "error": healed.err().map(|e| e.to_string())}),
            );
        }
        windows.push(Window {
            kind,
            variant,
            nodes,
            detail,
            start_ns,
            end_ns,
        });
        quiet = Duration::from_millis(rng.random_range(1500..=4000));
    }
    windows
}

/// Members to fault: current voters, else the initial ones.
async fn voters(cluster: &Arc<Mutex<Cluster>>) -> Vec<u64> {
    let c = cluster.lock().await;
    let mut v = c.voters().await.unwrap_or_else(|| c.initial_ids());
    v.retain(|id| c.is_up(*id));
    v
}

async fn leader(cluster: &Arc<Mutex<Cluster>>) -> Option<u64> {
    cluster.lock().await.leader().await
}

type Started = (String, Vec<u64>, Value, Active);

async fn start(
    cluster: &Arc<Mutex<Cluster>>,
    rec: &Recorder,
    opts: &NemesisOptions,
    kind: NemesisKind,
    rng: &mut StdRng,
    backups: &mut Vec<Backup>,
) -> anyhow::Result<Started> {
    if kind == NemesisKind::Restore {
        return restore(cluster, rec, opts, rng, backups).await;
    }
    let mut members = voters(cluster).await;
    anyhow::ensure!(!members.is_empty(), "no voters to fault");
    members.shuffle(rng);
    let leader = leader(cluster).await;
    let pick_leader =
        |rng: &mut StdRng| leader.unwrap_or_else(|| members[rng.random_range(0..members.len())]);
    let majority = members.len() / 2 + 1;
    let name = kind.name();
    let started: Started = match kind {
        NemesisKind::Kill | NemesisKind::Pause => {
            let variant = *["one", "leader", "majority"]
                .choose(rng)
                .expect("non-empty");
            let targets: Vec<u64> = match variant {
                "one" => vec![members[0]],
                "leader" => vec![pick_leader(rng)],
                _ => {
                    // A majority that includes the leader when there is one.
                    let l = pick_leader(rng);
                    let mut t = vec![l];
                    t.extend(
                        members
                            .iter()
                            .copied()
                            .filter(|&m| m != l)
                            .take(majority - 1),
                    );
                    t
                }
            };
            let mut c = cluster.lock().await;
            for &t in &targets {
                if kind == NemesisKind::Kill {
                    c.kill(t).await?;
                } else {
                    c.pause(t)?;
                }
            }
            let active = if kind == NemesisKind::Kill {
                Active::Killed(targets.clone())
            } else {
                Active::Paused(targets.clone())
            };
            (variant.to_string(), targets, json!({}), active)
        }
        NemesisKind::Partition | NemesisKind::LongPartition => {
            let mut variants = vec!["halves", "isolate-leader", "bridge", "one-way"];
            if members.len() >= 5 {
                variants.push("ring");
            }
            let variant = *variants.choose(rng).expect("non-empty");
            let reset = match opts.cut_mode {
                // A long partition answers nothing, not even a reset.
                _ if kind == NemesisKind::LongPartition => false,
                CutMode::Stall => false,
                CutMode::Reset => true,
                CutMode::Mixed => rng.random_bool(0.5),
            };
            let l = pick_leader(rng);
            let links = partition_links(variant, &members, l, rng);
            let c = cluster.lock().await;
            c.cut(&links, reset)?;
            let reset = reset && !c.in_netns();
            let nodes: Vec<u64> = match variant {
                "isolate-leader" | "one-way" => vec![l],
                _ => members.clone(),
            };
            (
                variant.to_string(),
                nodes,
                json!({"cut": links, "reset": reset}),
                Active::Cut,
            )
        }
        NemesisKind::Clock => {
            let variant = *[
                "fast-new-leader",
                "leader-fast",
                "leader-slow",
                "one",
                "all",
            ]
            .choose(rng)
            .expect("non-empty");
            let l = pick_leader(rng);
            let follower = members.iter().copied().find(|&m| m != l);
            let targets: Vec<(u64, f64)> = match (variant, follower) {
                ("fast-new-leader", Some(f)) => vec![(f, *[3.0, 5.0].choose(rng).expect("rates"))],
                ("leader-fast" | "fast-new-leader", _) => {
                    vec![(l, *[2.0, 3.0, 5.0].choose(rng).expect("rates"))]
                }
                ("leader-slow", _) => vec![(l, *[0.25, 0.5].choose(rng).expect("rates"))],
                ("one", _) => vec![(members[0], *[0.5, 2.0, 3.0].choose(rng).expect("rates"))],
                _ => members
                    .iter()
                    .map(|&m| (m, *[0.5, 0.8, 1.0, 1.5, 2.0].choose(rng).expect("rates")))
                    .collect(),
            };
            let mut new_leader = None;
            let mut c = cluster.lock().await;
            // One at a time: each is a graceful restart at the new rate.
            for &(id, rate) in &targets {
                c.set_rate(id, rate).await?;
            }
            if variant == "fast-new-leader" && follower.is_some() {
                // Depose the leader: the fast node's election timer fires
                // first, so it is likely to lead next, counting every
                // session's lease on its fast clock. Clients then believe
                // in leases the cluster has already expired; fencing is
                // what keeps the store safe.
                c.kill(l).await?;
                new_leader = c.wait_for_leader(Duration::from_secs(5)).await.ok();
                c.restart(l).await?;
            }
            let nodes: Vec<u64> = targets.iter().map(|t| t.0).collect();
            let rates: Vec<Value> = targets
                .iter()
                .map(|(id, r)| json!({"node": id, "rate": r}))
                .collect();
            (
                variant.to_string(),
                nodes.clone(),
                json!({ "rates": rates, "new_leader": new_leader }),
                Active::Clock(nodes),
            )
        }
        NemesisKind::Membership => {
            return membership(cluster, rec, opts, members, leader, rng).await;
        }
        NemesisKind::Restore => unreachable!("handled above"),
        NemesisKind::LoseUnsynced => {
            let l = pick_leader(rng);
            disk::lose_unsynced(cluster, &members, l, majority, rng).await?
        }
        NemesisKind::SlowDisk => {
            let l = pick_leader(rng);
            disk::slow_disk(cluster, &members, l, majority, rng).await?
        }
        NemesisKind::RestartFast => restart::restart_fast(cluster, &members, leader, rng).await?,
        NemesisKind::Rot => rot::rot(cluster, rec, &members, leader, rng).await?,
        NemesisKind::LostDisk => lost_disk::lost_disk(cluster, rec, &members, leader).await?,
        NemesisKind::DiskError => {
            let l = pick_leader(rng);
            disk::disk_error(cluster, &members, l, majority, rng).await?
        }
        NemesisKind::ClientLink => links::client_link(cluster, opts, &members, leader, rng).await?,
        NemesisKind::HostilePeer => {
            let messages = hostile::pick(rng, &members, leader);
            let (addrs, auth) = {
                let c = cluster.lock().await;
                (c.addrs(), c.token().is_some())
            };
            let mut sent = Vec::new();
            for (what, node, other) in messages {
                let outcome = hostile::send(&what, &addrs[&node], &addrs, other, rng).await;
                let v = json!({"node": node, "kind": what, "other_cluster": other.is_some(),
                               "auth": auth, "outcome": outcome});
                rec.record(Process::NEMESIS, Type::Info, "hostile-message", v.clone());
                sent.push(v);
            }
            let mut nodes: Vec<u64> = sent.iter().filter_map(|m| m["node"].as_u64()).collect();
            nodes.sort_unstable();
            nodes.dedup();
            (
                if auth {
                    "authenticated"
                } else {
                    "unauthenticated"
                }
                .to_string(),
                nodes,
                json!({ "messages": sent }),
                Active::Done,
            )
        }
    };
    rec.record(
        Process::NEMESIS,
        Type::Info,
        &format!("start-{name}"),
        json!({"variant": started.0, "nodes": started.1, "detail": started.2}),
    );
    Ok(started)
}

async fn heal(
    cluster: &Arc<Mutex<Cluster>>,
    active: &Active,
    links: Option<&crate::clientlink::ClientLinks>,
) -> anyhow::Result<()> {
    let mut c = cluster.lock().await;
    match active {
        Active::Killed(ids) => {
            for &id in ids {
                c.restart(id).await?;
            }
        }
        Active::Paused(ids) => {
            for &id in ids {
                c.resume(id)?;
            }
        }
        Active::Cut => c.heal_links()?,
        Active::Clock(ids) => {
            for &id in ids {
                c.set_rate(id, 1.0).await?;
            }
        }
        Active::SlowDisk(ids) => {
            for &id in ids {
                c.set_fsync_delay(id, Duration::ZERO)?;
            }
        }
        Active::ClientLinks => {
            if let Some(l) = links {
                l.heal().await;
            }
        }
        Active::DiskError(ids) => {
            for &id in ids {
                c.set_disk_error(id, None)?;
            }
            // Nodes that exited on the failing disk: start them now rather
            // than after the supervisor's delay.
            for &id in ids {
                c.restart(id).await?;
            }
        }
        Active::Done => {}
    }
    Ok(())
}

/// Rebuilds the fault windows from a history's nemesis events (for
/// re-checking a finished run).
pub fn windows_from_history(events: &[crate::history::Event]) -> Vec<Window> {
    let kind_of = |name: &str| match name {
        "add-node" | "remove-node" => Some(NemesisKind::Membership),
        "long-partition" => Some(NemesisKind::LongPartition),
        "rot" => Some(NemesisKind::Rot),
        "lost-disk" => Some(NemesisKind::LostDisk),
        name => ALL_KINDS.iter().copied().find(|k| k.name() == name),
    };
    let mut open: std::collections::HashMap<String, (u64, Value)> = Default::default();
    let mut out = Vec::new();
    for e in events.iter().filter(|e| e.process == Process::NEMESIS) {
        let (key, starting) = if let Some(k) = e.f.strip_prefix("start-") {
            (k.to_string(), true)
        } else if let Some(k) = e.f.strip_prefix("stop-") {
            (k.to_string(), false)
        } else if e.f == "add-node" || e.f == "remove-node" {
            (e.f.clone(), e.kind == Type::Invoke)
        } else {
            continue;
        };
        if starting {
            if e.value.get("error").is_none_or(Value::is_null) || e.kind == Type::Invoke {
                open.insert(key, (e.time_ns, e.value.clone()));
            }
            continue;
        }
        let (Some((start_ns, value)), Some(kind)) = (open.remove(&key), kind_of(&key)) else {
            continue;
        };
        let nodes: Vec<u64> = value
            .get("nodes")
            .and_then(Value::as_array)
            .map(|a| a.iter().filter_map(Value::as_u64).collect())
            .or_else(|| value.get("node").and_then(Value::as_u64).map(|n| vec![n]))
            .unwrap_or_default();
        let variant = value
            .get("variant")
            .and_then(Value::as_str)
            .map(str::to_string)
            .unwrap_or_else(|| key.trim_end_matches("-node").to_string());
        out.push(Window {
            kind,
            variant,
            nodes,
            detail: value.get("detail").cloned().unwrap_or(e.value.clone()),
            start_ns,
            end_ns: e.time_ns,
        });
    }
    out.sort_by_key(|w| w.start_ns);
    out
}

#[cfg(test)]
mod tests;
