//! The process's own figures, as Prometheus' client libraries name them
//! (`process_cpu_seconds_total`, `process_resident_memory_bytes`, ...), and
//! the data directory's size and free space.
//!
//! Read from `/proc/self` at scrape time, so Linux only: elsewhere
//! [`Process::read`] answers `None` and the series are left out.

use std::fmt::Write as _;
use std::path::Path;

use super::Disk;

/// The process at one moment.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Process {
    /// User and system CPU time, in seconds.
    pub cpu_seconds: f64,
    /// Resident set size, in bytes.
    pub resident_bytes: u64,
    /// Virtual memory size, in bytes.
    pub virtual_bytes: u64,
    /// Open file descriptors.
    pub open_fds: u64,
    /// The soft limit on open file descriptors (`None`: unlimited).
    pub max_fds: Option<u64>,
    /// When the process started, in seconds since the Unix epoch.
    pub start_time_seconds: f64,
    /// Threads.
    pub threads: u64,
}

impl Process {
    /// This process now, or `None` where `/proc` cannot be read.
    pub fn read() -> Option<Process> {
        let ticks = nix::unistd::sysconf(nix::unistd::SysconfVar::CLK_TCK)
            .ok()
            .flatten()
            .filter(|t| *t > 0)? as f64;
        let page = nix::unistd::sysconf(nix::unistd::SysconfVar::PAGE_SIZE)
            .ok()
            .flatten()
            .filter(|p| *p > 0)? as u64;
        let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
        let boot = std::fs::read_to_string("/proc/stat").ok()?;
        let limits = std::fs::read_to_string("/proc/self/limits").ok()?;
        let open_fds = std::fs::read_dir("/proc/self/fd").ok()?.count() as u64;
        let mut p = parse(&stat, &boot, &limits, ticks, page)?;
        p.open_fds = open_fds;
        Some(p)
    }

    /// The series, in the Prometheus text format.
    pub fn render(&self, out: &mut String) {
        let mut series = |name: &str, kind: &str, help: &str, v: String| {
            let _ = writeln!(
                out,
                "# HELP {name} {help}\n# TYPE {name} {kind}\n{name} {v}"
            );
        };
        series(
            "process_cpu_seconds_total",
            "counter",
            "User and system CPU time spent, in seconds.",
            self.cpu_seconds.to_string(),
        );
        series(
            "process_resident_memory_bytes",
            "gauge",
            "Resident memory size in bytes.",
            self.resident_bytes.to_string(),
        );
        series(
            "process_virtual_memory_bytes",
            "gauge",
            "Virtual memory size in bytes.",
            self.virtual_bytes.to_string(),
        );
        series(
            "process_open_fds",
            "gauge",
            "Open file descriptors.",
            self.open_fds.to_string(),
        );
        if let Some(max) = self.max_fds {
            series(
                "process_max_fds",
                "gauge",
                "Most open file descriptors allowed (the soft limit).",
                max.to_string(),
            );
        }
        series(
            "process_start_time_seconds",
            "gauge",
            "Start time of the process since the Unix epoch, in seconds.",
            self.start_time_seconds.to_string(),
        );
        series(
            "process_threads",
            "gauge",
            "Threads of the process.",
            self.threads.to_string(),
        );
    }
}

/// The figures in `/proc/self/stat` (`stat`), `/proc/stat` (`boot`, for
/// the boot time) and `/proc/self/limits` (`limits`), with `ticks` clock
/// ticks a second and `page` bytes a page. `open_fds` is left 0.
fn parse(stat: &str, boot: &str, limits: &str, ticks: f64, page: u64) -> Option<Process> {
    // The command name (field 2) is in parentheses and may hold spaces and
    // parentheses itself: the fields that follow start after the last ')'.
    let rest = &stat[stat.rfind(')')? + 1..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    // `f[0]` is field 3 (state), so field N is `f[N - 3]`.
    let field = |n: usize| -> Option<u64> { f.get(n - 3)?.parse().ok() };
    let (utime, stime) = (field(14)?, field(15)?);
    let threads = field(20)?;
    let start_ticks = field(22)?;
    let virtual_bytes = field(23)?;
    let rss_pages = field(24)?;
    let boot_time: u64 = boot
        .lines()
        .find_map(|l| l.strip_prefix("btime "))?
        .trim()
        .parse()
        .ok()?;
    let max_fds = limits
        .lines()
        .find(|l| l.starts_with("Max open files"))?
        .trim_start_matches("Max open files")
        .split_whitespace()
        .next()
        .and_then(|soft| soft.parse().ok());
    Some(Process {
        cpu_seconds: (utime + stime) as f64 / ticks,
        resident_bytes: rss_pages * page,
        virtual_bytes,
        open_fds: 0,
        max_fds,
        start_time_seconds: boot_time as f64 + start_ticks as f64 / ticks,
        threads,
    })
}

/// The size of the files under `dir` and the space on its file system, or
/// `None` if the file system cannot be asked.
pub fn disk(dir: &Path) -> Option<Disk> {
    let fs = nix::sys::statvfs::statvfs(dir).ok()?;
    let unit = fs.fragment_size() as u64;
    Some(Disk {
        data_bytes: size_of(dir),
        free_bytes: (fs.blocks_available() as u64).saturating_mul(unit),
        size_bytes: (fs.blocks() as u64).saturating_mul(unit),
    })
}

/// Bytes of the regular files under `dir`, not following symbolic links;
/// what cannot be read (a file deleted meanwhile) counts as nothing.
fn size_of(dir: &Path) -> u64 {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return 0;
    };
    entries
        .flatten()
        .map(|e| match e.file_type() {
            Ok(t) if t.is_dir() => size_of(&e.path()),
            Ok(t) if t.is_file() => e.metadata().map_or(0, |m| m.len()),
            _ => 0,
        })
        .sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    const STAT: &str = "4242 (raftlockd (x) y) S 1 4242 4242 0 -1 4194560 3150 0 0 0 \
        250 75 0 0 20 0 9 0 123400 987654321 2500 18446744073709551615 1 1 0 0 0 0 0 \
        4096 17610 0 0 0 17 1 0 0 0 0 0";

    const LIMITS: &str =
        "Limit                     Soft Limit           Hard Limit           Units     \n\
        Max cpu time              unlimited            unlimited            seconds   \n\
        Max open files            1024                 524288               files     \n";

    #[test]
    fn parses_the_proc_files_including_a_name_with_parentheses() {
        let p = parse(STAT, "cpu  1 2 3\nbtime 1700000000\n", LIMITS, 100.0, 4096).expect("parses");
        assert_eq!(
            p,
            Process {
                cpu_seconds: 3.25,
                resident_bytes: 2500 * 4096,
                virtual_bytes: 987654321,
                open_fds: 0,
                max_fds: Some(1024),
                start_time_seconds: 1700000000.0 + 1234.0,
                threads: 9,
            }
        );
        let unlimited = LIMITS.replace("1024                 524288", "unlimited unlimited");
        let p = parse(STAT, "btime 1\n", &unlimited, 100.0, 4096).expect("parses");
        assert_eq!(p.max_fds, None, "an unlimited soft limit has no series");
        assert!(parse("garbage", "btime 1\n", LIMITS, 100.0, 4096).is_none());
        assert!(parse(STAT, "no boot time", LIMITS, 100.0, 4096).is_none());
    }

    #[test]
    fn this_process_and_a_directory_are_read() {
        let p = Process::read().expect("/proc is there on Linux");
        assert!(
            p.resident_bytes > 0 && p.open_fds > 0 && p.threads > 0,
            "{p:?}"
        );
        let mut text = String::new();
        p.render(&mut text);
        assert!(text.contains("\nprocess_open_fds "), "{text}");
        let dir = tempfile::tempdir().expect("dir");
        std::fs::create_dir(dir.path().join("sub")).expect("sub");
        std::fs::write(dir.path().join("a"), [0u8; 1000]).expect("a");
        std::fs::write(dir.path().join("sub/b"), [0u8; 234]).expect("b");
        let d = disk(dir.path()).expect("statvfs");
        assert_eq!(d.data_bytes, 1234);
        assert!(d.size_bytes >= d.free_bytes && d.free_bytes > 0, "{d:?}");
        assert!(disk(&dir.path().join("missing")).is_none());
    }
}
