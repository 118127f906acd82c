//! A light progress bar on stderr.
//!
//! On a terminal it redraws one line in place a few times a second; when
//! stderr is a file or a pipe (as under `compare.sh`) it prints a plain line
//! every few seconds instead, so logs stay readable. It only reads atomic
//! counters, so it never slows the clients down.

use std::io::{IsTerminal, Write};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// What the bar shows, updated by the clients.
#[derive(Default)]
pub struct Counters {
    /// Completed operations (after warm-up).
    pub ops: AtomicU64,
    /// Failed attempts.
    pub errors: AtomicU64,
}

/// How far the run has to go.
#[derive(Clone, Copy)]
pub enum Goal {
    /// Run for this long.
    Time(Duration),
    /// Run until this many operations completed.
    Ops(u64),
}

/// Draws until `done` is set. Returns at once if `quiet`.
pub async fn draw(
    label: String,
    goal: Goal,
    counters: Arc<Counters>,
    done: Arc<AtomicBool>,
    quiet: bool,
) {
    if quiet {
        return;
    }
    let tty = std::io::stderr().is_terminal();
    let every = if tty {
        Duration::from_millis(250)
    } else {
        Duration::from_secs(5)
    };
    let start = Instant::now();
    let mut last_ops = 0;
    let mut last_t = start;
    loop {
        tokio::time::sleep(every).await;
        let finished = done.load(Ordering::Relaxed);
        let ops = counters.ops.load(Ordering::Relaxed);
        let errors = counters.errors.load(Ordering::Relaxed);
        let now = Instant::now();
        let rate = (ops - last_ops) as f64 / (now - last_t).as_secs_f64().max(1e-9);
        last_ops = ops;
        last_t = now;
        let elapsed = now - start;
        let frac = match goal {
            Goal::Time(d) => elapsed.as_secs_f64() / d.as_secs_f64().max(1e-9),
            Goal::Ops(n) => ops as f64 / n.max(1) as f64,
        }
        .clamp(0.0, 1.0);
        const WIDTH: usize = 30;
        let filled = (frac * WIDTH as f64) as usize;
        let bar: String = (0..WIDTH)
            .map(|i| match i.cmp(&filled) {
                std::cmp::Ordering::Less => '=',
                std::cmp::Ordering::Equal => '>',
                std::cmp::Ordering::Greater => ' ',
            })
            .collect();
        let line = format!(
            "{label} [{bar}] {:>5.1}s {ops:>9} ops {rate:>9.0}/s  errors {errors}",
            elapsed.as_secs_f64()
        );
        let mut err = std::io::stderr().lock();
        if tty {
            let _ = write!(err, "\r{line}\x1b[K");
            if finished {
                let _ = writeln!(err);
            }
        } else if !finished {
            let _ = writeln!(err, "{line}");
        }
        let _ = err.flush();
        if finished {
            return;
        }
    }
}
