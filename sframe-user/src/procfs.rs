//! Reading `/proc/PID/maps`.
//!
//! The file's contents come from the kernel but describe a process we do not control:
//! paths may hold any byte but NUL (a newline is shown as `\012` by the kernel), need
//! not be UTF-8, and a process may have tens of thousands of mappings with long names.
//! Parsing works on bytes, never panics and reports the bad line; a path that is not
//! UTF-8 is kept as bytes (for opening) and shown lossily (never dropped: a process
//! cannot hide behind such a name). The profiler reads only the executable mappings
//! ([`read_executable_maps`]), a line at a time, keeping at most a fixed number.

use std::path::PathBuf;

/// One line of `/proc/PID/maps`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Mapping {
    /// Start address of the mapping (inclusive).
    pub start: u64,
    /// End address of the mapping (exclusive).
    pub end: u64,
    /// Readable (`r` in the permissions).
    pub readable: bool,
    /// Writable (`w` in the permissions).
    pub writable: bool,
    /// Executable (`x` in the permissions).
    pub executable: bool,
    /// `MAP_SHARED` (`s` in the permissions), else private (`p`).
    pub shared: bool,
    /// File offset of `start`.
    pub offset: u64,
    /// Major number of the device holding the file (0 for anonymous memory).
    pub dev_major: u32,
    /// Minor number of the device holding the file.
    pub dev_minor: u32,
    /// Inode of the file (0 for anonymous memory and pseudo-regions).
    pub inode: u64,
    /// Path or pseudo-name (`[vdso]`, `[stack]`); empty for anonymous memory. A deleted
    /// file keeps its path with a ` (deleted)` suffix. Bytes that are not UTF-8 are
    /// shown as U+FFFD here; [`Mapping::path_bytes`] has them as they are.
    pub path: String,
    /// The path's bytes when they are not UTF-8 (else `path` is exact).
    pub raw_path: Option<Box<[u8]>>,
}

impl Mapping {
    /// The path exactly as the kernel shows it.
    pub fn path_bytes(&self) -> &[u8] {
        self.raw_path.as_deref().unwrap_or(self.path.as_bytes())
    }

    /// The path of a mapped file that still has it: `None` when the file was deleted
    /// (the path now names another file or none) or the name is not absolute.
    pub fn live_path(&self) -> Option<&[u8]> {
        let p = self.path_bytes();
        (!p.ends_with(b" (deleted)") && p.starts_with(b"/")).then_some(p)
    }

    /// True for mappings of a file (not anonymous memory nor `[pseudo]` regions).
    pub fn is_file(&self) -> bool {
        self.inode != 0 && self.path.starts_with('/')
    }
}

/// Why `/proc/PID/maps` could not be read.
#[derive(Debug, thiserror::Error)]
pub enum MapsError {
    /// The file could not be opened or read.
    #[error("reading {path}: {source}")]
    Io {
        /// The file's path.
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// A line could not be parsed.
    #[error("{path}: line {line}: malformed {field}")]
    Malformed {
        /// The file's path.
        path: PathBuf,
        /// The line's number (1-based).
        line: usize,
        /// The field that could not be parsed (e.g. `"permissions"`).
        field: &'static str,
    },
}

/// Reads and parses `/proc/PID/maps` (all mappings; for tools and tests).
pub fn read_maps(pid: u32) -> Result<Vec<Mapping>, MapsError> {
    read_maps_where(pid, |_| true, usize::MAX)
}

/// Most executable mappings [`read_executable_maps`] keeps (the kernel's mapping table
/// holds fewer; the rest are counted, not kept).
pub const MAX_EXECUTABLE_MAPPINGS: usize = 4 * sframe_common::budget::MAX_MAPPINGS;

/// The executable mappings of `pid`, at most [`MAX_EXECUTABLE_MAPPINGS`], read a line
/// at a time: memory stays bounded whatever the process maps. Past the bound, each
/// distinct part of a file is kept before further copies of one (by address then).
pub fn read_executable_maps(pid: u32) -> Result<Vec<Mapping>, MapsError> {
    read_maps_where(
        pid,
        |perms| perms.get(2) == Some(&b'x'),
        MAX_EXECUTABLE_MAPPINGS,
    )
}

/// The read-only, shared, not executable mappings (`r--s`) of `pid`, at most `limit`.
pub fn read_shared_read_only_maps(pid: u32, limit: usize) -> Result<Vec<Mapping>, MapsError> {
    read_maps_where(pid, |perms| perms.get(..4) == Some(b"r--s"), limit)
}

/// Longest line kept (the kernel bounds a path by PATH_MAX; anything longer is not a
/// line of the kernel's and is an error).
const MAX_LINE: usize = 4096 + 256;

fn read_maps_where(
    pid: u32,
    keep: impl Fn(&[u8]) -> bool,
    limit: usize,
) -> Result<Vec<Mapping>, MapsError> {
    use std::io::{BufRead as _, Read as _};
    let path = PathBuf::from(format!("/proc/{pid}/maps"));
    let io = |source| MapsError::Io {
        path: path.clone(),
        source,
    };
    let file = std::fs::File::open(&path).map_err(io)?;
    let mut reader = std::io::BufReader::with_capacity(64 * 1024, file);
    let mut line = Vec::with_capacity(256);
    let mut out = Vec::new();
    let mut number = 0;
    // Past `limit`, which mappings are kept: each distinct part of a file (device, inode,
    // offset) before further copies of one (any user can map one page thousands of
    // times, and would otherwise push the libraries its code runs in out of what is
    // read, wherever it put them). Copies among those kept (their indexes), to be
    // replaced by parts not kept yet.
    let mut parts = std::collections::HashSet::new();
    let mut copies = Vec::new();
    let mut replaced = false;
    loop {
        line.clear();
        let n = std::io::Read::by_ref(&mut reader)
            .take(MAX_LINE as u64 + 1)
            .read_until(b'\n', &mut line)
            .map_err(io)?;
        if n == 0 {
            break;
        }
        number += 1;
        let malformed = |field| MapsError::Malformed {
            path: path.clone(),
            line: number,
            field,
        };
        if !line.ends_with(b"\n") && line.len() > MAX_LINE {
            return Err(malformed("length"));
        }
        let text = line.strip_suffix(b"\n").unwrap_or(&line);
        if text.trim_ascii().is_empty() {
            continue;
        }
        // Cheap filter before the full parse: the permissions are the second field.
        let second = text.split(|&b| b == b' ').filter(|f| !f.is_empty()).nth(1);
        if !second.is_some_and(&keep) {
            continue;
        }
        let m = parse_line(text).map_err(malformed)?;
        let part = (m.dev_major, m.dev_minor, m.inode, m.offset);
        if limit == usize::MAX {
            // Unbounded (tools, tests): every mapping is kept, no choice to make.
            out.push(m);
        } else if out.len() < limit {
            if !parts.insert(part) {
                copies.push(out.len());
            }
            out.push(m);
        } else if !parts.contains(&part)
            && let Some(slot) = copies.pop().and_then(|i| out.get_mut(i))
        {
            // Past the bound, a part of a file not kept yet takes the place of a copy.
            parts.insert(part);
            *slot = m;
            replaced = true;
        }
    }
    if replaced {
        out.sort_by_key(|m| m.start);
    }
    Ok(out)
}

/// Parses the text of a maps file; on error returns the 1-based line and the field.
pub fn parse_maps(text: &str) -> Result<Vec<Mapping>, (usize, &'static str)> {
    parse_maps_bytes(text.as_bytes())
}

/// Parses the bytes of a maps file; on error returns the 1-based line and the field.
pub fn parse_maps_bytes(text: &[u8]) -> Result<Vec<Mapping>, (usize, &'static str)> {
    text.split(|&b| b == b'\n')
        .enumerate()
        .filter(|(_, l)| !l.trim_ascii().is_empty())
        .map(|(i, l)| parse_line(l).map_err(|field| (i + 1, field)))
        .collect()
}

/// `b` without its leading spaces (only spaces: a path may begin with other whitespace).
fn skip_spaces(b: &[u8]) -> &[u8] {
    let n = b.iter().take_while(|&&c| c == b' ').count();
    b.get(n..).unwrap_or_default()
}

fn parse_line(line: &[u8]) -> Result<Mapping, &'static str> {
    let mut rest = line;
    let mut field = |name: &'static str| -> Result<&str, &'static str> {
        let trimmed = skip_spaces(rest);
        let end = trimmed
            .iter()
            .position(|&b| b == b' ')
            .unwrap_or(trimmed.len());
        let (f, r) = trimmed.split_at(end);
        rest = r;
        if f.is_empty() {
            return Err(name);
        }
        std::str::from_utf8(f).map_err(|_| name)
    };
    let range = field("address range")?;
    let perms = field("permissions")?;
    let offset = field("offset")?;
    let dev = field("device")?;
    let inode = field("inode")?;
    let raw = skip_spaces(rest);
    let (path, raw_path) = match std::str::from_utf8(raw) {
        Ok(p) => (p.to_owned(), None),
        Err(_) => (
            String::from_utf8_lossy(raw).into_owned(),
            Some(raw.to_vec().into_boxed_slice()),
        ),
    };

    let (start, end) = range.split_once('-').ok_or("address range")?;
    let start = u64::from_str_radix(start, 16).map_err(|_| "start address")?;
    let end = u64::from_str_radix(end, 16).map_err(|_| "end address")?;
    if end < start {
        return Err("address range");
    }
    let Some(&[r, w, x, s]) = perms.as_bytes().first_chunk::<4>() else {
        return Err("permissions");
    };
    let (major, minor) = dev.split_once(':').ok_or("device")?;
    Ok(Mapping {
        start,
        end,
        readable: r == b'r',
        writable: w == b'w',
        executable: x == b'x',
        shared: s == b's',
        offset: u64::from_str_radix(offset, 16).map_err(|_| "offset")?,
        dev_major: u32::from_str_radix(major, 16).map_err(|_| "device")?,
        dev_minor: u32::from_str_radix(minor, 16).map_err(|_| "device")?,
        inode: inode.parse().map_err(|_| "inode")?,
        path,
        raw_path,
    })
}

/// The thread-group id of task `id` (`Tgid:` of `/proc/ID/status`): equal to `id` for
/// a process, different for a thread; `None` when the task does not exist.
pub fn thread_group_id(id: u32) -> Option<u32> {
    let status = std::fs::read_to_string(format!("/proc/{id}/status")).ok()?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("Tgid:"))
        .and_then(|v| v.trim().parse().ok())
}

/// The mapping containing `addr`, if any.
pub fn find(maps: &[Mapping], addr: u64) -> Option<&Mapping> {
    maps.iter().find(|m| m.start <= addr && addr < m.end)
}

/// glibc's `major()`/`minor()` of a `dev_t`, as `/proc/PID/maps` prints them.
pub fn dev_major_minor(dev: u64) -> (u32, u32) {
    let major = ((dev >> 32) & 0xffff_f000) | ((dev >> 8) & 0x0000_0fff);
    let minor = ((dev >> 12) & 0xffff_ff00) | (dev & 0x0000_00ff);
    (major as u32, minor as u32)
}

/// The command name of process `pid` (`/proc/PID/comm`), if it exists: raw, for
/// matching `--comm`; bytes that are not UTF-8 become U+FFFD (a process cannot hide
/// behind an invalid name). Outputs pass it through [`crate::sanitize::name`].
pub fn comm(pid: u32) -> Option<String> {
    let bytes = std::fs::read(format!("/proc/{pid}/comm")).ok()?;
    let bytes = bytes.strip_suffix(b"\n").unwrap_or(&bytes);
    Some(String::from_utf8_lossy(bytes).into_owned())
}

/// The pid of `pid` in its own (innermost) PID namespace (`NSpid:` of
/// `/proc/PID/status`), when that differs from `pid`.
pub fn namespace_pid(pid: u32) -> Option<u32> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let ns = status
        .lines()
        .find_map(|l| l.strip_prefix("NSpid:"))?
        .split_whitespace()
        .last()?
        .parse()
        .ok()?;
    (ns != pid).then_some(ns)
}

/// The effective and file-system user ids of `pid` (`Uid:` of `/proc/PID/status`, as
/// the profiler's user namespace sees them).
pub fn effective_uids(pid: u32) -> Option<[u32; 2]> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let mut ids = status
        .lines()
        .find_map(|l| l.strip_prefix("Uid:"))?
        .split_whitespace()
        .map(str::parse::<u32>);
    let _real = ids.next()?.ok()?;
    let effective = ids.next()?.ok()?;
    let _saved = ids.next()?.ok()?;
    let fs = ids.next()?.ok()?;
    Some([effective, fs])
}

/// When `pid` started, as wall-clock time (its `starttime` in `/proc/PID/stat`, clock
/// ticks since boot, placed on the real-time clock by the boot-time clock read now;
/// within a tick, 10 ms).
pub fn start_time(pid: u32) -> Option<std::time::SystemTime> {
    let stat = std::fs::read(format!("/proc/{pid}/stat")).ok()?;
    let close = stat.iter().rposition(|&b| b == b')')?;
    let rest = std::str::from_utf8(stat.get(close + 2..)?).ok()?;
    // Fields after the command name: state is the 3rd of the line, starttime the 22nd.
    let ticks: u64 = rest.split_ascii_whitespace().nth(19)?.parse().ok()?;
    // SAFETY: sysconf(3) has no preconditions.
    let hz = u64::try_from(unsafe { libc::sysconf(libc::_SC_CLK_TCK) }).ok()?;
    if hz == 0 {
        return None;
    }
    let since_boot = std::time::Duration::from_secs(ticks / hz)
        + std::time::Duration::from_nanos((ticks % hz) * 1_000_000_000 / hz);
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime(2) writes the timespec passed.
    if unsafe { libc::clock_gettime(libc::CLOCK_BOOTTIME, &mut ts) } != 0 {
        return None;
    }
    let boot_now = std::time::Duration::new(
        u64::try_from(ts.tv_sec).ok()?,
        u32::try_from(ts.tv_nsec).ok()?,
    );
    let ago = boot_now.checked_sub(since_boot)?;
    std::time::SystemTime::now().checked_sub(ago)
}

/// Every process of the system now (thread-group ids under `/proc`).
pub fn all_pids() -> Vec<u32> {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
        .collect()
}

/// The state letter of `/proc/PID/stat` (`R`, `S`, `D`, `Z`, …), `None` when the
/// process is gone. It follows the command name, which ends at the last `)`.
pub fn state(pid: u32) -> Option<u8> {
    let stat = std::fs::read(format!("/proc/{pid}/stat")).ok()?;
    let close = stat.iter().rposition(|&b| b == b')')?;
    stat.get(close + 2).copied()
}

/// What one read of `/proc/PID/stat` says of a process.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Liveness {
    /// The process does not exist (`/proc/PID/stat` cannot be read).
    Gone,
    /// Exited, not reaped yet (`Z` or `X`): `/proc/PID` is there, its mappings are not.
    Zombie,
    /// The process exists and is not a zombie.
    Alive,
}

/// Whether process `pid` is alive, a zombie or gone, from one read of
/// `/proc/PID/stat`.
pub fn liveness(pid: u32) -> Liveness {
    match state(pid) {
        None => Liveness::Gone,
        Some(b'Z' | b'X') => Liveness::Zombie,
        Some(_) => Liveness::Alive,
    }
}

/// Whether process `pid` exists and is not a zombie (`/proc/PID/stat` state `Z` or
/// `X`): a live process whose maps read empty is in the middle of an exec.
pub fn alive_not_zombie(pid: u32) -> bool {
    liveness(pid) == Liveness::Alive
}

/// Whether `/proc/PID` exists (a zombie still has it, with no mappings).
pub fn exists(pid: u32) -> bool {
    std::path::Path::new(&format!("/proc/{pid}")).exists()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Tests that map into this process or compare two reads of its maps run one at a
    /// time.
    static OWN_MAPS: std::sync::Mutex<()> = std::sync::Mutex::new(());

    #[test]
    fn copies_of_one_page_do_not_push_libraries_out_of_what_is_read() {
        let _own = OWN_MAPS.lock().unwrap_or_else(|e| e.into_inner());
        // More executable copies of one page of a file than are read, placed by the
        // kernel below the C library (top-down): the library is still read.
        let path = std::env::temp_dir().join(format!("procfs-copies-{}-page", std::process::id()));
        std::fs::write(&path, [0u8; 4096]).unwrap();
        let file = std::fs::File::open(&path).unwrap();
        std::fs::remove_file(&path).unwrap();
        let fd = std::os::fd::AsRawFd::as_raw_fd(&file);
        let mut maps = Vec::new();
        for _ in 0..MAX_EXECUTABLE_MAPPINGS + 100 {
            // SAFETY: a new private read-only mapping of a file we opened; unmapped below.
            let p = unsafe {
                libc::mmap(
                    std::ptr::null_mut(),
                    4096,
                    libc::PROT_READ | libc::PROT_EXEC,
                    libc::MAP_PRIVATE,
                    fd,
                    0,
                )
            };
            assert_ne!(p, libc::MAP_FAILED);
            maps.push(p);
        }
        let read = read_executable_maps(std::process::id());
        for p in maps {
            // SAFETY: mapped above, 4096 bytes.
            unsafe { libc::munmap(p, 4096) };
        }
        let read = read.unwrap();
        assert_eq!(read.len(), MAX_EXECUTABLE_MAPPINGS);
        assert!(read.windows(2).all(|w| w[0].start < w[1].start), "sorted");
        assert!(
            read.iter().any(|m| m.path.contains("libc.so")),
            "the C library was pushed out"
        );
        assert!(read.iter().any(|m| m.path.contains("-page")));
    }

    #[test]
    fn parses_file_anonymous_and_pseudo_lines() {
        let text = "\
5581f1a00000-5581f1a28000 r-xp 00002000 fe:01 1835019                    /usr/bin/cat with spaces
7ffd1c3e1000-7ffd1c402000 rw-p 00000000 00:00 0                          [stack]
7f0000000000-7f0000001000 rw-p 00000000 00:00 0
";
        let maps = parse_maps(text).unwrap();
        assert_eq!(maps.len(), 3);
        assert_eq!(maps[0].start, 0x5581f1a00000);
        assert!(maps[0].executable && !maps[0].writable);
        assert_eq!(maps[0].offset, 0x2000);
        assert_eq!((maps[0].dev_major, maps[0].dev_minor), (0xfe, 1));
        assert_eq!(maps[0].path, "/usr/bin/cat with spaces");
        assert!(maps[0].is_file());
        assert_eq!(maps[1].path, "[stack]");
        assert!(!maps[1].is_file());
        assert_eq!(maps[2].path, "");
        assert_eq!(find(&maps, 0x5581f1a00010).map(|m| m.inode), Some(1835019));
        assert!(find(&maps, 0x10).is_none());
    }

    #[test]
    fn only_spaces_separate_fields_a_path_keeps_other_leading_whitespace() {
        let m = parse_line(b"1000-2000 r-xs 00000000 08:01 7   \t/tmp/tab").unwrap();
        assert_eq!(m.path, "\t/tmp/tab");
        assert!(m.readable && m.executable && m.shared && !m.writable);
    }

    #[test]
    fn malformed_lines_are_errors_not_panics() {
        for (text, field) in [
            ("zzzz-1000 r-xp 0 00:00 0 x", "start address"),
            ("2000-1000 r-xp 0 00:00 0 x", "address range"),
            ("1000-2000 r 0 00:00 0 x", "permissions"),
            ("1000-2000 r-xp 0 0000 0 x", "device"),
            ("1000-2000 r-xp 0 00:00 abc x", "inode"),
            ("1000-2000", "permissions"),
        ] {
            let err = parse_maps(text).unwrap_err();
            assert_eq!(err, (1, field), "{text:?}");
        }
        let second_line = "1000-2000 r-xp 0 00:00 0 /x\nok";
        assert_eq!(parse_maps(second_line).unwrap_err(), (2, "permissions"));
    }

    #[test]
    fn paths_that_are_not_utf8_are_kept_as_bytes() {
        let text = b"1000-2000 r-xp 00000000 fe:01 42 /tmp/vict\xff ok\n";
        let maps = parse_maps_bytes(text).unwrap();
        assert_eq!(maps[0].path, "/tmp/vict\u{fffd} ok");
        assert_eq!(maps[0].path_bytes(), b"/tmp/vict\xff ok");
        assert_eq!(maps[0].live_path(), Some(&b"/tmp/vict\xff ok"[..]));
        assert!(maps[0].is_file());
        let deleted = parse_maps_bytes(b"1000-2000 r-xp 0 fe:01 42 /x (deleted)").unwrap();
        assert_eq!(deleted[0].live_path(), None);
    }

    #[test]
    fn reads_own_executable_maps() {
        let _own = OWN_MAPS.lock().unwrap_or_else(|e| e.into_inner());
        let all = read_maps(std::process::id()).unwrap();
        let exec = read_executable_maps(std::process::id()).unwrap();
        assert!(!exec.is_empty() && exec.iter().all(|m| m.executable));
        let expected: Vec<_> = all.into_iter().filter(|m| m.executable).collect();
        // The maps may change between the two reads only by this test's threads.
        assert_eq!(exec.len(), expected.len());
    }

    #[test]
    fn a_zombie_is_told_from_a_live_process() {
        assert!(alive_not_zombie(std::process::id()));
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let pid = child.id();
        // Exited, not reaped: a zombie.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
        while alive_not_zombie(pid) && std::time::Instant::now() < deadline {
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        assert!(!alive_not_zombie(pid));
        child.wait().unwrap();
        assert!(!alive_not_zombie(pid));
    }

    #[test]
    fn reads_own_maps() {
        let maps = read_maps(std::process::id()).unwrap();
        let here = reads_own_maps as *const () as u64;
        let m = find(&maps, here).expect("own code is mapped");
        assert!(m.executable);
    }
}
