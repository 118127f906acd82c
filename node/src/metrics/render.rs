//! The Prometheus text exposition: the series of a node's counters,
//! histograms and gauges, rendered at scrape time.

use std::fmt::Write as _;
use std::sync::atomic::Ordering;

use super::*;

impl Histogram {
    /// The histogram's series, `labels` (`key="value",` pairs, each
    /// followed by a comma, or empty) on every one.
    fn render(&self, out: &mut String, name: &str, labels: &str, bounds: &[f64; BUCKETS]) {
        for (b, le) in bounds.iter().enumerate() {
            let v = self.buckets[b].load(Ordering::Relaxed);
            let _ = writeln!(out, "{name}_bucket{{{labels}le=\"{le}\"}} {v}");
        }
        let count = self.count.load(Ordering::Relaxed);
        let sum = self.sum_micros.load(Ordering::Relaxed) as f64 / 1e6;
        let _ = writeln!(out, "{name}_bucket{{{labels}le=\"+Inf\"}} {count}");
        let labels = match labels.trim_end_matches(',') {
            "" => String::new(),
            labels => format!("{{{labels}}}"),
        };
        let _ = writeln!(out, "{name}_sum{labels} {sum}");
        let _ = writeln!(out, "{name}_count{labels} {count}");
    }
}

impl Metrics {
    fn render_lock_times(&self, out: &mut String) {
        let map = self
            .lock_times
            .by_prefix
            .lock()
            .expect("metrics lock poisoned");
        for (name, help, wait) in [
            (
                "raftlock_lock_wait_seconds",
                "How long queued acquires waited for their grant, by name prefix (as this node \
                 applied them; acquires granted at once are not counted).",
                true,
            ),
            (
                "raftlock_lock_hold_seconds",
                "How long grants were held until they ended (release, close, expiry, revoke), \
                 by name prefix (as this node applied them).",
                false,
            ),
        ] {
            let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} histogram");
            for (prefix, pair) in map.iter() {
                let labels = format!("prefix=\"{}\",", escape_label(prefix));
                let h = if wait { &pair.0 } else { &pair.1 };
                h.render(out, name, &labels, &LOCK_TIME_BUCKETS);
            }
        }
    }

    /// The Prometheus text exposition of this node, with `gauges` read by
    /// the caller.
    pub fn render(&self, gauges: &Gauges) -> String {
        let g = gauges;
        let mut out = String::new();
        let mut gauge = |name: &str, help: &str, v: u64| {
            let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} gauge\n{name} {v}");
        };
        gauge("raftlock_term", "Current Raft term.", g.term);
        gauge(
            "raftlock_is_leader",
            "1 if this node is the leader.",
            u64::from(g.is_leader),
        );
        gauge(
            "raftlock_leader_id",
            "Id of the leader this node knows (0: none, or one without its quorum).",
            g.leader_id,
        );
        gauge(
            "raftlock_commit_index",
            "Highest log index known committed.",
            g.commit_index,
        );
        gauge(
            "raftlock_applied_index",
            "Highest log index applied.",
            g.applied_index,
        );
        gauge(
            "raftlock_last_log_index",
            "Last log index.",
            g.last_log_index,
        );
        gauge("raftlock_sessions", "Open sessions.", g.sessions);
        gauge(
            "raftlock_held_locks",
            "Held grants (locks and semaphore permits).",
            g.held_locks,
        );
        gauge("raftlock_waiters", "Queued acquires.", g.waiters);
        gauge(
            "raftlock_last_fence",
            "Largest fence handed out.",
            g.last_fence,
        );
        gauge(
            "raftlock_parked_requests",
            "Blocking acquires parked on this node.",
            g.parked_requests,
        );
        gauge(
            "raftlock_watch_streams",
            "Watch streams open on this node.",
            g.watch_streams,
        );
        gauge(
            "raftlock_watch_streams_max",
            "The most Watch streams this node serves at once (more get RESOURCE_EXHAUSTED).",
            g.watch_streams_max,
        );
        gauge(
            "raftlock_longest_queue",
            "Queued requests of the longest queue (one name) in this node's table.",
            g.longest_queue,
        );
        for (name, help, d) in [
            (
                "raftlock_oldest_grant_seconds",
                "How long the longest-held live grant has been held, since this node applied it \
                 (0: none; after a restart, since it re-applied it from its log; grants from a snapshot are not counted).",
                g.oldest_grant,
            ),
            (
                "raftlock_oldest_wait_seconds",
                "How long the longest-waiting queued request has waited, since this node applied \
                 it (0: none; as for raftlock_oldest_grant_seconds).",
                g.oldest_wait,
            ),
        ] {
            let _ = writeln!(
                out,
                "# HELP {name} {help}\n# TYPE {name} gauge\n{name} {}",
                d.as_secs_f64()
            );
        }
        for counter in Counter::ALL {
            let (name, help) = counter.describe();
            let v = self.counters[counter as usize].load(Ordering::Relaxed);
            let _ = writeln!(
                out,
                "# HELP {name} {help}\n# TYPE {name} counter\n{name} {v}"
            );
        }
        let _ = writeln!(
            out,
            "# HELP raftlock_raft_rpc_errors_total Failed outgoing Raft RPCs, by peer.\n# TYPE raftlock_raft_rpc_errors_total counter"
        );
        let errors = self
            .raft_rpc_errors
            .lock()
            .expect("metrics lock poisoned")
            .clone();
        for ((peer, rpc), v) in errors {
            let rpc = RaftRpc::ALL[rpc].name();
            let _ = writeln!(
                out,
                "raftlock_raft_rpc_errors_total{{peer=\"{peer}\",rpc=\"{rpc}\"}} {v}"
            );
        }
        let _ = writeln!(
            out,
            "# HELP raftlock_request_duration_seconds gRPC request latency by method.\n# TYPE raftlock_request_duration_seconds histogram"
        );
        for (i, method) in Method::ALL.iter().enumerate() {
            let labels = format!("method=\"{}\",", method.name());
            self.requests[i].render(
                &mut out,
                "raftlock_request_duration_seconds",
                &labels,
                &LATENCY_BUCKETS,
            );
        }
        for (name, help, h) in [
            (
                "raftlock_log_append_duration_seconds",
                "Log appends, from the store taking the entries until they are on stable storage.",
                &self.log_append,
            ),
            (
                "raftlock_fsync_duration_seconds",
                "Syncs of the log to stable storage (flush and fsync).",
                &self.fsync,
            ),
        ] {
            let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} histogram");
            h.render(&mut out, name, "", &DISK_BUCKETS);
        }
        let name = "raftlock_keepalive_answer_seconds";
        let _ = writeln!(
            out,
            "# HELP {name} Keep-alive answers on this node (the leader), from the ask's arrival \
             to its answer (includes the quorum check).\n# TYPE {name} histogram"
        );
        self.keepalive_answer
            .render(&mut out, name, "", &LATENCY_BUCKETS);
        self.render_lock_times(&mut out);
        render_peers(&mut out, &g.peers);
        if let Some(disk) = &g.disk {
            let mut gauge = |name: &str, help: &str, v: u64| {
                let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} gauge\n{name} {v}");
            };
            gauge(
                "raftlock_data_size_bytes",
                "Bytes of the files under the data directory.",
                disk.data_bytes,
            );
            gauge(
                "raftlock_disk_free_bytes",
                "Bytes still free for raftlockd on the data directory's file system.",
                disk.free_bytes,
            );
            gauge(
                "raftlock_disk_size_bytes",
                "Size of the data directory's file system in bytes.",
                disk.size_bytes,
            );
        }
        let _ = writeln!(
            out,
            "# HELP raftlock_build_info The running build (always 1).\n# TYPE raftlock_build_info gauge\nraftlock_build_info{{version=\"{}\",profile=\"{}\"}} 1",
            env!("CARGO_PKG_VERSION"),
            if cfg!(debug_assertions) { "debug" } else { "release" }
        );
        if let Some(p) = process::Process::read() {
            p.render(&mut out);
        }
        out
    }
}

/// A leader's per-peer series: replication lag and time since contact.
fn render_peers(out: &mut String, peers: &[PeerGauges]) {
    let _ = writeln!(
        out,
        "# HELP raftlock_peer_replication_lag_entries As leader: log entries a member is not known to have yet.\n# TYPE raftlock_peer_replication_lag_entries gauge"
    );
    for p in peers {
        let _ = writeln!(
            out,
            "raftlock_peer_replication_lag_entries{{peer=\"{}\"}} {}",
            p.id, p.lag_entries
        );
    }
    let _ = writeln!(
        out,
        "# HELP raftlock_peer_last_contact_seconds As leader: seconds since a member last acknowledged it (+Inf: not since it became leader).\n# TYPE raftlock_peer_last_contact_seconds gauge"
    );
    for p in peers {
        let since = p
            .since_contact
            .map_or("+Inf".to_string(), |d| d.as_secs_f64().to_string());
        let _ = writeln!(
            out,
            "raftlock_peer_last_contact_seconds{{peer=\"{}\"}} {since}",
            p.id
        );
    }
}
