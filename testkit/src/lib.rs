//! Test support for raftlock's tests and harness.
//!
//! * [`TestCluster`] runs full nodes in this process (each with its own
//!   Raft, storage and gRPC server on a port the OS picked), so tests can
//!   kill, restart and add nodes quickly and run in parallel; with
//!   [`TestCluster::start_partitionable`] every node-to-node link goes
//!   through a [`proxy`], so tests can also partition, isolate and heal.
//! * [`eventually`] and the `wait_*` helpers poll for conditions with
//!   deadlines; tests never sleep for a fixed time to "let things settle".
//! * [`workload`]: contending workers that record what they were granted.
//! * [`proxy`]: the TCP fault proxy (one per ordered pair of nodes), also
//!   what the jepsen harness runs its partitions through. It is all that is
//!   built without the default `cluster` feature.
//! * [`hostile`] (feature `hostile`): Raft messages no member of the
//!   cluster sends (far-future terms, a snapshot beyond its vote, gaps,
//!   garbage), for the harness's hostile-peer nemesis and the simulator.
//! * [`servers`] (feature `servers`): real PostgreSQL and Redis servers in
//!   temporary directories on loopback ports, for the fenced-store tests
//!   and the harness.
//! * [`RefusingAddr`]: a loopback port that refuses connections and that
//!   no node started meanwhile can be given.
//! * [`ports`]: loopback ports for servers started in other processes,
//!   reserved across every process that asks it.
//! * [`guide`]: the operations guide's marked shell blocks, for the tests
//!   that run them as written.
//! * [`bins`]: another workspace package's binary, for tests that run it
//!   as a process.

pub mod bins;
pub mod guide;
#[cfg(feature = "hostile")]
pub mod hostile;
pub mod ports;
pub mod proxy;
mod refusing;
#[cfg(feature = "servers")]
pub mod servers;

#[cfg(feature = "cluster")]
mod cluster;
#[cfg(feature = "cluster")]
pub mod workload;

#[cfg(feature = "cluster")]
pub use cluster::*;
pub use refusing::RefusingAddr;
