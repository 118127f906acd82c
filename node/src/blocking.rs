//! Blocking work (file I/O, decoding and checking snapshots and backups)
//! kept off the async threads: on tokio's blocking pool, or inline on the
//! calling task when a deterministic simulation asked for it
//! ([`run_inline`]): a pool thread finishes at a time of the machine's
//! choosing, which no seed decides. Every blocking call of the node goes
//! through [`spawn`] (clippy's `disallowed-methods` refuses
//! `tokio::task::spawn_blocking` in this crate).

use std::sync::atomic::{AtomicBool, Ordering};

static INLINE: AtomicBool = AtomicBool::new(false);

/// From now on, in this process, [`spawn`] runs its work inline (for the
/// simulator: its whole cluster runs on one thread, in simulated time).
pub fn run_inline() {
    INLINE.store(true, Ordering::SeqCst);
}

/// Runs `f` on tokio's blocking pool (or inline, see [`run_inline`]) and
/// waits for its result; as `tokio::task::spawn_blocking(f).await`.
#[allow(clippy::disallowed_methods)] // the one place that may
pub async fn spawn<F, R>(f: F) -> Result<R, tokio::task::JoinError>
where
    F: FnOnce() -> R + Send + 'static,
    R: Send + 'static,
{
    if INLINE.load(Ordering::SeqCst) {
        Ok(f())
    } else {
        tokio::task::spawn_blocking(f).await
    }
}

#[cfg(test)]
mod tests {
    #[tokio::test]
    async fn the_work_runs_and_its_result_comes_back() {
        let on = std::thread::current().id();
        let (value, ran_on) = super::spawn(move || (6 * 7, std::thread::current().id()))
            .await
            .expect("no panic");
        assert_eq!(value, 42);
        assert_ne!(ran_on, on, "off the async thread by default");
    }
}
