//! `raftlock-jepsen`: a fault-injection harness for raftlock in the spirit
//! of Jepsen.
//!
//! It starts real `raftlockd` processes on 127.0.0.1 with every
//! node-to-node link routed through a proxy it controls ([`proxy`]), runs a
//! client workload against them ([`workload`]) while a seeded nemesis kills,
//! pauses, partitions, skews clocks and changes membership ([`nemesis`],
//! [`cluster`]), records a Jepsen-style history ([`history`]) and checks it
//! ([`checker`], [`linear`]): the fenced store never accepted a stale
//! write, no update was lost, fences only grow, locks were exclusive,
//! semaphores never over capacity, and the lock service's answers are
//! linearizable. [`run`] ties it together and writes `results.json` and
//! `report.html` ([`report`]).

pub mod audit;
pub mod availability;
pub mod beliefs;
pub mod campaign;
pub mod checker;
pub mod clientlink;
pub mod cluster;
pub mod dbstore;
pub mod history;
pub mod http;
pub mod lazyfs;
pub mod leases;
pub use raftlock_check::linear;
pub mod nemesis;
pub mod netns;
pub mod raw;
pub use raftlock_testkit::proxy;
pub mod report;
pub mod run;
pub mod store;
pub mod supervise;
pub mod workload;
pub mod zombie;
