//! Separate debug files fetched from debuginfod servers by build-id, for objects that
//! carry no line tables of their own (stripped executables, distribution libraries).
//!
//! The protocol is elfutils' (`GET URL/buildid/HEX/debuginfo`), the servers those of
//! `DEBUGINFOD_URLS` (space-separated, as elfutils and gdb read it) or `--debuginfod`.
//! Fetches run on [`WORKERS`] threads of their own; nothing else waits for them:
//! sampling, exports and reports name what is on the disk when they symbolize, and the
//! rest stays `[object+0xOFFSET]` with its build-id until a later round.
//!
//! Every input is untrusted:
//! - A build-id is read from the object the process maps (never from a name it gives),
//!   so a user who forges one gets another program's names for their own frames only.
//!   It must be 2 to 64 bytes of hex before it becomes part of a URL or a file name.
//! - The fetches a user's processes can cause are bounded ([`MAX_FETCHES_PER_USER`] per
//!   [`USER_WINDOW`]), as are those queued ([`MAX_QUEUED`]) and in flight
//!   ([`WORKERS`]); each has a deadline ([`FETCH_TIMEOUT`], connecting within
//!   [`CONNECT_TIMEOUT`]).
//! - A server's answer is read up to [`MAX_DEBUG_FILE_BYTES`], into a temporary file of
//!   the cache, and kept only if it is an ELF file with the build-id asked for. Failures
//!   are remembered ([`RETRY_NOT_FOUND`] for a 404, [`RETRY_FAILED`] otherwise) in a
//!   bounded negative cache.
//! - The disk cache (`CACHE_DIR/debuginfod`, the table cache's directory and its rules:
//!   changeable only by the profiler's user or root) is bounded in bytes: past its bound
//!   the least recently fetched files are removed.

use std::{
    collections::{HashMap, HashSet},
    fs::File,
    io::Write as _,
    os::unix::fs::OpenOptionsExt as _,
    path::{Path, PathBuf},
    sync::{
        Arc, Mutex, MutexGuard, PoisonError,
        atomic::{AtomicU64, Ordering},
        mpsc,
    },
    time::{Duration, Instant},
};

use crate::procfs::Mapping;

/// Fetches in flight at most (one per worker thread).
pub const WORKERS: usize = 2;
/// Requests waiting for a worker at most; more are dropped (asked again later).
pub const MAX_QUEUED: usize = 256;
/// Time to connect to a server.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// Time for a whole fetch, answer included.
pub const FETCH_TIMEOUT: Duration = Duration::from_secs(120);
/// Bytes of one debug file at most.
pub const MAX_DEBUG_FILE_BYTES: u64 = 1 << 30;
/// Default bound of the disk cache.
pub const DEFAULT_CACHE_BYTES: u64 = 2 << 30;
/// Fetches the processes of one user can cause per [`USER_WINDOW`].
pub const MAX_FETCHES_PER_USER: u32 = 64;
/// The window of [`MAX_FETCHES_PER_USER`].
pub const USER_WINDOW: Duration = Duration::from_secs(3600);
/// A build-id no server has is asked for again after this.
pub const RETRY_NOT_FOUND: Duration = Duration::from_secs(3600);
/// A fetch that failed otherwise (timeout, refused, bad answer) is tried again after this.
pub const RETRY_FAILED: Duration = Duration::from_secs(300);
/// Build-ids remembered as failed, objects seen, users counted: each at most this many
/// (the oldest half is forgotten past it).
const MAX_REMEMBERED: usize = 16 * 1024;

/// Where the client fetches from and keeps what it fetched.
#[derive(Clone, Debug)]
pub struct Config {
    /// Server base URLs (`http://` or `https://`), asked in order.
    pub urls: Vec<String>,
    /// The cache directory (`CACHE_DIR/debuginfod`).
    pub dir: PathBuf,
    /// Bytes of debug files kept on the disk at most.
    pub max_cache_bytes: u64,
}

impl Config {
    /// The servers of `DEBUGINFOD_URLS` (space-separated), if set and not empty.
    pub fn urls_from_env() -> Vec<String> {
        std::env::var("DEBUGINFOD_URLS")
            .map(|v| v.split_whitespace().map(str::to_owned).collect())
            .unwrap_or_default()
    }
}

/// Why the client cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum DebuginfodError {
    #[error("debuginfod server {0:?}: only http:// and https:// URLs are supported")]
    Url(String),
    #[error("debuginfod cache: {0}")]
    Cache(#[from] crate::cache::CacheError),
    #[error("debuginfod: starting a worker thread: {0}")]
    Thread(std::io::Error),
}

/// What the client can say of a build-id now.
#[derive(Debug, PartialEq, Eq)]
pub enum Lookup {
    /// The debug file is on the disk.
    Ready(PathBuf),
    /// Asked for (or waiting for room to be): ask again later.
    Waiting,
    /// No server had it, or the fetch failed, recently; or the user's fetches are spent.
    Unavailable,
}

/// Counts, for logs and metrics.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Stats {
    /// Debug files fetched and kept.
    pub fetched: u64,
    /// Bytes of them.
    pub fetched_bytes: u64,
    /// Fetches that found no file (404 from every server).
    pub not_found: u64,
    /// Fetches that failed (timeout, refused, over the size bound, not the build-id).
    pub failed: u64,
    /// Requests not fetched: the user's fetches were spent, or the queue was full.
    pub refused: u64,
    /// Files removed to keep the disk cache within its bound.
    pub evicted: u64,
}

/// One thing to find a debug file for.
enum Request {
    /// An object a process of `uid` maps: opened by a worker to read its build-id.
    Object {
        pid: u32,
        uid: u32,
        mapping: Mapping,
    },
    /// A build-id read already (by the symbolizer), of a process of `uid`.
    BuildId { id: String, uid: u32 },
}

#[derive(Default)]
struct State {
    /// Build-ids queued or being fetched.
    queued: HashSet<String>,
    /// Build-ids whose fetch failed, and when they may be asked for again.
    failed: HashMap<String, Instant>,
    /// Objects (user, device, inode) handed to the workers already: per user, so that
    /// one user's spent fetches leave another's objects asked for.
    seen: HashSet<(u32, u32, u32, u64)>,
    /// Per user: the start of the window and the fetches started in it.
    per_user: HashMap<u32, (Instant, u32)>,
}

struct Shared {
    config: Config,
    state: Mutex<State>,
    fetched: AtomicU64,
    fetched_bytes: AtomicU64,
    not_found: AtomicU64,
    failed: AtomicU64,
    refused: AtomicU64,
    evicted: AtomicU64,
}

/// A debuginfod client: the workers and what they share.
pub struct Debuginfod {
    shared: Arc<Shared>,
    queue: mpsc::SyncSender<Request>,
}

impl std::fmt::Debug for Debuginfod {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Debuginfod")
            .field("urls", &self.shared.config.urls)
            .field("dir", &self.shared.config.dir)
            .finish()
    }
}

/// Whether `id` may name a build-id in a URL and a file name: 2 to 64 bytes, in hex.
pub fn valid_build_id(id: &str) -> bool {
    (4..=128).contains(&id.len())
        && id.len().is_multiple_of(2)
        && id
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

/// Drops the older half of `map` (by the instant `at` gives) when it holds
/// [`MAX_REMEMBERED`] entries.
fn forget_oldest<K: Clone + Eq + std::hash::Hash, V>(
    map: &mut HashMap<K, V>,
    at: impl Fn(&V) -> Instant,
) {
    if map.len() < MAX_REMEMBERED {
        return;
    }
    let mut times: Vec<Instant> = map.values().map(&at).collect();
    times.sort_unstable();
    if let Some(&median) = times.get(times.len() / 2) {
        map.retain(|_, v| at(v) > median);
    }
}

impl Shared {
    fn new(config: Config) -> Self {
        Self {
            config,
            state: Mutex::new(State::default()),
            fetched: AtomicU64::new(0),
            fetched_bytes: AtomicU64::new(0),
            not_found: AtomicU64::new(0),
            failed: AtomicU64::new(0),
            refused: AtomicU64::new(0),
            evicted: AtomicU64::new(0),
        }
    }
}

impl Debuginfod {
    /// A client of `config`'s servers, its cache directory created (mode 0755) and
    /// checked, its workers started.
    pub fn start(config: Config) -> Result<Arc<Self>, DebuginfodError> {
        for url in &config.urls {
            if !(url.starts_with("http://") || url.starts_with("https://")) {
                return Err(DebuginfodError::Url(url.clone()));
            }
        }
        if std::fs::symlink_metadata(&config.dir).is_err() {
            use std::os::unix::fs::DirBuilderExt as _;
            std::fs::DirBuilder::new()
                .recursive(true)
                .mode(0o755)
                .create(&config.dir)
                .map_err(|e| {
                    DebuginfodError::Cache(crate::cache::CacheError::Io {
                        path: config.dir.clone(),
                        message: e.to_string(),
                    })
                })?;
        }
        crate::cache::check_owned(&config.dir)?;
        let shared = Arc::new(Shared::new(config));
        let (queue, requests) = mpsc::sync_channel(MAX_QUEUED);
        let requests = Arc::new(Mutex::new(requests));
        let agent = agent();
        for i in 0..WORKERS {
            let shared = shared.clone();
            let requests = requests.clone();
            let agent = agent.clone();
            std::thread::Builder::new()
                .name(format!("debuginfod-{i}"))
                .spawn(move || worker(&shared, &requests, &agent))
                .map_err(DebuginfodError::Thread)?;
        }
        Ok(Arc::new(Self { shared, queue }))
    }

    pub fn stats(&self) -> Stats {
        let s = &self.shared;
        Stats {
            fetched: s.fetched.load(Ordering::Relaxed),
            fetched_bytes: s.fetched_bytes.load(Ordering::Relaxed),
            not_found: s.not_found.load(Ordering::Relaxed),
            failed: s.failed.load(Ordering::Relaxed),
            refused: s.refused.load(Ordering::Relaxed),
            evicted: s.evicted.load(Ordering::Relaxed),
        }
    }

    /// Hands the executable file mappings of `pid` not seen before to the workers, which
    /// read each object's build-id and fetch a debug file for those without line
    /// tables. Cheap enough for the event loop: a set lookup per mapping, and a
    /// non-blocking send per new object.
    pub fn prefetch(&self, pid: u32, maps: &[Mapping]) {
        let mut uid = None;
        for m in maps.iter().filter(|m| m.executable && m.is_file()) {
            let uid = *uid.get_or_insert_with(|| process_uid(pid));
            let key = (uid, m.dev_major, m.dev_minor, m.inode);
            {
                let mut state = self.shared.state();
                if state.seen.len() >= MAX_REMEMBERED {
                    state.seen.clear();
                }
                if !state.seen.insert(key) {
                    continue;
                }
            }
            let request = Request::Object {
                pid,
                uid,
                mapping: m.clone(),
            };
            if self.queue.try_send(request).is_err() {
                self.shared.refused.fetch_add(1, Ordering::Relaxed);
                // Not seen after all: asked again when the process is next loaded.
                self.shared.state().seen.remove(&key);
            }
        }
    }

    /// The debug file of `build_id` if it is on the disk; else it is asked for (on
    /// behalf of a process of `pid`'s user) unless it failed recently.
    pub fn lookup(&self, build_id: &str, pid: u32) -> Lookup {
        if !valid_build_id(build_id) {
            return Lookup::Unavailable;
        }
        let path = self.shared.path_of(build_id);
        if is_regular(&path) {
            return Lookup::Ready(path);
        }
        {
            let state = self.shared.state();
            if state.queued.contains(build_id) {
                return Lookup::Waiting;
            }
            if state
                .failed
                .get(build_id)
                .is_some_and(|&until| Instant::now() < until)
            {
                return Lookup::Unavailable;
            }
        }
        let uid = process_uid(pid);
        if self.shared.spent(uid) {
            // Until the user's window ends: nothing to ask the worker, which would
            // refuse (asked again once a second per object otherwise).
            return Lookup::Unavailable;
        }
        match self.queue.try_send(Request::BuildId {
            id: build_id.to_owned(),
            uid,
        }) {
            Ok(()) => Lookup::Waiting,
            Err(_) => {
                self.shared.refused.fetch_add(1, Ordering::Relaxed);
                Lookup::Waiting
            }
        }
    }
}

/// The effective user of `pid` (`u32::MAX` when it is gone: such requests share one
/// user's bound).
fn process_uid(pid: u32) -> u32 {
    crate::procfs::effective_uids(pid).map_or(u32::MAX, |[euid, _]| euid)
}

fn is_regular(path: &Path) -> bool {
    std::fs::symlink_metadata(path).is_ok_and(|m| m.file_type().is_file())
}

impl Shared {
    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn path_of(&self, build_id: &str) -> PathBuf {
        self.config.dir.join(format!("{build_id}.debug"))
    }

    /// Whether `uid` has spent its fetches of the current window (its lookups answer
    /// `Unavailable` until the window ends; other users' are unaffected).
    fn spent(&self, uid: u32) -> bool {
        let state = self.state();
        state
            .per_user
            .get(&uid)
            .is_some_and(|&(start, n)| n >= MAX_FETCHES_PER_USER && start.elapsed() < USER_WINDOW)
    }

    /// Claims a fetch of `id` for `uid`: not on the disk, not queued or failed
    /// recently, and within the user's bound.
    fn claim(&self, id: &str, uid: u32) -> bool {
        if is_regular(&self.path_of(id)) {
            return false;
        }
        let now = Instant::now();
        let mut state = self.state();
        if state.queued.contains(id) || state.failed.get(id).is_some_and(|&until| now < until) {
            return false;
        }
        forget_oldest(&mut state.per_user, |&(at, _)| at);
        let (start, n) = state.per_user.entry(uid).or_insert((now, 0));
        if now.duration_since(*start) >= USER_WINDOW {
            (*start, *n) = (now, 0);
        }
        if *n >= MAX_FETCHES_PER_USER {
            self.refused.fetch_add(1, Ordering::Relaxed);
            return false;
        }
        *n += 1;
        state.queued.insert(id.to_owned());
        true
    }

    /// Records the end of a fetch of `id`: `Some(retry)` if it failed.
    fn finish(&self, id: &str, retry: Option<Duration>) {
        let mut state = self.state();
        state.queued.remove(id);
        if let Some(after) = retry {
            forget_oldest(&mut state.failed, |&until| until);
            state.failed.insert(id.to_owned(), Instant::now() + after);
        }
    }
}

fn agent() -> ureq::Agent {
    ureq::Agent::config_builder()
        .timeout_connect(Some(CONNECT_TIMEOUT))
        .timeout_global(Some(FETCH_TIMEOUT))
        .http_status_as_error(false)
        .max_redirects(4)
        .user_agent(concat!("sframe-user/", env!("CARGO_PKG_VERSION")))
        .build()
        .into()
}

fn worker(shared: &Shared, requests: &Mutex<mpsc::Receiver<Request>>, agent: &ureq::Agent) {
    loop {
        let request = {
            let rx = requests.lock().unwrap_or_else(PoisonError::into_inner);
            match rx.recv() {
                Ok(r) => r,
                // The client is gone.
                Err(_) => return,
            }
        };
        let (id, uid) = match request {
            Request::BuildId { id, uid } => (id, uid),
            Request::Object { pid, uid, mapping } => match needed_build_id(pid, &mapping) {
                Some(id) => (id, uid),
                None => continue,
            },
        };
        if !valid_build_id(&id) || !shared.claim(&id, uid) {
            continue;
        }
        let retry = match fetch(shared, agent, &id) {
            Ok(bytes) => {
                shared.fetched.fetch_add(1, Ordering::Relaxed);
                shared.fetched_bytes.fetch_add(bytes, Ordering::Relaxed);
                log::info!("debuginfod: fetched the debug file of {id} ({bytes} bytes)");
                evict(shared);
                None
            }
            Err(FetchError::NotFound) => {
                shared.not_found.fetch_add(1, Ordering::Relaxed);
                log::debug!("debuginfod: no server has {id}");
                Some(RETRY_NOT_FOUND)
            }
            Err(e) => {
                shared.failed.fetch_add(1, Ordering::Relaxed);
                log::info!("debuginfod: {id}: {e}");
                Some(RETRY_FAILED)
            }
        };
        shared.finish(&id, retry);
    }
}

/// The build-id of the object `mapping` of `pid` maps, if it has no line tables of its
/// own and no local debug file.
fn needed_build_id(pid: u32, mapping: &Mapping) -> Option<String> {
    let file = super::object::open_mapped_file(pid, mapping).ok()?;
    let meta = file.metadata().ok()?;
    let bytes = crate::mapped::ObjectBytes::map(file, &meta).ok()?;
    let facts = super::object::elf_facts(&*bytes)?;
    let id = facts.build_id?;
    (!facts.has_debug_info && !super::object::local_debug_file(&id)).then_some(id)
}

#[derive(Debug, thiserror::Error)]
enum FetchError {
    #[error("no server has it")]
    NotFound,
    #[error("{url}: {message}")]
    Server { url: String, message: String },
    #[error("cache: {0}")]
    Cache(std::io::Error),
}

/// Fetches the debug file of `id` from the first server that has it, into the cache.
/// Returns its size.
fn fetch(shared: &Shared, agent: &ureq::Agent, id: &str) -> Result<u64, FetchError> {
    let mut last = FetchError::NotFound;
    for base in &shared.config.urls {
        let url = format!("{}/buildid/{id}/debuginfo", base.trim_end_matches('/'));
        let server = |message: String| FetchError::Server {
            url: url.clone(),
            message,
        };
        let response = match agent.get(&url).call() {
            Ok(r) => r,
            Err(e) => {
                last = server(e.to_string());
                continue;
            }
        };
        let status = response.status().as_u16();
        if status == 404 {
            continue;
        }
        if status != 200 {
            last = server(format!("HTTP status {status}"));
            continue;
        }
        match store(
            shared,
            id,
            response.into_body().into_reader(),
            MAX_DEBUG_FILE_BYTES,
        ) {
            Ok(n) => return Ok(n),
            Err(StoreError::Io(e)) => return Err(FetchError::Cache(e)),
            Err(StoreError::Answer(message)) => last = server(message),
        }
    }
    Err(last)
}

enum StoreError {
    /// The cache could not be written.
    Io(std::io::Error),
    /// The server's answer is not the debug file asked for.
    Answer(String),
}

/// Writes the answer to a temporary file of the cache (at most `limit` bytes), checks
/// that it is an ELF file with build-id `id`, and renames it into place.
fn store(
    shared: &Shared,
    id: &str,
    body: impl std::io::Read,
    limit: u64,
) -> Result<u64, StoreError> {
    let dir = &shared.config.dir;
    let tmp = dir.join(format!(".{id}.{}.tmp", std::process::id()));
    let _ = std::fs::remove_file(&tmp);
    let result = (|| {
        let mut file = File::options()
            .read(true)
            .write(true)
            .create_new(true)
            .mode(0o644)
            .custom_flags(libc::O_NOFOLLOW)
            .open(&tmp)
            .map_err(StoreError::Io)?;
        let mut limited = std::io::Read::take(body, limit.saturating_add(1));
        let n = copy(&mut limited, &mut file)?;
        if n > limit {
            return Err(StoreError::Answer(format!("more than {limit} bytes")));
        }
        let meta = file.metadata().map_err(StoreError::Io)?;
        let bytes = crate::mapped::ObjectBytes::map(file, &meta).map_err(StoreError::Io)?;
        let facts = super::object::elf_facts(&*bytes)
            .ok_or_else(|| StoreError::Answer("not an ELF file".into()))?;
        if facts.build_id.as_deref() != Some(id) {
            return Err(StoreError::Answer(format!(
                "an ELF file of build-id {}",
                facts.build_id.as_deref().unwrap_or("none")
            )));
        }
        drop(bytes);
        std::fs::rename(&tmp, shared.path_of(id)).map_err(StoreError::Io)?;
        Ok(n)
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    result
}

/// Copies `from` into `to`; a read error is the server's, a write error the cache's.
fn copy(from: &mut impl std::io::Read, to: &mut File) -> Result<u64, StoreError> {
    let mut buf = vec![0u8; 64 * 1024];
    let mut n = 0u64;
    loop {
        let got = match from.read(&mut buf) {
            Ok(0) => return Ok(n),
            Ok(got) => got,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(StoreError::Answer(e.to_string())),
        };
        to.write_all(buf.get(..got).unwrap_or_default())
            .map_err(StoreError::Io)?;
        n += got as u64;
    }
}

/// Removes the least recently fetched debug files while the cache holds more than its
/// bound.
fn evict(shared: &Shared) {
    let Ok(entries) = std::fs::read_dir(&shared.config.dir) else {
        return;
    };
    let mut files: Vec<(std::time::SystemTime, u64, PathBuf)> = entries
        .filter_map(Result::ok)
        .filter(|e| e.file_name().to_string_lossy().ends_with(".debug"))
        .filter_map(|e| {
            let meta = e.metadata().ok()?;
            let modified = meta.modified().ok()?;
            meta.file_type()
                .is_file()
                .then(|| (modified, meta.len(), e.path()))
        })
        .collect();
    let mut total: u64 = files.iter().map(|f| f.1).sum();
    if total <= shared.config.max_cache_bytes {
        return;
    }
    files.sort();
    for (_, len, path) in files {
        if total <= shared.config.max_cache_bytes {
            break;
        }
        if std::fs::remove_file(&path).is_ok() {
            total = total.saturating_sub(len);
            shared.evicted.fetch_add(1, Ordering::Relaxed);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn build_ids_are_hex_of_a_bounded_length() {
        assert!(valid_build_id("0123456789abcdef0123456789abcdef01234567"));
        assert!(!valid_build_id("0123456789ABCDEF"));
        assert!(!valid_build_id("../etc/passwd"));
        assert!(!valid_build_id("abc"));
        assert!(!valid_build_id(""));
        assert!(!valid_build_id(&"ab".repeat(65)));
        assert!(!valid_build_id("ab/cd"));
    }

    fn shared(name: &str, max_cache_bytes: u64) -> Shared {
        let dir =
            std::env::temp_dir().join(format!("sframe-debuginfod-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        Shared::new(Config {
            urls: Vec::new(),
            dir,
            max_cache_bytes,
        })
    }

    /// This test binary: an ELF file with a build-id.
    fn own_elf() -> (Vec<u8>, String) {
        let bytes = std::fs::read(std::env::current_exe().unwrap()).unwrap();
        let id = crate::symbolize::object::elf_facts(&*bytes)
            .and_then(|f| f.build_id)
            .expect("the test binary has a build-id");
        (bytes, id)
    }

    /// A server's answer is kept only if it is an ELF file with the build-id asked for,
    /// and within the size bound; nothing else is left in the cache.
    #[test]
    fn answers_are_kept_only_if_they_are_the_file_asked_for() {
        let s = shared("answers", u64::MAX);
        let (elf, id) = own_elf();
        let other = "ab".repeat(20);
        let n = elf.len() as u64;
        assert!(matches!(
            store(&s, &other, &elf[..], u64::MAX),
            Err(StoreError::Answer(m)) if m.contains(&id)
        ));
        assert!(matches!(
            store(&s, &id, &b"<html>not found</html>"[..], u64::MAX),
            Err(StoreError::Answer(m)) if m.contains("not an ELF")
        ));
        assert!(matches!(
            store(&s, &id, &elf[..], n - 1),
            Err(StoreError::Answer(m)) if m.contains("more than")
        ));
        let left: Vec<_> = std::fs::read_dir(&s.config.dir).unwrap().collect();
        assert!(left.is_empty(), "{left:?}");
        assert_eq!(store(&s, &id, &elf[..], n).ok(), Some(n));
        assert!(is_regular(&s.path_of(&id)));
        let _ = std::fs::remove_dir_all(&s.config.dir);
    }

    /// One user's processes cause at most MAX_FETCHES_PER_USER fetches; another user's
    /// still get theirs; a build-id is fetched once at a time, and not again while its
    /// failure is remembered.
    #[test]
    fn fetches_are_bounded_per_user_and_failures_remembered() {
        let s = shared("claims", u64::MAX);
        let id = |i: u32| format!("{i:08x}{}", "0".repeat(32));
        for i in 0..MAX_FETCHES_PER_USER {
            assert!(s.claim(&id(i), 65534), "fetch {i}");
        }
        assert!(!s.claim(&id(MAX_FETCHES_PER_USER), 65534), "past the bound");
        // Its lookups stop asking until the window ends; another user's do not.
        assert!(s.spent(65534));
        assert!(!s.spent(0));
        assert!(s.claim(&id(1000), 0), "another user");
        assert!(!s.claim(&id(1000), 0), "already being fetched");
        s.finish(&id(1000), Some(RETRY_FAILED));
        assert!(!s.claim(&id(1000), 0), "failed recently");
        assert_eq!(s.refused.load(Ordering::Relaxed), 1);
        let _ = std::fs::remove_dir_all(&s.config.dir);
    }

    /// Past its bound in bytes, the cache drops the least recently fetched files.
    #[test]
    fn the_disk_cache_keeps_within_its_bound() {
        let s = shared("evict", 2500);
        for (i, age) in [(1u8, 300u64), (2, 200), (3, 100)] {
            let path = s.path_of(&format!("{i:02x}").repeat(20));
            std::fs::write(&path, vec![0u8; 1000]).unwrap();
            let when = std::time::SystemTime::now() - Duration::from_secs(age);
            File::options()
                .write(true)
                .open(&path)
                .unwrap()
                .set_modified(when)
                .unwrap();
        }
        evict(&s);
        let left: Vec<bool> = [1u8, 2, 3]
            .iter()
            .map(|i| is_regular(&s.path_of(&format!("{i:02x}").repeat(20))))
            .collect();
        assert_eq!(left, [false, true, true]);
        assert_eq!(s.evicted.load(Ordering::Relaxed), 1);
        let _ = std::fs::remove_dir_all(&s.config.dir);
    }

    #[test]
    fn the_oldest_half_is_forgotten_when_full() {
        let start = Instant::now();
        let mut map: HashMap<u32, Instant> = (0..MAX_REMEMBERED as u32)
            .map(|i| (i, start + Duration::from_millis(u64::from(i))))
            .collect();
        forget_oldest(&mut map, |&t| t);
        assert!(map.len() < MAX_REMEMBERED / 2 + 1, "{}", map.len());
        assert!(map.contains_key(&(MAX_REMEMBERED as u32 - 1)));
        assert!(!map.contains_key(&0));
    }
}
