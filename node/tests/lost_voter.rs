//! A voter that lost its data directory does not take part again under
//! its old id (issue 45, item 4).
//!
//! On 0857c51 a node whose data directory was emptied and which was
//! started again with its old id rejoined at once, logging only an INFO
//! "joined cluster": a node that had forgotten the votes it granted and
//! the entries it acknowledged counted in elections and quorums again.
//! The guide forbids it, but nothing stopped it (a Kubernetes pod whose
//! volume is lost does exactly this). Now the empty node refuses every
//! RPC that counts it as a voter of a membership after the bootstrap one,
//! says how to bring it back, and joins once it is removed and added
//! again, as a learner first.

mod procs;

use std::time::Duration;

use procs::{channel, eventually, lock_cycle, status, Procs};
use raftlock_proto::v1 as pb;
use raftlock_proto::v1::cluster_client::ClusterClient;

/// Generous: every step here takes well under a second on an idle machine.
const WITHIN: Duration = Duration::from_secs(60);

async fn add(procs: &Procs, id: u64) {
    let request = pb::AddNodeRequest {
        id,
        addr: procs.addr(id),
        catch_up_timeout_ms: 30_000,
        ..Default::default()
    };
    let leader = procs.leader_among(&[1]).await;
    let mut c = ClusterClient::new(channel(&procs.addr(leader)));
    c.add_node(request)
        .await
        .unwrap_or_else(|e| panic!("add node {id}: {e}"));
}

/// Node 3's view of the membership: (id, voter) pairs.
async fn members_seen_by(procs: &Procs, id: u64) -> Vec<(u64, bool)> {
    status(&procs.addr(id))
        .await
        .map(|s| s.members.iter().map(|m| (m.id, m.voter)).collect())
        .unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_voter_that_lost_its_data_stays_out_until_removed_and_added_again() {
    // A cluster grown as the Kubernetes manifests grow it: node 1
    // bootstraps alone, nodes 2 and 3 are added (learner, then voter).
    let mut procs = Procs::start(1, &[]);
    procs.leader().await;
    for id in [2, 3] {
        procs.add(id);
        add(&procs, id).await;
    }
    let leader = procs.leader().await;
    assert_eq!(leader, 1);
    assert!(lock_cycle(&procs.addr(1), "before", 1).await.is_some());

    // Node 3 loses its data directory and is started again as node 3.
    procs.kill(3).await;
    std::fs::remove_dir_all(procs.data_dir(3)).expect("wipe node 3");
    // Its log file is appended to: only what this start writes counts.
    let before = procs.read_log(3).len();
    procs.spawn(3, false);
    let since_restart = || procs.read_log(3)[before..].to_string();
    let refusal = "raftlock members remove 3";
    eventually("node 3 refuses to take part", WITHIN, || {
        let log = since_restart();
        async move { log.contains(refusal).then_some(()) }
    })
    .await;
    // It adopted nothing: no membership, no cluster.
    let seen = members_seen_by(&procs, 3).await;
    assert!(seen.is_empty(), "node 3 took up the cluster: {seen:?}");
    assert!(
        !since_restart().contains("joined cluster"),
        "{}",
        since_restart()
    );
    // The cluster goes on meanwhile (nodes 1 and 2 are a quorum).
    assert!(lock_cycle(&procs.addr(1), "meanwhile", 2).await.is_some());

    // Removed, then added again: it joins as a new member and catches up.
    let mut c = ClusterClient::new(channel(&procs.addr(1)));
    c.remove_node(pb::RemoveNodeRequest { id: 3 })
        .await
        .expect("remove node 3");
    add(&procs, 3).await;
    let committed = status(&procs.addr(1)).await.expect("node 1").commit_index;
    eventually("node 3 is a voter again and caught up", WITHIN, || {
        let addr = procs.addr(3);
        async move {
            let s = status(&addr).await?;
            let voter = s.members.iter().any(|m| m.id == 3 && m.voter);
            (voter && s.applied_index >= committed).then_some(())
        }
    })
    .await;
    assert!(since_restart().contains("joined cluster"));
}

/// A cluster bootstrapped with all its voters (`--init` with three
/// `--peers`, as the systemd and local guides do) forms as before: its
/// empty voters are voters of the bootstrap membership (log index 0).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn voters_of_the_bootstrap_membership_join_while_empty() {
    let procs = Procs::start(3, &[]);
    let leader = procs.leader().await;
    assert!(lock_cycle(&procs.addr(leader), "formed", 1).await.is_some());
    for id in 1..=3 {
        assert!(
            !procs.read_log(id).contains("members remove"),
            "node {id}: {}",
            procs.read_log(id)
        );
    }
}

/// The voters of node `id`'s membership.
async fn voters_seen_by(procs: &Procs, id: u64) -> Vec<u64> {
    members_seen_by(procs, id)
        .await
        .into_iter()
        .filter_map(|(id, voter)| voter.then_some(id))
        .collect()
}

/// `raftlockd run --join`: nodes add themselves (learner, then voter); a
/// node that lost its data stays out while the cluster counts it a voter
/// and adds itself again once removed; a node removed while it kept its
/// data is not added again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nodes_started_with_join_add_themselves_and_a_wiped_one_only_once_removed() {
    let mut procs = Procs::start(1, &[]);
    procs.leader().await;
    let first = procs.addr(1);
    let join = ["--join", first.as_str()];
    procs.add_with(2, &join);
    procs.add_with(3, &join);
    eventually("nodes 2 and 3 add themselves", WITHIN, || async {
        (voters_seen_by(&procs, 1).await == [1, 2, 3]).then_some(())
    })
    .await;
    for id in [2, 3] {
        eventually("each sees itself a voter, and stops asking", WITHIN, || {
            let log = procs.read_log(id);
            async move { log.contains("--join is done").then_some(()) }
        })
        .await;
        // It asked (the answer to its AddNode can be lost while the
        // change still commits: it is a voter either way).
        assert!(procs.read_log(id).contains("--join: asking to be added"));
    }

    // Node 3 loses its data and starts again with --join: it stays out.
    procs.kill(3).await;
    std::fs::remove_dir_all(procs.data_dir(3)).expect("wipe node 3");
    let before = procs.read_log(3).len();
    procs.spawn_with(3, false, &join);
    eventually("node 3 refuses to take part", WITHIN, || {
        let log = procs.read_log(3)[before..].to_string();
        async move { log.contains("raftlock members remove 3").then_some(()) }
    })
    .await;
    assert!(members_seen_by(&procs, 3).await.is_empty());
    assert_eq!(voters_seen_by(&procs, 1).await, [1, 2, 3]);

    // Removed: it adds itself again, as a new member.
    let mut c = ClusterClient::new(channel(&procs.addr(1)));
    c.remove_node(pb::RemoveNodeRequest { id: 3 })
        .await
        .expect("remove node 3");
    eventually("node 3 adds itself again", WITHIN, || async {
        (voters_seen_by(&procs, 3).await == [1, 2, 3]).then_some(())
    })
    .await;

    // Node 2 removed (it exits), and started again with its data and
    // --join: it is not added again.
    // (Once the promotion of node 3 has committed: one change at a time.)
    eventually("node 2 is removed", WITHIN, || {
        let mut c = c.clone();
        async move {
            match c.remove_node(pb::RemoveNodeRequest { id: 2 }).await {
                Ok(_) => Some(()),
                // An earlier try was applied though its answer was lost.
                Err(e) if e.code() == tonic::Code::NotFound => Some(()),
                Err(_) => None,
            }
        }
    })
    .await;
    let exited = procs.exited(2, WITHIN).await;
    assert!(exited.is_some_and(|s| s.success()), "{exited:?}");
    let before = procs.read_log(2).len();
    procs.spawn_with(2, false, &join);
    let exited = procs.exited(2, WITHIN).await;
    let log = procs.read_log(2)[before..].to_string();
    assert!(exited.is_some_and(|s| s.success()), "{exited:?}: {log}");
    // Its joiner says so, unless the node learns first, from its peers,
    // that it was removed, and exits.
    assert!(
        log.contains("is not added again") || log.contains("was removed from the cluster"),
        "{log}"
    );
    assert!(!log.contains("added to the cluster"), "{log}");
    // (A removal answered NotFound above may still be finishing its
    // joint configuration.)
    eventually("node 2 is no member", WITHIN, || async {
        let members = members_seen_by(&procs, 1).await;
        (members == [(1, true), (3, true)]).then_some(())
    })
    .await;
}

/// A voter of the bootstrap membership that has not heard from the
/// cluster yet is empty without having lost anything: it takes part once
/// it comes, whatever membership changes it missed (the simulator's seed
/// 3403419). On 0263ac2 the removal of node 2 while node 3 was still
/// down put a joint membership that needs node 3 into the log; node 3,
/// started then, refused every RPC as a voter that lost its data, and no
/// leader could be elected again: the cluster stopped.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bootstrap_voter_not_yet_started_joins_after_a_membership_change() {
    // Bootstrapped with voters 1, 2 and 3 (`--init` with three
    // `--peers`); node 3 does not start.
    let mut procs = Procs::start_some(3, &[], &[1, 2]);
    let leader = procs.leader().await;
    assert!(lock_cycle(&procs.addr(leader), "two of three", 1)
        .await
        .is_some());

    // The removal of node 2 needs node 3: its joint membership
    // [{1,2,3},{1,3}] commits only with node 3's answer.
    let addr = procs.addr(leader);
    let removal = tokio::spawn(async move {
        let mut c = ClusterClient::new(channel(&addr));
        c.remove_node(pb::RemoveNodeRequest { id: 2 }).await
    });
    // It is in the leader's log, and cannot commit.
    eventually("the joint membership waits for node 3", WITHIN, || {
        let addr = procs.addr(leader);
        async move {
            let s = status(&addr).await?;
            (s.last_log_index > s.commit_index).then_some(())
        }
    })
    .await;

    // Node 3 comes: it joins, the removal completes, the cluster works.
    procs.spawn(3, false);
    eventually("node 3 joins", WITHIN, || {
        let log = procs.read_log(3);
        async move { log.contains("joined cluster").then_some(()) }
    })
    .await;
    // (The removal's answer may be lost while the change still commits.)
    eventually("node 2 is removed", WITHIN, || async {
        (members_seen_by(&procs, 1).await == [(1, true), (3, true)]).then_some(())
    })
    .await;
    removal.abort();
    assert!(
        !procs.read_log(3).contains("members remove 3"),
        "node 3 refused as a lost voter: {}",
        procs.read_log(3)
    );
    let leader = procs.leader_among(&[1, 3]).await;
    assert!(lock_cycle(&procs.addr(leader), "one and three", 2)
        .await
        .is_some());
}

/// A voter of the bootstrap membership that has held data and lost it
/// stays out too, with no membership change since the bootstrap: the
/// cluster heard it answer. (Until 0263ac2 the guard could not tell such
/// a voter from a new one.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bootstrap_voter_that_lost_its_data_stays_out() {
    let mut procs = Procs::start(3, &[]);
    let leader = procs.leader().await;
    assert!(lock_cycle(&procs.addr(leader), "formed", 1).await.is_some());
    let wiped = if leader == 3 { 2 } else { 3 };
    procs.kill(wiped).await;
    std::fs::remove_dir_all(procs.data_dir(wiped)).expect("wipe");
    let before = procs.read_log(wiped).len();
    procs.spawn(wiped, false);
    let refusal = format!("raftlock members remove {wiped}");
    eventually("the wiped voter refuses to take part", WITHIN, || {
        let log = procs.read_log(wiped)[before..].to_string();
        let refused = log.contains(&refusal);
        async move { refused.then_some(()) }
    })
    .await;
    assert!(members_seen_by(&procs, wiped).await.is_empty());
    assert!(lock_cycle(&procs.addr(leader), "meanwhile", 2)
        .await
        .is_some());
}
