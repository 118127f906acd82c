//! `--net netns`: every node in a network namespace of its own, as on real
//! hosts, and faults as packet drops (`nft`), as Jepsen does with iptables.
//!
//! The harness makes a bridge in its own namespace with two addresses on a
//! /24 of its own (10.A.B.0/24: `.1`, which clients use, and `.2`, which
//! the harness's own probes bind to), and for each node a namespace with a
//! veth into the bridge, the address `.(10 + id)`, and a default route back
//! through the bridge. A node listens on `10.A.B.(10 + id):7000` and its
//! peers dial it there directly: no proxy between nodes.
//!
//! Faults are rules in one `nft` table (`inet rljepsen`) per namespace:
//!
//! * a cut direction `i → j` drops, in node `i`'s namespace, every packet
//!   to node `j` (so one-way partitions are exact, as with the proxies);
//!   nothing is reset and nothing held is delivered later by the harness:
//!   TCP retransmits (with its backoff) and HTTP/2 keep-alive pings decide
//!   when a connection is given up, so the nodes' and the clients' own
//!   settings are what is tested;
//! * a node cut off from the clients drops every packet from and to `.1`
//!   (the workers and their proxies) while `.2` (the sampler, the
//!   watchers, the nemesis's own requests) still gets through.
//!
//! Everything is named after the harness's pid (`rljepsen-PID-G-nID`, bridge
//! `rjPIDxG`), removed when the [`Netns`] is dropped (every exit path of a
//! run, an error or Ctrl-C included), and left-overs of a harness that was
//! killed (its pid gone) are removed by the next one. Needs root and
//! `ip netns`; `nft` is installed from Debian's `nftables` if missing.

use std::collections::{BTreeMap, BTreeSet};
use std::net::Ipv4Addr;
use std::path::PathBuf;
use std::process::Command;
use std::sync::{Mutex, OnceLock, RwLock};

use anyhow::Context;

use crate::proxy::Link;

/// The port every node listens on, inside its namespace.
pub const NODE_PORT: u16 = 7000;

/// Name prefix of everything the harness creates.
const PREFIX: &str = "rljepsen";

fn run(args: &[&str]) -> anyhow::Result<String> {
    let out = Command::new(args[0])
        .args(&args[1..])
        .output()
        .with_context(|| format!("cannot run {}", args[0]))?;
    anyhow::ensure!(
        out.status.success(),
        "`{}` failed: {}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr).trim()
    );
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

fn run_stdin(args: &[&str], input: &str) -> anyhow::Result<()> {
    use std::io::Write;
    let mut child = Command::new(args[0])
        .args(&args[1..])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .with_context(|| format!("cannot run {}", args[0]))?;
    child
        .stdin
        .take()
        .expect("piped")
        .write_all(input.as_bytes())?;
    let out = child.wait_with_output()?;
    anyhow::ensure!(
        out.status.success(),
        "`{}` failed: {}\n{input}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr).trim()
    );
    Ok(())
}

/// Makes sure `nft` is there, installing Debian's `nftables` if it is not
/// (once per process).
pub fn ensure_nft() -> anyhow::Result<()> {
    static DONE: OnceLock<Result<(), String>> = OnceLock::new();
    DONE.get_or_init(|| {
        let have = || Command::new("nft").arg("--version").output().is_ok_and(|o| o.status.success());
        if have() {
            return Ok(());
        }
        eprintln!("raftlock-jepsen: installing nftables from Debian for --net netns");
        let ok = Command::new("sh")
            .args([
                "-c",
                "apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq nftables >/dev/null",
            ])
            .status()
            .is_ok_and(|s| s.success());
        if ok && have() {
            Ok(())
        } else {
            Err("--net netns needs nft: `apt-get install -y nftables` failed".into())
        }
    })
    .clone()
    .map_err(|e| anyhow::anyhow!(e))
}

/// Checks that this process may make namespaces (root, `ip netns`).
pub fn check_available() -> anyhow::Result<()> {
    anyhow::ensure!(
        nix::unistd::geteuid().is_root(),
        "--net netns needs root (it makes network namespaces and a bridge)"
    );
    run(&["ip", "netns", "list"]).context("--net netns needs `ip netns` (iproute2)")?;
    ensure_nft()
}

/// Removes the namespaces and bridges of harnesses that are gone.
fn remove_leftovers() {
    let alive = |pid: &str| {
        pid.parse::<i32>()
            .is_ok_and(|p| nix::sys::signal::kill(nix::unistd::Pid::from_raw(p), None).is_ok())
    };
    if let Ok(list) = run(&["ip", "netns", "list"]) {
        for name in list.lines().filter_map(|l| l.split_whitespace().next()) {
            let mut parts = name.split('-');
            if parts.next() == Some(PREFIX) && parts.next().is_some_and(|pid| !alive(pid)) {
                let _ = run(&["ip", "netns", "del", name]);
            }
        }
    }
    if let Ok(links) = run(&["ip", "-o", "link", "show", "type", "bridge"]) {
        for name in links
            .lines()
            .filter_map(|l| l.split(':').nth(1))
            .map(str::trim)
        {
            if let Some(rest) = name.strip_prefix("rj") {
                if let Some(pid) = rest.split('x').next() {
                    if !alive(pid) {
                        let _ = run(&["ip", "link", "del", name]);
                    }
                }
            }
        }
    }
}

/// The /24s in use (by harness bridges of this process), so two clusters
/// (a restore makes a second one) never share one.
fn taken() -> &'static Mutex<BTreeSet<(u8, u8)>> {
    static T: OnceLock<Mutex<BTreeSet<(u8, u8)>>> = OnceLock::new();
    T.get_or_init(Default::default)
}

/// The harness's own address on each live subnet, for [`local_address`].
fn harness_addrs() -> &'static RwLock<BTreeMap<(u8, u8), Ipv4Addr>> {
    static A: OnceLock<RwLock<BTreeMap<(u8, u8), Ipv4Addr>>> = OnceLock::new();
    A.get_or_init(Default::default)
}

/// The address the harness's own requests to `ip` leave from (its `.2` on
/// that node's subnet), if `ip` is in a namespace of this harness.
pub fn local_address(ip: std::net::IpAddr) -> Option<std::net::IpAddr> {
    let std::net::IpAddr::V4(v4) = ip else {
        return None;
    };
    let o = v4.octets();
    harness_addrs()
        .read()
        .expect("harness addresses lock poisoned")
        .get(&(o[1], o[2]))
        .map(|a| std::net::IpAddr::V4(*a))
}

/// One cluster's namespaces, bridge and rules.
pub struct Netns {
    tag: String,
    bridge: String,
    subnet: (u8, u8),
    nodes: BTreeMap<u64, String>,
    state: Mutex<Rules>,
}

#[derive(Default)]
struct Rules {
    cut: BTreeSet<Link>,
    no_clients: BTreeSet<u64>,
}

impl Netns {
    /// Makes the bridge and a namespace per node of `ids`.
    pub fn create(ids: &[u64]) -> anyhow::Result<Netns> {
        static GENERATION: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        check_available()?;
        remove_leftovers();
        let pid = std::process::id();
        let gen = GENERATION.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        let subnet = {
            let mut taken = taken().lock().expect("subnets lock poisoned");
            let in_use = run(&["ip", "-o", "-4", "addr", "show"]).unwrap_or_default();
            let mut seed = (pid as u64).wrapping_mul(0x9e37_79b9) ^ gen.wrapping_mul(0x85eb_ca6b);
            loop {
                let s = (64 + ((seed >> 8) % 64) as u8, (seed % 256) as u8);
                let prefix = format!(" 10.{}.{}.", s.0, s.1);
                if !taken.contains(&s) && !in_use.contains(&prefix) {
                    taken.insert(s);
                    break s;
                }
                seed = seed.wrapping_add(1);
            }
        };
        let tag = format!("{PREFIX}-{pid}-{gen}");
        let bridge = format!("rj{pid}x{gen}");
        anyhow::ensure!(bridge.len() <= 15, "interface name {bridge} too long");
        let mut ns = Netns {
            tag,
            bridge,
            subnet,
            nodes: BTreeMap::new(),
            state: Mutex::new(Rules::default()),
        };
        // From here on, Drop removes whatever was made.
        ns.setup(ids)?;
        harness_addrs()
            .write()
            .expect("harness addresses lock poisoned")
            .insert(subnet, ns.ip(2));
        Ok(ns)
    }

    fn ip(&self, last: u8) -> Ipv4Addr {
        Ipv4Addr::new(10, self.subnet.0, self.subnet.1, last)
    }

    fn node_ip(id: u64) -> u8 {
        (10 + id) as u8
    }

    fn setup(&mut self, ids: &[u64]) -> anyhow::Result<()> {
        let (b, one, two) = (
            self.bridge.clone(),
            format!("{}/24", self.ip(1)),
            format!("{}/24", self.ip(2)),
        );
        run(&["ip", "link", "add", &b, "type", "bridge"])?;
        run(&["ip", "addr", "add", &one, "dev", &b])?;
        run(&["ip", "addr", "add", &two, "dev", &b])?;
        run(&["ip", "link", "set", &b, "up"])?;
        for &id in ids {
            anyhow::ensure!(id < 200, "node ids above 200 do not fit the /24");
            let name = format!("{}-n{id}", self.tag);
            run(&["ip", "netns", "add", &name])?;
            self.nodes.insert(id, name.clone());
            let veth = format!("{}v{id}", self.bridge);
            anyhow::ensure!(veth.len() <= 15, "interface name {veth} too long");
            run(&[
                "ip", "link", "add", &veth, "type", "veth", "peer", "name", "eth0", "netns", &name,
            ])?;
            run(&["ip", "link", "set", &veth, "master", &b, "up"])?;
            let addr = format!("{}/24", self.ip(Self::node_ip(id)));
            run(&["ip", "-n", &name, "addr", "add", &addr, "dev", "eth0"])?;
            run(&["ip", "-n", &name, "link", "set", "eth0", "up"])?;
            run(&["ip", "-n", &name, "link", "set", "lo", "up"])?;
            let gw = self.ip(1).to_string();
            run(&["ip", "-n", &name, "route", "add", "default", "via", &gw])?;
            self.apply(id, &Rules::default())?;
        }
        Ok(())
    }

    /// The address node `id` listens on.
    pub fn addr(&self, id: u64) -> String {
        format!("{}:{NODE_PORT}", self.ip(Self::node_ip(id)))
    }

    /// The namespace file of node `id` (for `setns`).
    pub fn ns_path(&self, id: u64) -> PathBuf {
        PathBuf::from("/run/netns").join(&self.nodes[&id])
    }

    /// Writes node `id`'s rules for `rules`.
    fn apply(&self, id: u64, rules: &Rules) -> anyhow::Result<()> {
        let mut out = String::new();
        let mut inp = String::new();
        for &(from, to) in &rules.cut {
            if from == id && self.nodes.contains_key(&to) {
                out.push_str(&format!(
                    "    ip daddr {} drop\n",
                    self.ip(Self::node_ip(to))
                ));
            }
        }
        if rules.no_clients.contains(&id) {
            out.push_str(&format!("    ip daddr {} drop\n", self.ip(1)));
            inp.push_str(&format!("    ip saddr {} drop\n", self.ip(1)));
        }
        // Replace the table whole: an empty one first, so the delete never
        // fails, then the rules in force.
        let script = format!(
            "table inet {PREFIX}\ndelete table inet {PREFIX}\ntable inet {PREFIX} {{\n  \
             chain output {{\n    type filter hook output priority 0; policy accept;\n{out}  }}\n  \
             chain input {{\n    type filter hook input priority 0; policy accept;\n{inp}  }}\n}}\n"
        );
        run_stdin(
            &["ip", "netns", "exec", &self.nodes[&id], "nft", "-f", "-"],
            &script,
        )
    }

    fn apply_all(&self, rules: &Rules) -> anyhow::Result<()> {
        for &id in self.nodes.keys() {
            self.apply(id, rules)?;
        }
        Ok(())
    }

    /// Drops every packet of these directions (in addition to those
    /// dropped already).
    pub fn cut(&self, links: &[Link]) -> anyhow::Result<()> {
        let mut r = self.state.lock().expect("rules lock poisoned");
        r.cut.extend(links.iter().copied());
        self.apply_all(&r)
    }

    /// Cuts `nodes` off from the clients (the harness's `.2` still gets
    /// through).
    pub fn cut_clients(&self, nodes: &[u64]) -> anyhow::Result<()> {
        let mut r = self.state.lock().expect("rules lock poisoned");
        r.no_clients.extend(nodes.iter().copied());
        self.apply_all(&r)
    }

    /// Removes every rule.
    pub fn heal(&self) -> anyhow::Result<()> {
        let mut r = self.state.lock().expect("rules lock poisoned");
        *r = Rules::default();
        self.apply_all(&r)
    }

    /// The directions dropped now.
    pub fn cut_links(&self) -> Vec<Link> {
        self.state
            .lock()
            .expect("rules lock poisoned")
            .cut
            .iter()
            .copied()
            .collect()
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        harness_addrs()
            .write()
            .expect("harness addresses lock poisoned")
            .remove(&self.subnet);
        // A namespace goes with its veth end; the bridge with its
        // addresses. Processes still in a namespace keep it alive until
        // they die (they are killed on the cluster's drop).
        for name in self.nodes.values() {
            let _ = run(&["ip", "netns", "del", name]);
        }
        let _ = run(&["ip", "link", "del", &self.bridge]);
        taken()
            .lock()
            .expect("subnets lock poisoned")
            .remove(&self.subnet);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A node in a namespace reaches the bridge and is reached from it; a
    /// cut drops its packets and a heal lets them through again; the
    /// namespaces and the bridge are gone after the drop.
    #[test]
    fn namespaces_connect_cut_heal_and_go_away() {
        if check_available().is_err() {
            eprintln!("SKIPPED: --net netns needs root, ip netns and nft");
            return;
        }
        let ns = Netns::create(&[1, 2]).expect("namespaces");
        let names: Vec<String> = ns.nodes.values().cloned().collect();
        let bridge = ns.bridge.clone();
        // A listener in node 1's namespace, on its address (Python's
        // sockets: nothing to install).
        let (ip1, ip2) = (ns.ip(Netns::node_ip(1)), ns.ip(Netns::node_ip(2)));
        // A connection attempt from namespace `from` (None: the harness's)
        // bound to `src`, with a 1 s timeout.
        let connect = |from: Option<&str>, src: Ipv4Addr, to: Ipv4Addr| {
            let script = format!(
                "import socket\ns=socket.socket()\ns.settimeout(1)\ns.bind(('{src}',0))\n\
                 s.connect(('{to}',{NODE_PORT}))"
            );
            let mut cmd = match from {
                Some(ns) => {
                    let mut c = Command::new("ip");
                    c.args(["netns", "exec", ns, "python3", "-c", &script]);
                    c
                }
                None => {
                    let mut c = Command::new("python3");
                    c.args(["-c", &script]);
                    c
                }
            };
            cmd.stderr(std::process::Stdio::null())
                .status()
                .is_ok_and(|s| s.success())
        };
        let mut listener = Command::new("ip")
            .args(["netns", "exec", &names[0], "python3", "-c"])
            .arg(format!(
                "import socket\ns=socket.socket()\ns.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)\n\
                 s.bind(('{ip1}',{NODE_PORT}))\ns.listen(64)\nwhile True:\n    c,_=s.accept()\n"
            ))
            .spawn()
            .expect("listener");
        let up = (0..50).any(|_| {
            std::thread::sleep(std::time::Duration::from_millis(100));
            connect(Some(&names[1]), ip2, ip1)
        });
        assert!(up, "node 2 reaches node 1");
        ns.cut(&[(2, 1)]).unwrap();
        assert!(!connect(Some(&names[1]), ip2, ip1), "2 -> 1 is cut");
        assert!(
            connect(None, ns.ip(1), ip1),
            "the clients still reach node 1"
        );
        ns.heal().unwrap();
        assert!(connect(Some(&names[1]), ip2, ip1), "healed");
        ns.cut_clients(&[1]).unwrap();
        assert!(!connect(None, ns.ip(1), ip1), "the clients are cut off");
        assert!(connect(None, ns.ip(2), ip1), "the harness is not");
        assert!(connect(Some(&names[1]), ip2, ip1), "nor are the peers");
        ns.heal().unwrap();
        assert!(connect(None, ns.ip(1), ip1), "healed");
        let _ = listener.kill();
        let _ = listener.wait();
        drop(ns);
        let list = run(&["ip", "netns", "list"]).unwrap();
        assert!(names.iter().all(|n| !list.contains(n.as_str())), "{list}");
        assert!(
            run(&["ip", "link", "show", &bridge]).is_err(),
            "bridge removed"
        );
    }
}
