//! Readiness ("can this node serve now") and the gRPC health statuses set
//! from the view.

use std::time::Duration;

use super::{Role, View, READY_MAX_APPLY_LAG};
use crate::raft::NodeId;

/// A follower's last word from its leader.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Contact {
    /// How long ago it came.
    pub silent: Duration,
    /// It said the leader has heard from no quorum for over its quorum
    /// timeout: the leader cannot commit, and neither side of the
    /// partition it is on has this node's leader working.
    pub quorum_lost: bool,
}

/// Whether node `me`, whose view is `view`, can serve now: `Ok`, or why
/// not. `contact` is its last word from its leader (`None`: none since it
/// started); a follower silent for over `max_silence`, or whose leader
/// said it has lost its quorum, is not ready; nor is a node that has
/// applied `applied` of `committed` entries with more than
/// [`READY_MAX_APPLY_LAG`] to go.
pub fn readiness(
    view: &View,
    me: NodeId,
    contact: Option<Contact>,
    max_silence: Duration,
    applied: u64,
    committed: u64,
) -> Result<(), String> {
    if !view.alive() {
        return Err(match &view.fatal {
            Some(cause) => format!("this node has stopped: {cause}"),
            None => "the Raft core has stopped".into(),
        });
    }
    let Some(leader) = view.leader else {
        return Err(format!(
            "no leader known ({}, term {})",
            view.status_role(),
            view.term
        ));
    };
    if leader == me {
        if view.role != Role::Leader {
            return Err(format!("not leader yet (term {})", view.term));
        }
        if view.quorum_lost {
            return Err(format!(
                "leader of term {} without word from a quorum for over the election timeout",
                view.term
            ));
        }
    } else {
        match contact {
            None => {
                return Err(format!(
                    "no word from leader {leader} since this node started"
                ))
            }
            Some(c) if c.silent > max_silence => {
                return Err(format!(
                    "no word from leader {leader} for {} ms",
                    c.silent.as_millis()
                ))
            }
            Some(c) if c.quorum_lost => {
                return Err(format!(
                    "leader {leader} says it has heard from no quorum for over its election \
                     timeout"
                ))
            }
            Some(_) => {}
        }
    }
    let lag = committed.saturating_sub(applied);
    if lag > READY_MAX_APPLY_LAG {
        return Err(format!(
            "applied index {applied} is {lag} entries behind the commit index {committed}"
        ));
    }
    Ok(())
}

/// The gRPC health service name that answers "does this process still
/// work" (its Raft core runs), whether or not a leader is known: for
/// liveness probes, which must not restart every node of a cluster that
/// has lost its quorum.
pub const LIVENESS_SERVICE: &str = "liveness";

/// Sets the services' health: `""`, `raftlock.v1.Locks` and
/// `raftlock.v1.Cluster` by `serving`, [`LIVENESS_SERVICE`] by `alive`.
pub(super) async fn set_health(
    health: &tonic_health::server::HealthReporter,
    (serving, alive): (bool, bool),
) {
    let status = |ok| {
        if ok {
            tonic_health::ServingStatus::Serving
        } else {
            tonic_health::ServingStatus::NotServing
        }
    };
    for service in ["", "raftlock.v1.Locks", "raftlock.v1.Cluster"] {
        health.set_service_status(service, status(serving)).await;
    }
    health
        .set_service_status(LIVENESS_SERVICE, status(alive))
        .await;
}
