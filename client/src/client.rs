//! The client's façade: sessions, reads and cluster administration, over
//! the transport (connections, leader discovery, retries: `transport.rs`).

use std::time::Duration;

use futures::StreamExt;
use raftlock_proto::v1 as pb;

use crate::error::{Error, Result};
use crate::keepalive;
use crate::session::{Session, SessionOptions};
use crate::transport::{after, Kind, Transport};
pub use crate::transport::{ClientOptions, ClientTls};
use crate::types::{
    members, Backup, Fence, LockInfo, Member, NodeStatus, Restored, Role, SessionId, WatchEvent,
    WatchStream,
};

/// A lock taken with [`Client::lock_once`]: a session of its own holds
/// it until [`unlock`](OneShot::unlock) or the end of its ttl (dropping it
/// does not release it early).
pub struct OneShot {
    client: Client,
    session: SessionId,
    fence: Fence,
}

impl OneShot {
    /// The grant's fencing token.
    pub fn fence(&self) -> Fence {
        self.fence
    }

    /// The session holding it.
    pub fn session_id(&self) -> SessionId {
        self.session
    }

    /// Releases the lock and closes its session, in one write; the number
    /// of grants released (0 if the session had expired meanwhile).
    pub async fn unlock(self) -> Result<u32> {
        let req = pb::UnlockRequest {
            session_id: self.session.get(),
        };
        match self
            .client
            .transport
            .locks_call(Kind::Write, |mut c| async move { c.unlock(req).await })
            .await
        {
            Ok(r) => Ok(r.into_inner().released),
            Err(Error::SessionNotFound(_)) => Ok(0),
            Err(e) => Err(e),
        }
    }
}

/// Metadata key in which a follower names the leader's address.
pub use raftlock_proto::LEADER_ADDR_KEY;

/// A handle to a raftlock cluster. Cheap to clone; clones share
/// connections, the leader guess and one keep-alive stream.
#[derive(Clone)]
pub struct Client {
    /// Connections, credentials, the leader guess and retries.
    pub(crate) transport: Transport,
    /// The keep-alive stream its sessions share.
    pub(crate) keep_alives: keepalive::Mux,
}

impl Client {
    /// Connects to a cluster given some of its nodes' addresses
    /// (`host:port`). Nothing is dialled until the first request.
    pub async fn connect<I, S>(endpoints: I) -> Result<Client>
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        Self::with_options(endpoints, ClientOptions::default())
    }

    /// Like [`connect`](Self::connect), with options.
    pub fn with_options<I, S>(endpoints: I, options: ClientOptions) -> Result<Client>
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        let transport = Transport::new(endpoints, options)?;
        Ok(Client {
            keep_alives: keepalive::Mux::new(transport.downgrade()),
            transport,
        })
    }

    /// The endpoints this client was given.
    pub fn endpoints(&self) -> &[String] {
        self.transport.endpoints()
    }

    /// The options in force.
    pub fn options(&self) -> &ClientOptions {
        self.transport.options()
    }

    /// Opens a session with `ttl` (and no lock-delay).
    pub async fn session(&self, ttl: Duration) -> Result<Session> {
        Session::open(
            self.clone(),
            SessionOptions {
                ttl,
                ..SessionOptions::default()
            },
        )
        .await
    }

    /// Takes `name` in one write (the `Lock` RPC): a session of its own
    /// with `ttl`, opened and holding the lock at once. Waits at most
    /// `timeout` (`None`: without a timeout; `Some(ZERO)`: try once);
    /// `Ok(None)` if not granted in time (nothing is left behind).
    ///
    /// The session is not kept alive: use this for work shorter than
    /// `ttl` (counted from the call), and end it with
    /// [`OneShot::unlock`], one more write. For longer work, or several
    /// locks, open a [`Session`].
    pub async fn lock_once(
        &self,
        name: &str,
        ttl: Duration,
        timeout: Option<Duration>,
    ) -> Result<Option<OneShot>> {
        let req = pb::LockRequest {
            name: name.to_string(),
            ttl_ms: u64::try_from(ttl.as_millis()).unwrap_or(u64::MAX),
            timeout_ms: timeout.map_or(0, |t| {
                u64::try_from(t.as_millis())
                    .unwrap_or(u64::MAX)
                    .min(u64::MAX - 1)
            }),
            wait: timeout.is_none(),
            // A retry with the same nonce finds this attempt's session.
            nonce: crate::random::next_u64() | 1,
            ..Default::default()
        };
        let opts = self.options();
        let (attempt, deadline) = match timeout {
            None => (crate::session::FOREVER_ATTEMPT, after(Duration::MAX)),
            Some(t) => (
                t.saturating_add(opts.request_timeout),
                after(opts.retry_deadline.saturating_add(t.saturating_mul(2))),
            ),
        };
        let resp = self
            .transport
            .call(Kind::Write, attempt, deadline, |c| {
                let req = req.clone();
                async move { crate::transport::locks_client(c).lock(req).await }
            })
            .await?
            .into_inner();
        Ok(resp.acquired.then(|| OneShot {
            client: self.clone(),
            session: SessionId::new(resp.session_id),
            fence: Fence::new(resp.fence),
        }))
    }

    /// Opens a session with options.
    pub async fn session_with(&self, options: SessionOptions) -> Result<Session> {
        Session::open(self.clone(), options).await
    }

    /// Asks the cluster whether `fence` belongs to a current holder of
    /// `name` (linearizable).
    pub async fn check_fence(&self, name: &str, fence: Fence) -> Result<bool> {
        let req = pb::CheckFenceRequest {
            name: name.to_string(),
            fence: fence.get(),
            stale: false,
        };
        let resp = self
            .transport
            .locks_call(Kind::Read, |mut c| {
                let req = req.clone();
                async move { c.check_fence(req).await }
            })
            .await?;
        Ok(resp.into_inner().current)
    }

    /// Describes `name` (linearizable); `None` if nobody holds, waits for or
    /// delays it.
    pub async fn describe(&self, name: &str) -> Result<Option<LockInfo>> {
        let req = pb::DescribeRequest {
            name: name.to_string(),
            stale: false,
        };
        let resp = self
            .transport
            .locks_call(Kind::Read, |mut c| {
                let req = req.clone();
                async move { c.describe(req).await }
            })
            .await?
            .into_inner();
        resp.info
            .filter(|_| resp.exists)
            .map(LockInfo::try_from)
            .transpose()
    }

    /// Lists names with `prefix`, following pages to the end.
    pub async fn list(&self, prefix: &str) -> Result<Vec<LockInfo>> {
        let mut out = Vec::new();
        let mut token = String::new();
        loop {
            let req = pb::ListRequest {
                prefix: prefix.to_string(),
                page_token: token.clone(),
                limit: 0,
                stale: false,
            };
            let page = self
                .transport
                .locks_call(Kind::Read, |mut c| {
                    let req = req.clone();
                    async move { c.list(req).await }
                })
                .await?
                .into_inner();
            for info in page.locks {
                out.push(LockInfo::try_from(info)?);
            }
            if page.next_page_token.is_empty() {
                return Ok(out);
            }
            token = page.next_page_token;
        }
    }

    /// Streams events for `name` (exact) or, if `prefix` is true, for every
    /// name starting with it. Served by whichever node answers; events carry
    /// the log index that caused them. The stream ends with an error when
    /// the node serving it stops (watch again to resume).
    pub async fn watch(&self, name: &str, prefix: bool) -> Result<WatchStream> {
        let req = if prefix {
            pb::WatchRequest {
                name: String::new(),
                prefix: name.to_string(),
            }
        } else {
            pb::WatchRequest {
                name: name.to_string(),
                prefix: String::new(),
            }
        };
        let resp = self
            .transport
            .locks_call(Kind::Read, |mut c| {
                let req = req.clone();
                async move { c.watch(req).await }
            })
            .await?;
        Ok(resp
            .into_inner()
            .map(|e| match e {
                Ok(e) => WatchEvent::try_from(e),
                Err(status) => Err(Error::from_status(&status, false)),
            })
            .boxed())
    }

    /// The status of the node at `addr` (not necessarily the leader).
    pub async fn node_status(&self, addr: &str) -> Result<NodeStatus> {
        let mut c = crate::transport::cluster_client(self.transport.channel(addr)?);
        let resp = tokio::time::timeout(
            self.options().request_timeout,
            c.status(pb::StatusRequest {}),
        )
        .await
        .map_err(|_| Error::Unavailable(format!("{addr} did not answer")))?
        .map_err(|s| Error::from_status(&s, false))?;
        Ok(resp.into_inner().into())
    }

    /// The status of the leader.
    pub async fn status(&self) -> Result<NodeStatus> {
        // Status answers on any node; ask until one that knows a leader
        // answers, then ask the leader itself.
        let any = self
            .transport
            .cluster_call(
                Kind::Read,
                self.options().request_timeout,
                |mut c| async move { c.status(pb::StatusRequest {}).await },
            )
            .await?
            .into_inner();
        if any.leader_addr == any.addr && !any.addr.is_empty() {
            return Ok(any.into());
        }
        if !any.leader_addr.is_empty() {
            let leader = any.leader_addr.clone();
            return self.node_status(&leader).await.or(Ok(any.into()));
        }
        // The node that answered knows no leader (an empty node not yet
        // added, one that lost its data, one cut off from its quorum):
        // another endpoint may know one.
        for addr in self.endpoints() {
            let Ok(other) = self.node_status(addr).await else {
                continue;
            };
            if other.role == Role::Leader {
                return Ok(other);
            }
            if let Some((_, leader)) = &other.leader {
                if let Ok(leader) = self.node_status(leader).await {
                    return Ok(leader);
                }
            }
        }
        Ok(any.into())
    }

    /// The current members, as the leader sees them (a follower, or a node
    /// that was removed, may know an older membership).
    pub async fn members(&self) -> Result<Vec<Member>> {
        let status = self.status().await?;
        if status.role != Role::Leader {
            return Err(Error::Unavailable(
                "no leader to ask for the membership".into(),
            ));
        }
        Ok(status.members)
    }

    /// Adds node `id` at `addr` (learner, catch-up, then voter unless
    /// `learner_only`). Waits until done.
    pub async fn add_node(&self, id: u64, addr: &str, learner_only: bool) -> Result<Vec<Member>> {
        self.add_node_with_peer_addr(id, addr, None, learner_only)
            .await
    }

    /// Like [`add_node`](Self::add_node), for a node that serves peers on a
    /// separate `peer_addr` (`raftlockd run --peer-listen`).
    pub async fn add_node_with_peer_addr(
        &self,
        id: u64,
        addr: &str,
        peer_addr: Option<&str>,
        learner_only: bool,
    ) -> Result<Vec<Member>> {
        self.add_node_with(id, addr, peer_addr, learner_only, None)
            .await
    }

    /// Like [`add_node_with_peer_addr`](Self::add_node_with_peer_addr),
    /// with the time the leader gives the new node to catch up before it
    /// promotes it (`None`: the node's default, 30 s). A node that has not
    /// caught up by then stays a learner, and the call fails with
    /// [`Error::FailedPrecondition`] saying how far it got.
    pub async fn add_node_with(
        &self,
        id: u64,
        addr: &str,
        peer_addr: Option<&str>,
        learner_only: bool,
        catch_up: Option<Duration>,
    ) -> Result<Vec<Member>> {
        let catch_up_ms = catch_up.map_or(0, |d| (d.as_millis() as u64).max(1));
        let req = pb::AddNodeRequest {
            id,
            addr: addr.to_string(),
            peer_addr: peer_addr.unwrap_or_default().to_string(),
            learner_only,
            catch_up_timeout_ms: catch_up_ms,
        };
        // The catch-up wait, then the promotion's commit.
        let timeout = catch_up.unwrap_or(Duration::from_secs(30)) + Duration::from_secs(30);
        let resp = self
            .transport
            .cluster_call(Kind::Write, timeout, |mut c| {
                let req = req.clone();
                async move { c.add_node(req).await }
            })
            .await?;
        Ok(members(resp.into_inner().members))
    }

    /// A consistent backup of the lock table, read on the leader.
    pub async fn backup(&self) -> Result<Backup> {
        let timeout = Duration::from_secs(60);
        let resp = self
            .transport
            .cluster_call(Kind::Read, timeout, |mut c| async move {
                c.backup(pb::BackupRequest {}).await
            })
            .await?;
        Ok(resp.into_inner().into())
    }

    /// Restores a backup into an empty cluster, raising its fence counter
    /// by the default bump (see [`restore_with`](Self::restore_with)).
    pub async fn restore(&self, snapshot: Vec<u8>) -> Result<Restored> {
        self.restore_with(snapshot, None).await
    }

    /// Restores a backup into an empty cluster, waiting up to a minute plus
    /// a second per 256 KiB of backup (a 1 GiB backup: about 70 minutes),
    /// raising its fence counter by `fence_bump` (`None`: the server's default, which puts the counter
    /// 2^32 above the restore's time in microseconds since 1970, by the
    /// leader's clock, and above the backup's counter). A bump given must
    /// exceed the number of grants the backup's cluster made after the
    /// backup was taken, and reach above every fence of an earlier restore
    /// of it, or stores may see a fence twice.
    pub async fn restore_with(
        &self,
        snapshot: Vec<u8>,
        fence_bump: Option<u64>,
    ) -> Result<Restored> {
        let timeout = raftlock_proto::backup::restore_patience(snapshot.len());
        // One id for every attempt: a retry of a restore that was
        // installed (its answer lost to a leader change) is answered as
        // it was, not refused because the cluster is no longer empty.
        let req = pb::RestoreRequest {
            snapshot,
            fence_bump,
            restore_id: Some(crate::random::next_u64() | 1),
        };
        let resp = self
            .transport
            .cluster_call(Kind::Write, timeout, |mut c| {
                let req = req.clone();
                async move { c.restore(req).await }
            })
            .await?;
        Ok(resp.into_inner().into())
    }

    /// Removes node `id`.
    pub async fn remove_node(&self, id: u64) -> Result<Vec<Member>> {
        let timeout = Duration::from_secs(30);
        let resp = self
            .transport
            .cluster_call(Kind::Write, timeout, |mut c| async move {
                c.remove_node(pb::RemoveNodeRequest { id }).await
            })
            .await?;
        Ok(members(resp.into_inner().members))
    }

    /// Revokes session `id` (needs `admin`): from now on nothing renews
    /// it (its owner learns at its next keep-alive:
    /// [`Session::lost`](crate::Session::lost) fires,
    /// [`Guard::is_held`](crate::Guard::is_held) turns false), and the
    /// cluster ends it, as if its lease had run out, when the lease its
    /// last keep-alive earned runs out (at most its ttl from now: its owner
    /// may count that lease). Its grants end then (lock-delay applies), its
    /// waits are withdrawn, and the next waiters are granted with larger
    /// fences. Returns, once it has ended, the number of grants that ended.
    /// [`Error::SessionNotFound`] if no such session is open (never opened,
    /// ended, or revoked already), [`Error::InvalidArgument`] for id 0.
    pub async fn revoke_session(&self, id: u64) -> Result<u32> {
        // The call lasts as long as the session's lease has left: at most
        // the longest ttl (one hour).
        let timeout = Duration::from_secs(3_600 + 30);
        let resp = self
            .transport
            .cluster_call(Kind::Write, timeout, |mut c| async move {
                c.revoke_session(pb::RevokeSessionRequest { session_id: id })
                    .await
            })
            .await?;
        Ok(resp.into_inner().released)
    }

    /// Hands the leadership to voter `to` (`None`: the voter with the most
    /// log among those the leader hears from), for planned maintenance of
    /// the leader. Returns the new leader's id and client address once the
    /// old leader has stepped down (`None` if it did not learn who won in
    /// time). Needs `admin`.
    pub async fn transfer_leader(&self, to: Option<u64>) -> Result<Option<(u64, String)>> {
        let timeout = Duration::from_secs(10);
        let resp = self
            .transport
            .cluster_call(Kind::Write, timeout, |mut c| async move {
                c.transfer_leader(pb::TransferLeaderRequest {
                    to: to.unwrap_or(0),
                })
                .await
            })
            .await?
            .into_inner();
        Ok((resp.leader_id != 0).then_some((resp.leader_id, resp.leader_addr)))
    }
}

#[cfg(test)]
#[allow(clippy::disallowed_types)] // the public `address_map`'s type
mod tests {
    use std::collections::HashMap;

    use super::*;

    /// An announced address in the map is dialled at its mapped address.
    #[tokio::test]
    async fn an_announced_address_is_dialled_where_the_map_says() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let reachable = listener.local_addr().unwrap().to_string();
        // TEST-NET-1: never routed, so only the map can make it reachable.
        let announced = "192.0.2.1:7101".to_string();
        let client = Client::with_options(
            [announced.clone()],
            ClientOptions {
                request_timeout: Duration::from_millis(500),
                address_map: HashMap::from([(announced.clone(), reachable)]),
                ..ClientOptions::default()
            },
        )
        .unwrap();
        let (asked, accepted) = tokio::join!(
            client.node_status(&announced),
            tokio::time::timeout(Duration::from_secs(2), listener.accept())
        );
        assert!(
            matches!(accepted, Ok(Ok(_))),
            "the client did not dial the mapped address"
        );
        assert!(asked.is_err(), "the listener is no raftlock node");
    }
}
