//! A FUSE layer for disk faults, in the spirit of Jepsen's LazyFS: each
//! node's data directory is a FUSE mount that passes every operation
//! through to a backing directory, and remembers what a power loss would
//! take.
//!
//! * **Unsynced writes.** Every write and truncation of a file is applied
//!   to the backing file at once, and the bytes it replaced are kept in an
//!   undo log until the file is `fsync`ed or `fdatasync`ed (through any
//!   descriptor). [`Control::lose_unsynced`] replays the undo logs
//!   backwards and cuts every file back to its size at its last sync: what
//!   a machine that lost power before those syncs would find on its disk.
//!   A file created since (never synced) comes back empty. Directory
//!   operations (create, rename, unlink) are kept as if synced; only file
//!   contents and sizes are lost.
//! * **Slow syncs.** [`Control::set_fsync_delay`] makes every `fsync`,
//!   `fdatasync` and directory sync take that long (all other requests on
//!   the mount wait behind it, as they would behind a stalled disk).
//! * **Failing disks.** [`Control::set_error`] makes the disk full (every
//!   write, growing truncation, file or directory creation and sync fails
//!   with `ENOSPC`; reads, unlinks and renames still work) or its syncs
//!   fail with `EIO` (writes still land; what they wrote stays unsynced,
//!   so a power loss would drop it), until it is set back to `None`. This
//!   models a disk that refuses to store or persist; it does not model
//!   the page-cache loss after a failed writeback (a later sync that
//!   succeeds makes the data durable here).
//!
//! Everything else is passed through unchanged. The mount needs `/dev/fuse`
//! and the right to mount (root, or `fusermount3` from Debian's `fuse3`).

use nix::libc;
use std::collections::HashMap;
use std::ffi::OsStr;
use std::fs::{File, OpenOptions};
use std::os::unix::fs::{DirBuilderExt, FileExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use fuser::{
    FileAttr, FileType, Filesystem, MountOption, ReplyAttr, ReplyCreate, ReplyData, ReplyDirectory,
    ReplyEmpty, ReplyEntry, ReplyOpen, ReplyWrite, Request, TimeOrNow,
};

/// Attributes are not cached by the kernel: a lost write changes sizes
/// behind its back.
const TTL: Duration = Duration::ZERO;

/// What a power loss would undo in one file.
struct Unsynced {
    /// A descriptor of its own (survives renames and unlinks).
    file: File,
    /// Its size at its last sync.
    synced_len: u64,
    /// Bytes overwritten since, oldest first: (offset, old bytes).
    undo: Vec<(u64, Vec<u8>)>,
}

/// How a failing disk fails.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum DiskError {
    /// No space left: writes, growing truncations, creations and syncs
    /// fail with `ENOSPC`.
    Full,
    /// Syncs fail with `EIO`.
    SyncEio,
}

/// The fault controls of one mount, shared with the harness.
#[derive(Default)]
pub struct Control {
    /// By backing inode number.
    dirty: Mutex<HashMap<u64, Unsynced>>,
    fsync_delay: Mutex<Duration>,
    error: Mutex<Option<DiskError>>,
    /// Requests refused because of `error`, ever.
    refused: std::sync::atomic::AtomicU64,
}

impl Control {
    /// Makes the disk fail as `error` says (`None`: it works again).
    pub fn set_error(&self, error: Option<DiskError>) {
        *self.error.lock().expect("lock") = error;
    }

    /// Requests refused by a failing disk so far.
    pub fn refused(&self) -> u64 {
        self.refused.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// The errno a request of `kind` gets now, if the disk fails it.
    fn fail(&self, kind: Op) -> Result<(), i32> {
        let errno = match (*self.error.lock().expect("lock"), kind) {
            (Some(DiskError::Full), _) => libc::ENOSPC,
            (Some(DiskError::SyncEio), Op::Sync) => libc::EIO,
            _ => return Ok(()),
        };
        self.refused
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        Err(errno)
    }

    /// Makes every sync take `delay` (zero: back to normal).
    pub fn set_fsync_delay(&self, delay: Duration) {
        *self.fsync_delay.lock().expect("lock") = delay;
    }

    fn fsync_delay(&self) -> Duration {
        *self.fsync_delay.lock().expect("lock")
    }

    /// Drops every write not synced yet, as a power loss would. Call it
    /// while nothing uses the mount (the node is dead). Returns the number
    /// of files that lost something.
    pub fn lose_unsynced(&self) -> std::io::Result<usize> {
        let mut dirty = self.dirty.lock().expect("lock");
        let count = dirty.len();
        for (_, u) in dirty.drain() {
            for (offset, old) in u.undo.iter().rev() {
                u.file.write_all_at(old, *offset)?;
            }
            u.file.set_len(u.synced_len)?;
            u.file.sync_all()?;
        }
        Ok(count)
    }

    /// Bytes of undo log held (for the report).
    pub fn unsynced_files(&self) -> usize {
        self.dirty.lock().expect("lock").len()
    }

    /// Records that `file` (backing inode `ino`) is about to change in
    /// `[offset, offset + len)`, or to be cut to `offset` if `len` is None.
    fn before_change(
        &self,
        ino: u64,
        file: &File,
        offset: u64,
        len: Option<u64>,
    ) -> std::io::Result<()> {
        let current = file.metadata()?.len();
        let mut dirty = self.dirty.lock().expect("lock");
        let u = match dirty.entry(ino) {
            std::collections::hash_map::Entry::Occupied(o) => o.into_mut(),
            std::collections::hash_map::Entry::Vacant(v) => v.insert(Unsynced {
                file: file.try_clone()?,
                // What is there when it is first seen counts as synced.
                synced_len: current,
                undo: Vec::new(),
            }),
        };
        let end = match len {
            Some(len) => (offset + len).min(current),
            None => current,
        };
        // Only bytes below the synced size need saving: the rest is cut off
        // anyway.
        let end = end.min(u.synced_len);
        if offset < end {
            let mut old = vec![0; (end - offset) as usize];
            file.read_exact_at(&mut old, offset)?;
            u.undo.push((offset, old));
        }
        Ok(())
    }

    /// A new, empty file: all of it is unsynced.
    fn created(&self, ino: u64, file: &File) -> std::io::Result<()> {
        let mut dirty = self.dirty.lock().expect("lock");
        dirty.entry(ino).or_insert(Unsynced {
            file: file.try_clone()?,
            synced_len: 0,
            undo: Vec::new(),
        });
        Ok(())
    }

    fn synced(&self, ino: u64) {
        self.dirty.lock().expect("lock").remove(&ino);
    }
}

/// What a request asks of the disk, for [`Control::fail`].
#[derive(Clone, Copy, PartialEq, Eq)]
enum Op {
    /// Takes space: a write, a growing truncation, a creation.
    Store,
    /// A sync.
    Sync,
}

/// The passthrough filesystem.
struct LazyFs {
    root: PathBuf,
    control: Arc<Control>,
    /// FUSE inode → backing path (FUSE inode = backing inode, root = 1).
    paths: HashMap<u64, PathBuf>,
    files: HashMap<u64, File>,
    next_fh: u64,
}

fn errno(e: &std::io::Error) -> i32 {
    e.raw_os_error().unwrap_or(libc::EIO)
}

fn time(secs: i64, nsecs: i64) -> SystemTime {
    if secs >= 0 {
        UNIX_EPOCH + Duration::new(secs as u64, nsecs as u32)
    } else {
        UNIX_EPOCH
    }
}

impl LazyFs {
    fn attr(&self, ino: u64, m: &std::fs::Metadata) -> FileAttr {
        let kind = if m.is_dir() {
            FileType::Directory
        } else if m.file_type().is_symlink() {
            FileType::Symlink
        } else {
            FileType::RegularFile
        };
        FileAttr {
            ino,
            size: m.len(),
            blocks: m.blocks(),
            atime: time(m.atime(), m.atime_nsec()),
            mtime: time(m.mtime(), m.mtime_nsec()),
            ctime: time(m.ctime(), m.ctime_nsec()),
            crtime: time(m.ctime(), m.ctime_nsec()),
            kind,
            perm: (m.mode() & 0o7777) as u16,
            nlink: m.nlink() as u32,
            uid: m.uid(),
            gid: m.gid(),
            rdev: m.rdev() as u32,
            blksize: m.blksize() as u32,
            flags: 0,
        }
    }

    fn ino_of(&self, path: &Path, m: &std::fs::Metadata) -> u64 {
        if path == self.root {
            fuser::FUSE_ROOT_ID
        } else {
            m.ino()
        }
    }

    fn path(&self, ino: u64) -> Result<PathBuf, i32> {
        self.paths.get(&ino).cloned().ok_or(libc::ENOENT)
    }

    fn child(&self, parent: u64, name: &OsStr) -> Result<PathBuf, i32> {
        Ok(self.path(parent)?.join(name))
    }

    fn entry(&mut self, path: PathBuf) -> Result<FileAttr, i32> {
        let m = std::fs::symlink_metadata(&path).map_err(|e| errno(&e))?;
        let ino = self.ino_of(&path, &m);
        let attr = self.attr(ino, &m);
        self.paths.insert(ino, path);
        Ok(attr)
    }

    fn backing_ino(&self, fh: u64) -> Result<u64, i32> {
        let f = self.files.get(&fh).ok_or(libc::EBADF)?;
        Ok(f.metadata().map_err(|e| errno(&e))?.ino())
    }

    fn sync(&self, file: &File, ino: u64, data_only: bool) -> Result<(), i32> {
        let delay = self.control.fsync_delay();
        if !delay.is_zero() {
            std::thread::sleep(delay);
        }
        self.control.fail(Op::Sync)?;
        let r = if data_only {
            file.sync_data()
        } else {
            file.sync_all()
        };
        r.map_err(|e| errno(&e))?;
        self.control.synced(ino);
        Ok(())
    }
}

impl Filesystem for LazyFs {
    fn lookup(&mut self, _req: &Request<'_>, parent: u64, name: &OsStr, reply: ReplyEntry) {
        match self.child(parent, name).and_then(|p| self.entry(p)) {
            Ok(attr) => reply.entry(&TTL, &attr, 0),
            Err(e) => reply.error(e),
        }
    }

    fn getattr(&mut self, _req: &Request<'_>, ino: u64, fh: Option<u64>, reply: ReplyAttr) {
        let m = match fh.and_then(|fh| self.files.get(&fh)) {
            Some(f) => f.metadata(),
            None => match self.path(ino) {
                Ok(p) => std::fs::symlink_metadata(p),
                Err(e) => return reply.error(e),
            },
        };
        match m {
            Ok(m) => reply.attr(&TTL, &self.attr(ino, &m)),
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn setattr(
        &mut self,
        _req: &Request<'_>,
        ino: u64,
        mode: Option<u32>,
        _uid: Option<u32>,
        _gid: Option<u32>,
        size: Option<u64>,
        _atime: Option<TimeOrNow>,
        _mtime: Option<TimeOrNow>,
        _ctime: Option<SystemTime>,
        fh: Option<u64>,
        _crtime: Option<SystemTime>,
        _chgtime: Option<SystemTime>,
        _bkuptime: Option<SystemTime>,
        _flags: Option<u32>,
        reply: ReplyAttr,
    ) {
        let result = (|| -> Result<std::fs::Metadata, i32> {
            let path = self.path(ino);
            if let Some(mode) = mode {
                std::fs::set_permissions(path.clone()?, std::fs::Permissions::from_mode(mode))
                    .map_err(|e| errno(&e))?;
            }
            if let Some(size) = size {
                let current = match fh.and_then(|fh| self.files.get(&fh)) {
                    Some(f) => f.metadata(),
                    None => std::fs::metadata(path.clone()?),
                }
                .map_err(|e| errno(&e))?
                .len();
                if size > current {
                    self.control.fail(Op::Store)?;
                }
                let own;
                let file = match fh.and_then(|fh| self.files.get(&fh)) {
                    Some(f) => f,
                    None => {
                        own = OpenOptions::new()
                            .write(true)
                            .open(path.clone()?)
                            .map_err(|e| errno(&e))?;
                        &own
                    }
                };
                let backing = file.metadata().map_err(|e| errno(&e))?.ino();
                self.control
                    .before_change(backing, file, size, None)
                    .map_err(|e| errno(&e))?;
                file.set_len(size).map_err(|e| errno(&e))?;
            }
            match fh.and_then(|fh| self.files.get(&fh)) {
                Some(f) => f.metadata().map_err(|e| errno(&e)),
                None => std::fs::symlink_metadata(path?).map_err(|e| errno(&e)),
            }
        })();
        match result {
            Ok(m) => reply.attr(&TTL, &self.attr(ino, &m)),
            Err(e) => reply.error(e),
        }
    }

    fn mkdir(
        &mut self,
        _req: &Request<'_>,
        parent: u64,
        name: &OsStr,
        mode: u32,
        _umask: u32,
        reply: ReplyEntry,
    ) {
        let result = self.child(parent, name).and_then(|p| {
            self.control.fail(Op::Store)?;
            std::fs::DirBuilder::new()
                .mode(mode)
                .create(&p)
                .map_err(|e| errno(&e))?;
            self.entry(p)
        });
        match result {
            Ok(attr) => reply.entry(&TTL, &attr, 0),
            Err(e) => reply.error(e),
        }
    }

    fn unlink(&mut self, _req: &Request<'_>, parent: u64, name: &OsStr, reply: ReplyEmpty) {
        match self
            .child(parent, name)
            .and_then(|p| std::fs::remove_file(p).map_err(|e| errno(&e)))
        {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(e),
        }
    }

    fn rmdir(&mut self, _req: &Request<'_>, parent: u64, name: &OsStr, reply: ReplyEmpty) {
        match self
            .child(parent, name)
            .and_then(|p| std::fs::remove_dir(p).map_err(|e| errno(&e)))
        {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(e),
        }
    }

    fn rename(
        &mut self,
        _req: &Request<'_>,
        parent: u64,
        name: &OsStr,
        newparent: u64,
        newname: &OsStr,
        _flags: u32,
        reply: ReplyEmpty,
    ) {
        let result = (|| -> Result<(), i32> {
            let from = self.child(parent, name)?;
            let to = self.child(newparent, newname)?;
            std::fs::rename(&from, &to).map_err(|e| errno(&e))?;
            // Paths under the old name now live under the new one.
            for p in self.paths.values_mut() {
                if let Ok(rest) = p.strip_prefix(&from) {
                    *p = to.join(rest);
                }
            }
            Ok(())
        })();
        match result {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(e),
        }
    }

    fn open(&mut self, _req: &Request<'_>, ino: u64, flags: i32, reply: ReplyOpen) {
        let result = self.path(ino).and_then(|p| {
            let acc = flags & libc::O_ACCMODE;
            OpenOptions::new()
                .read(acc == libc::O_RDONLY || acc == libc::O_RDWR)
                .write(acc == libc::O_WRONLY || acc == libc::O_RDWR)
                .custom_flags(
                    flags & !(libc::O_ACCMODE | libc::O_CREAT | libc::O_EXCL | libc::O_TRUNC),
                )
                .open(p)
                .map_err(|e| errno(&e))
        });
        match result {
            Ok(f) => {
                self.next_fh += 1;
                self.files.insert(self.next_fh, f);
                reply.opened(self.next_fh, 0);
            }
            Err(e) => reply.error(e),
        }
    }

    fn read(
        &mut self,
        _req: &Request<'_>,
        _ino: u64,
        fh: u64,
        offset: i64,
        size: u32,
        _flags: i32,
        _lock_owner: Option<u64>,
        reply: ReplyData,
    ) {
        let Some(f) = self.files.get(&fh) else {
            return reply.error(libc::EBADF);
        };
        let mut buf = vec![0; size as usize];
        let mut got = 0;
        while got < buf.len() {
            match f.read_at(&mut buf[got..], offset as u64 + got as u64) {
                Ok(0) => break,
                Ok(n) => got += n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => return reply.error(errno(&e)),
            }
        }
        reply.data(&buf[..got]);
    }

    fn write(
        &mut self,
        _req: &Request<'_>,
        _ino: u64,
        fh: u64,
        offset: i64,
        data: &[u8],
        _write_flags: u32,
        _flags: i32,
        _lock_owner: Option<u64>,
        reply: ReplyWrite,
    ) {
        let result = (|| -> Result<(), i32> {
            self.control.fail(Op::Store)?;
            let backing = self.backing_ino(fh)?;
            let f = self.files.get(&fh).ok_or(libc::EBADF)?;
            self.control
                .before_change(backing, f, offset as u64, Some(data.len() as u64))
                .map_err(|e| errno(&e))?;
            f.write_all_at(data, offset as u64).map_err(|e| errno(&e))
        })();
        match result {
            Ok(()) => reply.written(data.len() as u32),
            Err(e) => reply.error(e),
        }
    }

    fn flush(&mut self, _req: &Request<'_>, _ino: u64, _fh: u64, _lock: u64, reply: ReplyEmpty) {
        reply.ok();
    }

    fn release(
        &mut self,
        _req: &Request<'_>,
        _ino: u64,
        fh: u64,
        _flags: i32,
        _lock_owner: Option<u64>,
        _flush: bool,
        reply: ReplyEmpty,
    ) {
        self.files.remove(&fh);
        reply.ok();
    }

    fn fsync(&mut self, _req: &Request<'_>, _ino: u64, fh: u64, datasync: bool, reply: ReplyEmpty) {
        let result = self.backing_ino(fh).and_then(|backing| {
            let f = self.files.get(&fh).ok_or(libc::EBADF)?;
            self.sync(f, backing, datasync)
        });
        match result {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(e),
        }
    }

    fn readdir(
        &mut self,
        _req: &Request<'_>,
        ino: u64,
        _fh: u64,
        offset: i64,
        mut reply: ReplyDirectory,
    ) {
        let path = match self.path(ino) {
            Ok(p) => p,
            Err(e) => return reply.error(e),
        };
        let mut entries: Vec<(u64, FileType, std::ffi::OsString)> = vec![
            (ino, FileType::Directory, ".".into()),
            (ino, FileType::Directory, "..".into()),
        ];
        let list = match std::fs::read_dir(&path) {
            Ok(l) => l,
            Err(e) => return reply.error(errno(&e)),
        };
        for e in list.flatten() {
            let Ok(m) = e.metadata() else { continue };
            let kind = if m.is_dir() {
                FileType::Directory
            } else {
                FileType::RegularFile
            };
            entries.push((m.ino(), kind, e.file_name()));
        }
        for (i, (ino, kind, name)) in entries.into_iter().enumerate().skip(offset as usize) {
            if reply.add(ino, i as i64 + 1, kind, name) {
                break;
            }
        }
        reply.ok();
    }

    fn fsyncdir(
        &mut self,
        _req: &Request<'_>,
        ino: u64,
        _fh: u64,
        _datasync: bool,
        reply: ReplyEmpty,
    ) {
        let delay = self.control.fsync_delay();
        if !delay.is_zero() {
            std::thread::sleep(delay);
        }
        match self
            .control
            .fail(Op::Sync)
            .and_then(|()| self.path(ino))
            .and_then(|p| {
                File::open(p)
                    .and_then(|d| d.sync_all())
                    .map_err(|e| errno(&e))
            }) {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(e),
        }
    }

    fn access(&mut self, _req: &Request<'_>, _ino: u64, _mask: i32, reply: ReplyEmpty) {
        reply.ok();
    }

    fn create(
        &mut self,
        _req: &Request<'_>,
        parent: u64,
        name: &OsStr,
        mode: u32,
        _umask: u32,
        flags: i32,
        reply: ReplyCreate,
    ) {
        let result = (|| -> Result<(FileAttr, File), i32> {
            self.control.fail(Op::Store)?;
            let path = self.child(parent, name)?;
            let acc = flags & libc::O_ACCMODE;
            let file = OpenOptions::new()
                .read(acc == libc::O_RDONLY || acc == libc::O_RDWR)
                .write(true)
                .create(true)
                .truncate(false)
                .mode(mode)
                .custom_flags(flags & !(libc::O_ACCMODE | libc::O_CREAT | libc::O_TRUNC))
                .open(&path)
                .map_err(|e| errno(&e))?;
            let m = file.metadata().map_err(|e| errno(&e))?;
            if flags & libc::O_TRUNC != 0 && m.len() > 0 {
                // An existing file cut to nothing: a change to undo.
                self.control
                    .before_change(m.ino(), &file, 0, None)
                    .map_err(|e| errno(&e))?;
                file.set_len(0).map_err(|e| errno(&e))?;
            } else if m.len() == 0 {
                self.control
                    .created(m.ino(), &file)
                    .map_err(|e| errno(&e))?;
            }
            let attr = self.entry(path)?;
            Ok((attr, file))
        })();
        match result {
            Ok((attr, file)) => {
                self.next_fh += 1;
                self.files.insert(self.next_fh, file);
                reply.created(&TTL, &attr, 0, self.next_fh, 0);
            }
            Err(e) => reply.error(e),
        }
    }
}

/// A mounted layer: unmounted on drop.
pub struct Mount {
    /// Its fault controls.
    pub control: Arc<Control>,
    _session: fuser::BackgroundSession,
}

/// Mounts a passthrough of `backing` at `mountpoint` (both created if
/// missing).
pub fn mount(backing: &Path, mountpoint: &Path) -> anyhow::Result<Mount> {
    std::fs::create_dir_all(backing)?;
    std::fs::create_dir_all(mountpoint)?;
    let root = backing.canonicalize()?;
    let control = Arc::new(Control::default());
    let fs = LazyFs {
        paths: HashMap::from([(fuser::FUSE_ROOT_ID, root.clone())]),
        root,
        control: control.clone(),
        files: HashMap::new(),
        next_fh: 0,
    };
    let session = fuser::spawn_mount2(
        fs,
        mountpoint,
        &[MountOption::FSName("raftlock-lazyfs".into())],
    )
    .map_err(|e| {
        anyhow::anyhow!(
            "cannot mount the disk-fault layer at {}: {e} (needs /dev/fuse and root, or \
             fusermount3 from Debian's fuse3)",
            mountpoint.display()
        )
    })?;
    Ok(Mount {
        control,
        _session: session,
    })
}

/// Whether this machine can mount the layer (`/dev/fuse` exists).
pub fn available() -> bool {
    Path::new("/dev/fuse").exists()
}

#[cfg(test)]
mod tests;
