//! CPU time of processes, from `/proc/PID/stat`: what the servers under
//! test (and the load generator itself) spent over a measured window.
//! CPU per operation is the figure a shared machine bends least: a busy
//! neighbour slows a run down but does not make its work cost more cycles.

/// Clock ticks per second (`getconf CLK_TCK`; 100 on Linux).
pub const TICKS_PER_SEC: f64 = 100.0;

/// CPU time (user + system) of `pid` so far, in clock ticks (0 when the
/// process is gone).
pub fn ticks(pid: i32) -> u64 {
    parse_ticks(&std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default())
}

/// CPU time of this process so far, in clock ticks.
pub fn own_ticks() -> u64 {
    parse_ticks(&std::fs::read_to_string("/proc/self/stat").unwrap_or_default())
}

/// utime + stime from a `/proc/PID/stat` line.
pub fn parse_ticks(text: &str) -> u64 {
    // The fields after the command name (which may hold spaces) start
    // after the last ')'; utime and stime are fields 14 and 15.
    let Some((_, rest)) = text.rsplit_once(')') else {
        return 0;
    };
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let field = |i: usize| {
        fields
            .get(i)
            .and_then(|v| v.parse::<u64>().ok())
            .unwrap_or(0)
    };
    field(11) + field(12)
}

/// CPU counters of the servers and of this process at one instant.
#[derive(Clone, Debug)]
pub struct Snapshot {
    servers: Vec<u64>,
    own: u64,
}

/// CPU seconds used between two snapshots.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Used {
    /// By every server process together.
    pub servers_s: f64,
    /// By the load generator (this process).
    pub own_s: f64,
}

impl Snapshot {
    /// The counters of `pids` and of this process now.
    pub fn take(pids: &[i32]) -> Snapshot {
        Snapshot {
            servers: pids.iter().map(|p| ticks(*p)).collect(),
            own: own_ticks(),
        }
    }

    /// What was used from `self` to `later`. A server that went away in
    /// between counts as nothing rather than as a negative.
    pub fn until(&self, later: &Snapshot) -> Used {
        let servers: u64 = self
            .servers
            .iter()
            .zip(&later.servers)
            .map(|(a, b)| b.saturating_sub(*a))
            .sum();
        Used {
            servers_s: servers as f64 / TICKS_PER_SEC,
            own_s: later.own.saturating_sub(self.own) as f64 / TICKS_PER_SEC,
        }
    }
}

/// CPU seconds per 1,000 operations.
pub fn per_kop(secs: f64, ops: u64) -> Option<f64> {
    (ops > 0).then(|| secs * 1_000.0 / ops as f64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_time_is_read_past_a_command_name_with_spaces() {
        let line =
            "4242 (raft lockd) x) S 1 4242 4242 0 -1 4194560 100 0 0 0 250 70 0 0 20 0 9 0 1 2 3";
        assert_eq!(parse_ticks(line), 320);
        assert_eq!(parse_ticks(""), 0);
    }

    #[test]
    fn a_window_counts_what_every_server_used() {
        let a = Snapshot {
            servers: vec![100, 50, 7],
            own: 10,
        };
        // The third server went away (reads 0): it counts as nothing.
        let b = Snapshot {
            servers: vec![250, 80, 0],
            own: 35,
        };
        let used = a.until(&b);
        assert_eq!(
            used,
            Used {
                servers_s: 1.8,
                own_s: 0.25
            }
        );
        assert_eq!(per_kop(used.servers_s, 3_600), Some(0.5));
        assert_eq!(per_kop(1.0, 0), None);
    }

    /// Both counters see this process's CPU. Not "the two are equal":
    /// they are read a moment apart, and the test binary's other threads
    /// may be ticked in between (a fresh-clone CI run, 2026-12-01: 0.01
    /// against 0.02).
    #[test]
    fn this_process_is_measured() {
        let pid = std::process::id() as i32;
        let before = Snapshot::take(&[pid]);
        // Burn CPU until the counter has moved 3 ticks (30 ms of CPU, on a
        // busy machine too); both readings after it must count them.
        let start = ticks(pid);
        let give_up = std::time::Instant::now() + std::time::Duration::from_secs(30);
        let mut x = 0u64;
        while ticks(pid) < start + 3 && std::time::Instant::now() < give_up {
            for _ in 0..10_000 {
                x = x.wrapping_mul(6364136223846793005).wrapping_add(1);
            }
        }
        std::hint::black_box(x);
        let used = before.until(&Snapshot::take(&[pid]));
        assert!(used.servers_s >= 0.03, "{used:?}");
        assert!(used.own_s >= 0.03, "{used:?}");
    }
}
