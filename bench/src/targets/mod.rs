//! The systems under test. Each target turns a [`Workload`] into cycles of
//! its own API; where a target has no direct equivalent the run's `note`
//! says what was done instead.

#[cfg(feature = "etcd")]
pub mod etcd;
#[cfg(feature = "etcd")]
pub mod etcd_leases;
pub mod raftlock;
pub mod redis;
pub mod resp;

use std::time::Duration;

use clap::ValueEnum;
use serde::{Deserialize, Serialize};

/// Which system to drive.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Target {
    /// raftlock through the `raftlock-client` crate.
    Raftlock,
    /// etcd's lease + lock API (what `etcdctl lock` does); needs the `etcd`
    /// feature.
    Etcd,
    /// One Redis with the single-instance `SET NX PX` lock.
    Redis,
}

impl Target {
    /// Lower-case name.
    pub fn name(self) -> &'static str {
        match self {
            Target::Raftlock => "raftlock",
            Target::Etcd => "etcd",
            Target::Redis => "redis",
        }
    }
}

/// What each client does in a cycle.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Workload {
    /// Each client locks and unlocks names of its own (100 per client).
    Uncontended,
    /// Every client locks and unlocks the same name: hand-off latency.
    Contended,
    /// Every client takes and gives back 1 permit of one semaphore of
    /// capacity K.
    Semaphore,
    /// Session churn: open a session, lock a name of its own, close it.
    Sessions,
    /// The `SET NX EX` habit: take a name of its own with a ttl and give
    /// it back, in as few calls as each system offers (raftlock: Lock +
    /// Unlock, two writes).
    Oneshot,
    /// Each cycle takes 4 random names of 100 shared by every client, then
    /// gives them back: raftlock in one atomic request, the others one by
    /// one in sorted order (as their users are told to).
    Multi,
}

/// Names a `multi` cycle takes.
pub const MULTI_NAMES: usize = 4;

/// The pool `multi` draws its names from.
pub const MULTI_POOL: u32 = 100;

impl Workload {
    /// Lower-case name.
    pub fn name(self) -> &'static str {
        match self {
            Workload::Uncontended => "uncontended",
            Workload::Contended => "contended",
            Workload::Semaphore => "semaphore",
            Workload::Sessions => "sessions",
            Workload::Oneshot => "oneshot",
            Workload::Multi => "multi",
        }
    }

    /// All workloads, in report order.
    pub const ALL: [Workload; 6] = [
        Workload::Uncontended,
        Workload::Contended,
        Workload::Semaphore,
        Workload::Sessions,
        Workload::Oneshot,
        Workload::Multi,
    ];
}

/// Settings every target reads.
#[derive(Clone, Debug)]
pub struct Opts {
    /// Addresses (`host:port`) of the target's nodes.
    pub endpoints: Vec<String>,
    /// The workload.
    pub workload: Workload,
    /// Semaphore capacity (K).
    pub capacity: u32,
    /// Session / lease / key ttl.
    pub ttl: Duration,
    /// Prefix of every name this run touches, unique per run so that runs
    /// never see each other's leftovers.
    pub prefix: String,
    /// Redis: first and largest pause between polls of a taken lock.
    pub poll_backoff: (Duration, Duration),
}

impl Opts {
    /// The name client `client` uses in cycle `i`.
    pub fn name(&self, client: usize, i: u64, sep: char) -> String {
        let p = &self.prefix;
        match self.workload {
            Workload::Uncontended => format!("{p}{sep}u{sep}{client}{sep}{}", i % 100),
            Workload::Contended => format!("{p}{sep}contended"),
            Workload::Semaphore => format!("{p}{sep}semaphore"),
            Workload::Sessions => format!("{p}{sep}s{sep}{client}"),
            Workload::Oneshot => format!("{p}{sep}o{sep}{client}{sep}{}", i % 100),
            Workload::Multi => format!("{p}{sep}m"),
        }
    }

    /// A `multi` cycle's names: [`MULTI_NAMES`] distinct random ones of
    /// [`MULTI_POOL`], sorted.
    pub fn multi_names(&self, sep: char) -> Vec<String> {
        let mut picked: Vec<u32> = Vec::with_capacity(MULTI_NAMES);
        while picked.len() < MULTI_NAMES {
            let k = rand::random_range(0..MULTI_POOL);
            if !picked.contains(&k) {
                picked.push(k);
            }
        }
        picked.sort_unstable();
        let p = &self.prefix;
        picked
            .into_iter()
            .map(|k| format!("{p}{sep}m{sep}{k:03}"))
            .collect()
    }
}

/// Jittered exponential backoff for polling loops.
pub struct Backoff {
    next: Duration,
    max: Duration,
}

impl Backoff {
    /// Starts at `first`, doubles up to `max`.
    pub fn new((first, max): (Duration, Duration)) -> Backoff {
        Backoff { next: first, max }
    }

    /// Sleeps the next delay (×0.5..1.5 jitter).
    pub async fn wait(&mut self) {
        let jitter: f64 = rand::random_range(0.5..1.5);
        tokio::time::sleep(self.next.mul_f64(jitter)).await;
        self.next = (self.next * 2).min(self.max);
    }
}
