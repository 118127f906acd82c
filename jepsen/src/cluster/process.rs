//! A node's process: how it is started, and the reaper that owns it.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::Stdio;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use tokio::process::{Child, Command};
use tokio::sync::{mpsc, watch};

use super::logs::{last_log_line, removal_line};
use super::Cluster;
use super::ExitReport;

/// A running process and its reaper.
pub(super) struct Running {
    pub(super) pid: u32,
    /// Signals for the reaper to deliver.
    signals: mpsc::UnboundedSender<Signal>,
    /// Set once the process has ended.
    ended: watch::Receiver<bool>,
    /// The harness is stopping it (its end is not reported as a failure).
    pub(super) by_harness: Arc<AtomicBool>,
    pub(super) reaper: tokio::task::JoinHandle<()>,
}

impl Running {
    pub(super) fn alive(&self) -> bool {
        !*self.ended.borrow()
    }

    /// Has the reaper signal the process (if it is still there).
    pub(super) fn signal(&self, sig: Signal) {
        let _ = self.signals.send(sig);
    }

    /// Waits up to `within` for the process to end.
    pub(super) async fn wait(&self, within: Duration) -> bool {
        let mut ended = self.ended.clone();
        let done = tokio::time::timeout(within, ended.wait_for(|e| *e))
            .await
            .is_ok();
        done
    }
}

/// Owns `child` until it ends: delivers the signals the cluster asks for,
/// and reports the end.
async fn reap(
    mut child: Child,
    mut signals: mpsc::UnboundedReceiver<Signal>,
    ended: watch::Sender<bool>,
    by_harness: Arc<AtomicBool>,
    report: Option<mpsc::UnboundedSender<ExitReport>>,
    (cluster_dir, node, log): (PathBuf, u64, PathBuf),
) {
    use std::os::unix::process::ExitStatusExt;
    let pid = child.id().unwrap_or(0);
    let status = loop {
        tokio::select! {
            status = child.wait() => break status.ok(),
            Some(sig) = signals.recv() => {
                // Not reaped yet (only this task waits on it), so the pid
                // is still this process's.
                if let Some(pid) = child.id() {
                    kill(Pid::from_raw(pid as i32), sig).ok();
                }
            }
        }
    };
    ended.send_replace(true);
    if let Some(report) = report {
        let _ = report.send(ExitReport {
            cluster_dir,
            node,
            pid,
            code: status.and_then(|s| s.code()),
            signal: status.and_then(|s| s.signal()),
            by_harness: by_harness.load(Ordering::SeqCst),
            last_log_line: last_log_line(&log),
            removed: status
                .and_then(|s| s.code())
                .filter(|c| *c == 0)
                .and_then(|_| removal_line(&log)),
        });
    }
}

pub(super) struct NodeProc {
    pub(super) addr: String,
    /// Holds `addr` until the node first starts (see [`cluster_ports`](super::cluster_ports)).
    pub(super) reserved: Option<std::net::TcpListener>,
    pub(super) dir: PathBuf,
    /// The process, if one was started and not stopped by the harness
    /// (it may have ended on its own since).
    pub(super) proc: Option<Running>,
    /// Stopped with SIGSTOP.
    pub(super) paused: bool,
    /// Stopped by the harness, to stay down until it restarts it (the
    /// supervisor starts only nodes that ended on their own).
    pub(super) held_down: bool,
    /// Started at least once since its data was last wiped: never pass
    /// `--init` again (a wiped node must not bootstrap a second cluster).
    pub(super) started: bool,
    /// Clock rate under libfaketime (1.0 = real time).
    pub(super) rate: f64,
    /// The disk-fault layer under its data directory, if any.
    pub(super) disk: Option<crate::lazyfs::Mount>,
}

impl Cluster {
    pub(super) fn spawn(&mut self, id: u64) -> anyhow::Result<()> {
        anyhow::ensure!(!self.is_up(id), "node {id} is already running");
        let ids = self.ids();
        let addrs: BTreeMap<u64, String> = self
            .nodes
            .iter()
            .map(|(i, n)| (*i, n.addr.clone()))
            .collect();
        let n = self.nodes.get_mut(&id).expect("known node");
        // Through the proxies; in namespaces, straight to the peers.
        let dial: Vec<String> = match &self.netns {
            Some(_) => Vec::new(),
            None => ids
                .iter()
                .filter(|&&j| j != id)
                .map(|&j| format!("{j}={}", self.net.proxy_addr(id, j).expect("proxy exists")))
                .collect(),
        };
        let log_path = n.dir.join("raftlockd.log");
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log_path)?;
        let mut cmd = Command::new(&self.opts.raftlockd);
        cmd.arg("run")
            .arg("--id")
            .arg(id.to_string())
            .arg("--listen")
            .arg(&n.addr)
            .arg("--data-dir")
            .arg(n.dir.join("data"))
            .stdin(Stdio::null())
            .stdout(Stdio::from(log.try_clone()?))
            .stderr(Stdio::from(log))
            .kill_on_drop(true)
            // Its own process group: a Ctrl-C in the terminal reaches the
            // harness, which then stops the nodes itself.
            .process_group(0);
        match &self.opts.acl {
            Some(acl) => {
                cmd.arg("--acl-file").arg(&acl.file);
            }
            // The harness's nodes talk through its proxies on loopback; a
            // hostile peer is one of its faults, not a thing to lock out.
            None if self.opts.insecure_peers_flag => {
                cmd.arg("--insecure-peers");
            }
            None => {}
        }
        if !dial.is_empty() {
            cmd.arg("--dial").arg(dial.join(","));
        }
        if id == 1 && !n.started {
            let peers: Vec<String> = (1..=self.opts.nodes)
                .map(|p| format!("{p}={}", addrs[&p]))
                .collect();
            cmd.arg("--init").arg("--peers").arg(peers.join(","));
        }
        if let Some(lib) = &self.opts.libfaketime {
            // The rate is fixed for the life of the process: libfaketime's
            // run-time rate changes (FAKETIME_TIMESTAMP_FILE) make the
            // monotonic clock jump, backwards with FAKETIME_XRESET, so a
            // new rate means a restart. Every clock runs from the
            // process's start at this rate, with no jump.
            cmd.env("LD_PRELOAD", lib)
                .env("FAKETIME", format!("+0 x{:.3}", n.rate))
                .env_remove("FAKETIME_TIMESTAMP_FILE");
        }
        // The node's network namespace, entered between fork and exec.
        let netns_file = match &self.netns {
            Some(ns) => Some(
                std::fs::File::open(ns.ns_path(id))
                    .with_context(|| format!("cannot open {}", ns.ns_path(id).display()))?,
            ),
            None => None,
        };
        let netns_fd = netns_file.as_ref().map(std::os::fd::AsRawFd::as_raw_fd);
        // The node dies with the harness: a harness killed mid-run leaves
        // no cluster behind.
        // SAFETY: between fork and exec the closure makes async-signal-safe
        // system calls only (setns, prctl) and allocates nothing; the
        // namespace's descriptor stays open until the spawn has returned.
        #[allow(unsafe_code)]
        unsafe {
            cmd.pre_exec(move || {
                if let Some(fd) = netns_fd {
                    nix::sched::setns(
                        std::os::fd::BorrowedFd::borrow_raw(fd),
                        nix::sched::CloneFlags::CLONE_NEWNET,
                    )?;
                }
                nix::sys::prctl::set_pdeathsig(Signal::SIGKILL)?;
                Ok(())
            });
        }
        // Hand the port over: from here until the node binds it, another
        // process could take it, which `wait_serving` reports.
        n.reserved = None;
        let child = cmd
            .spawn()
            .with_context(|| format!("cannot start {}", self.opts.raftlockd.display()))?;
        drop(netns_file);
        let (signals, signals_rx) = mpsc::unbounded_channel();
        let (ended_tx, ended) = watch::channel(false);
        let by_harness = Arc::new(AtomicBool::new(false));
        let pid = child.id().unwrap_or(0);
        let reaper = tokio::spawn(reap(
            child,
            signals_rx,
            ended_tx,
            by_harness.clone(),
            self.opts.hooks.exits.clone(),
            (self.opts.dir.clone(), id, log_path),
        ));
        n.proc = Some(Running {
            pid,
            signals,
            ended,
            by_harness,
            reaper,
        });
        n.paused = false;
        n.held_down = false;
        n.started = true;
        self.publish();
        Ok(())
    }
}
