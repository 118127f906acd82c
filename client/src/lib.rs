//! Async Rust client for raftlock.
//!
//! ```no_run
//! # async fn demo() -> Result<(), raftlock_client::Error> {
//! use std::time::Duration;
//! use raftlock_client::Client;
//!
//! let client = Client::connect(["127.0.0.1:7101", "127.0.0.1:7102", "127.0.0.1:7103"]).await?;
//! let session = client.session(Duration::from_secs(10)).await?;
//! let guard = session.lock("jobs/nightly").await?;
//! // Pass the fence to every store you write while holding the lock.
//! println!("holding with fence {}", guard.fence());
//! guard.release().await?;
//! session.close().await?;
//! # Ok(()) }
//! ```
//!
//! * [`Client`] finds the leader, follows leader hints and retries with
//!   jittered exponential backoff under a deadline.
//! * [`Session`] keeps its lease alive in the background and reports,
//!   without cancelling anything, when its view stops saying held
//!   ([`Session::invalid`]: jeopardy, which the next answered keep-alive
//!   ends) and when the lease is lost for good ([`Session::lost`]); see
//!   docs/concepts/sessions-and-leases.md, "Held, jeopardy, lost".
//! * [`Guard`]s release on drop; `release()` is idempotent.
//! * [`fence`] is what a downstream store embeds to refuse stale writers.
//!
//! **Grants and waits.** No two live guards ever share one grant:
//!
//! * a session holds at most one grant per name. A second `lock` of a name
//!   the session holds (or waits for), from another task sharing the
//!   session, fails with [`Error::FailedPrecondition`] instead of being
//!   handed the same grant. Give each task its own session, or share the
//!   guard;
//! * `drop(guard); session.lock(name)` is safe: the dropped guard's release
//!   is sent in the background, and a new acquire of that name on that
//!   session waits until it is done, so it gets a fresh grant (with a new,
//!   larger fence) in its turn;
//! * a wait the caller gives up on is withdrawn through the log (the
//!   `Cancel` RPC): a `lock()` future dropped while queued, an acquire whose
//!   outcome is unknown after a leader change or a timeout, the failing
//!   name of [`Session::acquire_all`], a campaign given up with
//!   [`Election::resign`]. A grant made to such an acquire meanwhile is
//!   released. It never stays queued to be granted to nobody.

// Every decision reads tokio's clock (see clippy.toml).
#![deny(clippy::disallowed_types)]

mod client;
mod connector;
mod election;
mod error;
pub mod fence;
mod guard;
mod keepalive;
pub mod random;
mod session;
mod transport;
mod types;

pub use client::{Client, ClientOptions, ClientTls, OneShot, LEADER_ADDR_KEY};
pub use connector::{Connector, Io};
pub use election::Election;
pub use error::{Error, Result};
pub use guard::{Guard, Mode};
pub use keepalive::LeaseState;
/// The backup file format: check and take apart what
/// [`Client::backup`] returns (`raftlock snapshot inspect` uses it).
pub use raftlock_proto::backup;
pub use raftlock_proto::v1 as proto;
pub use session::{Semaphore, Session, SessionOptions, DEFAULT_END_ON_DISCONNECT, WAIT_FOREVER_MS};
pub use transport::{MAX_MESSAGE_BYTES, REFUSED_ROUNDS};
pub use types::{
    Backup, EventKind, Fence, Holder, LockInfo, LockKind, LockMode, Member, NodeStatus, Restored,
    Role, SessionId, Waiter, WatchEvent, WatchStream,
};
