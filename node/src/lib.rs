//! raftlock's server: the lock table ([`state`]) replicated through
//! openraft ([`raft`]), stored in sled, with leader-side leases
//! ([`leases`]) and served over gRPC ([`api`]). [`node::Node`] wires one
//! node together; the `raftlockd` binary runs it.

// Every decision reads tokio's clock (see clippy.toml).
#![deny(clippy::disallowed_types)]
#![deny(clippy::disallowed_methods)]

pub mod api;
pub mod apply;
pub mod auth;
pub mod blocking;
pub mod codec;
pub mod config;
pub mod console;
pub mod error;
pub mod export;
pub mod join;
pub mod leader;
pub mod leases;
pub mod metrics;
pub mod node;
pub mod proposals;
pub mod raft;
pub mod random;
pub mod state;
#[cfg(unix)]
pub mod systemd;
pub mod throttle;
pub mod tls;
pub mod transport;

/// Largest request a client may send, in bytes (names ≤ 512 B and values
/// ≤ 4 KiB fit many times over).
pub const MAX_MESSAGE_BYTES: usize = 64 * 1024;
