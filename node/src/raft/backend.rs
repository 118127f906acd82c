//! Which log store a node runs on: sled on disk (every real node), or the
//! in-memory store over a simulated disk (the deterministic simulator).
//! [`Log`] hands openraft either through one type.

use std::fmt::Debug;
use std::io;
use std::ops::RangeBounds;
use std::sync::atomic::AtomicU64;
use std::sync::Arc;

use openraft::storage::{IOFlushed, RaftLogStorage};
use openraft::{LogState, OptionalSend, RaftLogReader};

use super::log_store::{LogStore, StoreClosed};
use super::mem_log::{MemDisk, MemLogStore};
use super::{Entry, LogId, NodeId, TypeConfig, Vote};
use crate::metrics::Metrics;

/// Where a node keeps its log (`NodeOptions::storage`).
#[derive(Clone, Debug, Default)]
pub enum Storage {
    /// sled in the data directory, made durable with real syncs.
    #[default]
    Sled,
    /// The in-memory store over this simulated disk (for simulators: it
    /// survives the node's process, and loses what a crash takes). The
    /// snapshot file is kept on the same disk
    /// ([`SnapshotLocation::Simulated`](crate::apply::snapshot_location::SnapshotLocation::Simulated)).
    Memory(MemDisk),
}

/// A node's log store, either kind. Cheap to clone.
#[derive(Clone)]
pub enum Log {
    /// sled on disk.
    Sled(LogStore),
    /// Memory over a simulated disk.
    Memory(MemLogStore),
}

impl From<LogStore> for Log {
    fn from(store: LogStore) -> Self {
        Log::Sled(store)
    }
}

impl From<MemLogStore> for Log {
    fn from(store: MemLogStore) -> Self {
        Log::Memory(store)
    }
}

impl Log {
    /// Tells when every handle of the store is gone.
    pub fn closed(&self) -> StoreClosed {
        match self {
            Log::Sled(s) => s.closed(),
            Log::Memory(s) => StoreClosed::of(s.alive()),
        }
    }

    /// A shared view of the commit index the store has saved.
    pub fn committed_marker(&self) -> Arc<AtomicU64> {
        match self {
            Log::Sled(s) => s.committed_marker(),
            Log::Memory(s) => s.committed_marker(),
        }
    }

    /// A shared view of the first index the store has not purged (0:
    /// nothing purged).
    pub fn purged_marker(&self) -> Arc<AtomicU64> {
        match self {
            Log::Sled(s) => s.purged_marker(),
            Log::Memory(s) => s.purged_marker(),
        }
    }

    /// Binds the store to node `id` (see [`LogStore::check_node_id`]).
    pub async fn check_node_id(&self, id: NodeId) -> anyhow::Result<()> {
        match self {
            Log::Sled(s) => s.check_node_id(id).await,
            Log::Memory(s) => s.check_node_id(id).await,
        }
    }

    /// The cluster this node belongs to, if known.
    pub fn cluster_id(&self) -> io::Result<Option<u64>> {
        match self {
            Log::Sled(s) => s.cluster_id(),
            Log::Memory(s) => s.cluster_id(),
        }
    }

    /// Records (durably) that this node belongs to cluster `id`.
    pub async fn set_cluster_id(&self, id: u64) -> io::Result<()> {
        match self {
            Log::Sled(s) => s.set_cluster_id(id).await,
            Log::Memory(s) => s.set_cluster_id(id).await,
        }
    }

    /// Where the store keeps its first failed sync's error (once one has
    /// failed, the process must stop, whichever write the sync was for),
    /// as a handle that does not keep the store open.
    pub fn sync_failure(&self) -> SyncFailure {
        match self {
            Log::Sled(s) => SyncFailure::Sled(s.sync_failure()),
            Log::Memory(s) => SyncFailure::Memory(s.disk()),
        }
    }

    /// True if this node has never voted or logged.
    pub fn is_fresh(&self) -> bool {
        match self {
            Log::Sled(s) => s.is_fresh(),
            Log::Memory(s) => s.is_fresh(),
        }
    }

    /// Never purges what the snapshot does not cover (see
    /// [`LogStore::with_snapshot_floor`]).
    pub fn with_snapshot_floor(self, floor: Arc<AtomicU64>) -> Self {
        match self {
            Log::Sled(s) => Log::Sled(s.with_snapshot_floor(floor)),
            Log::Memory(s) => Log::Memory(s.with_snapshot_floor(floor)),
        }
    }

    /// Times appends into `metrics` (the sled store; the simulated one
    /// keeps no timings).
    pub fn with_metrics(self, metrics: Arc<Metrics>) -> Self {
        match self {
            Log::Sled(s) => Log::Sled(s.with_metrics(metrics)),
            memory => memory,
        }
    }
}

impl RaftLogReader<TypeConfig> for Log {
    async fn try_get_log_entries<RB: RangeBounds<u64> + Clone + Debug + OptionalSend>(
        &mut self,
        range: RB,
    ) -> Result<Vec<Entry>, io::Error> {
        match self {
            Log::Sled(s) => s.try_get_log_entries(range).await,
            Log::Memory(s) => s.try_get_log_entries(range).await,
        }
    }

    async fn read_vote(&mut self) -> Result<Option<Vote>, io::Error> {
        match self {
            Log::Sled(s) => s.read_vote().await,
            Log::Memory(s) => s.read_vote().await,
        }
    }

    /// What a replication stream sends from `start` (the only reader
    /// openraft calls this for): the entries from `start` on, up to the
    /// first missing index, and nothing if `start` itself is gone.
    ///
    /// openraft 0.10.0-alpha.37 can restart a follower's stream from a
    /// `LogsSince` payload that its leader has already replaced by a
    /// snapshot (the core switches a follower to a snapshot without telling
    /// its replication task), while the log is purged past where that
    /// stream starts (the simulator's seed 713724 on 4d345ff). The entries
    /// after the purged head would make a request whose first entry does
    /// not follow `prev_log_id`: a debug assertion in openraft, and in a
    /// release build a request the follower refuses
    /// (`peer_input::check_append`), which restarts the snapshot. Given
    /// nothing, openraft sends an entry-less request instead, which the
    /// network ends the stale stream on ([`network`](super::network),
    /// `ends_stale_stream`), so the task takes up the leader's current
    /// payload.
    async fn limited_get_log_entries(&mut self, start: u64, end: u64) -> io::Result<Vec<Entry>> {
        let entries = self.try_get_log_entries(start..end).await?;
        Ok(from_start(start, entries))
    }
}

/// The entries of `entries` from index `start` on, up to the first
/// missing index: nothing if `start` is missing (see
/// [`Log::limited_get_log_entries`]).
fn from_start(start: u64, mut entries: Vec<Entry>) -> Vec<Entry> {
    let keep = entries
        .iter()
        .zip(start..)
        .take_while(|(e, index)| e.log_id.index == *index)
        .count();
    if keep < entries.len() {
        tracing::debug!(
            start,
            read = entries.len(),
            kept = keep,
            "a replication read found an index missing (purged while a stale stream still \
             wanted it)"
        );
        entries.truncate(keep);
    }
    entries
}

impl RaftLogStorage<TypeConfig> for Log {
    type LogReader = Log;

    async fn get_log_state(&mut self) -> Result<LogState<TypeConfig>, io::Error> {
        match self {
            Log::Sled(s) => s.get_log_state().await,
            Log::Memory(s) => s.get_log_state().await,
        }
    }

    async fn get_log_reader(&mut self) -> Self::LogReader {
        self.clone()
    }

    async fn save_vote(&mut self, vote: &Vote) -> Result<(), io::Error> {
        match self {
            Log::Sled(s) => s.save_vote(vote).await,
            Log::Memory(s) => s.save_vote(vote).await,
        }
    }

    async fn save_committed(&mut self, committed: Option<LogId>) -> Result<(), io::Error> {
        match self {
            Log::Sled(s) => s.save_committed(committed).await,
            Log::Memory(s) => s.save_committed(committed).await,
        }
    }

    async fn read_committed(&mut self) -> Result<Option<LogId>, io::Error> {
        match self {
            Log::Sled(s) => s.read_committed().await,
            Log::Memory(s) => s.read_committed().await,
        }
    }

    async fn append<I>(&mut self, entries: I, callback: IOFlushed<TypeConfig>) -> io::Result<()>
    where
        I: IntoIterator<Item = Entry> + OptionalSend,
        I::IntoIter: OptionalSend,
    {
        match self {
            Log::Sled(s) => s.append(entries, callback).await,
            Log::Memory(s) => s.append(entries, callback).await,
        }
    }

    async fn truncate_after(&mut self, last_log_id: Option<LogId>) -> Result<(), io::Error> {
        match self {
            Log::Sled(s) => s.truncate_after(last_log_id).await,
            Log::Memory(s) => s.truncate_after(last_log_id).await,
        }
    }

    async fn purge(&mut self, log_id: LogId) -> Result<(), io::Error> {
        match self {
            Log::Sled(s) => s.purge(log_id).await,
            Log::Memory(s) => s.purge(log_id).await,
        }
    }
}

/// Where a log store keeps its first failed sync's error, apart from the
/// store (see [`Log::sync_failure`]).
#[derive(Clone)]
pub enum SyncFailure {
    /// The sled store's copy.
    Sled(Arc<std::sync::OnceLock<String>>),
    /// The simulated disk's state.
    Memory(crate::raft::mem_log::MemDisk),
}

impl SyncFailure {
    /// The first failed sync's error, if one has failed.
    pub fn get(&self) -> Option<String> {
        match self {
            SyncFailure::Sled(first) => first.get().cloned(),
            SyncFailure::Memory(disk) => disk.failed_sync(),
        }
    }
}

#[cfg(test)]
mod tests {
    use openraft::type_config::TypeConfigExt as _;

    use super::*;
    use crate::apply::snapshot_location::SnapshotLocation;
    use crate::apply::state_machine::StateMachineStore;
    use crate::raft::{log_id, EntryPayload};

    struct SuiteBuilder;

    impl openraft::testing::log::StoreBuilder<TypeConfig, Log, StateMachineStore, ()> for SuiteBuilder {
        async fn build(
            &self,
        ) -> Result<((), Log, StateMachineStore), openraft::StorageError<TypeConfig>> {
            let disk = MemDisk::new();
            let log = Log::from(MemLogStore::open(disk.clone()).expect("open"));
            let sm = StateMachineStore::open(
                crate::apply::Shared::new_for_tests(),
                SnapshotLocation::Simulated(disk),
            )
            .expect("state machine");
            Ok(((), log, sm))
        }
    }

    /// openraft's storage conformance suite on the type openraft is given
    /// (it runs on each store too): [`Log`] keeps the reader's contract.
    #[tokio::test]
    async fn openraft_storage_suite_on_log() {
        openraft::testing::log::Suite::test_all(SuiteBuilder)
            .await
            .expect("suite passes");
    }

    fn indexes(entries: &[Entry]) -> Vec<u64> {
        entries.iter().map(|e| e.log_id.index).collect()
    }

    /// A replication read never sends entries that do not follow its
    /// start: with the log purged past a stale stream's start (openraft
    /// 0.10.0-alpha.37, the simulator's seed 713724 on 4d345ff) it gives
    /// nothing, where the range read gives what is left, as openraft's
    /// contract for it says.
    #[tokio::test]
    async fn a_replication_read_gives_nothing_from_a_purged_start() {
        let mut log = Log::from(MemLogStore::open(MemDisk::new()).expect("open"));
        let (tx, rx) = TypeConfig::oneshot();
        let entries = (1..=5).map(|index| Entry {
            log_id: log_id(1, 1, index),
            payload: EntryPayload::Blank,
        });
        log.append(entries, IOFlushed::<TypeConfig>::signal(tx))
            .await
            .expect("append");
        rx.await.expect("callback").expect("synced");
        log.purge(log_id(1, 1, 2)).await.expect("purge");
        assert_eq!(
            log.purged_marker()
                .load(std::sync::atomic::Ordering::SeqCst),
            3
        );

        let read = log.limited_get_log_entries(3, 6).await.expect("read");
        assert_eq!(indexes(&read), vec![3, 4, 5]);
        let read = log.limited_get_log_entries(2, 6).await.expect("read");
        assert_eq!(indexes(&read), Vec::<u64>::new(), "the head is purged");
        let read = log.try_get_log_entries(2..6).await.expect("read");
        assert_eq!(
            indexes(&read),
            vec![3, 4, 5],
            "a range read keeps openraft's contract"
        );
    }

    /// The replication read stops at a missing index (a purge that a
    /// range scan overtook).
    #[test]
    fn from_start_stops_at_the_first_missing_index() {
        let at = |index| Entry {
            log_id: log_id(1, 1, index),
            payload: EntryPayload::Blank,
        };
        assert_eq!(
            indexes(&from_start(4, vec![at(4), at(5), at(7)])),
            vec![4, 5]
        );
        assert_eq!(
            indexes(&from_start(4, vec![at(5), at(6)])),
            Vec::<u64>::new()
        );
        assert_eq!(indexes(&from_start(4, vec![])), Vec::<u64>::new());
    }
}
