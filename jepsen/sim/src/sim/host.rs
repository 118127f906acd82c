//! A node's simulated host: its process (the real node over its simulated
//! disk, restarted at each bounce), and the driver's and clients' gRPC
//! channels to it.

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::rc::Rc;
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt as _;
use raftlock_node::node::{Listeners, Node, NodeOptions, RaftTiming};
use raftlock_node::raft::log_store::{MemDisk, Storage};
use raftlock_node::raft::{NodeAddrs, WatchReceiver as _};
use raftlock_node::transport::{Conn, Listener};

use super::{
    addr, data_root, host, node_connector, nodes, note, Shared, LOGS_TO_KEEP, PORT, SNAPSHOT_EVERY,
};
use crate::oracle;

/// Registers node `id`'s host over `disk`: its process starts now, and again
/// at each bounce.
pub(super) fn start_host(sim: &mut turmoil::Sim<'_>, id: u64, disk: MemDisk, record: &Shared) {
    let incarnation = Rc::new(RefCell::new(0u64));
    let record = record.clone();
    sim.host(host(id), move || {
        let inc = {
            let mut i = incarnation.borrow_mut();
            *i += 1;
            *i
        };
        run_node(id, disk.clone(), record.clone(), inc)
    });
}

/// Starts node `id` on the current simulated host over `disk`, registers
/// it, and runs until its core fails.
async fn run_node(id: u64, disk: MemDisk, record: Shared, incarnation: u64) -> turmoil::Result {
    let listener = turmoil::net::TcpListener::bind(("0.0.0.0", PORT)).await?;
    let conns = futures::stream::unfold(listener, |l| async move {
        let next = l.accept().await.map(|(s, _)| Conn::new(s));
        Some((next, l))
    })
    .boxed();
    // The first nodes bootstrap from each other; one the operator adds
    // later knows only itself until it is added.
    let peers = if id <= nodes() {
        (1..=nodes())
            .map(|n| (n, NodeAddrs::shared(addr(n))))
            .collect()
    } else {
        BTreeMap::from([(id, NodeAddrs::shared(addr(id)))])
    };
    let opts = NodeOptions {
        id,
        advertise: addr(id),
        peer_advertise: None,
        data_dir: data_root().join(format!("n{id}")),
        peers,
        init: id == 1,
        timing: RaftTiming {
            heartbeat: Duration::from_millis(100),
            election_timeout: (Duration::from_millis(300), Duration::from_millis(500)),
            // Snapshots often, and a short log behind them: a node back
            // from a long downtime is sent a snapshot, and a crash may find
            // one half written.
            snapshot_every: SNAPSHOT_EVERY,
            logs_to_keep: LOGS_TO_KEEP,
        },
        dial: BTreeMap::new(),
        tls: None,
        auth: Arc::new(raftlock_node::auth::Auth::new(None)),
        storage_faults: Default::default(),
        prefix_labels: Default::default(),
        connector: Some(node_connector()),
        storage: Storage::Memory(disk),
        join: Vec::new(),
    };
    let node = match Node::start_with(opts, Listeners::client(Listener::Custom(conns))).await {
        Ok(node) => Rc::new(node),
        Err(e) => {
            let e = e.to_string();
            note(&record, format!("node {id} failed to start: {e}"));
            let mut r = record.borrow_mut();
            if r.damaged.contains_key(&id) && e.contains("snapshot file") {
                // The refusal a damaged snapshot file must meet: the
                // operator replaces the node.
                r.refused.push(id);
            } else if e.contains("lost data it had made durable") {
                // A log that lost what it had made durable: right only
                // on a disk the driver damaged; the operator replaces it.
                let ever = r.log_damaged_ever.contains(&id);
                if let Err(v) = oracle::log_refused_only_if_damaged(id, ever, &e) {
                    r.violation.get_or_insert(v);
                }
                r.refused.push(id);
            } else {
                // As a process that exits at start: the supervisor
                // restarts it.
                r.exited.push(id);
            }
            return Ok(());
        }
    };
    let damaged = record.borrow().damaged.get(&id).cloned();
    if let Err(v) = oracle::no_start_from_damaged(id, incarnation, damaged.as_deref()) {
        record.borrow_mut().violation.get_or_insert(v);
    }
    let lost = record.borrow().lost_log.get(&id).cloned();
    if let Err(v) = oracle::no_start_from_lost_log(id, incarnation, lost.as_deref()) {
        record.borrow_mut().violation.get_or_insert(v);
    }
    note(
        &record,
        format!("node {id} started (incarnation {incarnation})"),
    );
    record
        .borrow_mut()
        .nodes
        .insert(id, (node.clone(), incarnation));
    tokio::select! {
        why = node.failed() => {
            // Fail-stop: the process exits; the simulated supervisor (the
            // driver) restarts it, as systemd's `Restart=always` would.
            note(&record, format!("node {id} failed: {why}"));
            let mut r = record.borrow_mut();
            r.nodes.remove(&id);
            r.exited.push(id);
        }
        why = node.removed() => {
            // Exits 0, as `raftlockd run` does: not restarted.
            note(&record, format!("node {id} exits: {why}"));
            let mut r = record.borrow_mut();
            r.nodes.remove(&id);
            r.retired.insert(id);
        }
    }
    Ok(())
}

/// Whether node `id` leads and has applied a membership without node `old`
/// (applied, so committed), as the driver sees it.
pub(super) fn applied_without(record: &Shared, id: u64, old: u64) -> bool {
    let Some(node) = record.borrow().nodes.get(&id).map(|(n, _)| n.clone()) else {
        return false;
    };
    let m = node.raft.metrics().borrow_watched().clone();
    let config = &m.membership_config;
    let applied = m.last_applied.map_or(0, |l| l.index);
    m.state == openraft::ServerState::Leader
        && config.get_node(&old).is_none()
        && config.log_id().as_ref().map_or(0, |l| l.index) <= applied
}

/// Channels to the members, made as they join.
#[derive(Default)]
pub(super) struct Channels(pub(super) BTreeMap<u64, tonic::transport::Channel>);

impl Channels {
    /// A channel to each member now.
    pub(super) fn of_members(&mut self, record: &Shared) -> Vec<(u64, tonic::transport::Channel)> {
        let members = record.borrow().members.clone();
        members
            .into_iter()
            .map(|id| (id, self.0.entry(id).or_insert_with(|| channel(id)).clone()))
            .collect()
    }
}

/// A gRPC channel to node `id` over the simulated network.
pub(super) fn channel(id: u64) -> tonic::transport::Channel {
    let endpoint = tonic::transport::Endpoint::from_shared(format!("http://{}", addr(id)))
        .expect("host:port is a valid URI")
        .connect_timeout(Duration::from_millis(200));
    node_connector().channel(&endpoint)
}
