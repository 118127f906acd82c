//! The internal `Raft` service: openraft's RPCs as bincode payloads.

use raftlock_proto::v1 as pb;
use raftlock_proto::v1::raft_server::Raft as RaftRpc;
use serde::de::DeserializeOwned;
use serde::Serialize;
use tonic::{Request, Response, Status};

use std::sync::Arc;

use crate::auth::Auth;
use crate::raft::identity::ClusterIdentity;
use crate::raft::Raft;

/// Serves the node-to-node RPCs of one node.
#[derive(Clone)]
pub struct RaftService {
    raft: Raft,
    auth: Arc<Auth>,
    cluster: Arc<ClusterIdentity>,
}

impl RaftService {
    /// The service over `raft`; with access control on, only peers (see
    /// [`Auth::check_peer`]) may call it, and only from this node's cluster
    /// (see [`ClusterIdentity`]).
    pub fn new(raft: Raft, auth: Arc<Auth>, cluster: Arc<ClusterIdentity>) -> Self {
        RaftService {
            raft,
            auth,
            cluster,
        }
    }

    async fn admit<T>(&self, req: &Request<T>) -> Result<(), Status> {
        self.auth.check_peer(req)?;
        self.cluster.check(req.metadata()).await
    }
}

fn decode<T: DeserializeOwned>(msg: &pb::RaftMessage) -> Result<T, Status> {
    bincode::deserialize(&msg.data)
        .map_err(|e| Status::invalid_argument(format!("malformed raft message: {e}")))
}

/// Packs openraft's answer: the value in `data`, or its error in `error`.
fn reply<T: Serialize, E: Serialize>(
    result: Result<T, E>,
) -> Result<Response<pb::RaftMessage>, Status> {
    let msg = match result {
        Ok(v) => pb::RaftMessage {
            data: bincode::serialize(&v).map_err(internal)?,
            error: Vec::new(),
        },
        Err(e) => pb::RaftMessage {
            data: Vec::new(),
            error: bincode::serialize(&e).map_err(internal)?,
        },
    };
    Ok(Response::new(msg))
}

fn internal(e: bincode::Error) -> Status {
    Status::internal(format!("cannot encode raft reply: {e}"))
}

#[tonic::async_trait]
impl RaftRpc for RaftService {
    async fn append_entries(
        &self,
        req: Request<pb::RaftMessage>,
    ) -> Result<Response<pb::RaftMessage>, Status> {
        self.admit(&req).await?;
        let rpc = decode(req.get_ref())?;
        reply(self.raft.append_entries(rpc).await)
    }

    async fn vote(
        &self,
        req: Request<pb::RaftMessage>,
    ) -> Result<Response<pb::RaftMessage>, Status> {
        self.admit(&req).await?;
        let rpc = decode(req.get_ref())?;
        reply(self.raft.vote(rpc).await)
    }

    async fn install_snapshot(
        &self,
        req: Request<pb::RaftMessage>,
    ) -> Result<Response<pb::RaftMessage>, Status> {
        self.admit(&req).await?;
        let rpc = decode(req.get_ref())?;
        reply(self.raft.install_snapshot(rpc).await)
    }
}
