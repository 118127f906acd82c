//! Faults on the nodes: kill, restart, wipe, disks, pause, clock rates, and
//! healing them all.

use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::time::Duration;

use anyhow::Context;
use nix::sys::signal::Signal;

use super::process::Running;
use super::{Cluster, ClusterOptions};

impl Cluster {
    fn running_proc(&self, id: u64) -> anyhow::Result<&Running> {
        self.nodes[&id]
            .proc
            .as_ref()
            .filter(|p| p.alive())
            .with_context(|| format!("node {id} is not running"))
    }

    /// SIGKILLs node `id` and waits for it to end; it stays down until
    /// [`restart`](Self::restart) (the supervisor leaves it alone).
    pub async fn kill(&mut self, id: u64) -> anyhow::Result<()> {
        let n = self.nodes.get_mut(&id).expect("known node");
        n.held_down = true;
        n.paused = false;
        if let Some(p) = n.proc.take() {
            if p.alive() {
                p.by_harness.store(true, Ordering::SeqCst);
                p.signal(Signal::SIGKILL);
                anyhow::ensure!(
                    p.wait(Duration::from_secs(5)).await,
                    "node {id} (pid {}) did not die within 5 s of SIGKILL",
                    p.pid
                );
            }
        }
        self.publish();
        Ok(())
    }

    /// Starts node `id` from its data directory without waiting for it
    /// (no-op if running).
    pub fn start_node(&mut self, id: u64) -> anyhow::Result<()> {
        if self.is_up(id) {
            return Ok(());
        }
        self.spawn(id)
    }

    /// Restarts node `id` from its data directory (no-op if running) and
    /// waits until it answers.
    pub async fn restart(&mut self, id: u64) -> anyhow::Result<()> {
        if self.is_up(id) {
            return Ok(());
        }
        self.spawn(id)?;
        self.wait_serving(id, Duration::from_secs(30)).await
    }

    /// Kills node `id`, deletes its data and starts it empty (a new machine
    /// under the old id; only for nodes that left the cluster).
    pub async fn wipe(&mut self, id: u64) -> anyhow::Result<()> {
        self.kill(id).await?;
        let n = self.nodes.get_mut(&id).expect("known node");
        let data = n.dir.join("data");
        if n.disk.is_some() {
            // The directory is a mount point: empty it.
            for e in std::fs::read_dir(&data)? {
                let p = e?.path();
                if p.is_dir() {
                    std::fs::remove_dir_all(&p)
                } else {
                    std::fs::remove_file(&p)
                }
                .with_context(|| format!("cannot wipe {}", p.display()))?;
            }
        } else if data.exists() {
            std::fs::remove_dir_all(&data)
                .with_context(|| format!("cannot wipe {}", data.display()))?;
        }
        n.started = true;
        self.restart(id).await
    }

    fn disk(&self, id: u64) -> anyhow::Result<&crate::lazyfs::Mount> {
        self.nodes[&id]
            .disk
            .as_ref()
            .context("no disk-fault layer (the run was started without disk nemeses)")
    }

    /// Drops every write node `id`'s disk has not synced (kill it first):
    /// the files that lost something.
    pub fn lose_unsynced(&self, id: u64) -> anyhow::Result<usize> {
        Ok(self.disk(id)?.control.lose_unsynced()?)
    }

    /// Makes every sync on node `id`'s disk take `delay`.
    pub fn set_fsync_delay(&self, id: u64, delay: Duration) -> anyhow::Result<()> {
        self.disk(id)?.control.set_fsync_delay(delay);
        Ok(())
    }

    /// Makes node `id`'s disk fail (or work again, with `None`).
    pub fn set_disk_error(
        &self,
        id: u64,
        error: Option<crate::lazyfs::DiskError>,
    ) -> anyhow::Result<()> {
        self.disk(id)?.control.set_error(error);
        Ok(())
    }

    /// SIGSTOPs node `id`.
    pub fn pause(&mut self, id: u64) -> anyhow::Result<()> {
        self.running_proc(id)?.signal(Signal::SIGSTOP);
        self.nodes.get_mut(&id).expect("known node").paused = true;
        self.publish();
        Ok(())
    }

    /// SIGCONTs node `id` (no-op if it is not paused).
    pub fn resume(&mut self, id: u64) -> anyhow::Result<()> {
        if !self.nodes[&id].paused {
            return Ok(());
        }
        if let Ok(p) = self.running_proc(id) {
            p.signal(Signal::SIGCONT);
        }
        self.nodes.get_mut(&id).expect("known node").paused = false;
        self.publish();
        Ok(())
    }

    /// Restarts node `id` (gracefully: SIGTERM, then SIGKILL after 5 s)
    /// with its clocks running at `rate` under libfaketime. Errors if the
    /// cluster does not run under libfaketime.
    pub async fn set_rate(&mut self, id: u64, rate: f64) -> anyhow::Result<()> {
        anyhow::ensure!(
            self.opts.libfaketime.is_some(),
            "nodes do not run under libfaketime"
        );
        if let Some(p) = self.nodes.get_mut(&id).and_then(|n| n.proc.take()) {
            if p.alive() {
                p.by_harness.store(true, Ordering::SeqCst);
                p.signal(Signal::SIGCONT);
                p.signal(Signal::SIGTERM);
                if !p.wait(Duration::from_secs(5)).await {
                    p.signal(Signal::SIGKILL);
                    p.wait(Duration::from_secs(5)).await;
                }
            }
        }
        let n = self.nodes.get_mut(&id).expect("known node");
        n.paused = false;
        n.rate = rate;
        self.restart(id).await
    }

    /// The current clock rate of node `id`.
    pub fn rate(&self, id: u64) -> f64 {
        self.nodes[&id].rate
    }

    /// Resumes paused nodes, restarts dead ones, resets clock rates, disk
    /// faults and the network.
    pub async fn heal_all(&mut self) -> anyhow::Result<()> {
        self.heal_links()?;
        for id in self.ids() {
            self.resume(id)?;
            if let Some(d) = &self.nodes[&id].disk {
                d.control.set_fsync_delay(Duration::ZERO);
                d.control.set_error(None);
            }
        }
        for id in self.ids() {
            if self.opts.libfaketime.is_some() && self.rate(id) != 1.0 {
                self.set_rate(id, 1.0).await?;
            }
            self.restart(id).await?;
        }
        Ok(())
    }

    /// Disaster recovery: starts a fresh cluster of the same shape in
    /// `dir` (new ports, empty data), restores `backup` into it with
    /// `fence_bump` (`None`: the server's default), and puts it in this
    /// one's place; the old
    /// cluster's nodes and proxies are stopped. Returns the restore's
    /// answer.
    pub async fn replace_by_restore(
        &mut self,
        backup: Vec<u8>,
        fence_bump: Option<u64>,
        dir: PathBuf,
    ) -> anyhow::Result<raftlock_client::Restored> {
        let opts = ClusterOptions {
            dir,
            ..self.opts.clone()
        };
        let mut fresh = Cluster::start(opts).await?;
        let restored = fresh
            .admin
            .restore_with(backup, fence_bump)
            .await
            .context("restore into the fresh cluster")?;
        std::mem::swap(self, &mut fresh);
        fresh.stop_all().await;
        self.publish();
        Ok(restored)
    }
}
