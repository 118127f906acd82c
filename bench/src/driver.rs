//! The load loop: N client tasks, each running one [`Worker`]'s cycles
//! back to back until the goal is reached.
//!
//! * Closed loop: a client starts its next cycle when the last one ended, so
//!   the offered load is N outstanding cycles, as with N real clients.
//! * Warm-up cycles are run but not recorded.
//! * Each task records into its own histogram; they are merged at the end.
//! * Cycles still under way when the goal is reached are cancelled and not
//!   counted, so the figure is what completed inside the window.

use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::watch;
use tokio::time::Instant;

use crate::progress::{self, Counters, Goal};
use crate::stats::Latencies;

/// One simulated client of one target running one workload.
pub trait Worker: Send + 'static {
    /// One full cycle (acquire + release, or session open + lock + close).
    /// Calls [`Ctx::granted`] when the grant is seen and [`Ctx::releasing`]
    /// just before the release is sent, and returns the hand-off sample
    /// `granted` gave it, if any.
    fn cycle(&mut self, ctx: &Ctx)
        -> impl Future<Output = anyhow::Result<Option<Duration>>> + Send;

    /// Gives back what the worker holds (sessions, leases, connections).
    fn finish(self) -> impl Future<Output = ()> + Send;
}

/// What all clients of one run share.
pub struct Ctx {
    base: Instant,
    /// When the current holder of the contended name started releasing,
    /// in ns since `base` (+1; 0 = nobody is releasing).
    releasing_at: AtomicU64,
    /// Every grant's instant, when failover is measured.
    grants: Option<Mutex<Vec<Instant>>>,
    /// Set to end the run early.
    stop: watch::Sender<bool>,
    /// Set when the measured window starts (warm-up over).
    window: watch::Sender<bool>,
    /// Latency of single writes (a lock or a release) in the window, as
    /// workers report them with [`Ctx::write`].
    writes: Mutex<Latencies>,
}

impl Ctx {
    /// A context; `track_grants` keeps the instant of every grant.
    pub fn new(track_grants: bool) -> Arc<Ctx> {
        Arc::new(Ctx {
            base: Instant::now(),
            releasing_at: AtomicU64::new(0),
            grants: track_grants.then(|| Mutex::new(Vec::new())),
            stop: watch::channel(false).0,
            window: watch::channel(false).0,
            writes: Mutex::default(),
        })
    }

    /// Called by a worker when it sees a grant. Returns the hand-off time
    /// from the previous holder's release, if one was under way (only
    /// meaningful for one exclusive name: `contended`).
    pub fn granted(&self) -> Option<Duration> {
        let now = Instant::now();
        if let Some(g) = &self.grants {
            g.lock().expect("grants lock poisoned").push(now);
        }
        let at = self.releasing_at.swap(0, Ordering::AcqRel);
        (at != 0).then(|| (now - self.base).saturating_sub(Duration::from_nanos(at - 1)))
    }

    /// Called by a worker just before it sends its release.
    pub fn releasing(&self) {
        let ns = (Instant::now() - self.base).as_nanos() as u64;
        self.releasing_at.store(ns + 1, Ordering::Release);
    }

    /// The instants of every grant so far.
    pub fn grants(&self) -> Vec<Instant> {
        self.grants
            .as_ref()
            .map(|g| g.lock().expect("grants lock poisoned").clone())
            .unwrap_or_default()
    }

    /// Records one write's latency (only inside the measured window).
    pub fn write(&self, d: Duration) {
        if *self.window.borrow() {
            self.writes.lock().expect("writes lock poisoned").record(d);
        }
    }

    /// The writes recorded so far.
    pub fn writes(&self) -> Latencies {
        self.writes.lock().expect("writes lock poisoned").clone()
    }

    /// Waits until the measured window starts.
    pub async fn window_started(&self) {
        let _ = self.window.subscribe().wait_for(|w| *w).await;
    }

    /// Ends the run now.
    pub fn stop(&self) {
        self.stop.send_replace(true);
    }
}

/// How to run.
pub struct Plan {
    /// Run for a time or an op count.
    pub goal: Goal,
    /// Unrecorded cycles before the window.
    pub warmup: Duration,
    /// Progress bar label.
    pub label: String,
    /// No progress bar.
    pub quiet: bool,
    /// Server processes whose CPU time to count over the window.
    pub cpu_pids: Vec<i32>,
}

/// What a run measured.
pub struct Measured {
    /// Cycles completed in the window.
    pub ops: u64,
    /// Failed attempts in the window.
    pub errors: u64,
    /// Length of the window.
    pub window: Duration,
    /// Cycle latencies.
    pub latencies: Latencies,
    /// Hand-off latencies.
    pub handoff: Latencies,
    /// CPU used in the window (with [`Plan::cpu_pids`]).
    pub cpu: Option<crate::cpu::Used>,
}

struct TaskOut<W> {
    worker: W,
    latencies: Latencies,
    handoff: Latencies,
}

/// Runs `workers` (one task each) under `plan`; then calls `finish` on
/// each (bounded in time).
pub async fn run<W: Worker>(workers: Vec<W>, plan: &Plan, ctx: Arc<Ctx>) -> Measured {
    let counters = Arc::new(Counters::default());
    let recording = Arc::new(AtomicBool::new(plan.warmup.is_zero()));
    let remaining = Arc::new(AtomicU64::new(match plan.goal {
        Goal::Ops(n) => n,
        Goal::Time(_) => u64::MAX,
    }));
    let mut stop_rx = ctx.stop.subscribe();
    let mut tasks = Vec::with_capacity(workers.len());
    let printed = Arc::new(AtomicU64::new(0));
    for mut worker in workers {
        let ctx = ctx.clone();
        let counters = counters.clone();
        let recording = recording.clone();
        let remaining = remaining.clone();
        let printed = printed.clone();
        let mut stop = ctx.stop.subscribe();
        tasks.push(tokio::spawn(async move {
            let mut latencies = Latencies::default();
            let mut handoff = Latencies::default();
            loop {
                if *stop.borrow() {
                    break;
                }
                let t0 = Instant::now();
                let result = tokio::select! {
                    r = worker.cycle(&ctx) => r,
                    _ = stop.wait_for(|s| *s) => break,
                };
                let rec = recording.load(Ordering::Relaxed);
                match result {
                    Ok(h) => {
                        if !rec {
                            continue;
                        }
                        latencies.record(t0.elapsed());
                        if let Some(h) = h {
                            handoff.record(h);
                        }
                        counters.ops.fetch_add(1, Ordering::Relaxed);
                        if remaining.fetch_sub(1, Ordering::AcqRel) == 1 {
                            ctx.stop();
                        }
                    }
                    Err(e) => {
                        if rec {
                            counters.errors.fetch_add(1, Ordering::Relaxed);
                        }
                        if printed.fetch_add(1, Ordering::Relaxed) < 5 {
                            eprintln!("raftlock-bench: cycle failed (retrying): {e:#}");
                        }
                        // A failed attempt is retried after a short pause, so
                        // an unavailable target is not hammered.
                        tokio::select! {
                            _ = tokio::time::sleep(Duration::from_millis(10)) => {}
                            _ = stop.wait_for(|s| *s) => break,
                        }
                    }
                }
            }
            TaskOut {
                worker,
                latencies,
                handoff,
            }
        }));
    }
    let done = Arc::new(AtomicBool::new(false));
    let bar = tokio::spawn(progress::draw(
        plan.label.clone(),
        plan.goal,
        counters.clone(),
        done.clone(),
        plan.quiet,
    ));
    if !plan.warmup.is_zero() {
        tokio::select! {
            _ = tokio::time::sleep(plan.warmup) => {}
            _ = stop_rx.wait_for(|s| *s) => {}
        }
        recording.store(true, Ordering::Relaxed);
    }
    ctx.window.send_replace(true);
    let start = Instant::now();
    let cpu_start = (!plan.cpu_pids.is_empty()).then(|| crate::cpu::Snapshot::take(&plan.cpu_pids));
    match plan.goal {
        Goal::Time(d) => {
            tokio::select! {
                _ = tokio::time::sleep(d) => {}
                _ = stop_rx.wait_for(|s| *s) => {}
            }
        }
        Goal::Ops(_) => {
            let _ = stop_rx.wait_for(|s| *s).await;
        }
    }
    let window = start.elapsed();
    let cpu = cpu_start.map(|s| s.until(&crate::cpu::Snapshot::take(&plan.cpu_pids)));
    ctx.stop();
    let mut latencies = Latencies::default();
    let mut handoff = Latencies::default();
    let mut finishing = Vec::new();
    for t in tasks {
        match t.await {
            Ok(out) => {
                latencies.merge(&out.latencies);
                handoff.merge(&out.handoff);
                finishing.push(tokio::spawn(out.worker.finish()));
            }
            Err(e) => eprintln!("raftlock-bench: client task failed: {e}"),
        }
    }
    done.store(true, Ordering::Relaxed);
    let _ = bar.await;
    // Closing sessions and leases is not measured, but bounded.
    let _ = tokio::time::timeout(
        Duration::from_secs(15),
        futures::future::join_all(finishing),
    )
    .await;
    Measured {
        ops: latencies.count(),
        errors: counters.errors.load(Ordering::Relaxed),
        window,
        latencies,
        handoff,
        cpu,
    }
}
