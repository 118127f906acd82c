//! `raftlock-check`: the history of lock operations and the checkers that
//! read it alone, shared by the fault-injection harness (`raftlock-jepsen`,
//! on the machine's monotonic clock) and the simulator (`raftlock-sim`, on
//! simulated time).
//!
//! * [`history`]: events (an operation's invocation and completion, Jepsen's
//!   `invoke`/`ok`/`fail`/`info`) and the operations paired from them;
//! * [`linear`]: the lock model and porcupine's linearizability search;
//! * [`checker`]: fence order, mutual exclusion, semaphore capacity, and the
//!   windows clients believed they held.
//!
//! Nothing here reads a clock unless asked to: times are the history's,
//! and only [`linear::check`] bounds its search by `std::time::Instant`.

pub mod checker;
pub mod history;
pub mod linear;
