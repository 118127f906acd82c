//! openraft's async runtime for raftlock: tokio, as openraft's own
//! `TokioRuntime`, except that openraft's random draws (election timeouts,
//! first tick waits) come from [`crate::random`], the node's one source of
//! randomness. In production that source is OS-seeded, as tokio's runtime
//! RNG is; a deterministic simulator seeds it, and then openraft's choices
//! repeat with the seed too.

use std::future::Future;
use std::time::Duration;

use openraft::async_runtime::AsyncRuntime;
use openraft::OptionalSend;
use openraft_rt_tokio::TokioRuntime;
use rand::rngs::StdRng;
use rand::SeedableRng as _;

/// The runtime raftlock's [`TypeConfig`](super::TypeConfig) names.
#[derive(Debug)]
pub struct NodeRuntime(TokioRuntime);

impl AsyncRuntime for NodeRuntime {
    type JoinError = <TokioRuntime as AsyncRuntime>::JoinError;
    type JoinHandle<T: OptionalSend + 'static> = <TokioRuntime as AsyncRuntime>::JoinHandle<T>;
    type Sleep = <TokioRuntime as AsyncRuntime>::Sleep;
    type Instant = <TokioRuntime as AsyncRuntime>::Instant;
    type TimeoutError = <TokioRuntime as AsyncRuntime>::TimeoutError;
    type Timeout<R, T: Future<Output = R> + OptionalSend> =
        <TokioRuntime as AsyncRuntime>::Timeout<R, T>;
    type ThreadLocalRng = StdRng;

    fn spawn<T>(future: T) -> Self::JoinHandle<T::Output>
    where
        T: Future + OptionalSend + 'static,
        T::Output: OptionalSend + 'static,
    {
        TokioRuntime::spawn(future)
    }

    fn sleep(duration: Duration) -> Self::Sleep {
        TokioRuntime::sleep(duration)
    }

    fn sleep_until(deadline: Self::Instant) -> Self::Sleep {
        TokioRuntime::sleep_until(deadline)
    }

    fn timeout<R, F: Future<Output = R> + OptionalSend>(
        duration: Duration,
        future: F,
    ) -> Self::Timeout<R, F> {
        TokioRuntime::timeout(duration, future)
    }

    fn timeout_at<R, F: Future<Output = R> + OptionalSend>(
        deadline: Self::Instant,
        future: F,
    ) -> Self::Timeout<R, F> {
        TokioRuntime::timeout_at(deadline, future)
    }

    fn is_panic(join_error: &Self::JoinError) -> bool {
        TokioRuntime::is_panic(join_error)
    }

    /// A generator seeded from [`crate::random`] (a fresh one per call, as
    /// openraft draws once per call).
    fn thread_rng() -> Self::ThreadLocalRng {
        StdRng::seed_from_u64(crate::random::next_u64())
    }

    type Mpsc = <TokioRuntime as AsyncRuntime>::Mpsc;
    type Watch = <TokioRuntime as AsyncRuntime>::Watch;
    type Oneshot = <TokioRuntime as AsyncRuntime>::Oneshot;
    type Mutex<T: OptionalSend + 'static> = <TokioRuntime as AsyncRuntime>::Mutex<T>;

    fn new(threads: usize) -> Self {
        NodeRuntime(TokioRuntime::new(threads))
    }

    fn block_on<F, T>(&mut self, future: F) -> T
    where
        F: Future<Output = T>,
    {
        self.0.block_on(future)
    }
}

#[cfg(test)]
mod tests {
    use rand::RngExt as _;

    use super::*;

    /// openraft's draws follow the node's random source: seeded, they
    /// repeat.
    #[test]
    fn openraft_draws_follow_the_seed() {
        crate::random::seed(11);
        let a: u64 = NodeRuntime::thread_rng().random_range(150..300);
        let b: u64 = NodeRuntime::thread_rng().random_range(150..300);
        crate::random::seed(11);
        assert_eq!(NodeRuntime::thread_rng().random_range(150..300), a);
        assert_eq!(NodeRuntime::thread_rng().random_range(150..300), b);
        crate::random::unseed();
    }
}
