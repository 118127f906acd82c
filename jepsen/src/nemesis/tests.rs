//! Unit tests of the nemesis: kinds, fault windows, partition shapes.

use super::*;
use crate::proxy::Link;

#[test]
fn windows_are_rebuilt_from_the_history() {
    use crate::history::Event;
    let ev = |kind, f: &str, value: Value, t| Event {
        process: Process::NEMESIS,
        kind,
        f: f.into(),
        value,
        time_ns: t,
    };
    let events = vec![
        ev(
            Type::Info,
            "start-kill",
            json!({"variant": "leader", "nodes": [2]}),
            10,
        ),
        ev(Type::Info, "stop-kill", json!({}), 20),
        ev(Type::Invoke, "add-node", json!({"node": 4}), 30),
        ev(Type::Ok, "add-node", json!({"node": 4}), 40),
        ev(Type::Info, "heal", json!({}), 50),
    ];
    let w = windows_from_history(&events);
    assert_eq!(w.len(), 2);
    assert_eq!(
        (w[0].kind, w[0].variant.as_str(), w[0].nodes.clone()),
        (NemesisKind::Kill, "leader", vec![2])
    );
    assert_eq!(
        (w[1].kind, w[1].variant.as_str(), w[1].start_ns, w[1].end_ns),
        (NemesisKind::Membership, "add", 30, 40)
    );
}

#[test]
fn lists_parse() {
    assert_eq!(
        NemesisKind::parse_list("kill,pause").unwrap(),
        vec![NemesisKind::Kill, NemesisKind::Pause]
    );
    assert_eq!(NemesisKind::parse_list("all").unwrap().len(), 12);
    assert_eq!(
        NemesisKind::parse_list("restart-fast,disk-error,client-link,hostile-peer").unwrap(),
        vec![
            NemesisKind::RestartFast,
            NemesisKind::DiskError,
            NemesisKind::ClientLink,
            NemesisKind::HostilePeer
        ]
    );
    assert_eq!(
        NemesisKind::parse_list("restore,disk").unwrap(),
        vec![
            NemesisKind::Restore,
            NemesisKind::LoseUnsynced,
            NemesisKind::SlowDisk
        ]
    );
    assert!(NemesisKind::parse_list("none").unwrap().is_empty());
    // A long partition only when named: one would fill a short run.
    assert!(!NemesisKind::parse_list("all")
        .unwrap()
        .contains(&NemesisKind::LongPartition));
    assert_eq!(
        NemesisKind::parse_list("long-partition,partition").unwrap(),
        vec![NemesisKind::Partition, NemesisKind::LongPartition]
    );
    assert!(NemesisKind::parse_list("flood").is_err());
}

fn reach(links: &[Link], members: &[u64]) -> Vec<usize> {
    members
        .iter()
        .map(|&m| {
            members
                .iter()
                .filter(|&&o| o == m || !links.contains(&(m, o)))
                .count()
        })
        .collect()
}

#[test]
fn partitions_have_the_promised_shape() {
    let mut rng = StdRng::seed_from_u64(1);
    let five = [1, 2, 3, 4, 5];
    // Ring: every node reaches exactly a majority (itself + 2).
    assert_eq!(
        reach(&partition_links("ring", &five, 1, &mut rng), &five),
        vec![3; 5]
    );
    // Bridge: the middle node reaches everyone.
    let bridge = partition_links("bridge", &five, 1, &mut rng);
    assert_eq!(reach(&bridge, &five), vec![3, 3, 5, 3, 3]);
    // Isolating the leader cuts it off both ways.
    let iso = partition_links("isolate-leader", &five, 3, &mut rng);
    assert_eq!(iso.len(), 8);
    assert!(iso.iter().all(|&(a, b)| a == 3 || b == 3));
    // One-way cuts only one direction.
    let one = partition_links("one-way", &five, 3, &mut rng);
    assert_eq!(one.len(), 4);
    assert!(one.iter().all(|&(a, b)| !one.contains(&(b, a))));
}

/// The `log-rot` check: a start must match what the copy of the damaged
/// files said, and a node must do one or the other.
#[test]
fn rot_outcomes_are_judged_against_the_copy() {
    use crate::history::Event;
    let outcome = |expected: Value, outcome: &str| Event {
        process: Process::NEMESIS,
        kind: Type::Info,
        f: "rot-outcome".into(),
        value: json!({"node": 2, "expected_refusal": expected, "outcome": outcome,
                      "last_log_line": "raftlockd: something"}),
        time_ns: 5,
    };
    let lost = json!("entry 7, which the mark names, is gone");
    let fine = [
        outcome(lost.clone(), "refused"),
        outcome(Value::Null, "started"),
        // A copy that could not be judged is not counted.
        outcome(json!({"unknown": "no copy"}), "started"),
    ];
    let (summary, anomalies) = rot::check(&fine);
    assert_eq!(anomalies, Vec::<Value>::new());
    assert_eq!(
        (summary["damaged"].clone(), summary["refused"].clone()),
        (json!(3), json!(1))
    );
    for (event, says) in [
        (outcome(lost.clone(), "started"), "started on a damaged log"),
        (
            outcome(Value::Null, "refused"),
            "refused a damaged log that still holds",
        ),
        (outcome(lost, "exited"), "neither started nor refused"),
        (
            outcome(Value::Null, "undecided"),
            "neither started nor refused",
        ),
    ] {
        let (summary, anomalies) = rot::check(std::slice::from_ref(&event));
        assert_eq!(summary["valid"], json!(false), "{event:?}");
        let message = anomalies[0]["message"].as_str().unwrap_or("");
        assert!(message.contains(says), "{message}");
    }
    // Named only: `all` leaves it out.
    assert_eq!(
        NemesisKind::parse_list("rot").unwrap(),
        vec![NemesisKind::Rot]
    );
    assert!(!NemesisKind::parse_list("all")
        .unwrap()
        .contains(&NemesisKind::Rot));
}
