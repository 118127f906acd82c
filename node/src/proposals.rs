//! Every command this process proposes to Raft, kept for the
//! deterministic simulator's exactly-once oracle (`jepsen/sim`: no write
//! is applied that nobody proposed, and none more often than it was
//! proposed). Commands are noted where they start on their way to the
//! log: a client's request as the API takes it ([`crate::api`]), a
//! restore's parts, and the leader's expiries ([`crate::leases`]); the
//! batcher, Raft, the codec and the log store lie between that point and
//! the applied log. Only with the `sim` feature (the simulator's build):
//! otherwise [`note`] does nothing and nothing is kept.

use crate::state::Command;

#[cfg(feature = "sim")]
thread_local! {
    /// The simulator runs every node of a run on one thread.
    static PROPOSED: std::cell::RefCell<Vec<Command>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// Notes commands about to be proposed.
#[cfg_attr(not(feature = "sim"), allow(unused_variables))]
pub fn note<'a>(commands: impl IntoIterator<Item = &'a Command>) {
    #[cfg(feature = "sim")]
    PROPOSED.with(|p| p.borrow_mut().extend(commands.into_iter().cloned()));
}

/// The commands noted on this thread since the last call.
#[cfg(feature = "sim")]
pub fn take() -> Vec<Command> {
    PROPOSED.with(|p| std::mem::take(&mut *p.borrow_mut()))
}
