//! The node's one view of its own leadership, and the one place that
//! answers every "may I": accept a write, serve a linearizable read, renew
//! a lease, report `SERVING`, name myself leader.
//!
//! The view is built from one state: openraft's role and term, whether
//! **this process** has had an entry of its own term committed and applied
//! (the *barrier*), when the leader last heard from a quorum, and whether
//! the Raft core still runs. Nothing else in the node reads openraft's
//! metrics to decide any of these.
//!
//! Why the barrier is per process: openraft 0.10 can restore a leader
//! whose vote is committed in its old term when it restarts inside its
//! followers' lease (`Config::enable_leader_restore`), without an election
//! and without its own no-op entry, starting from the commit index it had
//! saved, which can lag what it acknowledged. raftlock turns restore off
//! (`node/start.rs`): a restored leader could also have lost the last entries it
//! sent before they reached its own disk, and would give their indexes to
//! new commands (the harness saw one log id name two entries). The barrier
//! stays as the one rule for every leader, however it got there: before it
//! serves a read, renews a lease or counts a timer, it commits and applies
//! an empty entry of its own; everything committed before is then applied
//! too. Writes need no barrier: they are answered from the apply of their
//! own entry, which comes after everything before it.
//!
//! Readiness ("can this node serve now", for `/readyz` and gRPC health):
//! its core runs, it knows a leader and, as a follower, has heard from it
//! within the last few heartbeats (a follower of a dead leader still
//! "knows" it until its election timeout, and writes fail meanwhile) and
//! the leader's last message did not say it had lost its quorum, or, as
//! the leader, from a quorum within the election timeout; and it has
//! applied all but [`READY_MAX_APPLY_LAG`] of the entries it knows are
//! committed. The Raft service tells [`Leadership::heard_from_leader`]
//! of every message of the leader that openraft takes. A leader cut off
//! from its quorum keeps its term and its heartbeats to whoever it still
//! reaches (openraft does not step it down), so it says so on every
//! AppendEntries (`RaftMessage.leader_quorum_lost`, set from this view),
//! or its followers on the same side of a partition would call themselves
//! ready beside a leader that can commit nothing.
//!
//! Fail-stop: when the Raft core stops on its own (a storage error such as
//! a full disk, or a panic inside openraft), the view says so, health turns
//! `NOT_SERVING`, every request is refused, and [`Leadership::failed`]
//! resolves with the cause so the process can exit and be restarted by its
//! supervisor. A node never runs on with a dead core.

use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::Instant;

use openraft::error::Fatal;
use openraft::ServerState;
use tokio::sync::watch;

use crate::apply::{Raft, Shared};
use crate::error::Error;
use crate::raft::log_store::SyncFailure;
use crate::raft::WatchReceiver as _;
use crate::raft::{Batch, NodeAddrs, NodeId, RaftMetrics, TypeConfig, Vote};

mod check;
mod health;
mod transfer;

use check::LeaderCheck;
use health::set_health;
pub use health::{readiness, Contact, LIVENESS_SERVICE};

/// How long a proposal waits for a newly elected leader's first quorum
/// acknowledgement (openraft 0.10 refuses a leader's writes until then, as
/// "not the leader").
pub const FIRST_QUORUM_WAIT: Duration = Duration::from_millis(500);

/// How long a leader waits before it tries its barrier again.
const BARRIER_RETRY: Duration = Duration::from_millis(50);

/// A voter the leader has not heard from for longer than this is not handed
/// the leadership: openraft stops the leader's heartbeats once it starts a
/// transfer, so a target that cannot take over would leave the cluster
/// without a leader until an election.
pub const TRANSFER_MAX_SILENCE: Duration = Duration::from_secs(1);

/// Most committed log entries a node may not have applied yet and still
/// call itself ready (a follower catching up is not).
pub const READY_MAX_APPLY_LAG: u64 = 100;

/// A follower that has not heard from its leader for this many heartbeat
/// intervals is not ready.
pub const READY_MISSED_HEARTBEATS: u32 = 3;

/// How long [`Leadership::transfer`] waits for this node to step down.
pub const TRANSFER_WAIT: Duration = Duration::from_secs(3);

/// What this node is, as far as serving is concerned.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    /// openraft's leader of the current term.
    Leader,
    /// A follower (voter).
    Follower,
    /// Campaigning.
    Candidate,
    /// A non-voting member catching up.
    Learner,
    /// The Raft core has stopped (shutdown or a fatal error), or a sync of
    /// the log has failed.
    Stopped,
}

/// Whether node `id` leads the term of `vote`: the vote is its own and
/// committed (granted by a quorum). This is what its log says of it, not
/// what openraft's role says at this moment: the removal procedure
/// ([`Node`](crate::node::Node)) asks it of the vote that stands beside a
/// membership the node has applied.
pub fn leads_term(id: NodeId, vote: &Vote) -> bool {
    vote.is_committed() && vote.leader_id().node_id == id
}

/// The node's view of itself at one moment.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct View {
    /// The role openraft reports (`Stopped` once the core has stopped).
    pub role: Role,
    /// The current term.
    pub term: u64,
    /// The leader openraft knows of (possibly this node).
    pub leader: Option<NodeId>,
    /// As leader: this process has had an entry of the current term
    /// committed and applied, so its table holds everything committed.
    pub ready: bool,
    /// As leader of a multi-voter cluster: no quorum has acknowledged it
    /// for longer than the quorum timeout. It may already be deposed.
    pub quorum_lost: bool,
    /// Why the core stopped, if it stopped on its own.
    pub fatal: Option<String>,
}

impl View {
    fn initial() -> View {
        View {
            role: Role::Follower,
            term: 0,
            leader: None,
            ready: false,
            quorum_lost: false,
            fatal: None,
        }
    }

    /// Leader of its term, caught up (barrier applied) and in touch with a
    /// quorum: it may renew leases, count timers, serve reads, and calls
    /// itself leader.
    pub fn working_leader(&self) -> bool {
        self.role == Role::Leader && self.ready && !self.quorum_lost
    }

    /// Whether health checks report `SERVING`: the core runs, a leader is
    /// known, and if this node is that leader it is in touch with a
    /// quorum.
    pub fn serving(&self) -> bool {
        self.role != Role::Stopped
            && self.fatal.is_none()
            && self.leader.is_some()
            && !(self.role == Role::Leader && self.quorum_lost)
    }

    /// Whether the process still works: its Raft core runs (for liveness
    /// probes; see [`LIVENESS_SERVICE`]).
    pub fn alive(&self) -> bool {
        self.role != Role::Stopped && self.fatal.is_none()
    }

    /// The role `Status` reports: "leader" only for a working leader; a
    /// node that openraft calls leader but that has not yet committed an
    /// entry of its own term, or has lost its quorum, is still establishing
    /// (or re-establishing) itself and reports "candidate".
    pub fn status_role(&self) -> &'static str {
        match self.role {
            Role::Leader if self.working_leader() => "leader",
            Role::Leader | Role::Candidate => "candidate",
            Role::Follower => "follower",
            Role::Learner => "learner",
            Role::Stopped => "shutdown",
        }
    }
}

/// Bookkeeping of the follow loop that the view is computed from.
#[derive(Default)]
struct Follow {
    /// Since when this node has led its current term (a leader that has
    /// never heard from a quorum counts its silence from there).
    leading_since: Option<(u64, Instant)>,
    /// The core ended without being asked to: why.
    fatal: Option<String>,
}

/// The owner of "am I a working leader".
pub struct Leadership {
    id: NodeId,
    raft: Raft,
    shared: Arc<Shared>,
    /// A leader that has heard from no quorum for this long counts as cut
    /// off (openraft's followers campaign after about as long).
    quorum_timeout: Duration,
    /// Named in the fatal-error message (a full disk is this directory's).
    data_dir: PathBuf,
    /// The term whose barrier this process has committed and applied as
    /// leader (0: none).
    ready_term: AtomicU64,
    /// One barrier write at a time; the others wait for it.
    barrier: tokio::sync::Mutex<()>,
    /// Shares leadership confirmations among keep-alives.
    check: LeaderCheck,
    /// The follow loop's state; also serialises every lease-keeper
    /// transition, so the keeper always matches the latest view.
    follow: Mutex<Follow>,
    /// The latest view, for anyone who waits on a change.
    view: watch::Sender<View>,
    /// The cause of a fatal stop of the core, published once health says
    /// `NOT_SERVING`.
    fatal: watch::Sender<Option<String>>,
    /// A follower that has not heard from its leader for longer is not
    /// ready.
    leader_silence: Duration,
    /// When this node last took a message of the leader, and whether
    /// that message said the leader had lost its quorum.
    leader_contact: Mutex<Option<(Instant, bool)>>,
    /// Set while this node leads without word from a quorum
    /// (`View::quorum_lost`); the network tells followers with every
    /// AppendEntries.
    quorum_flag: Arc<std::sync::atomic::AtomicBool>,
    /// The log's store's first failed sync: once one has failed, for
    /// whatever write, the node stops (fail-stop), as when its Raft core
    /// stops. Not the store itself, which this would keep open.
    store: SyncFailure,
}

impl Leadership {
    /// The owner for node `id`; `heartbeat` is the leader's heartbeat
    /// interval (a follower that misses [`READY_MISSED_HEARTBEATS`] of them
    /// is not ready); `store` is where its log's store keeps a failed
    /// sync; `quorum_flag` is set while this node leads without a quorum
    /// (the network sends it to followers).
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        id: NodeId,
        raft: Raft,
        shared: Arc<Shared>,
        quorum_timeout: Duration,
        heartbeat: Duration,
        data_dir: PathBuf,
        store: SyncFailure,
        quorum_flag: Arc<std::sync::atomic::AtomicBool>,
    ) -> Arc<Leadership> {
        Arc::new(Leadership {
            id,
            raft,
            shared,
            quorum_timeout,
            data_dir,
            ready_term: AtomicU64::new(0),
            barrier: tokio::sync::Mutex::new(()),
            check: LeaderCheck::default(),
            follow: Mutex::new(Follow::default()),
            view: watch::channel(View::initial()).0,
            fatal: watch::channel(None).0,
            leader_silence: heartbeat * READY_MISSED_HEARTBEATS,
            leader_contact: Mutex::new(None),
            quorum_flag,
            store,
        })
    }

    /// This node has just taken a message of its leader (an append, a
    /// heartbeat, a snapshot); `quorum_lost` if the message said the
    /// leader has heard from no quorum for over its quorum timeout.
    pub fn heard_from_leader(&self, quorum_lost: bool) {
        *self.leader_contact.lock().expect("contact lock poisoned") =
            Some((Instant::now(), quorum_lost));
    }

    /// The leader `/metrics` exports (`raftlock_leader_id`; 0: none): the
    /// one `view` knows, unless it cannot commit: this node leads without
    /// its quorum, or its leader's last message said that leader had lost
    /// its own (see `RaftMessage.leader_quorum_lost`).
    pub fn exported_leader(&self, view: &View) -> u64 {
        let leader_lost_quorum = self
            .leader_contact
            .lock()
            .expect("contact lock poisoned")
            .is_some_and(|(_, lost)| lost);
        let without_quorum = match view.role {
            Role::Leader => view.quorum_lost,
            _ => leader_lost_quorum,
        };
        if without_quorum {
            0
        } else {
            view.leader.unwrap_or(0)
        }
    }

    /// Whether no message of a leader has been taken for `quiet` (or none
    /// ever since this node started).
    pub fn no_leader_contact_for(&self, quiet: Duration) -> bool {
        self.leader_contact
            .lock()
            .expect("contact lock poisoned")
            .is_none_or(|(at, _)| at.elapsed() >= quiet)
    }

    /// `Ok` while the process works: it is not stopping and its Raft core
    /// runs. Else why not (for `/livez`).
    pub fn live(&self) -> Result<(), String> {
        self.check_running().map_err(|e| e.to_string())
    }

    /// `Ok` while this node can serve now (see the module doc); else why
    /// not (for `/readyz`, and what gRPC health reports).
    pub fn ready(&self) -> Result<(), String> {
        self.live()?;
        let m = self.raft.metrics().borrow_watched().clone();
        self.ready_with(&self.view(), &m)
    }

    fn ready_with(&self, view: &View, m: &RaftMetrics) -> Result<(), String> {
        let contact = self
            .leader_contact
            .lock()
            .expect("contact lock poisoned")
            .map(|(at, quorum_lost)| Contact {
                silent: at.elapsed(),
                quorum_lost,
            });
        let applied = m.last_applied.map_or(0, |l| l.index);
        let committed = m
            .cluster_committed
            .max(m.local_committed)
            .map_or(0, |l| l.index);
        readiness(
            view,
            self.id,
            contact,
            self.leader_silence,
            applied,
            committed,
        )
    }

    /// The latest view.
    pub fn view(&self) -> View {
        self.view.borrow().clone()
    }

    /// A receiver of every new view.
    pub fn watch(&self) -> watch::Receiver<View> {
        self.view.subscribe()
    }

    /// Whether the Raft core answers a round trip within `within`: it runs
    /// and its loop is not stuck (for systemd's watchdog, which restarts a
    /// node whose core hangs). The view alone cannot tell: a hung core
    /// changes nothing in it.
    pub async fn core_responds(&self, within: Duration) -> bool {
        if !self.view().alive() {
            return false;
        }
        matches!(
            tokio::time::timeout(within, self.raft.with_raft_state(|_| ())).await,
            Ok(Ok(()))
        )
    }

    /// Resolves with the cause once the Raft core has stopped on its own,
    /// or a sync of the log has failed (never for a shutdown the node asked
    /// for), after health has been set to `NOT_SERVING`.
    pub async fn failed(&self) -> String {
        let mut rx = self.fatal.subscribe();
        let cause = match rx.wait_for(Option::is_some).await {
            Ok(cause) => cause.clone(),
            // The owner is gone: the node has been dropped.
            Err(_) => None,
        };
        match cause {
            Some(cause) => cause,
            None => std::future::pending().await,
        }
    }

    /// Refuses at once if this node is stopping or its core has stopped.
    pub fn check_running(&self) -> Result<(), Error> {
        if self.shared.stopping.load(Ordering::SeqCst) {
            return Err(Error::Unavailable("this node is stopping".into()));
        }
        if let Some(cause) = &self.view.borrow().fatal {
            return Err(Error::Unavailable(format!(
                "this node has stopped ({cause}); it is exiting"
            )));
        }
        Ok(())
    }

    /// May this node propose a write now? Refused while it is stopping,
    /// its core has stopped, or, as leader, it has lost its quorum (nothing
    /// it proposes could commit, and another node may lead by now).
    /// Followers are left to openraft, which answers with the leader.
    pub fn may_write(&self) -> Result<(), Error> {
        self.check_running()?;
        let v = self.view.borrow();
        if v.role == Role::Leader && v.quorum_lost {
            return Err(Error::NotLeader { leader: None });
        }
        Ok(())
    }

    /// Resolves once this node, as leader, has lost its quorum (a pending
    /// write's outcome is then unknown).
    pub async fn quorum_lost(&self) {
        let mut rx = self.view.subscribe();
        if rx
            .wait_for(|v| v.role == Role::Leader && v.quorum_lost)
            .await
            .is_err()
        {
            std::future::pending::<()>().await;
        }
    }

    /// Waits (at most [`FIRST_QUORUM_WAIT`]) until a newly elected leader
    /// has heard from a quorum in its term, which openraft 0.10 requires
    /// before it accepts a write; right after an election that would
    /// otherwise turn away the first requests. A leader that heard from a
    /// quorum once and then lost it is not held here (openraft refuses it).
    pub async fn wait_first_quorum(&self) {
        let unconfirmed = |m: &RaftMetrics| {
            m.state == ServerState::Leader
                && m.last_quorum_acked.is_none()
                && m.membership_config.membership().voter_ids().count() > 1
        };
        let mut metrics = self.raft.metrics();
        if !unconfirmed(&metrics.borrow_watched()) {
            return;
        }
        let _ = tokio::time::timeout(
            FIRST_QUORUM_WAIT,
            crate::raft::wait_metrics(&mut metrics, |m| !unconfirmed(m)),
        )
        .await;
    }

    /// Makes sure this process, as leader of the current term, has had an
    /// entry of its own committed and applied (see the module doc), and the
    /// lease keeper counts for the term. Returns the term.
    pub async fn ensure_ready(&self) -> Result<u64, Error> {
        self.check_running()?;
        let v = self.view();
        if v.role != Role::Leader {
            return Err(self.not_leader());
        }
        if self.ready_term.load(Ordering::Acquire) == v.term {
            return Ok(v.term);
        }
        let _one = self.barrier.lock().await;
        if self.ready_term.load(Ordering::Acquire) == v.term {
            return Ok(v.term);
        }
        self.wait_first_quorum().await;
        let written = self.raft.client_write(Batch(Vec::new())).await?;
        // The entry committed, and this node proposed it as leader of the
        // entry's term; it has been applied here before client_write
        // returned.
        let term = written.log_id.leader_id.term;
        self.ready_term.fetch_max(term, Ordering::AcqRel);
        let v = self.settle();
        if v.role == Role::Leader && v.term == term {
            Ok(term)
        } else {
            Err(self.not_leader())
        }
    }

    /// Waits until this node's table reflects every write committed before
    /// the call (openraft's read-index after this process's barrier),
    /// unless `stale`.
    pub async fn read_barrier(&self, stale: bool) -> Result<(), Error> {
        self.check_running()?;
        if stale {
            return Ok(());
        }
        // A follower is refused here with the leader's address.
        self.raft
            .ensure_linearizable(openraft::ReadPolicy::ReadIndex)
            .await?;
        // openraft says this node leads; the read waits for this process's
        // own barrier of the term too, whatever the published view says yet
        // (it starts as a follower's when the node starts): a table that
        // may lag what this leader acknowledged is never read.
        if self.view.borrow().role != Role::Leader {
            self.settle();
        }
        self.ensure_ready().await?;
        Ok(())
    }

    /// For keep-alives: confirms, in a quorum round that starts after this
    /// call (shared with concurrent callers), that this node is still the
    /// leader, after its barrier; the lease keeper then counts for this
    /// term (or refuses, if the quorum is lost meanwhile).
    pub async fn confirm(&self) -> Result<(), Error> {
        self.ensure_ready().await?;
        self.check.confirm(&self.raft).await?;
        Ok(())
    }

    /// `NotLeader` with the leader this node knows of (none if that is
    /// itself: it is not a working leader, or it would not be refusing).
    pub fn not_leader(&self) -> Error {
        let leader = self.leader_elsewhere().map(|(id, node)| (id, node.addr));
        Error::NotLeader { leader }
    }

    /// The leader this node knows of, with its addresses, if that is
    /// another node (where a follower forwards requests, `api::forward`).
    pub fn leader_elsewhere(&self) -> Option<(NodeId, NodeAddrs)> {
        let metrics = self.raft.metrics().borrow_watched().clone();
        metrics
            .current_leader
            .filter(|l| *l != self.id)
            .and_then(|l| {
                metrics
                    .membership_config
                    .membership()
                    .get_node(&l)
                    .map(|n| (l, n.clone()))
            })
    }

    /// Recomputes the view from openraft's latest metrics and the clock,
    /// publishes it, and brings the lease keeper and parked requests in
    /// line with it.
    fn settle(&self) -> View {
        let m = self.raft.metrics().borrow_watched().clone();
        self.settle_with(&m, false)
    }

    /// [`settle`](Self::settle) from metrics `m`; `core_gone` if the core's
    /// task has ended (its metrics channel closed).
    fn settle_with(&self, m: &RaftMetrics, core_gone: bool) -> View {
        let mut f = self.follow.lock().expect("leadership lock poisoned");
        let stopping = self.shared.stopping.load(Ordering::SeqCst);
        if f.fatal.is_none() && !stopping {
            f.fatal = match (&m.running_state, core_gone) {
                (Err(fatal), _) => Some(self.cause(fatal)),
                (Ok(()), true) => {
                    Some("the Raft core ended unexpectedly (a panic: see the message above)".into())
                }
                // A failed sync outside openraft's own writes (recording
                // the cluster id, say) leaves the core running, but nothing
                // this process writes can be trusted any more, and every
                // later write fails: the node stops as if its core had
                // (without this, simulator seed 304475: a node answered
                // every peer `UNAVAILABLE` and never restarted).
                (Ok(()), false) => self.store.get().map(|first| {
                    self.storage_cause(&format!(
                        "a sync of the log failed ({first}); nothing written since can be \
                         trusted to reach the disk"
                    ))
                }),
            };
        }
        let stopped = f.fatal.is_some()
            || m.running_state.is_err()
            || core_gone
            || m.state == ServerState::Shutdown;
        let leading =
            !stopped && m.state == ServerState::Leader && m.current_leader == Some(self.id);
        if !leading {
            f.leading_since = None;
        } else if f.leading_since.is_none_or(|(t, _)| t != m.current_term) {
            f.leading_since = Some((m.current_term, Instant::now()));
        }
        // Single-voter clusters have no one to ack; they never lose quorum.
        let voters = m.membership_config.membership().voter_ids().count();
        let silent = match &m.last_quorum_acked {
            Some(at) => openraft::Instant::elapsed(&**at),
            None => f
                .leading_since
                .map_or(Duration::ZERO, |(_, since)| since.elapsed()),
        };
        let view = View {
            role: match m.state {
                _ if stopped => Role::Stopped,
                ServerState::Leader if leading => Role::Leader,
                // openraft briefly reports a node as leader before its own
                // id is the known leader (bootstrapping).
                ServerState::Leader | ServerState::Candidate => Role::Candidate,
                ServerState::Follower => Role::Follower,
                ServerState::Learner => Role::Learner,
                ServerState::Shutdown => Role::Stopped,
            },
            term: m.current_term,
            leader: if stopped { None } else { m.current_leader },
            ready: leading && self.ready_term.load(Ordering::Acquire) == m.current_term,
            quorum_lost: leading && voters > 1 && silent > self.quorum_timeout,
            fatal: f.fatal.clone(),
        };
        self.quorum_flag.store(view.quorum_lost, Ordering::Relaxed);
        self.steer_leases(&view);
        self.view.send_if_modified(|old| {
            let changed = *old != view;
            if changed {
                *old = view.clone();
            }
            changed
        });
        view
    }

    /// Brings the lease keeper in line with `view` (called under the
    /// follow lock, so transitions never interleave).
    fn steer_leases(&self, view: &View) {
        let shared = &self.shared;
        let leases = &shared.leases;
        if view.role == Role::Leader && view.ready && !view.quorum_lost {
            // Counting for this term: a new term re-arms everything at full
            // length; the same term after a quorum blip goes on.
            shared.read(|applied| leases.activate_for_term(view.term, &applied.table));
        } else if view.role == Role::Leader && view.ready {
            // Cut off from a quorum but still leader of this term: the
            // deadlines stay valid for as long as it leads (a quorum that
            // elected another leader would refuse it); propose and
            // acknowledge nothing until the quorum is back. Parked requests
            // go to retry where they can be answered.
            if leases.is_active() && !leases.is_paused() {
                tracing::info!(term = view.term, "leases: quorum lost, pausing");
                leases.pause();
                shared.waiters.fail_all();
            }
        } else if view.role == Role::Leader {
            // Leader of a term whose barrier has not applied yet: its table
            // may lag, so nothing is counted from it yet.
            if leases.is_active() {
                leases.deactivate();
                shared.waiters.fail_all();
            }
        } else if leases.is_active() {
            // Deposed or stopped: stop counting leases (a new leader counts
            // them) and send parked requests to retry where they can be
            // answered.
            tracing::info!(term = view.term, "leases: not the leader, stop counting");
            leases.deactivate();
            shared.waiters.fail_all();
        }
    }

    /// One line an operator can act on, for a fatal error of the core.
    fn cause(&self, fatal: &Fatal<TypeConfig>) -> String {
        match fatal {
            Fatal::Panicked => "the Raft core panicked (see the panic message above)".into(),
            Fatal::Stopped => "the Raft core stopped".into(),
            _ => self.storage_cause(&fatal.to_string()),
        }
    }

    /// One line an operator can act on, for a storage error `text`: what
    /// kind, and in which data directory.
    fn storage_cause(&self, text: &str) -> String {
        let dir = self.data_dir.display();
        if text.contains("os error 28") || text.contains("No space left") {
            format!("disk full in {dir}: {text}")
        } else if text.contains("os error 5") || text.contains("Input/output error") {
            format!("I/O error in {dir}: {text}")
        } else {
            format!("storage error in {dir}: {text}")
        }
    }

    /// Follows openraft's metrics and the clock for as long as the node
    /// runs: settles the view on every change, starts the barrier when this
    /// node begins to lead a term, and keeps gRPC health in line. Returns
    /// when the core has stopped.
    pub async fn follow(self: Arc<Self>, health: tonic_health::server::HealthReporter) {
        let mut metrics = self.raft.metrics();
        let mut reported = None;
        // A leader cut off from its followers does not learn it is deposed
        // until it hears from them, and a follower's readiness fades when
        // its leader falls silent, so also look at the clock.
        let mut tick =
            tokio::time::interval((self.quorum_timeout / 2).min(self.leader_silence / 3));
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut barrier_for = 0;
        let mut core_gone = false;
        loop {
            let m = metrics.borrow_and_update().clone();
            let view = self.settle_with(&m, core_gone);
            let health_now = (self.ready_with(&view, &m).is_ok(), view.alive());
            if reported != Some(health_now) {
                reported = Some(health_now);
                set_health(&health, health_now).await;
            }
            if view.role == Role::Leader && !view.ready && barrier_for != view.term {
                // Arm the lease keeper as soon as the barrier applies, not
                // at the first keep-alive: sessions must expire even when
                // nobody asks.
                barrier_for = view.term;
                let me = self.clone();
                let term = view.term;
                tokio::spawn(async move {
                    // Until it applies, or this node no longer leads the
                    // term (a later term starts its own).
                    while let Err(e) = me.ensure_ready().await {
                        let v = me.view();
                        if v.role != Role::Leader || v.term != term {
                            return;
                        }
                        tracing::debug!(error = %e, "leadership barrier not written yet");
                        tokio::time::sleep(BARRIER_RETRY).await;
                    }
                });
            }
            if view.role == Role::Stopped {
                if let Some(cause) = &view.fatal {
                    tracing::error!(cause = %cause, "fatal: this node has stopped");
                    self.fatal.send_replace(Some(cause.clone()));
                }
                return;
            }
            tokio::select! {
                changed = metrics.changed() => core_gone = changed.is_err(),
                _ = tick.tick() => {}
            }
        }
    }
}

#[cfg(test)]
mod tests;
