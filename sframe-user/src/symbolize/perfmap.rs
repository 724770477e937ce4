//! Names of JIT-compiled code from perf maps (`/tmp/perf-PID.map`).
//!
//! JITs that follow perf's convention — V8 (`--perf-basic-prof`), HotSpot
//! (`-XX:+DumpPerfMapAtExit`, `jcmd PID Compiler.perfmap`), CPython ≥ 3.12 (`-X perf`),
//! .NET (`DOTNET_PerfMapEnabled=1`), LuaJIT, Wasmtime — write one line per code object,
//! `START SIZE NAME` (hexadecimal, `0x` optional), to `/tmp/perf-PID.map` in their own
//! mount namespace, named by their pid in their own PID namespace, and append as they
//! compile. A frame in anonymous executable memory (or in memory the last read of the
//! process's mappings did not have yet) is named from that file.
//!
//! The file is any user's to write, so it is read under the threat model:
//! - The process's root directory is held open (`O_PATH`) from when the process is first
//!   seen with anonymous executable memory, and the map is opened inside it with
//!   `openat2(RESOLVE_IN_ROOT | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS)`: no link is
//!   followed, and a container's `/tmp` is its own. Held open, the root still serves
//!   after the process exits (HotSpot writes its map at exit).
//! - Only a regular file, opened without blocking on a FIFO, owned by the process's
//!   effective or file-system user or by root: another user's file is never taken for
//!   the process's.
//! - A file last written before the process started belongs to an earlier process with
//!   the same pid and is not used.
//! - Bounded: lines of at most [`MAX_LINE`] bytes, at most [`MAX_READ_PER_REFRESH`]
//!   bytes read per refresh and [`MAX_READ_PER_USER_INTERVAL`] per user and
//!   [`REFRESH_INTERVAL`], a refresh (an open and a `stat` when nothing was appended) at
//!   most every [`REFRESH_INTERVAL`] per map, when it is used, [`MAX_ENTRIES`] entries and
//!   [`MAX_KEPT_PER_MAP`] bytes kept per map, [`MAX_KEPT_PER_USER`] for the maps of one
//!   user's processes and [`MAX_KEPT_TOTAL`] in all, and [`MAX_MAPS_PER_USER`] of
//!   [`MAX_MAPS`] maps (each holds one descriptor): one user's processes cannot take the
//!   room of another's.
//! - Names pass [`crate::sanitize::name`].
//!
//! A code object written again at an address replaces every entry it overlaps (the JIT
//! reused that memory), so the entries kept follow the code alive, not the history.

use std::{
    collections::{BTreeMap, HashMap},
    fs::File,
    io::{BufRead as _, BufReader, Read as _, Seek as _, SeekFrom},
    os::{
        fd::{AsFd as _, OwnedFd},
        unix::fs::MetadataExt as _,
    },
    path::PathBuf,
    sync::{Arc, Mutex, MutexGuard, PoisonError},
    time::{Duration, Instant, SystemTime},
};

use crate::procfs::Mapping;

/// Longest line read, in bytes (a name of [`crate::sanitize::MAX_NAME_CHARS`]
/// characters and two numbers); longer lines are skipped.
pub const MAX_LINE: usize = 4096 + 64;
/// Most bytes of a map read by one refresh (the rest is read by the next ones).
pub const MAX_READ_PER_REFRESH: u64 = 4 << 20;
/// Least time between two refreshes of one map.
pub const REFRESH_INTERVAL: Duration = Duration::from_secs(1);
/// Most entries kept per map.
pub const MAX_ENTRIES: usize = 1 << 18;
/// Most bytes kept per map (entries and names).
pub const MAX_KEPT_PER_MAP: u64 = 16 << 20;
/// Most bytes kept by the maps of the processes of one user.
pub const MAX_KEPT_PER_USER: u64 = 16 << 20;
/// Most bytes kept by all maps.
pub const MAX_KEPT_TOTAL: u64 = 64 << 20;
/// Most maps held at once (each holds its process's root directory open).
pub const MAX_MAPS: usize = 1024;
/// Most maps held at once for the processes of one user.
pub const MAX_MAPS_PER_USER: usize = MAX_MAPS / 4;
/// Most bytes read from the maps of one user's processes per [`REFRESH_INTERVAL`].
pub const MAX_READ_PER_USER_INTERVAL: u64 = 8 << 20;

/// What an entry costs besides its name (tree node share, bounds, the name's box).
const ENTRY_OVERHEAD: u64 = 64;

/// The object name of frames named from a perf map.
pub const JIT_OBJECT: &str = "[jit]";

/// The maps held and the bytes they keep, per user and in all; bytes read this interval.
#[derive(Default)]
struct Usage {
    maps: usize,
    maps_by_user: HashMap<u32, usize>,
    kept: u64,
    kept_by_user: HashMap<u32, u64>,
    interval_start: Option<Instant>,
    read_by_user: HashMap<u32, u64>,
}

static USAGE: Mutex<Option<Usage>> = Mutex::new(None);

fn usage() -> MutexGuard<'static, Option<Usage>> {
    USAGE.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Bytes held by all maps now (for the profiler's metrics and tests).
pub fn kept_bytes() -> u64 {
    usage().as_ref().map_or(0, |u| u.kept)
}

/// Maps held now.
pub fn maps_held() -> usize {
    usage().as_ref().map_or(0, |u| u.maps)
}

/// The perf map of one process: where to read it and what was read.
pub struct PerfMap {
    pid: u32,
    /// `/tmp/perf-NSPID.map`, as the process names it.
    path: String,
    /// The process's root directory.
    root: OwnedFd,
    /// When the process started: a map last written before is an earlier process's.
    started: SystemTime,
    /// The process's effective and file-system user ids (owners accepted, with root).
    uids: [u32; 2],
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    /// Start → entry; entries never overlap.
    entries: BTreeMap<u64, Entry>,
    /// The file read so far (device, inode): another file starts over.
    file: Option<(u64, u64)>,
    /// Bytes of the file consumed (whole lines).
    offset: u64,
    /// Bytes kept (entries and names), counted in [`USAGE`].
    kept: u64,
    last_refresh: Option<Instant>,
    /// Why entries stopped being added (a bound reached), if they did.
    full: Option<&'static str>,
    /// Why the last refresh read nothing, if it did not.
    unread: Option<String>,
    /// Skipping the rest of a line longer than [`MAX_LINE`].
    skipping: bool,
}

struct Entry {
    end: u64,
    name: Box<str>,
}

impl Entry {
    fn cost(&self) -> u64 {
        ENTRY_OVERHEAD + self.name.len() as u64
    }
}

impl std::fmt::Debug for PerfMap {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let state = self.state();
        f.debug_struct("PerfMap")
            .field("pid", &self.pid)
            .field("path", &self.path)
            .field("entries", &state.entries.len())
            .field("offset", &state.offset)
            .finish()
    }
}

impl Drop for PerfMap {
    fn drop(&mut self) {
        let kept = std::mem::take(&mut self.state().kept);
        let mut guard = usage();
        let u = guard.get_or_insert_with(Usage::default);
        u.maps = u.maps.saturating_sub(1);
        release(&mut u.maps_by_user, self.uids[0], 1);
        u.kept = u.kept.saturating_sub(kept);
        release(&mut u.kept_by_user, self.uids[0], kept);
    }
}

fn release<T: Copy + PartialOrd + std::ops::Sub<Output = T> + Default>(
    by_user: &mut HashMap<u32, T>,
    uid: u32,
    amount: T,
) {
    if let Some(v) = by_user.get_mut(&uid) {
        if *v > amount {
            *v = *v - amount;
        } else {
            by_user.remove(&uid);
        }
    }
}

/// Whether a mapping holds code that only a perf map can name: executable memory that is
/// not a file's, nor the kernel's (`[vdso]`, `[vsyscall]`, `[uprobes]`).
pub fn is_jit_mapping(m: &Mapping) -> bool {
    m.executable
        && !m.is_file()
        && !matches!(m.path.as_str(), "[vdso]" | "[vsyscall]" | "[uprobes]")
}

/// Why a process has no [`PerfMap`].
#[derive(Debug, thiserror::Error)]
pub enum PerfMapError {
    #[error("pid {0}: gone")]
    Gone(u32),
    #[error("pid {pid}: its root directory: {source}")]
    Root {
        pid: u32,
        #[source]
        source: crate::safe_open::OpenError,
    },
    #[error("{0} perf maps held, the most for all users")]
    TooMany(usize),
    #[error("{0} perf maps held for user {1}, the most for one user")]
    TooManyForUser(usize, u32),
}

impl PerfMap {
    /// The perf map of process `pid` (`ns_pid` in its own PID namespace, when it
    /// differs), if it maps anonymous executable memory; nothing is read yet.
    pub fn for_process(
        pid: u32,
        ns_pid: Option<u32>,
        maps: &[Mapping],
    ) -> Option<Result<Arc<Self>, PerfMapError>> {
        maps.iter()
            .any(is_jit_mapping)
            .then(|| Self::open(pid, ns_pid).map(Arc::new))
    }

    /// The perf map of process `pid`, whatever it maps.
    pub fn open(pid: u32, ns_pid: Option<u32>) -> Result<Self, PerfMapError> {
        let uids = crate::procfs::effective_uids(pid).ok_or(PerfMapError::Gone(pid))?;
        let started = crate::procfs::start_time(pid).ok_or(PerfMapError::Gone(pid))?;
        let root = crate::safe_open::open_process_root(pid)
            .map_err(|source| PerfMapError::Root { pid, source })?;
        // The process read above is the one whose root is held (not a later one with
        // its pid).
        if crate::procfs::start_time(pid).is_none_or(|again| {
            again.duration_since(started).unwrap_or_default() > Duration::from_millis(20)
        }) {
            return Err(PerfMapError::Gone(pid));
        }
        {
            let mut guard = usage();
            let u = guard.get_or_insert_with(Usage::default);
            if u.maps >= MAX_MAPS {
                return Err(PerfMapError::TooMany(u.maps));
            }
            let mine = u.maps_by_user.entry(uids[0]).or_default();
            if *mine >= MAX_MAPS_PER_USER {
                return Err(PerfMapError::TooManyForUser(*mine, uids[0]));
            }
            *mine += 1;
            u.maps += 1;
        }
        Ok(Self {
            pid,
            path: format!("/tmp/perf-{}.map", ns_pid.unwrap_or(pid)),
            root,
            started,
            uids,
            state: Mutex::new(State::default()),
        })
    }

    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Entries kept now.
    pub fn entries(&self) -> usize {
        self.state().entries.len()
    }

    /// Why names are missing, if the map could not be read or stopped growing.
    pub fn problem(&self) -> Option<String> {
        let state = self.state();
        state
            .unread
            .clone()
            .or_else(|| state.full.map(str::to_owned))
    }

    /// The name of the code at `addr` and the start of its code object, first reading
    /// what the JIT appended if the map was not read within [`REFRESH_INTERVAL`].
    pub fn lookup(&self, addr: u64) -> Option<(String, u64)> {
        let mut state = self.state();
        let due = state
            .last_refresh
            .is_none_or(|at| at.elapsed() >= REFRESH_INTERVAL);
        if !due {
            return state.find(addr);
        }
        // Read again even when `addr` is known: the JIT may have put other code there
        // since (its line comes later in the map and replaces the entry).
        state.last_refresh = Some(Instant::now());
        match self.refresh(&mut state) {
            Ok(()) => state.unread = None,
            Err(why) => {
                log::debug!("pid {}: perf map {}: {why}", self.pid, self.path);
                state.unread = Some(why);
            }
        }
        state.find(addr)
    }

    /// Reads what was appended to the map since the last refresh, within the bounds.
    fn refresh(&self, state: &mut State) -> Result<(), String> {
        let shown = PathBuf::from(format!("/proc/{}/root{}", self.pid, self.path));
        let (file, meta) =
            crate::safe_open::open_in_root_no_links(self.root.as_fd(), &self.path, &shown)
                .map_err(|e| e.to_string())?;
        if meta.uid() != 0 && !self.uids.contains(&meta.uid()) {
            return Err(format!(
                "owned by user {}, not the process's ({}) nor root: not used",
                meta.uid(),
                self.uids[0]
            ));
        }
        // The clock of a file's times and of the start time differ by up to a tick.
        let written = meta.modified().map_err(|e| e.to_string())?;
        if written + Duration::from_millis(20) < self.started {
            return Err(
                "last written before the process started (an earlier process's): not used".into(),
            );
        }
        let identity = (meta.dev(), meta.ino());
        if state.file != Some(identity) || meta.size() < state.offset {
            // Another file, or truncated: start over.
            self.clear(state);
            state.file = Some(identity);
        }
        if state.full.is_some() || meta.size() <= state.offset {
            return Ok(());
        }
        let budget = {
            let mut guard = usage();
            let u = guard.get_or_insert_with(Usage::default);
            if u.interval_start
                .is_none_or(|at| at.elapsed() >= REFRESH_INTERVAL)
            {
                u.interval_start = Some(Instant::now());
                u.read_by_user.clear();
            }
            let read = u.read_by_user.entry(self.uids[0]).or_default();
            let budget = MAX_READ_PER_USER_INTERVAL
                .saturating_sub(*read)
                .min(MAX_READ_PER_REFRESH)
                .min(meta.size() - state.offset);
            *read += budget;
            budget
        };
        if budget == 0 {
            return Err("the read budget of this user's perf maps is spent this second".into());
        }
        self.read(state, file, budget).map_err(|e| e.to_string())
    }

    fn read(&self, state: &mut State, mut file: File, budget: u64) -> std::io::Result<()> {
        file.seek(SeekFrom::Start(state.offset))?;
        let mut reader = BufReader::with_capacity(64 * 1024, file.take(budget));
        let mut line = Vec::with_capacity(256);
        loop {
            line.clear();
            let n = (&mut reader)
                .take(MAX_LINE as u64 + 1)
                .read_until(b'\n', &mut line)?;
            if n == 0 {
                return Ok(());
            }
            let whole = line.last() == Some(&b'\n');
            if !whole && line.len() <= MAX_LINE {
                // The JIT is writing this line (or the budget ends in it): read it next time.
                return Ok(());
            }
            state.offset += n as u64;
            let skipped = std::mem::replace(&mut state.skipping, !whole);
            if skipped || !whole {
                continue;
            }
            if let Some((start, entry)) = parse_line(&line)
                && let Err(full) = self.insert(state, start, entry)
            {
                state.full = Some(full);
                return Ok(());
            }
        }
    }

    /// Adds an entry, removing those it overlaps.
    fn insert(&self, state: &mut State, start: u64, entry: Entry) -> Result<(), &'static str> {
        let mut freed = 0;
        let overlapped: Vec<u64> = state
            .entries
            .range(..entry.end)
            .rev()
            .take_while(|(_, e)| e.end > start)
            .map(|(&s, _)| s)
            .collect();
        for s in overlapped {
            if let Some(old) = state.entries.remove(&s) {
                freed += old.cost();
            }
        }
        let cost = entry.cost();
        let uid = self.uids[0];
        let mut guard = usage();
        let u = guard.get_or_insert_with(Usage::default);
        u.kept = u.kept.saturating_sub(freed);
        release(&mut u.kept_by_user, uid, freed);
        state.kept = state.kept.saturating_sub(freed);
        let mine = u.kept_by_user.get(&uid).copied().unwrap_or(0);
        if state.entries.len() >= MAX_ENTRIES {
            return Err("the most entries one perf map keeps");
        }
        if state.kept + cost > MAX_KEPT_PER_MAP {
            return Err("the most bytes one perf map keeps");
        }
        if mine + cost > MAX_KEPT_PER_USER {
            return Err("the most bytes the perf maps of one user keep");
        }
        if u.kept + cost > MAX_KEPT_TOTAL {
            return Err("the most bytes all perf maps keep");
        }
        u.kept += cost;
        *u.kept_by_user.entry(uid).or_default() += cost;
        state.kept += cost;
        state.entries.insert(start, entry);
        Ok(())
    }

    fn clear(&self, state: &mut State) {
        let kept = std::mem::take(&mut state.kept);
        state.entries.clear();
        state.offset = 0;
        state.full = None;
        state.skipping = false;
        let mut guard = usage();
        let u = guard.get_or_insert_with(Usage::default);
        u.kept = u.kept.saturating_sub(kept);
        release(&mut u.kept_by_user, self.uids[0], kept);
    }
}

impl State {
    fn find(&self, addr: u64) -> Option<(String, u64)> {
        let (&start, entry) = self.entries.range(..=addr).next_back()?;
        (addr < entry.end).then(|| (entry.name.to_string(), start))
    }
}

/// `START SIZE NAME` (hexadecimal numbers, `0x` optional) → (start, entry); `None` for a
/// line that is not one, an empty name or an empty or overflowing range.
fn parse_line(line: &[u8]) -> Option<(u64, Entry)> {
    let line = line.strip_suffix(b"\n").unwrap_or(line);
    let line = line.strip_suffix(b"\r").unwrap_or(line);
    let mut parts = line.splitn(3, |&b| b == b' ');
    let start = hex(parts.next()?)?;
    let size = hex(parts.next()?)?;
    let name = parts.next()?;
    if size == 0 || name.iter().all(u8::is_ascii_whitespace) {
        return None;
    }
    let end = start.checked_add(size)?;
    let name = crate::sanitize::name_bytes(name).into_boxed_str();
    Some((start, Entry { end, name }))
}

fn hex(s: &[u8]) -> Option<u64> {
    let s = s
        .strip_prefix(b"0x")
        .or_else(|| s.strip_prefix(b"0X"))
        .unwrap_or(s);
    if s.is_empty() || s.len() > 16 {
        return None;
    }
    u64::from_str_radix(std::str::from_utf8(s).ok()?, 16).ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write as _;

    fn own_map(lines: &str) -> (PerfMap, PathBuf) {
        let me = std::process::id();
        let path = PathBuf::from(format!("/tmp/perf-{me}.map"));
        std::fs::write(&path, lines).unwrap();
        (PerfMap::open(me, None).unwrap(), path)
    }

    #[test]
    fn lines_parse_with_and_without_0x() {
        let (start, e) = parse_line(b"7f00 10 JS:*leaf /app.js:1\n").unwrap();
        assert_eq!(
            (start, e.end, &*e.name),
            (0x7f00, 0x7f10, "JS:*leaf /app.js:1")
        );
        let (start, e) = parse_line(b"0x10 0x8 int Hot.javaLeaf(int)").unwrap();
        assert_eq!(
            (start, e.end, &*e.name),
            (0x10, 0x18, "int Hot.javaLeaf(int)")
        );
        assert!(parse_line(b"10 0 empty").is_none());
        assert!(parse_line(b"ffffffffffffffff 2 wraps").is_none());
        assert!(parse_line(b"10 8").is_none());
        assert!(parse_line(b"10 8 ").is_none());
        assert!(parse_line(b"zz 8 name").is_none());
        assert!(parse_line(b"10000000000000000 8 name").is_none());
        let (_, e) = parse_line(b"10 8 a\x1bb\tc").unwrap();
        assert_eq!(&*e.name, "a\\x1bb\\tc");
    }

    /// One test runs at a time on this process's map (its path is the pid's).
    static OWN: Mutex<()> = Mutex::new(());

    #[test]
    fn appended_lines_are_read_at_the_next_refresh_and_overlaps_replaced() {
        let _own = OWN.lock().unwrap_or_else(PoisonError::into_inner);
        let (map, path) = own_map("1000 100 first\n2000 100 second\n3000 10 part");
        assert_eq!(map.lookup(0x1050).unwrap(), ("first".into(), 0x1000));
        assert_eq!(map.lookup(0x20ff).unwrap().0, "second");
        // A partial last line is not taken until it ends.
        assert_eq!(map.lookup(0x3005), None);
        let mut f = std::fs::OpenOptions::new()
            .append(true)
            .open(&path)
            .unwrap();
        f.write_all(b"ial\n1080 100 replaces\n").unwrap();
        // Not read again within the interval.
        assert_eq!(map.lookup(0x3005), None);
        map.state().last_refresh = None;
        assert_eq!(map.lookup(0x3005).unwrap().0, "partial");
        assert_eq!(map.lookup(0x1050), None, "the overlapped entry is gone");
        assert_eq!(map.lookup(0x1100).unwrap(), ("replaces".into(), 0x1080));
        assert_eq!(map.entries(), 3);
        drop(map);
        std::fs::remove_file(path).unwrap();
    }

    #[test]
    fn a_map_older_than_the_process_is_not_used() {
        let _own = OWN.lock().unwrap_or_else(PoisonError::into_inner);
        let (map, path) = own_map("1000 100 stale\n");
        let old = SystemTime::now() - Duration::from_secs(3600 * 24 * 365 * 10);
        File::options()
            .write(true)
            .open(&path)
            .unwrap()
            .set_modified(old)
            .unwrap();
        assert_eq!(map.lookup(0x1050), None);
        assert!(
            map.problem()
                .unwrap()
                .contains("before the process started")
        );
        drop(map);
        std::fs::remove_file(path).unwrap();
    }

    #[test]
    fn long_lines_are_skipped_and_the_kept_bytes_released() {
        let _own = OWN.lock().unwrap_or_else(PoisonError::into_inner);
        let long = "x".repeat(MAX_LINE * 3);
        let (map, path) = own_map(&format!("1000 10 {long}\n2000 10 after\n"));
        assert_eq!(map.lookup(0x1000), None);
        assert_eq!(map.lookup(0x2000).unwrap().0, "after");
        assert_eq!(map.entries(), 1);
        assert!(kept_bytes() >= ENTRY_OVERHEAD + 5);
        let before = kept_bytes();
        drop(map);
        assert!(kept_bytes() <= before - ENTRY_OVERHEAD - 5);
        std::fs::remove_file(path).unwrap();
    }

    #[test]
    fn a_symlink_is_not_followed() {
        let _own = OWN.lock().unwrap_or_else(PoisonError::into_inner);
        let me = std::process::id();
        let target = PathBuf::from(format!("/tmp/perf-target-{me}"));
        std::fs::write(&target, "1000 100 linked\n").unwrap();
        let path = PathBuf::from(format!("/tmp/perf-{me}.map"));
        let _ = std::fs::remove_file(&path);
        std::os::unix::fs::symlink(&target, &path).unwrap();
        let map = PerfMap::open(me, None).unwrap();
        assert_eq!(map.lookup(0x1050), None);
        assert!(map.problem().is_some());
        drop(map);
        std::fs::remove_file(path).unwrap();
        std::fs::remove_file(target).unwrap();
    }
}
