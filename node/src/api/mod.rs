//! The gRPC services: request validation, proposals through Raft, reads
//! through read-index, and the one error → status mapping ([`crate::error`]).
//!
//! Leader routing: this node does **not** forward. A follower answers a
//! write (and a linearizable read, and a keep-alive) with `UNAVAILABLE`
//! carrying the leader's address in metadata `raftlock-leader`; clients
//! retry there. Forwarding would hide a hop and double the failure modes of
//! a request whose outcome may be unknown.

/// Proposes a command (`write_reply!(api, command, PATTERN => VALUE, …)`)
/// and takes its reply apart by the patterns its kind of command answers
/// with. Every command kind has its own reply variants, so any other reply
/// is a bug: it is answered `INTERNAL`, from this one place.
macro_rules! write_reply {
    ($api:expr, $command:expr, $($pattern:pat => $value:expr),+ $(,)?) => {
        match $api.write($command).await?.1 {
            $($pattern => $value,)+
            #[allow(unreachable_patterns)]
            other => {
                return Err($crate::error::Error::Internal(format!(
                    "a command was answered with {other:?}, which its kind never gets"
                ))
                .into())
            }
        }
    };
}

pub mod batcher;
pub mod cluster;
pub mod convert;
pub mod locks;
pub mod raft_service;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use tokio::sync::oneshot;

use crate::apply::Raft;
use crate::apply::Shared;
use crate::auth::{Auth, Caller};
use crate::error::Error;
use crate::metrics::stages::{between, Stage};
use crate::raft::NodeId;
use crate::raft::WatchReceiver as _;
use crate::state::{Command, Reply};

/// How often a pending write looks whether its leader lost its quorum
/// (it then fails fast instead of hanging until the client's deadline).
pub const QUORUM_CHECK: std::time::Duration = std::time::Duration::from_millis(100);

/// State shared by the public services.
pub struct ApiInner {
    /// This node's id.
    pub id: NodeId,
    /// This node's advertised address.
    pub addr: String,
    /// The Raft handle.
    pub raft: Raft,
    /// Table, waiters, leases, watch.
    pub shared: Arc<Shared>,
    /// Coalesces leadership confirmations.
    leader_check: LeaderCheck,
    /// Groups concurrent writes into one log entry.
    batcher: batcher::Batcher,
    /// Open `Watch` streams.
    pub(crate) watches: Arc<std::sync::atomic::AtomicUsize>,
    /// Access control.
    pub auth: Arc<Auth>,
    /// The term in which this process, as leader, has had an entry of its
    /// own committed and applied (0: none yet); see [`Api::read_barrier`].
    read_ready_term: AtomicU64,
}

/// The public services (`Locks`, `Cluster`); cheap to clone.
#[derive(Clone)]
pub struct Api(pub Arc<ApiInner>);

impl Api {
    /// Services for the node `id` at `addr`.
    pub fn new(id: NodeId, addr: String, raft: Raft, shared: Arc<Shared>, auth: Arc<Auth>) -> Self {
        let metrics = shared.metrics.clone();
        Api(Arc::new(ApiInner {
            id,
            addr,
            raft: raft.clone(),
            shared,
            leader_check: LeaderCheck::default(),
            batcher: batcher::Batcher::start(raft.clone(), metrics),
            watches: Arc::default(),
            auth,
            read_ready_term: AtomicU64::new(0),
        }))
    }

    /// Identifies the caller of `req` (see [`crate::auth`]).
    pub fn caller<T>(&self, req: &tonic::Request<T>) -> Result<Caller, Error> {
        self.0.auth.caller(req)
    }

    /// Proposes `command` and waits until it is applied here; returns the
    /// log index and the table's reply (refusals as errors).
    pub async fn write(&self, command: Command) -> Result<(u64, Reply), Error> {
        let received = std::time::Instant::now();
        self.check_running()?;
        let leases = &self.0.shared.leases;
        if leases.is_paused() {
            // This leader has lost its quorum (see `follow_leadership`):
            // nothing it proposes can commit until it is back, and another
            // node may be leader by now. Not proposed, so surely not applied.
            return Err(Error::NotLeader { leader: None });
        }
        let stages = &self.0.shared.metrics.stages;
        let submit = async {
            stages.record(Stage::Receive, received.elapsed(), 1);
            self.0.batcher.submit(command).await
        };
        tokio::pin!(submit);
        let (index, response, responded) = loop {
            tokio::select! {
                done = &mut submit => break done?,
                _ = tokio::time::sleep(QUORUM_CHECK) => {
                    if leases.is_paused() {
                        return Err(Error::Timeout(
                            "this leader lost its quorum while the write was pending; the \
                             outcome is unknown (it may still commit): retry with the same \
                             session_id and seq"
                                .into(),
                        ));
                    }
                }
            }
        };
        let replied = std::time::Instant::now();
        stages.record(Stage::Reply, between(responded, replied), 1);
        stages.record(Stage::Server, between(received, replied), 1);
        match response.reply {
            Reply::Refused(refusal) => Err(refusal.into()),
            reply => Ok((index, reply)),
        }
    }

    /// Restores `backup` into the (empty) cluster: checks it, then proposes
    /// it in parts of at most `MAX_RESTORE_PART` bytes, one after the other;
    /// the last part installs it, with its fence counter raised by
    /// `fence_bump`. Returns the sessions restored and the fence counter.
    pub async fn restore_backup(
        &self,
        backup: &[u8],
        fence_bump: u64,
    ) -> Result<(u64, u64), Error> {
        use crate::state::limits::{MAX_RESTORE_BYTES, MAX_RESTORE_PART};
        if backup.len() > MAX_RESTORE_BYTES {
            return Err(Error::InvalidArgument(format!(
                "a backup may be at most {MAX_RESTORE_BYTES} bytes, got {}",
                backup.len()
            )));
        }
        // Refuse garbage before it reaches the log. Decoding and checking a
        // large backup takes a while: not on a runtime thread.
        let copy = backup.to_vec();
        tokio::task::spawn_blocking(move || {
            crate::state::LockTable::from_snapshot(&copy).map(drop)
        })
        .await
        .map_err(|e| Error::Internal(format!("backup check failed: {e}")))?
        .map_err(|e| Error::InvalidArgument(format!("invalid backup: {e}")))?;
        let restore = rand::random::<u64>();
        let chunks: Vec<&[u8]> = if backup.is_empty() {
            vec![backup]
        } else {
            backup.chunks(MAX_RESTORE_PART).collect()
        };
        let parts = u32::try_from(chunks.len())
            .map_err(|_| Error::InvalidArgument("backup too large".into()))?;
        for (part, bytes) in chunks.into_iter().enumerate() {
            let command = Command::RestorePart {
                restore,
                part: part as u32,
                parts,
                bytes: bytes.to_vec(),
                fence_bump,
            };
            write_reply!(self, command,
                Reply::RestorePartTaken { .. } => {},
                Reply::Restored { sessions, last_fence } => return Ok((sessions, last_fence)),
            );
        }
        Err(Error::Internal(
            "the last restore part did not install the backup".into(),
        ))
    }

    /// Fails at once if this node is stopping.
    pub fn check_running(&self) -> Result<(), Error> {
        if self
            .0
            .shared
            .stopping
            .load(std::sync::atomic::Ordering::SeqCst)
        {
            return Err(Error::Unavailable("this node is stopping".into()));
        }
        Ok(())
    }

    /// Waits until this node's table reflects every write committed before
    /// the call (openraft's read-index), unless `stale`.
    ///
    /// openraft's read index is the larger of the leader's first entry of
    /// its term and its commit index. A leader restarted with its term
    /// (openraft restores a leader whose vote is committed) starts from the
    /// commit index it saved, which can lag what it acknowledged before it
    /// stopped, and its first entry of the term is old: that read index
    /// would serve a table missing acknowledged writes. So before its first
    /// linearizable read in a term, this process as leader has an empty
    /// entry of its own committed and applied, which brings the commit
    /// index past everything committed before.
    pub async fn read_barrier(&self, stale: bool) -> Result<(), Error> {
        self.check_running()?;
        if stale {
            return Ok(());
        }
        let (leading, term) = {
            let m = self.0.raft.metrics();
            let m = m.borrow_watched();
            (m.state == openraft::ServerState::Leader, m.current_term)
        };
        if leading && self.0.read_ready_term.load(Ordering::Acquire) != term {
            self.0
                .raft
                .client_write(crate::raft::Batch(Vec::new()))
                .await?;
            self.0.read_ready_term.store(term, Ordering::Release);
        }
        self.0
            .raft
            .ensure_linearizable(openraft::ReadPolicy::ReadIndex)
            .await?;
        Ok(())
    }

    /// Confirms leadership with a quorum in a round that starts after this
    /// call; concurrent callers share rounds. Also makes sure the lease
    /// keeper counts for the current term.
    pub async fn confirm_leadership(&self) -> Result<(), Error> {
        self.check_running()?;
        self.0.leader_check.confirm(&self.0.raft).await?;
        let term = self.0.raft.metrics().borrow_watched().current_term;
        let leases = &self.0.shared.leases;
        self.0
            .shared
            .read(|applied| leases.activate_for_term(term, &applied.table));
        Ok(())
    }
}

/// Leadership confirmations in shared rounds: a caller joins the next round
/// that starts after it arrives, never one already under way (that round
/// could have collected its acknowledgements before the caller's request
/// existed).
#[derive(Default)]
struct LeaderCheck {
    state: Arc<Mutex<CheckState>>,
}

#[derive(Default)]
struct CheckState {
    running: bool,
    pending: Vec<oneshot::Sender<Result<(), Error>>>,
}

impl LeaderCheck {
    async fn confirm(&self, raft: &Raft) -> Result<(), Error> {
        let (tx, rx) = oneshot::channel();
        let start = {
            let mut s = self.state.lock().expect("leader check lock poisoned");
            s.pending.push(tx);
            !std::mem::replace(&mut s.running, true)
        };
        if start {
            let state = self.state.clone();
            let raft = raft.clone();
            tokio::spawn(async move {
                loop {
                    let batch = {
                        let mut s = state.lock().expect("leader check lock poisoned");
                        if s.pending.is_empty() {
                            s.running = false;
                            return;
                        }
                        std::mem::take(&mut s.pending)
                    };
                    let result = raft
                        .ensure_linearizable(openraft::ReadPolicy::ReadIndex)
                        .await
                        .map(|_| ())
                        .map_err(Error::from);
                    for tx in batch {
                        let _ = tx.send(result.clone());
                    }
                }
            });
        }
        rx.await
            .map_err(|_| Error::Unavailable("node shutting down".into()))?
    }
}
