//! Async Rust client for raftlock.
//!
//! The full client (sessions, guards, leader following) arrives with the
//! client issue; for now this crate re-exports the generated gRPC stubs so
//! other languages' users and early tools can talk to a node.

pub use raftlock_proto::v1 as proto;
