//! Unit tests of the cluster's ports and log lines.

use super::cluster_ports;
use super::logs::removal_line;

/// Nodes of one cluster never share a port (while the kernel picked
/// them, from the ephemeral range, ports found one at a time collided:
/// a 7-node harness run hit one), and none is in the ephemeral range,
/// where every outgoing connection's source port comes from.
#[test]
fn ports_of_one_cluster_are_distinct() {
    let held = cluster_ports(1_000).unwrap();
    let ports: Vec<u16> = held
        .iter()
        .map(|l| l.local_addr().unwrap().port())
        .collect();
    let distinct: std::collections::BTreeSet<u16> = ports.iter().copied().collect();
    assert_eq!(distinct.len(), ports.len(), "a port was handed out twice");
    assert!(
        ports.iter().all(|p| *p < raftlock_testkit::ports::END),
        "a port from the ephemeral range"
    );
    // Held means taken: nobody else (a proxy, say) can listen there.
    let taken = std::net::TcpListener::bind(("127.0.0.1", ports[0]));
    assert!(taken.is_err(), "a held port could be bound again");
    // Held by this process: a listening socket of ours on every one.
    let ours = |ports: &[u16]| {
        let mine = own_socket_inodes();
        listening_inodes(ports)
            .into_iter()
            .filter(|inode| mine.contains(inode))
            .count()
    };
    assert_eq!(
        ours(&ports),
        ports.len(),
        "a held port has no socket of ours"
    );
    drop(held);
    // Released on drop: no socket of this process listens on any of
    // them (still reserved for this process: no other process that
    // asks `raftlock_testkit::ports` is given one).
    assert_eq!(ours(&ports), 0, "a dropped port is still held");
}

/// Inodes of the sockets listening on `ports` (127.0.0.1), from the
/// kernel's table.
fn listening_inodes(ports: &[u16]) -> std::collections::BTreeSet<u64> {
    let wanted: std::collections::BTreeSet<u16> = ports.iter().copied().collect();
    let table = std::fs::read_to_string("/proc/net/tcp").unwrap();
    table
        .lines()
        .skip(1)
        .filter_map(|line| {
            let f: Vec<&str> = line.split_whitespace().collect();
            let (addr, port) = f.get(1)?.split_once(':')?;
            let port = u16::from_str_radix(port, 16).ok()?;
            // 0100007F is 127.0.0.1; state 0A is LISTEN.
            (addr == "0100007F" && *f.get(3)? == "0A" && wanted.contains(&port))
                .then(|| f.get(9)?.parse().ok())
                .flatten()
        })
        .collect()
}

/// Inodes of the sockets this process has open.
fn own_socket_inodes() -> std::collections::BTreeSet<u64> {
    std::fs::read_dir("/proc/self/fd")
        .unwrap()
        .filter_map(|e| {
            let link = std::fs::read_link(e.ok()?.path()).ok()?;
            let link = link.to_str()?;
            link.strip_prefix("socket:[")?
                .strip_suffix(']')?
                .parse()
                .ok()
        })
        .collect()
}

/// A removal counts only when the node said it after its last start:
/// a node started again after an old removal (and added back) that
/// then exits for another reason is not "removed".
#[test]
fn a_removal_line_counts_only_after_the_last_start() {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("raftlockd.log");
    let removed = "2026-11-27T03:23:26Z  WARN raftlockd: node 3 was removed from the \
                   cluster (node 1's membership at log index 9 does not have it); exiting. \
                   Delete its data directory";
    let serving = "2026-11-27T03:23:20Z  INFO raftlockd: raftlockd serving id=3";
    let shutting = "2026-11-27T03:23:26Z  INFO raftlockd: shutting down";
    std::fs::write(&log, format!("{serving}\n{removed}\n{shutting}\n")).unwrap();
    assert_eq!(removal_line(&log).as_deref(), Some(removed));
    std::fs::write(
        &log,
        format!("{serving}\n{removed}\n{serving}\n{shutting}\n"),
    )
    .unwrap();
    assert_eq!(removal_line(&log), None);
    std::fs::write(&log, format!("{serving}\n{shutting}\n")).unwrap();
    assert_eq!(removal_line(&log), None);
    assert_eq!(removal_line(&dir.path().join("missing.log")), None);
}
