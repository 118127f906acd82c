//! Latency histograms and the result of one run.
//!
//! Latencies are recorded in microseconds in HDR histograms (3 significant
//! digits, 1 µs ..= 10 min), one per client task, merged at the end, so the
//! hot loop never shares a lock. A run's histogram is kept in its JSON as
//! `[value_us, count]` pairs so that `report` can merge rounds exactly
//! instead of averaging percentiles.

use std::time::Duration;

use hdrhistogram::Histogram;
use serde::{Deserialize, Serialize};

/// Highest latency a histogram tracks; larger samples are clamped to it.
const MAX_US: u64 = 600_000_000;

/// A latency histogram in microseconds.
#[derive(Clone)]
pub struct Latencies(Histogram<u64>);

impl Default for Latencies {
    fn default() -> Self {
        Latencies(Histogram::new_with_bounds(1, MAX_US, 3).expect("valid histogram bounds"))
    }
}

impl Latencies {
    /// Records one sample.
    pub fn record(&mut self, d: Duration) {
        let us = (d.as_micros() as u64).clamp(1, MAX_US);
        self.0.saturating_record(us);
    }

    /// Adds every sample of `other`.
    pub fn merge(&mut self, other: &Latencies) {
        // Both have the same bounds, so this cannot fail.
        self.0.add(&other.0).expect("histograms with equal bounds");
    }

    /// Number of samples.
    pub fn count(&self) -> u64 {
        self.0.len()
    }

    /// The `q` quantile (0..=1) in milliseconds.
    pub fn quantile_ms(&self, q: f64) -> f64 {
        if self.0.is_empty() {
            return 0.0;
        }
        self.0.value_at_quantile(q) as f64 / 1e3
    }

    /// Mean in milliseconds.
    pub fn mean_ms(&self) -> f64 {
        self.0.mean() / 1e3
    }

    /// Largest sample in milliseconds.
    pub fn max_ms(&self) -> f64 {
        self.0.max() as f64 / 1e3
    }

    /// The non-empty buckets as `[value_us, count]`.
    pub fn to_pairs(&self) -> Vec<[u64; 2]> {
        self.0
            .iter_recorded()
            .map(|v| [v.value_iterated_to(), v.count_at_value()])
            .collect()
    }

    /// Rebuilds a histogram from [`to_pairs`](Self::to_pairs).
    pub fn from_pairs(pairs: &[[u64; 2]]) -> Latencies {
        let mut h = Latencies::default();
        for [v, n] in pairs {
            h.0.saturating_record_n((*v).clamp(1, MAX_US), *n);
        }
        h
    }
}

/// Percentile summary of a histogram, in milliseconds.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct Summary {
    /// Samples.
    pub count: u64,
    /// Median.
    pub p50_ms: f64,
    /// 99th percentile.
    pub p99_ms: f64,
    /// 99.9th percentile.
    pub p999_ms: f64,
    /// Largest sample.
    pub max_ms: f64,
    /// Mean.
    pub mean_ms: f64,
}

impl From<&Latencies> for Summary {
    fn from(h: &Latencies) -> Self {
        Summary {
            count: h.count(),
            p50_ms: round3(h.quantile_ms(0.50)),
            p99_ms: round3(h.quantile_ms(0.99)),
            p999_ms: round3(h.quantile_ms(0.999)),
            max_ms: round3(h.max_ms()),
            mean_ms: round3(h.mean_ms()),
        }
    }
}

/// Rounds to 3 decimals for readable JSON.
pub fn round3(x: f64) -> f64 {
    (x * 1000.0).round() / 1000.0
}

/// What one `raftlock-bench run` measured: the JSON it writes.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct RunResult {
    /// `raftlock`, `etcd` or `redis`.
    pub target: String,
    /// `uncontended`, `contended`, `semaphore` or `sessions`.
    pub workload: String,
    /// Concurrent clients.
    pub clients: usize,
    /// Length of the measured window in seconds (warm-up excluded).
    pub secs: f64,
    /// Operations completed in the window. One operation is one full
    /// cycle: acquire + release (`sessions`: open + acquire + release +
    /// close).
    pub ops: u64,
    /// `ops / secs`.
    pub ops_per_sec: f64,
    /// Median cycle latency.
    pub p50_ms: f64,
    /// 99th percentile cycle latency.
    pub p99_ms: f64,
    /// 99.9th percentile cycle latency.
    pub p999_ms: f64,
    /// Largest cycle latency.
    pub max_ms: f64,
    /// Mean cycle latency.
    pub mean_ms: f64,
    /// Failed attempts (each is retried; not counted in `ops`).
    pub errors: u64,
    /// `contended`: time from the holder starting its release to the next
    /// holder seeing its grant.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub handoff: Option<Summary>,
    /// How this target implements the workload, where it differs from the
    /// others.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub note: String,
    /// `/proc/loadavg` (1, 5, 15 min) at the end of the run.
    #[serde(default)]
    pub load_avg: String,
    /// Cycle latencies as `[value_us, count]`, for exact merging of rounds.
    #[serde(default)]
    pub histogram: Vec<[u64; 2]>,
    /// Hand-off latencies as `[value_us, count]`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub handoff_histogram: Vec<[u64; 2]>,
    /// `--trace-stages`: where a write's time went, stage by stage.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stages: Option<Vec<crate::stages::StageRow>>,
    /// `--pids`: CPU seconds (user + system) all the server processes
    /// used in the window.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub server_cpu_s: Option<f64>,
    /// `--pids`: CPU seconds the load generator used in the window.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bench_cpu_s: Option<f64>,
}

impl RunResult {
    /// Fills the latency fields from `h`.
    pub fn set_latencies(&mut self, h: &Latencies) {
        let s = Summary::from(h);
        self.p50_ms = s.p50_ms;
        self.p99_ms = s.p99_ms;
        self.p999_ms = s.p999_ms;
        self.max_ms = s.max_ms;
        self.mean_ms = s.mean_ms;
        self.histogram = h.to_pairs();
    }
}

/// The current `/proc/loadavg` triple, or empty where there is none.
pub fn load_avg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pairs_round_trip_keeps_percentiles() {
        let mut h = Latencies::default();
        for us in 1..=10_000u64 {
            h.record(Duration::from_micros(us));
        }
        let back = Latencies::from_pairs(&h.to_pairs());
        assert_eq!(back.count(), h.count());
        assert_eq!(back.quantile_ms(0.5), h.quantile_ms(0.5));
        assert_eq!(back.quantile_ms(0.99), h.quantile_ms(0.99));
        assert!((h.quantile_ms(0.5) - 5.0).abs() < 0.01);
    }

    #[test]
    fn huge_samples_are_clamped_not_lost() {
        let mut h = Latencies::default();
        h.record(Duration::from_secs(100_000));
        assert_eq!(h.count(), 1);
    }
}
