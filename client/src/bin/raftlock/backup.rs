//! `snapshot save` and `snapshot inspect`: backup files on this machine.

use std::io::Write as _;
use std::os::unix::fs::OpenOptionsExt as _;
use std::path::Path;

use raftlock_client::backup::{self, Backup};
use raftlock_client::Error;
use serde_json::json;

/// Writes `bytes` to `path` as a new file readable by this user only
/// (0600): through a temporary file beside it, synced, then renamed over
/// `path`, so a crash leaves the old file or the whole new one.
pub fn write_private(path: &Path, bytes: &[u8]) -> Result<(), Error> {
    let err = |e: std::io::Error| Error::Config(format!("cannot write {}: {e}", path.display()));
    let name = path
        .file_name()
        .ok_or_else(|| Error::Config(format!("{} is not a file name", path.display())))?;
    let mut tmp_name = std::ffi::OsString::from(".");
    tmp_name.push(name);
    tmp_name.push(".tmp");
    let tmp = path.with_file_name(tmp_name);
    let _ = std::fs::remove_file(&tmp);
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&tmp)
        .map_err(err)?;
    let written = f
        .write_all(bytes)
        .and_then(|()| f.sync_all())
        .and_then(|()| std::fs::rename(&tmp, path));
    if let Err(e) = written {
        let _ = std::fs::remove_file(&tmp);
        return Err(err(e));
    }
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    if let Ok(d) = std::fs::File::open(dir) {
        let _ = d.sync_all();
    }
    Ok(())
}

/// `file`'s bytes, checked as a backup; the error names the file.
pub fn read_checked(file: &Path) -> Result<Vec<u8>, String> {
    let bytes = std::fs::read(file).map_err(|e| format!("cannot read {}: {e}", file.display()))?;
    backup::decode(&bytes).map_err(|e| format!("{}: {e}", file.display()))?;
    Ok(bytes)
}

/// Prints what `file` holds; an error if it is not an intact backup.
pub fn inspect(file: &Path, as_json: bool) -> Result<(), String> {
    let bytes = read_checked(file)?;
    let len = bytes.len();
    let decoded = backup::decode(&bytes).map_err(|e| e.to_string())?;
    let table_version = decoded.table().first().copied().unwrap_or(0);
    match decoded {
        Backup::Checked { header, sha256, .. } => {
            if as_json {
                out!(
                    "{}",
                    json!({
                        "file": file.display().to_string(),
                        "bytes": len,
                        "format": backup::FORMAT,
                        "table_format": table_version,
                        "checksum": "ok",
                        "sha256": backup::hex(&sha256),
                        "cluster_id": format!("{:016x}", header.cluster_id),
                        "index": header.index,
                        "created_unix_secs": header.created_unix_secs,
                        "sessions": header.sessions,
                        "grants": header.grants,
                        "last_fence": header.last_fence,
                    })
                );
            } else {
                out!(
                    "{}: raftlock backup, format {}",
                    file.display(),
                    backup::FORMAT
                );
                out!("  checksum:    ok (SHA-256 {})", backup::hex(&sha256));
                out!("  cluster id:  {:016x}", header.cluster_id);
                out!("  index:       {}", header.index);
                out!(
                    "  taken at:    {} (seconds since the Unix epoch, the leader's clock)",
                    header.created_unix_secs
                );
                out!("  sessions:    {}", header.sessions);
                out!("  grants:      {}", header.grants);
                out!("  last fence:  {}", header.last_fence);
                out!("  size:        {len} bytes (lock-table format {table_version})");
            }
        }
        Backup::Legacy { .. } => {
            if as_json {
                out!(
                    "{}",
                    json!({
                        "file": file.display().to_string(),
                        "bytes": len,
                        "format": 0,
                        "table_format": table_version,
                        "checksum": "none",
                    })
                );
            } else {
                out!(
                    "{}: a bare lock table (format {table_version}), as releases before backup \
                     format 1 wrote backups",
                    file.display()
                );
                out!(
                    "  checksum:    none: this file cannot be verified; restores still take it \
                     and check its contents"
                );
                out!("  size:        {len} bytes");
            }
        }
    }
    Ok(())
}
