//! From `/proc/PID/maps` to kernel tables: every executable mapping of a process gets
//! its object's table (built once per object, shared by all processes that map it) and
//! its load bias.
//!
//! Files are opened through `/proc/PID/map_files/START-END` (so deleted-but-mapped files
//! work and the process's own mount namespace is used), falling back to
//! `/proc/PID/root/PATH`. The vDSO is read from the process's memory.

use std::{
    collections::HashMap,
    fs,
    os::unix::fs::MetadataExt as _,
    time::{Duration, Instant},
};

use object::{Object as _, ObjectSegment as _};
use sframe_common::layout::{MAPPING_FLAG_BUILDING, MAPPING_FLAG_VDSO, MappingEntry, NO_OBJECT};

use crate::{
    flatten::{RuleDict, flatten},
    kmaps::{KernelTables, Placement},
    mapped::ObjectBytes,
    objtable::{ObjTableOptions, table_for_elf},
    procfs::{self, Mapping},
    segments::{self, Segment},
    table::Source,
};

/// Largest object file used (bigger ones get no table and use frame pointers). Files
/// are mapped, not read: the memory they cost is the pages the parsers touch.
pub const MAX_OBJECT_BYTES: u64 = 1 << 30;

/// Jobs waiting for the build thread at most (objects to identify or to build); more
/// are dropped (counted in [`StoreStats::builds_dropped`]) and tried again at their
/// process's next reload. Each holds a file mapping, not its bytes.
pub const MAX_QUEUED_BUILDS: usize = 64;

/// How an object is identified across processes and in the disk cache.
///
/// Not by build-id: a build-id is what the file says about itself, and any user can
/// link a program with another program's build-id (`-Wl,--build-id=0x…`). An ELF
/// object is identified by [`content_digest`], a SHA-256 of everything its table is
/// derived from; two files share a table only when that is the same.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum ObjectKey {
    Content([u8; 32]),
    File {
        dev: u64,
        inode: u64,
        size: u64,
        mtime: i64,
    },
}

// What tells a file rewritten in place (same device and inode) from the one read
// before: its size and its modification and status-change times.
use crate::mapped::Stamp as FileStamp;

/// The stamp of the file a process maps now (`None` when it cannot be reached).
/// Checked at every refresh of every new mapping: a `stat`, never an open of the
/// file (`map_files` is a link to the mapped inode; the path in the process's root
/// is resolved inside it with `O_PATH`, which neither reads nor blocks).
fn stamp_of_mapping(pid: u32, m: &Mapping) -> Option<FileStamp> {
    let map_files = format!("/proc/{pid}/map_files/{:x}-{:x}", m.start, m.end);
    if let Ok(meta) = fs::metadata(&map_files) {
        return Some(FileStamp::of(&meta));
    }
    let root = std::path::PathBuf::from(format!("/proc/{pid}/root"));
    crate::safe_open::stat_in_root(&root, m.live_path()?)
        .ok()
        .map(|meta| FileStamp::of(&meta))
}

/// Why the file behind a mapping was not opened.
#[derive(Debug, thiserror::Error)]
pub enum MappedFileError {
    /// `/proc/PID/map_files` could not be opened, and the mapping has no live path.
    #[error(transparent)]
    Open(crate::safe_open::OpenError),
    /// Neither `/proc/PID/map_files` nor the path in the process's root could be opened.
    #[error("{map_files}; {in_root}")]
    OpenEither {
        map_files: crate::safe_open::OpenError,
        #[source]
        in_root: crate::safe_open::OpenError,
    },
    /// The path now names another file on the mapped device.
    #[error(
        "{path}: inode {found} is not the mapped inode {mapped} (replaced since it was mapped)"
    )]
    Replaced {
        path: String,
        found: u64,
        mapped: u64,
    },
}

/// Why an object has no table in the kernel.
#[derive(Clone, Debug, thiserror::Error)]
pub enum ObjectError {
    /// No table could be built from the file.
    #[error(transparent)]
    Table(std::sync::Arc<crate::objtable::ObjTableError>),
    /// The mapped file changed while its table was derived (what came of it is refused).
    #[error("the file changed while it was read")]
    Changed,
    /// The table does not fit the kernel layout.
    #[error(transparent)]
    Flatten(crate::flatten::FlattenError),
    /// The kernel maps refused it (full, or a map update failed).
    #[error(transparent)]
    Kernel(std::sync::Arc<crate::kmaps::TablesError>),
}

impl ObjectError {
    /// The cause, as a short label (logs, metrics).
    pub fn cause(&self) -> &'static str {
        match self {
            ObjectError::Table(_) => "no_table",
            ObjectError::Changed => "changed",
            ObjectError::Flatten(_) => "layout",
            ObjectError::Kernel(e) if matches!(**e, crate::kmaps::TablesError::Full { .. }) => {
                "kernel_full"
            }
            ObjectError::Kernel(_) => "kernel",
        }
    }
}

/// Opens the file behind a mapping (`crate::safe_open`: regular files only, never
/// blocking): `/proc/PID/map_files/START-END` (the mapped inode itself, even when
/// deleted or renamed over), else the path resolved inside the process's root (its
/// mount namespace; its symlinks cannot leave it), which must then be the mapped inode
/// when it is on the mapped device.
fn open_mapped_file(pid: u32, m: &Mapping) -> Result<(fs::File, fs::Metadata), MappedFileError> {
    let map_files = format!("/proc/{pid}/map_files/{:x}-{:x}", m.start, m.end);
    let first = match crate::safe_open::open_regular(std::path::Path::new(&map_files)) {
        Ok(opened) => return Ok(opened),
        Err(e) => e,
    };
    let Some(path) = m.live_path() else {
        return Err(MappedFileError::Open(first));
    };
    let root = std::path::PathBuf::from(format!("/proc/{pid}/root"));
    let (file, meta) = crate::safe_open::open_in_root(&root, path).map_err(|in_root| {
        MappedFileError::OpenEither {
            map_files: first,
            in_root,
        }
    })?;
    let replaced = crate::procfs::dev_major_minor(meta.dev()) == (m.dev_major, m.dev_minor)
        && meta.ino() != m.inode;
    if replaced {
        return Err(MappedFileError::Replaced {
            path: m.path.clone(),
            found: meta.ino(),
            mapped: m.inode,
        });
    }
    Ok((file, meta))
}

/// What happened to one object.
#[derive(Clone, Debug)]
pub struct ObjectInfo {
    pub path: String,
    pub placement: Option<Placement>,
    pub source: Option<Source>,
    /// Why the object has no kernel table.
    pub error: Option<ObjectError>,
    /// The PT_LOAD segments.
    segments: Vec<Segment>,
    pub table_rows: usize,
    pub unencodable_rows: u64,
    /// Processes whose mapping table refers to this object now.
    refs: u32,
    /// When the last such process dropped it (eviction order).
    unused_since: Instant,
    /// The table did not fit in the kernel maps: retry after this time.
    retry_at: Option<Instant>,
}

impl ObjectInfo {
    /// `bias` for the vDSO: its image is mapped from its start (file offset 0 is at
    /// `m.start`), read from process memory rather than from a file.
    fn vdso_bias(&self, m: &Mapping) -> Option<u64> {
        segments::image_bias(&self.segments, m.start)
    }

    /// `pc - bias = object virtual address` for a mapping of this object.
    fn bias(&self, m: &Mapping) -> Option<u64> {
        segments::mapping_bias(&self.segments, m.start, m.offset)
    }
}

/// The store's figures for the exporters ([`ObjectStore::figures`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StoreFigures {
    /// Objects whose table is in the kernel.
    pub objects_loaded: u64,
    /// Of those, by table source ([`source_index`]).
    pub objects_by_source: [u64; 4],
    /// Objects for which no table could be built.
    pub objects_failed: u64,
    /// Kernel rows in use and their capacity.
    pub rows_in_use: u64,
    pub row_capacity: u64,
    /// Kernel table bytes in use.
    pub table_bytes: u64,
}

/// Index of a table source in [`StoreFigures::objects_by_source`]: SFrame, `.eh_frame`,
/// `.debug_frame`, synthesized.
pub fn source_index(source: Source) -> usize {
    match source {
        Source::SFrame { .. } => 0,
        Source::EhFrame => 1,
        Source::DebugFrame => 2,
        Source::Synthesized => 3,
    }
}

/// Per-process results.
#[derive(Clone, Debug, Default)]
pub struct ProcessReport {
    pub executable_mappings: usize,
    pub with_table: usize,
    pub dropped_mappings: usize,
    /// The executable mappings read (for symbolization), so callers need not re-read.
    pub maps: Vec<Mapping>,
    /// Of the load's time, what building tables of objects seen first took (the rest is
    /// what reloading this process costs).
    pub build_time: Duration,
}

/// One malloc arena for the whole process, set before any thread starts. glibc gives
/// threads arenas of their own (up to 8 per CPU), and each keeps the memory freed in it:
/// the event loop, the build worker and tokio's threads each held tens of MB of
/// fragments. On the busy-host bench one arena took the steady RSS from 70 to 60 MB
/// (anonymous memory 52 → 42 MB) at the same CPU.
pub fn single_heap_arena() {
    #[cfg(target_env = "gnu")]
    // SAFETY: mallopt sets an allocator parameter; called before other threads exist.
    unsafe {
        libc::mallopt(libc::M_ARENA_MAX, 1);
    }
}

/// Returns the allocator's free pages to the system (glibc keeps freed memory of each
/// thread's arena resident until trimmed).
pub fn release_free_heap() {
    #[cfg(target_env = "gnu")]
    // SAFETY: malloc_trim only walks the allocator's own free lists.
    unsafe {
        libc::malloc_trim(0);
    }
}

/// How `refresh_process` builds objects it has not seen.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Build {
    /// Every table before returning (explicit targets: their first samples must unwind).
    Now,
    /// Objects over `SYNC_BUILD_BYTES` on the worker thread (loads from events).
    Background,
}

/// A process's mapping table as installed in the kernel: the objects it refers to and
/// the entries themselves (for walks in user space).
struct Installed {
    objects: Vec<ObjectKey>,
    entries: Vec<MappingEntry>,
    /// The file mappings resolved then (range, offset, device, inode): a reload takes
    /// those it finds again as they are, without checking their files again.
    resolved: std::collections::HashSet<MappingId>,
}

/// A mapped file as `/proc/PID/maps` names it: device (major, minor), inode, path.
type FileId = (u32, u32, u64, String);

/// What identifies a mapping across reloads of its process.
type MappingId = (u64, u64, u64, u32, u32, u64);

fn mapping_id(m: &Mapping) -> MappingId {
    (m.start, m.end, m.offset, m.dev_major, m.dev_minor, m.inode)
}

/// The `FileId` a mapping's object is known by; the vDSO (no file) by its size, one
/// image per size for the whole boot.
fn file_id(m: &Mapping) -> FileId {
    if m.path == "[vdso]" {
        (0, 0, m.end.saturating_sub(m.start), m.path.clone())
    } else {
        (m.dev_major, m.dev_minor, m.inode, m.path.clone())
    }
}

/// How long a file that could not be opened or mapped is not tried again.
const UNREADABLE_RETRY: Duration = Duration::from_secs(10);
/// Unreadable files remembered at most (then forgotten all at once).
const MAX_UNREADABLE: usize = 16 * 1024;

/// CPU seconds spent loading tables so far (reading maps, opening, hashing, deriving,
/// flattening and copying tables into the kernel), on the loop and the build thread.
/// The overhead governor leaves it out of the sampling budget: it scales with process
/// churn, not with the sampling rate.
pub fn load_cpu_seconds() -> f64 {
    crate::cputime::seconds(&crate::cputime::LOADING)
}

fn load_timer() -> crate::cputime::Timer {
    crate::cputime::Timer::start(&crate::cputime::LOADING)
}

/// Objects larger than this are identified (their content digest) and derived on the
/// worker thread when loads come from events (unless their table is cached): on a
/// busy host, deriving a 2 MB library takes the loop 50-150 ms, hashing a compiler's
/// code 100-350 ms, and a short process starts and exits unseen meanwhile.
pub const SYNC_BUILD_BYTES: usize = 1 << 20;

/// An object's table, derived and flattened (no kernel state: made on any thread). Its
/// rules are numbered in a dictionary of its own; [`FlatObject::renumber`] moves them
/// into the kernel's.
///
/// [`FlatObject::renumber`]: crate::flatten::FlatObject::renumber
struct Derived {
    source: Source,
    table_rows: usize,
    flat: crate::flatten::FlatObject,
    rules: RuleDict,
}

/// The CFI/SFrame derivation and flattening of one object. A mapped file truncated
/// meanwhile read partly as zeros: what came of it is refused.
fn derive(data: &ObjectBytes, options: &ObjTableOptions) -> Result<Derived, ObjectError> {
    let derived = data
        .releasing(|| table_for_elf(data, options))
        .map_err(|e| ObjectError::Table(std::sync::Arc::new(e)));
    // What the derivation touched (unwind sections, code around function ends) leaves
    // the profiler's RSS now, not when the mapping is dropped.
    data.release(0..data.len());
    if data.maybe_changed() {
        return Err(ObjectError::Changed);
    }
    let t = derived?;
    let mut rules = RuleDict::default();
    let flat = flatten(&t.table, &mut rules).map_err(ObjectError::Flatten)?;
    Ok(Derived {
        source: t.source,
        table_rows: t.table.row_count(),
        flat,
        rules,
    })
}

/// What the build thread is asked to do.
enum Job {
    /// Find the key of a file first seen (hashing a large object's code takes long too).
    Identify {
        file: FileId,
        stamp: FileStamp,
        path: String,
        data: ObjectBytes,
        /// The key if the file is not ELF.
        fallback: ObjectKey,
    },
    /// Derive and flatten the table of an object whose key is known.
    Build {
        key: ObjectKey,
        path: String,
        data: ObjectBytes,
        options: ObjTableOptions,
    },
}

impl Job {
    /// The order jobs are taken in: identifications first (they are quick, and what
    /// comes next may be loaded or cached already), then the smallest object (a small
    /// library must not wait behind a compiler's hundreds of MB).
    fn order(&self) -> (u8, usize) {
        match self {
            Job::Identify { data, .. } => (0, data.len()),
            Job::Build { data, .. } => (1, data.len()),
        }
    }
}

enum Done {
    Identified {
        file: FileId,
        stamp: FileStamp,
        path: String,
        data: ObjectBytes,
        key: ObjectKey,
    },
    Built {
        key: ObjectKey,
        path: String,
        data: ObjectBytes,
        derived: Result<Derived, ObjectError>,
    },
}

/// The jobs waiting for the build thread, and whether its owner is gone.
#[derive(Default)]
struct JobQueue {
    jobs: Vec<Job>,
    closed: bool,
}

/// One thread identifying and deriving objects off the event loop, from a bounded
/// queue, smallest first.
struct Worker {
    queue: std::sync::Arc<(std::sync::Mutex<JobQueue>, std::sync::Condvar)>,
    done: std::sync::mpsc::Receiver<Done>,
}

impl Worker {
    fn spawn() -> Option<Self> {
        let queue = std::sync::Arc::new((
            std::sync::Mutex::new(JobQueue::default()),
            std::sync::Condvar::new(),
        ));
        let (done_tx, done) = std::sync::mpsc::channel();
        let shared = queue.clone();
        std::thread::Builder::new()
            .name("sframe-build".into())
            .spawn(move || {
                while let Some(job) = Self::next(&shared) {
                    let timer = load_timer();
                    let out = match job {
                        Job::Identify {
                            file,
                            stamp,
                            path,
                            data,
                            fallback,
                        } => Done::Identified {
                            key: content_digest(&data)
                                .map(ObjectKey::Content)
                                .unwrap_or(fallback),
                            file,
                            stamp,
                            path,
                            data,
                        },
                        Job::Build {
                            key,
                            path,
                            data,
                            options,
                        } => Done::Built {
                            derived: derive(&data, &options),
                            key,
                            path,
                            data,
                        },
                    };
                    drop(timer);
                    if done_tx.send(out).is_err() {
                        break;
                    }
                }
            })
            .map_err(|e| log::warn!("no table build thread, large objects block the loop: {e}"))
            .ok()?;
        Some(Self { queue, done })
    }

    /// The next job (waits for one); `None` once the worker's owner is gone.
    fn next(shared: &(std::sync::Mutex<JobQueue>, std::sync::Condvar)) -> Option<Job> {
        let (queue, ready) = shared;
        let mut q = queue
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        loop {
            if q.closed {
                return None;
            }
            let first = q
                .jobs
                .iter()
                .enumerate()
                .min_by_key(|(_, j)| j.order())
                .map(|(i, _)| i);
            if let Some(i) = first {
                return Some(q.jobs.swap_remove(i));
            }
            q = ready
                .wait(q)
                .unwrap_or_else(std::sync::PoisonError::into_inner);
        }
    }

    /// Queues `job`; false (the job dropped) if the queue is full.
    fn send(&self, job: Job) -> bool {
        let (queue, ready) = &*self.queue;
        let mut q = queue
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if q.jobs.len() >= MAX_QUEUED_BUILDS {
            return false;
        }
        q.jobs.push(job);
        ready.notify_one();
        true
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        let (queue, ready) = &*self.queue;
        queue
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .closed = true;
        ready.notify_one();
    }
}

/// How long an object whose table did not fit waits before it is tried again.
const RETRY_FULL: Duration = Duration::from_secs(5);

/// What the store did since it was created.
#[derive(Clone, Copy, Debug, Default)]
pub struct StoreStats {
    /// Tables built and loaded into the kernel.
    pub loads: u64,
    /// Objects evicted from the kernel maps to make room (least recently used first).
    pub evictions: u64,
    /// Objects that found no room even after evicting every unused object.
    pub full: u64,
    /// Large objects not queued for the build thread because its queue was full (tried
    /// again at their process's next reload).
    pub builds_dropped: u64,
    /// Large objects derived on the worker thread.
    pub background_builds: u64,
    /// Large files first seen identified (hashed) on the worker thread.
    pub background_identifications: u64,
    /// Mapped files found rewritten in place since they were read (read again).
    pub files_changed: u64,
    /// Times a process's mapping table found no room in the kernel map (its samples are
    /// then unwound in user space from the deferred stack copies; it tries again once
    /// another process left the map).
    pub process_table_full: u64,
}

/// Objects loaded so far, and the kernel tables they live in.
///
/// Each object counts the processes whose mapping table refers to it; objects no
/// process refers to stay loaded (a new process of the same program needs them) until
/// room is needed, then the least recently used go first.
pub struct ObjectStore {
    pub tables: KernelTables,
    objects: HashMap<ObjectKey, ObjectInfo>,
    /// (dev, inode, path) of a mapped file → its key and the file's stamp when it was
    /// read, so a file is read once, and again when it was rewritten in place.
    files: HashMap<FileId, (ObjectKey, FileStamp)>,
    /// What each process's kernel mapping table holds.
    processes: HashMap<u32, Installed>,
    options: ObjTableOptions,
    /// Flattened tables on disk, by build-id (`--cache-dir`).
    pub cache: Option<crate::cache::TableCache>,
    /// Derives the tables of large objects off the event loop.
    worker: Option<Worker>,
    /// Objects on the worker, and the processes to reload when they are done.
    in_flight: HashMap<ObjectKey, std::collections::HashSet<u32>>,
    /// Files being identified on the worker, and the processes that map them.
    identifying: HashMap<FileId, std::collections::HashSet<u32>>,
    /// Finished builds are left on the worker's channel (tests: a build that takes long).
    builds_held: bool,
    /// Time spent building tables on the calling thread, in all.
    build_time: Duration,
    /// Objects whose table could not be built or loaded.
    pub failed_objects: u64,
    pub stats: StoreStats,
    /// Processes whose mapping table found the kernel map full, with the number of
    /// processes removed from it at that time: trying again is useless until one more
    /// has been removed.
    no_room: HashMap<u32, u64>,
    /// Processes removed from the kernel map so far.
    removals: u64,
    /// Files that could not be opened or mapped, and when: not tried again before
    /// `UNREADABLE_RETRY` (a process with thousands of such mappings costs one attempt
    /// per file, not one per mapping and reload).
    /// Keyed by process too: another process's open of the same file may succeed (the
    /// failure may have been a race with this process unmapping it).
    unreadable: HashMap<(u32, FileId), Instant>,
}

impl ObjectStore {
    pub fn new(tables: KernelTables) -> Self {
        Self {
            tables,
            objects: HashMap::new(),
            files: HashMap::new(),
            processes: HashMap::new(),
            options: ObjTableOptions::default(),
            cache: None,
            worker: None,
            in_flight: HashMap::new(),
            identifying: HashMap::new(),
            builds_held: false,
            build_time: Duration::ZERO,
            failed_objects: 0,
            stats: StoreStats::default(),
            no_room: HashMap::new(),
            removals: 0,
            unreadable: HashMap::new(),
        }
    }

    /// The build thread, started on first use (so that it inherits the privileges the
    /// process has then, e.g. after `--drop-privileges`).
    fn worker(&mut self) -> Option<&Worker> {
        if self.worker.is_none() {
            self.worker = Worker::spawn();
        }
        self.worker.as_ref()
    }

    /// Loads the tables the worker finished; returns the processes to reload (they map
    /// those objects).
    pub fn poll_builds(&mut self) -> Vec<u32> {
        let _timer = load_timer();
        let mut reload = Vec::new();
        let finished: Vec<Done> = match &self.worker {
            Some(w) if !self.builds_held => w.done.try_iter().collect(),
            _ => return reload,
        };
        let mut built = false;
        for done in finished {
            match done {
                Done::Identified {
                    file,
                    stamp,
                    path,
                    data,
                    key,
                } => {
                    let pids = self.identifying.remove(&file).unwrap_or_default();
                    self.take_object(&pids, key, file, stamp, &path, data, Build::Background);
                    // Loaded now, or being built (then reloaded again when it is: the
                    // reload marks the mapping as waiting for its build), or dropped.
                    reload.extend(pids);
                }
                Done::Built {
                    key,
                    path,
                    data,
                    derived,
                } => {
                    built = true;
                    let info = self.finish_build(&key, &path, &data, Some(derived));
                    self.objects.insert(key.clone(), info);
                    if let Some(pids) = self.in_flight.remove(&key) {
                        reload.extend(pids);
                    }
                }
            }
        }
        if built {
            // A large object's derivation peaks at tens of MB of heap on the worker's
            // arena; give the freed pages back rather than keep them as resident memory.
            release_free_heap();
        }
        reload.sort_unstable();
        reload.dedup();
        reload
    }

    /// While `held`, builds the worker finished are not taken in: to tests, a build
    /// still running (what a large object on a busy host is).
    #[doc(hidden)]
    pub fn hold_builds(&mut self, held: bool) {
        self.builds_held = held;
    }

    /// Objects being identified or built on the worker.
    pub fn builds_in_flight(&self) -> usize {
        self.in_flight.len() + self.identifying.len()
    }

    /// Whether an object `pid` maps is being identified or built on the worker (its
    /// table may be coming).
    pub fn awaits_build(&self, pid: u32) -> bool {
        self.in_flight
            .values()
            .chain(self.identifying.values())
            .any(|pids| pids.contains(&pid))
    }

    /// Whether the object of mapping `m` is being identified or built on the worker.
    fn building(&self, m: &Mapping) -> bool {
        let id = file_id(m);
        self.identifying.contains_key(&id)
            || self
                .files
                .get(&id)
                .is_some_and(|(k, _)| self.in_flight.contains_key(k))
    }

    /// The mapping table of a process that exited, rebuilt from the executable mappings
    /// it had: for walking, in user space, the samples it left while the tables of its
    /// objects were being built. Nothing is read from `/proc` (the process is gone) or
    /// installed in the kernel: each mapping resolves through the file identity seen
    /// while the process lived, and only to a table loaded now.
    pub fn exited_entries(&self, maps: &[Mapping]) -> Vec<MappingEntry> {
        let mut entries: Vec<MappingEntry> = maps
            .iter()
            .filter(|m| m.executable)
            .take(sframe_common::budget::MAX_MAPPINGS)
            .map(|m| {
                let vdso = m.path == "[vdso]";
                let resolved = self
                    .files
                    .get(&file_id(m))
                    .and_then(|(key, _)| self.objects.get(key))
                    .and_then(|info| {
                        let bias = if vdso {
                            info.vdso_bias(m)?
                        } else {
                            info.bias(m)?
                        };
                        Some((info.placement?.object, bias))
                    });
                let (object, bias) = resolved.unwrap_or((NO_OBJECT, 0));
                MappingEntry {
                    start: m.start,
                    end: m.end,
                    bias,
                    object,
                    flags: if vdso { MAPPING_FLAG_VDSO } else { 0 },
                }
            })
            .collect();
        entries.sort_by_key(|e| e.start);
        entries
    }

    /// Processes with a mapping table installed by this store.
    pub fn process_count(&self) -> usize {
        self.processes.len()
    }

    /// Forgets `pid`: its mapping table is removed (the kernel side removes it itself
    /// when the process exits) and its objects lose a reference.
    pub fn forget_process(&mut self, pid: u32) {
        self.unreadable.retain(|(p, _), _| *p != pid);
        if self.no_room.remove(&pid).is_none() {
            self.tables.remove_process(pid);
            self.removals += 1;
        }
        if let Some(installed) = self.processes.remove(&pid) {
            self.release(&installed.objects);
        }
    }

    /// Whether `pid`'s mapping table found the kernel map full and no process left it
    /// since (reloading it now would fail again).
    pub fn waiting_for_room(&self, pid: u32) -> bool {
        self.no_room.get(&pid) == Some(&self.removals)
    }

    /// `pid`'s mapping table as installed in the kernel.
    pub fn process_entries(&self, pid: u32) -> Option<&[MappingEntry]> {
        self.processes.get(&pid).map(|p| p.entries.as_slice())
    }

    fn release(&mut self, keys: &[ObjectKey]) {
        let now = Instant::now();
        for key in keys {
            if let Some(info) = self.objects.get_mut(key) {
                info.refs = info.refs.saturating_sub(1);
                if info.refs == 0 {
                    info.unused_since = now;
                }
            }
        }
    }

    /// Evicts the least recently used object no process refers to; false if none.
    fn evict_one(&mut self) -> bool {
        let victim = self
            .objects
            .iter()
            .filter(|(_, i)| i.refs == 0 && i.placement.is_some())
            .min_by_key(|(_, i)| i.unused_since)
            .map(|(k, _)| k.clone());
        let Some(key) = victim else {
            return false;
        };
        if let Some(info) = self.objects.remove(&key) {
            if let Some(p) = info.placement
                && let Err(err) = self.tables.unload_object(&p)
            {
                log::warn!("{}: evicting its table: {err}", info.path);
            }
            log::debug!("evicted the table of {}", info.path);
            self.files.retain(|_, (k, _)| *k != key);
            self.stats.evictions += 1;
        }
        true
    }

    /// What the exporters report of the store.
    pub fn figures(&self) -> StoreFigures {
        let loaded = || self.objects().filter(|o| o.placement.is_some());
        let mut by_source = [0; 4];
        for s in loaded().filter_map(|o| o.source) {
            by_source[source_index(s)] += 1;
        }
        let (rows_in_use, row_capacity) = self.tables.row_usage();
        StoreFigures {
            objects_loaded: loaded().count() as u64,
            objects_by_source: by_source,
            objects_failed: self.failed_objects,
            rows_in_use,
            row_capacity,
            table_bytes: self.tables.bytes_in_use(),
        }
    }

    pub fn objects(&self) -> impl Iterator<Item = &ObjectInfo> {
        self.objects.values()
    }

    /// Reads the process's maps and installs its mapping table in the kernel; `build`
    /// says whether large new objects may be derived in the background.
    pub fn refresh_process(
        &mut self,
        pid: u32,
        build: Build,
    ) -> Result<ProcessReport, procfs::MapsError> {
        let _timer = load_timer();
        let maps = procfs::read_executable_maps(pid)?;
        let mut report = ProcessReport::default();
        let build_time_before = self.build_time;
        let mut entries = Vec::new();
        // References are taken as objects are resolved, so that loading a later object
        // of this process cannot evict an earlier one; the old ones are released after.
        // Objects of this process already loaded are pinned first, so that room for a new
        // one is never made by evicting one it maps too.
        let pinned: Vec<ObjectKey> = maps
            .iter()
            .filter(|m| m.executable)
            .filter_map(|m| self.files.get(&file_id(m)).map(|(k, _)| k.clone()))
            .filter(|k| self.objects.contains_key(k))
            .collect();
        for k in &pinned {
            if let Some(info) = self.objects.get_mut(k) {
                info.refs += 1;
            }
        }
        let mut keys = Vec::new();
        let previous = self
            .processes
            .get_mut(&pid)
            .map(|p| std::mem::take(&mut p.resolved))
            .unwrap_or_default();
        let mut resolved = std::collections::HashSet::new();
        for m in maps.iter().filter(|m| m.executable) {
            report.executable_mappings += 1;
            let id = mapping_id(m);
            let unchanged = previous.contains(&id);
            let (object, bias, flags) = match self.mapping_object(pid, m, build, unchanged) {
                Some((key, object, bias, flags)) => {
                    if let Some(info) = self.objects.get_mut(&key) {
                        info.refs += 1;
                    }
                    keys.push(key);
                    resolved.insert(id);
                    (object, bias, flags)
                }
                None => {
                    // Its table is being built on the worker: the kernel defers samples
                    // that the frame-pointer fallback cannot walk there.
                    let building = self.building(m);
                    let flags = match (m.path == "[vdso]", building) {
                        (true, _) => MAPPING_FLAG_VDSO,
                        (false, true) => MAPPING_FLAG_BUILDING,
                        (false, false) => 0,
                    };
                    (NO_OBJECT, 0, flags)
                }
            };
            if object != NO_OBJECT {
                report.with_table += 1;
            }
            entries.push(MappingEntry {
                start: m.start,
                end: m.end,
                bias,
                object,
                flags,
            });
        }
        entries.sort_by_key(|e| e.start);
        match self.tables.set_process(pid, &entries) {
            Ok(dropped) => {
                self.no_room.remove(&pid);
                report.dropped_mappings = dropped;
            }
            Err(err) => {
                self.no_room.insert(pid, self.removals);
                self.stats.process_table_full += 1;
                // Once per power of two: a full map repeats this for every new process.
                if self.stats.process_table_full.is_power_of_two() {
                    log::warn!(
                        "pid {pid}: {err} ({} times so far; --max-processes raises the limit)",
                        self.stats.process_table_full
                    );
                }
            }
        }
        entries.truncate(sframe_common::budget::MAX_MAPPINGS);
        let installed = Installed {
            objects: keys,
            entries,
            resolved,
        };
        if let Some(old) = self.processes.insert(pid, installed) {
            self.release(&old.objects);
        }
        self.release(&pinned);
        report.maps = maps;
        report.build_time = self.build_time.saturating_sub(build_time_before);
        Ok(report)
    }

    /// The object of an executable mapping with a loaded table: key, id, bias, flags.
    /// `unchanged`: the same mapping was resolved at the process's last load (its file
    /// is not checked again).
    fn mapping_object(
        &mut self,
        pid: u32,
        m: &Mapping,
        build: Build,
        unchanged: bool,
    ) -> Option<(ObjectKey, u32, u64, u32)> {
        if m.path == "[vdso]" {
            let (key, id, bias) = self.vdso(pid, m)?;
            return Some((key, id, bias, MAPPING_FLAG_VDSO));
        }
        if !m.is_file() {
            return None; // anonymous executable memory (JIT code)
        }
        let file_id = file_id(m);
        // A file rewritten in place keeps its inode: the key is reused only while the
        // file's size and times are those it had when it was read.
        let known = match self.files.get(&file_id) {
            Some((key, _)) if unchanged => Some(key.clone()),
            Some((key, stamp)) if stamp_of_mapping(pid, m).as_ref() == Some(stamp) => {
                Some(key.clone())
            }
            Some(_) => {
                self.stats.files_changed += 1;
                None
            }
            None => None,
        };
        if let Some(k) = &known
            && let Some(waiting) = self.in_flight.get_mut(k)
        {
            // Its table is being built on the worker: this process is reloaded then.
            waiting.insert(pid);
            return None;
        }
        if let Some(waiting) = self.identifying.get_mut(&file_id) {
            // Being identified on the worker: this process is reloaded then.
            waiting.insert(pid);
            return None;
        }
        let key = match known.clone().filter(|k| self.usable(k)) {
            Some(k) => k,
            None => {
                let unreadable_id = (pid, file_id.clone());
                if self
                    .unreadable
                    .get(&unreadable_id)
                    .is_some_and(|at| at.elapsed() < UNREADABLE_RETRY)
                {
                    return None;
                }
                let Some((fallback, stamp, data)) = self.open_object(pid, m) else {
                    if self.unreadable.len() >= MAX_UNREADABLE {
                        self.unreadable.clear();
                    }
                    self.unreadable.insert(unreadable_id, Instant::now());
                    return None;
                };
                let key = match known {
                    // Known, but to build again (its table found no room): not hashed
                    // again.
                    Some(k) => k,
                    None if data.len() > SYNC_BUILD_BYTES
                        && build == Build::Background
                        && self.worker().is_some() =>
                    {
                        let job = Job::Identify {
                            file: file_id.clone(),
                            stamp,
                            path: m.path.clone(),
                            data,
                            fallback,
                        };
                        match self.worker().map(|w| w.send(job)) {
                            Some(true) => {
                                self.stats.background_identifications += 1;
                                self.identifying.insert(file_id, [pid].into());
                            }
                            // Not remembered as read: the next reload tries again.
                            _ => self.stats.builds_dropped += 1,
                        }
                        return None;
                    }
                    None => content_digest(&data)
                        .map(ObjectKey::Content)
                        .unwrap_or(fallback),
                };
                let pids = [pid].into();
                if !self.take_object(&pids, key.clone(), file_id, stamp, &m.path, data, build) {
                    return None;
                }
                key
            }
        };
        let info = self.objects.get(&key)?;
        match (info.placement, info.bias(m)) {
            (Some(p), Some(bias)) => Some((key, p.object, bias, 0)),
            _ => None,
        }
    }

    /// Whether the object is known and need not be built again (it is loaded, or failed
    /// for good, or failed for lack of room recently).
    fn usable(&self, key: &ObjectKey) -> bool {
        match self.objects.get(key) {
            None => false,
            Some(info) => info
                .retry_at
                .is_none_or(|at| info.placement.is_some() || Instant::now() < at),
        }
    }

    /// With its key known, takes a file's object: joins its build if it is on the worker,
    /// or builds it (here, or on the worker if it is large, `build` allows it and its table
    /// is not cached) unless it is loaded already. Returns whether it is usable now;
    /// otherwise `pids` are reloaded when its build is done (or tried again at their next
    /// reload if the worker's queue was full).
    #[allow(clippy::too_many_arguments)]
    fn take_object(
        &mut self,
        pids: &std::collections::HashSet<u32>,
        key: ObjectKey,
        file: FileId,
        stamp: FileStamp,
        path: &str,
        data: ObjectBytes,
        build: Build,
    ) -> bool {
        if let Some(waiting) = self.in_flight.get_mut(&key) {
            // The same object (another path or inode) is being built already.
            waiting.extend(pids);
            self.files.insert(file, (key, stamp));
            return false;
        }
        if !self.usable(&key) {
            let options = self.options.clone();
            if data.len() > SYNC_BUILD_BYTES
                && build == Build::Background
                && !self.cached(&key)
                && let Some(worker) = self.worker()
            {
                // A large object takes long to derive: build it off the event loop;
                // meanwhile its PCs use the frame-pointer fallback, and samples it cannot
                // walk wait (MAPPING_FLAG_BUILDING).
                let job = Job::Build {
                    key: key.clone(),
                    path: path.to_owned(),
                    data,
                    options,
                };
                if worker.send(job) {
                    self.files.insert(file, (key.clone(), stamp));
                    self.stats.background_builds += 1;
                    self.in_flight.insert(key, pids.clone());
                } else {
                    // Not remembered as read: the next reload tries again.
                    self.stats.builds_dropped += 1;
                }
                return false;
            }
            let info = self.finish_build(&key, path, &data, None);
            self.objects.insert(key.clone(), info);
        }
        self.files.insert(file, (key, stamp));
        true
    }

    /// Maps the file behind `m` (size checked from `fstat` first): its key if it is not
    /// ELF (by file identity), its stamp and its bytes.
    fn open_object(
        &mut self,
        pid: u32,
        m: &Mapping,
    ) -> Option<(ObjectKey, FileStamp, ObjectBytes)> {
        let (file, meta) = open_mapped_file(pid, m)
            .map_err(|e| log::debug!("pid {pid}: cannot open {}: {e}", m.path))
            .ok()?;
        if meta.len() > MAX_OBJECT_BYTES {
            log::warn!(
                "{}: {} bytes, larger than the limit; no table",
                m.path,
                meta.len()
            );
            return None;
        }
        let data = ObjectBytes::map(file, &meta)
            .map_err(|e| log::debug!("pid {pid}: cannot map {}: {e}", m.path))
            .ok()?;
        let fallback = ObjectKey::File {
            dev: meta.dev(),
            inode: meta.ino(),
            size: meta.len(),
            mtime: meta.mtime(),
        };
        Some((fallback, FileStamp::of(&meta), data))
    }

    fn vdso(&mut self, pid: u32, m: &Mapping) -> Option<(ObjectKey, u32, u64)> {
        let len = m.end.checked_sub(m.start)?;
        if len > 1 << 20 {
            return None;
        }
        // Every process of a boot maps the same vDSO image (one per size: 64-bit, x32,
        // 32-bit): read it from process memory once per size.
        let vdso_file = file_id(m);
        let key = match self.files.get(&vdso_file).filter(|(k, _)| self.usable(k)) {
            Some((key, _)) => key.clone(),
            None => {
                let mut data = vec![0u8; len as usize];
                let mem = fs::File::open(format!("/proc/{pid}/mem"))
                    .map_err(|e| log::debug!("pid {pid}: cannot open its memory for the vDSO: {e}"))
                    .ok()?;
                std::os::unix::fs::FileExt::read_exact_at(&mem, &mut data, m.start)
                    .map_err(|e| log::debug!("pid {pid}: cannot read its vDSO: {e}"))
                    .ok()?;
                let key = ObjectKey::Content(digest_bytes(&data));
                let data = ObjectBytes::Heap(data);
                if !self.usable(&key) {
                    let info = self.finish_build(&key, "[vdso]", &data, None);
                    self.objects.insert(key.clone(), info);
                }
                self.files
                    .insert(vdso_file, (key.clone(), FileStamp::default()));
                key
            }
        };
        let info = self.objects.get(&key)?;
        if info.placement.is_none() {
            log::debug!(
                "pid {pid}: the vDSO has no table in the kernel ({:?})",
                info.error
            );
        }
        let bias = info.vdso_bias(m)?;
        let id = info.placement?.object;
        Some((key, id, bias))
    }

    /// Whether the disk cache holds this object's table (then loading it is quick).
    fn cached(&self, key: &ObjectKey) -> bool {
        match (&self.cache, key) {
            (Some(cache), ObjectKey::Content(digest)) => cache.contains(digest),
            _ => false,
        }
    }

    /// Builds the object's kernel table from the disk cache, else from `derived` (the
    /// result of `derive` on `data`, computed on the worker) or derived now.
    fn finish_build(
        &mut self,
        key: &ObjectKey,
        path: &str,
        data: &ObjectBytes,
        derived: Option<Result<Derived, ObjectError>>,
    ) -> ObjectInfo {
        let started = Instant::now();
        let info = self.build_info(key, path, data, derived);
        self.build_time += started.elapsed();
        info
    }

    fn build_info(
        &mut self,
        key: &ObjectKey,
        path: &str,
        data: &ObjectBytes,
        derived: Option<Result<Derived, ObjectError>>,
    ) -> ObjectInfo {
        let mut info = ObjectInfo {
            path: path.to_owned(),
            placement: None,
            source: None,
            error: None,
            segments: segments::segments(data),
            table_rows: 0,
            unencodable_rows: 0,
            refs: 0,
            unused_since: Instant::now(),
            retry_at: None,
        };
        let id = match key {
            ObjectKey::Content(digest) => Some(&digest[..]),
            ObjectKey::File { .. } => None,
        };
        let cached = match (self.cache.as_mut(), id) {
            (Some(cache), Some(id)) => cache.load(id, self.tables.rule_dict()),
            _ => None,
        };
        let flat = match cached {
            Some((flat, meta)) => {
                info.source = Some(meta.source);
                info.table_rows = usize::try_from(meta.table_rows).unwrap_or(usize::MAX);
                Ok(flat)
            }
            None => derived
                .unwrap_or_else(|| derive(data, &self.options))
                .and_then(|d| {
                    info.source = Some(d.source);
                    info.table_rows = d.table_rows;
                    let mut flat = d.flat;
                    flat.renumber(&d.rules, self.tables.rule_dict())
                        .map_err(ObjectError::Flatten)?;
                    if let (Some(cache), Some(id)) = (self.cache.as_mut(), id) {
                        let meta = crate::cache::CachedMeta {
                            source: d.source,
                            table_rows: d.table_rows as u64,
                        };
                        if let Err(err) = cache.store(id, meta, &flat, self.tables.rule_dict()) {
                            log::info!("table cache: {err}");
                        }
                    }
                    Ok(flat)
                }),
        };
        let result = flat.and_then(|flat| {
            info.unencodable_rows = flat.unencodable_rows;
            self.load_evicting(&flat).map_err(|e| {
                if matches!(e, crate::kmaps::TablesError::Full { .. }) {
                    info.retry_at = Some(Instant::now() + RETRY_FULL);
                }
                ObjectError::Kernel(std::sync::Arc::new(e))
            })
        });
        match result {
            Ok(p) => {
                self.stats.loads += 1;
                log::info!(
                    "{path}: {} rows from {}",
                    info.table_rows,
                    info.source.map_or("?", crate::table::Source::describe)
                );
                info.placement = Some(p);
            }
            Err(e) => {
                log::info!("{path}: no unwind table ({}): {e}", e.cause());
                self.failed_objects += 1;
                info.error = Some(e);
            }
        }
        info
    }
}

impl ObjectStore {
    /// Loads a flattened table, evicting unused objects (least recently used first)
    /// while there is no room.
    fn load_evicting(
        &mut self,
        flat: &crate::flatten::FlatObject,
    ) -> Result<Placement, crate::kmaps::TablesError> {
        loop {
            match self.tables.load_object(flat) {
                Err(crate::kmaps::TablesError::Full { .. }) if self.evict_one() => continue,
                Err(e @ crate::kmaps::TablesError::Full { .. }) => {
                    self.stats.full += 1;
                    return Err(e);
                }
                other => return other,
            }
        }
    }
}

/// Sections whose bytes a table is derived from, besides the executable ones.
const UNWIND_SECTIONS: &[&str] = &[
    ".sframe",
    ".eh_frame",
    ".eh_frame_hdr",
    ".debug_frame",
    ".zdebug_frame",
    ".plt",
    ".plt.sec",
    ".plt.got",
    ".got",
];

/// A SHA-256 of everything an ELF object's table is derived from: its class,
/// endianness, machine and entry point, every segment's layout, every section's name,
/// kind, flags, address and size, and the bytes of its executable and unwind sections
/// (not debug information, symbols or data). `None` when it is not an ELF file.
///
/// The bytes hashed (the code of a large object is most of it) are released from the
/// profiler's memory a chunk at a time as they are hashed.
pub fn content_digest(data: &ObjectBytes) -> Option<[u8; 32]> {
    use object::{ObjectSection as _, SectionFlags};
    use sha2::Digest as _;
    let file = object::File::parse(&data[..]).ok()?;
    let mut h = sha2::Sha256::new();
    h.update(b"sframe-user object v1\0");
    h.update([u8::from(file.is_64()), u8::from(file.is_little_endian())]);
    h.update(format!("{:?}", file.architecture()).as_bytes());
    h.update(file.entry().to_le_bytes());
    for s in file.segments() {
        let (offset, size) = s.file_range();
        let flags = match s.flags() {
            object::SegmentFlags::Elf { p_flags } => p_flags,
            _ => 0,
        };
        for v in [offset, size, s.address(), s.size(), u64::from(flags)] {
            h.update(v.to_le_bytes());
        }
    }
    for s in file.sections() {
        let name = s.name_bytes().unwrap_or(b"");
        let flags = match s.flags() {
            SectionFlags::Elf { sh_flags } => sh_flags,
            _ => 0,
        };
        h.update((name.len() as u64).to_le_bytes());
        h.update(name);
        for v in [
            flags,
            s.address(),
            s.size(),
            s.file_range().map_or(0, |r| r.1),
        ] {
            h.update(v.to_le_bytes());
        }
        h.update(format!("{:?}", s.kind()).as_bytes());
        let wanted = flags & u64::from(object::elf::SHF_EXECINSTR) != 0
            || std::str::from_utf8(name).is_ok_and(|n| UNWIND_SECTIONS.contains(&n));
        if wanted && let Some((offset, size)) = s.file_range() {
            let range = usize::try_from(offset)
                .ok()
                .zip(usize::try_from(size).ok())
                .and_then(|(o, n)| Some(o..o.checked_add(n)?))
                .filter(|r| r.end <= data.len());
            match range {
                Some(r) => {
                    const CHUNK: usize = 8 << 20;
                    let mut at = r.start;
                    while at < r.end {
                        let end = (at + CHUNK).min(r.end);
                        h.update(&data[at..end]);
                        data.release(at..end);
                        at = end;
                    }
                }
                // Out of the file: the table derivation refuses it too.
                None => h.update(b"\xffout of file"),
            }
        }
    }
    Some(h.finalize().into())
}

/// A SHA-256 of raw bytes (the vDSO image).
fn digest_bytes(data: &[u8]) -> [u8; 32] {
    use sha2::Digest as _;
    sha2::Sha256::digest(data).into()
}
