//! Tests of the metrics: prefix labels, escaping, help text, histograms and
//! the text exposition.

use super::*;

#[test]
fn prefix_labels_keep_the_first_segments() {
    let at = |depth| PrefixLabels { depth, max: 10 };
    assert_eq!(at(1).prefix_of("jobs/nightly/7"), "jobs/");
    assert_eq!(at(2).prefix_of("jobs/nightly/7"), "jobs/nightly/");
    assert_eq!(at(3).prefix_of("jobs/nightly/7"), "jobs/nightly/7");
    assert_eq!(at(1).prefix_of("demo"), "demo");
    assert_eq!(at(1).prefix_of("/x"), "/");
    assert_eq!(at(0).prefix_of("jobs/nightly"), "");
    // Multi-byte names cut at a '/' only, so always on a char boundary.
    assert_eq!(at(1).prefix_of("zürich/é"), "zürich/");
}

#[test]
fn the_prefix_label_cap_holds_at_its_edge() {
    let m = Metrics::default();
    m.set_prefix_labels(PrefixLabels { depth: 1, max: 3 });
    // Three distinct prefixes fill the cap exactly.
    for name in ["a/1", "b/1", "c/1", "a/2"] {
        m.lock_hold(name, Duration::from_millis(5));
    }
    let text = m.render(&Gauges::default());
    for p in ["a/", "b/", "c/"] {
        assert!(
            text.contains(&format!(
                "raftlock_lock_hold_seconds_count{{prefix=\"{p}\"}}"
            )),
            "{p}: {text}"
        );
    }
    assert!(text.contains("raftlock_lock_hold_seconds_count{prefix=\"a/\"} 2"));
    assert!(!text.contains(OVERFLOW_PREFIX), "{text}");
    // The fourth, and every one after, goes to the overflow label;
    // known prefixes keep their own.
    for name in ["d/1", "e/1", "f/\"quoted\"/1", "b/2"] {
        m.lock_wait(name, Duration::from_millis(5));
    }
    let text = m.render(&Gauges::default());
    assert!(
        text.contains("raftlock_lock_wait_seconds_count{prefix=\"_other\"} 3"),
        "{text}"
    );
    assert!(text.contains("raftlock_lock_wait_seconds_count{prefix=\"b/\"} 1"));
    let labels: std::collections::BTreeSet<&str> = text
        .lines()
        .filter(|l| l.starts_with("raftlock_lock_wait_seconds_count"))
        .collect();
    assert_eq!(
        labels.len(),
        4,
        "three prefixes and the overflow: {labels:?}"
    );
    assert!(text.contains("# HELP raftlock_lock_wait_seconds "));
    assert!(text.contains("# HELP raftlock_lock_hold_seconds "));
}

#[test]
fn label_values_are_escaped() {
    assert_eq!(escape_label("a\"b\\c\nd"), "a\\\"b\\\\c\\nd");
}

#[test]
fn every_metric_has_help() {
    let m = Metrics::default();
    m.lock_wait("x/1", Duration::from_millis(1));
    let text = m.render(&Gauges::default());
    let mut helped = std::collections::BTreeSet::new();
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("# HELP ") {
            helped.insert(rest.split(' ').next().unwrap_or("").to_string());
        }
    }
    for line in text.lines().filter(|l| !l.starts_with('#')) {
        let series = line.split(['{', ' ']).next().unwrap_or("");
        let family = ["_bucket", "_sum", "_count"]
            .iter()
            .find_map(|s| series.strip_suffix(s).filter(|f| helped.contains(*f)))
            .unwrap_or(series);
        assert!(helped.contains(family), "{series} has no # HELP");
    }
    for name in [
        "raftlock_sessions_revoked_total",
        "raftlock_leader_changes_total",
        "raftlock_fatal_errors_total",
        "raftlock_keepalive_answer_seconds",
        "raftlock_watch_streams",
        "raftlock_watch_streams_max",
        "raftlock_longest_queue",
        "raftlock_expiries_total",
    ] {
        assert!(helped.contains(name), "{name} missing");
    }
}

#[test]
fn histogram_buckets_are_cumulative() {
    let h = Histogram::default();
    h.observe(&LATENCY_BUCKETS, Duration::from_micros(300));
    h.observe(&LATENCY_BUCKETS, Duration::from_millis(30));
    assert_eq!(h.buckets[0].load(Ordering::Relaxed), 1, "le 0.5 ms");
    assert_eq!(h.buckets[6].load(Ordering::Relaxed), 2, "le 50 ms");
    assert_eq!(h.count.load(Ordering::Relaxed), 2);
}

#[test]
fn disk_peer_process_and_build_series_show_in_the_text() {
    let m = Metrics::default();
    m.fsync(Duration::from_micros(80));
    m.fsync(Duration::from_millis(2));
    m.log_append(Duration::from_millis(3));
    let text = m.render(&Gauges {
        peers: vec![
            PeerGauges {
                id: 2,
                lag_entries: 0,
                since_contact: Some(Duration::from_millis(40)),
            },
            PeerGauges {
                id: 3,
                lag_entries: 17,
                since_contact: None,
            },
        ],
        disk: Some(Disk {
            data_bytes: 1234,
            free_bytes: 5000,
            size_bytes: 9000,
        }),
        ..Gauges::default()
    });
    for series in [
        "\nraftlock_fsync_duration_seconds_bucket{le=\"0.0001\"} 1\n",
        "\nraftlock_fsync_duration_seconds_bucket{le=\"0.0025\"} 2\n",
        "\nraftlock_fsync_duration_seconds_bucket{le=\"+Inf\"} 2\n",
        "\nraftlock_fsync_duration_seconds_count 2\n",
        "\nraftlock_log_append_duration_seconds_bucket{le=\"0.0025\"} 0\n",
        "\nraftlock_log_append_duration_seconds_bucket{le=\"0.005\"} 1\n",
        "\nraftlock_log_append_duration_seconds_sum 0.003\n",
        "\nraftlock_peer_replication_lag_entries{peer=\"3\"} 17\n",
        "\nraftlock_peer_last_contact_seconds{peer=\"2\"} 0.04\n",
        "\nraftlock_peer_last_contact_seconds{peer=\"3\"} +Inf\n",
        "\nraftlock_data_size_bytes 1234\n",
        "\nraftlock_disk_free_bytes 5000\n",
        "\nraftlock_disk_size_bytes 9000\n",
        "\nprocess_cpu_seconds_total ",
        "\nprocess_resident_memory_bytes ",
        "\nprocess_open_fds ",
        "\nprocess_start_time_seconds ",
    ] {
        assert!(text.contains(series), "missing {series:?} in:\n{text}");
    }
    let build = format!(
        "\nraftlock_build_info{{version=\"{}\",profile=\"{}\"}} 1\n",
        env!("CARGO_PKG_VERSION"),
        if cfg!(debug_assertions) {
            "debug"
        } else {
            "release"
        }
    );
    assert!(text.contains(&build), "{text}");
    let without = m.render(&Gauges::default());
    assert!(
        !without.contains("raftlock_disk_free_bytes ")
            && !without.contains("raftlock_peer_last_contact_seconds{"),
        "no disk or peer series where they are unknown:\n{without}"
    );
}

#[test]
fn every_key_has_its_slot_and_shows_in_the_text() {
    let m = Metrics::default();
    for (i, rpc) in RaftRpc::ALL.iter().enumerate() {
        assert_eq!(*rpc as usize, i, "{rpc:?} out of order in ALL");
        m.raft_rpc_error(*rpc, 2);
    }
    for (i, counter) in Counter::ALL.iter().enumerate() {
        assert_eq!(*counter as usize, i, "{counter:?} out of order in ALL");
        m.count(*counter);
    }
    let text = m.render(&Gauges {
        term: 7,
        ..Gauges::default()
    });
    assert!(text.contains("\nraftlock_term 7\n"), "{text}");
    assert!(
        text.contains("raftlock_raft_rpc_errors_total{peer=\"2\",rpc=\"vote\"} 1"),
        "{text}"
    );
    assert!(
        text.contains("\nraftlock_wait_timeouts_total 1\n"),
        "{text}"
    );
    assert!(text.contains("\nraftlock_grants_total 1\n"), "{text}");
    for (i, method) in Method::ALL.iter().enumerate() {
        assert_eq!(*method as usize, i, "{method:?} out of order in ALL");
        drop(m.timer(*method));
        assert_eq!(m.requests[i].count.load(Ordering::Relaxed), 1);
    }
}
