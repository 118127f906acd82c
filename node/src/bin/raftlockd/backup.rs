//! Backup files in data directories: `restore` (a backup left for the
//! node that bootstraps), `export` (a stopped node's data as a backup) and
//! `run --force-new-cluster` (a survivor's data as its new cluster's
//! backup).

use std::time::Duration;

use raftlock_node::node::NodeOptions;

pub(super) fn restore(
    file: &std::path::Path,
    data_dir: &std::path::Path,
    fence_bump: Option<u64>,
) -> anyhow::Result<()> {
    let bytes =
        std::fs::read(file).map_err(|e| anyhow::anyhow!("cannot read {}: {e}", file.display()))?;
    let checked = raftlock_node::api::backup::check(&bytes)
        .map_err(|e| anyhow::anyhow!("{}: {e}", file.display()))?;
    if data_dir.join("sled").exists() {
        anyhow::bail!(
            "{} already holds a node's data; restore seeds a new cluster only",
            data_dir.display()
        );
    }
    // Without --fence-bump the bump is counted when the cluster applies the
    // backup (above the time it does so); checked here as of now.
    let bump_now = fence_bump.unwrap_or_else(|| checked.default_fence_bump_now());
    let first_fence = checked
        .table
        .fence_after_restore(bump_now)
        .map_err(|e| anyhow::anyhow!("--fence-bump {bump_now}: {e}"))?;
    std::fs::create_dir_all(data_dir)?;
    write_private(&data_dir.join(raftlock_node::node::RESTORE_FILE), &bytes)?;
    if let Some(bump) = fence_bump {
        write_private(
            &data_dir.join(raftlock_node::node::RESTORE_BUMP_FILE),
            bump.to_string().as_bytes(),
        )?;
    }
    let stats = checked.table.stats();
    let checksum = match &checked.header {
        Some(h) => format!(
            "checksum ok, cluster {:016x}, index {}",
            h.cluster_id, h.index
        ),
        None => "written before backup format 1: no checksum to check".into(),
    };
    let fences = if fence_bump.is_some() {
        format!("new fences start above {first_fence}")
    } else {
        format!(
            "by default, new fences start at least 2^32 above the time the cluster applies it, in \
             microseconds since 1970: above {first_fence} if it did so now"
        )
    };
    println!(
        "backup ({checksum}) with {} sessions, {} grants, last fence {} ({fences}) placed in {}; start this node with `raftlockd run --init ...`",
        stats.sessions,
        stats.grants,
        stats.last_fence,
        data_dir.display()
    );
    if first_fence == raftlock_node::state::limits::MAX_FENCE {
        eprintln!(
            "warning: the fence counter will be at the largest fence; the restored cluster can grant nothing (use a smaller --fence-bump)"
        );
    }
    Ok(())
}

/// `raftlockd export`: the backup of a stopped node's data directory.
pub(super) async fn export(
    data_dir: &std::path::Path,
    out: &std::path::Path,
) -> anyhow::Result<()> {
    anyhow::ensure!(!out.exists(), "{} exists; not overwritten", out.display());
    let exported = raftlock_node::export::export(data_dir).await?;
    write_private(out, &exported.backup)?;
    sync_parent(out)?;
    let s = exported.stats;
    println!(
        "exported {} (cluster {:016x}, log index {}, of which committed as far as this node knew: {}) with {} sessions, {} grants, last fence {}: {} bytes",
        out.display(),
        exported.cluster_id,
        exported.index,
        exported
            .committed
            .map_or_else(|| "none".to_string(), |c| c.to_string()),
        s.sessions,
        s.grants,
        s.last_fence,
        exported.backup.len()
    );
    Ok(())
}

/// `run --force-new-cluster`: turns the data directory of a survivor of a
/// lost majority into the seed of a new cluster of this node alone (its
/// data exported, set aside, and placed as the backup `--init` restores).
pub(super) async fn force_new_cluster(opts: &mut NodeOptions) -> anyhow::Result<()> {
    let dir = opts.data_dir.clone();
    let own = raftlock_node::raft::NodeAddrs::new(
        opts.advertise.clone(),
        opts.peer_advertise
            .clone()
            .unwrap_or_else(|| opts.advertise.clone()),
    );
    if dir.join(raftlock_node::node::RESTORE_FILE).exists() {
        // Stopped after setting the old data aside, before the new cluster
        // took the backup: this start finishes it.
        tracing::warn!(
            "--force-new-cluster: the new cluster's backup is still waiting in {}; bootstrapping \
             with it",
            dir.display()
        );
        opts.init = true;
        opts.peers = [(opts.id, own)].into_iter().collect();
        return Ok(());
    }
    let exported = raftlock_node::export::export(&dir).await?;
    anyhow::ensure!(
        !exported.voters.is_empty(),
        "--force-new-cluster: {} holds no membership (the node never joined a cluster); \
         nothing to start from",
        dir.display()
    );
    if exported.voters.keys().eq([&opts.id]) {
        tracing::warn!(
            "--force-new-cluster: node {} is already the only voter of its cluster; \
             starting as usual. Remove the flag",
            opts.id
        );
        return Ok(());
    }
    // A voter that still listens may be part of a majority that still
    // works (or the flag was left on after the cluster grew again): two
    // clusters would then grant the same locks. Refused.
    for (id, addrs) in exported.voters.iter().filter(|(id, _)| **id != opts.id) {
        let addr = &addrs.peer_addr;
        let connect = tokio::net::TcpStream::connect(addr.as_str());
        if let Ok(Ok(_)) = tokio::time::timeout(Duration::from_secs(1), connect).await {
            anyhow::bail!(
                "--force-new-cluster refused: node {id} of this node's cluster answers at {addr}, \
                 so its majority may still work and two clusters would grant the same locks. \
                 Stop every other node of the old cluster first (and remove the flag once this \
                 node runs a cluster again)"
            );
        }
    }
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let aside = dir.join(format!("{FORCED_ASIDE_PREFIX}{secs}"));
    std::fs::create_dir(&aside)
        .map_err(|e| anyhow::anyhow!("cannot create {}: {e}", aside.display()))?;
    for entry in std::fs::read_dir(&dir)? {
        let name = entry?.file_name();
        if name.to_string_lossy().starts_with(FORCED_ASIDE_PREFIX) {
            continue;
        }
        std::fs::rename(dir.join(&name), aside.join(&name))
            .map_err(|e| anyhow::anyhow!("cannot move {:?} aside: {e}", name))?;
    }
    std::fs::File::open(&aside)?.sync_all()?;
    write_private(
        &dir.join(raftlock_node::node::RESTORE_FILE),
        &exported.backup,
    )?;
    std::fs::File::open(&dir)?.sync_all()?;
    opts.init = true;
    opts.peers = [(opts.id, own)].into_iter().collect();
    let s = exported.stats;
    tracing::warn!(
        node = opts.id,
        old_cluster = format!("{:016x}", exported.cluster_id),
        old_voters = ?exported.voters.keys().collect::<Vec<_>>(),
        index = exported.index,
        committed = ?exported.committed,
        sessions = s.sessions,
        grants = s.grants,
        last_fence = s.last_fence,
        aside = %aside.display(),
        "--force-new-cluster: starting a new cluster of this node alone from its own data \
         (fences continue above the last one it knew); grow it with `raftlock members add`, \
         and remove the flag"
    );
    Ok(())
}

/// The name of the directory `--force-new-cluster` moves a data
/// directory's old contents into (followed by the time in Unix seconds).
const FORCED_ASIDE_PREFIX: &str = "before-force-new-cluster-";

/// Syncs the directory `path` is in, so that a file just created there
/// stays after a crash.
fn sync_parent(path: &std::path::Path) -> anyhow::Result<()> {
    let parent = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => std::path::Path::new("."),
    };
    std::fs::File::open(parent)
        .and_then(|d| d.sync_all())
        .map_err(|e| anyhow::anyhow!("cannot sync {}: {e}", parent.display()))
}

/// Writes `bytes` to `path`, readable and writable by this user only
/// (0600): a backup holds every session's owner and every holder's value.
fn write_private(path: &std::path::Path, bytes: &[u8]) -> anyhow::Result<()> {
    use std::io::Write as _;
    use std::os::unix::fs::OpenOptionsExt as _;
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(path)
        .map_err(|e| anyhow::anyhow!("cannot write {}: {e}", path.display()))?;
    f.write_all(bytes)
        .and_then(|()| f.sync_all())
        .map_err(|e| anyhow::anyhow!("cannot write {}: {e}", path.display()))
}
