//! From `/proc/PID/maps` to kernel tables: every executable mapping of a process gets
//! its object's table (built once per object, shared by all processes that map it) and
//! its load bias.
//!
//! Files are opened through `/proc/PID/map_files/START-END` (so deleted-but-mapped files
//! work and the process's own mount namespace is used), falling back to
//! `/proc/PID/root/PATH`. The vDSO is read from the process's memory.
//!
//! Three parts, one job each:
//! - `identity`: the file behind a mapping, its stamp, and the object's key;
//! - `build`: tables built (here or on the build thread), from the disk cache or
//!   derived and flattened, and copied into the kernel;
//! - this module: residency — which objects each process's mapping table refers to,
//!   their reference counts, eviction of unused ones when room is needed.

mod build;
mod identity;

use std::{
    collections::HashMap,
    fs,
    time::{Duration, Instant},
};

use sframe_common::layout::{MAPPING_FLAG_BUILDING, MAPPING_FLAG_VDSO, MappingEntry, NO_OBJECT};

pub(crate) use self::identity::open_mapped_file;
use self::{
    build::{Job, Worker, load_timer},
    identity::{
        FileId, FileStamp, MappingId, digest_bytes, file_id, mapping_id, open_object,
        stamp_of_mapping,
    },
};
pub use self::{
    build::{
        MAX_QUEUED_BUILDS, SYNC_BUILD_BYTES, load_cpu_seconds, release_free_heap, single_heap_arena,
    },
    identity::{MAX_OBJECT_BYTES, MappedFileError, ObjectKey, content_digest},
};
use crate::{
    kmaps::{KernelTables, Placement},
    mapped::ObjectBytes,
    objtable::ObjTableOptions,
    procfs::{self, Mapping},
    segments::{self, Segment},
    table::Source,
};

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
    /// Which install this is (`ObjectStore::installs` then): a sample that found no
    /// mapping is walked again only over a newer table.
    generation: u64,
}

/// How long a file that could not be opened or mapped is not tried again.
const UNREADABLE_RETRY: Duration = Duration::from_secs(10);
/// Unreadable files remembered at most (then forgotten all at once).
const MAX_UNREADABLE: usize = 16 * 1024;

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
    tables: KernelTables,
    objects: HashMap<ObjectKey, ObjectInfo>,
    /// (dev, inode, path) of a mapped file → its key and the file's stamp when it was
    /// read, so a file is read once, and again when it was rewritten in place.
    files: HashMap<FileId, (ObjectKey, FileStamp)>,
    /// What each process's kernel mapping table holds.
    processes: HashMap<u32, Installed>,
    options: ObjTableOptions,
    /// Flattened tables on disk, by build-id (`--cache-dir`).
    cache: Option<crate::cache::TableCache>,
    /// Identify and derive objects off the event loop: small ones, large ones.
    workers: [Option<Worker>; 2],
    /// Objects on the worker, and the processes to reload when they are done.
    in_flight: HashMap<ObjectKey, std::collections::HashSet<u32>>,
    /// Files being identified on the worker, and the processes that map them.
    identifying: HashMap<FileId, std::collections::HashSet<u32>>,
    /// Finished builds are left on the worker's channel (tests: a build that takes long).
    builds_held: bool,
    /// Time spent building tables on the calling thread, in all.
    build_time: Duration,
    /// Objects whose table could not be built or loaded.
    failed_objects: u64,
    stats: StoreStats,
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
    /// Process tables installed so far.
    installs: u64,
}

/// The executable mappings a process's table keeps (sorted by address, at most
/// `MAX_MAPPINGS`) and how many it drops. Within the bound, all of them. Past it (any
/// user can map the same page of a file thousands of times), first one mapping of each
/// distinct part of each object with a table (its start less its bias, the link-time
/// address, identifies the part) and the vDSO and mappings whose table is being built;
/// then the rest, lowest addresses first. So a process cannot push the libraries its
/// code runs in out of its own table with copies of one page, wherever it puts them.
fn choose_mappings(mut entries: Vec<MappingEntry>) -> (Vec<MappingEntry>, usize) {
    use sframe_common::budget::MAX_MAPPINGS;
    entries.sort_by_key(|e| e.start);
    if entries.len() <= MAX_MAPPINGS {
        return (entries, 0);
    }
    let dropped = entries.len() - MAX_MAPPINGS;
    let mut parts = std::collections::HashSet::new();
    let (mut first, mut rest): (Vec<MappingEntry>, Vec<MappingEntry>) =
        entries.into_iter().partition(|e| {
            (e.object != NO_OBJECT || e.flags != 0)
                && parts.insert((e.object, e.flags, e.start.wrapping_sub(e.bias)))
        });
    first.truncate(MAX_MAPPINGS);
    rest.truncate(MAX_MAPPINGS - first.len());
    first.append(&mut rest);
    first.sort_by_key(|e| e.start);
    (first, dropped)
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
            workers: [None, None],
            in_flight: HashMap::new(),
            identifying: HashMap::new(),
            builds_held: false,
            build_time: Duration::ZERO,
            failed_objects: 0,
            stats: StoreStats::default(),
            no_room: HashMap::new(),
            removals: 0,
            unreadable: HashMap::new(),
            installs: 0,
        }
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

    /// Which install `pid`'s table is: it changes with every load of the process.
    pub fn process_generation(&self, pid: u32) -> Option<u64> {
        self.processes.get(&pid).map(|p| p.generation)
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

    /// What the store did since it was created.
    pub fn stats(&self) -> StoreStats {
        self.stats
    }

    /// The kernel tables the objects live in.
    pub fn tables(&self) -> &KernelTables {
        &self.tables
    }

    /// The disk cache of flattened tables (`--cache-dir`), if any.
    pub fn cache(&self) -> Option<&crate::cache::TableCache> {
        self.cache.as_ref()
    }

    /// From now on the cache's files are written by its own thread (the loop must not
    /// wait for the disk).
    pub fn write_cache_in_background(&mut self) {
        if let Some(cache) = self.cache.as_mut() {
            cache.write_in_background();
        }
    }

    /// Drops the profiler's mappings of the table maps if unused for `idle` (see
    /// [`KernelTables::unmap_if_idle`]); whether they were.
    pub fn unmap_tables_if_idle(&mut self, idle: Duration) -> bool {
        self.tables.unmap_if_idle(idle)
    }

    /// Uses `cache` for tables from now on.
    pub fn set_cache(&mut self, cache: crate::cache::TableCache) {
        self.cache = Some(cache);
    }

    /// What the exporters report of the store.
    pub fn figures(&self) -> StoreFigures {
        let loaded = || self.objects().filter(|o| o.placement.is_some());
        let mut by_source = [0; 4];
        for s in loaded().filter_map(|o| o.source) {
            if let Some(n) = by_source.get_mut(source_index(s)) {
                *n += 1;
            }
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
        self.refresh_process_with(pid, build, &mut || {})
    }

    /// [`ObjectStore::refresh_process`], calling `between` after each executable mapping:
    /// the loop drains the kernel's deferred ring there, which a process load that builds
    /// several libraries on the loop (100 ms each under load) would otherwise overflow.
    pub fn refresh_process_with(
        &mut self,
        pid: u32,
        build: Build,
        between: &mut dyn FnMut(),
    ) -> Result<ProcessReport, procfs::MapsError> {
        let _timer = load_timer();
        let maps = procfs::read_executable_maps(pid)?;
        if maps.is_empty() {
            // No executable mapping: it exited (a zombie's maps read empty) or was read
            // mid-exec. The table installed before stays: samples still waiting are
            // walked with it before the caller forgets the process (an empty table
            // would leave them only their PC).
            return Ok(ProcessReport::default());
        }
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
            between();
        }
        let (entries, dropped) = choose_mappings(entries);
        match self.tables.set_process(pid, &entries) {
            Ok(_) => {
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
        self.installs += 1;
        let installed = Installed {
            objects: keys,
            entries,
            resolved,
            generation: self.installs,
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
                let Some((fallback, stamp, data)) = open_object(pid, m) else {
                    if self.unreadable.len() >= MAX_UNREADABLE {
                        self.unreadable.clear();
                    }
                    self.unreadable.insert(unreadable_id, Instant::now());
                    return None;
                };
                match known {
                    // Known, but to build again (its table found no room): not hashed
                    // again.
                    Some(k) => {
                        let pids = [pid].into();
                        if !self.take_object(&pids, k.clone(), file_id, stamp, &m.path, data, build)
                        {
                            return None;
                        }
                        k
                    }
                    None if data.len() > SYNC_BUILD_BYTES
                        && build == Build::Background
                        && self.worker(data.len()).is_some() =>
                    {
                        let len = data.len();
                        let job = Job::Identify {
                            file: file_id.clone(),
                            stamp,
                            path: m.path.clone(),
                            data,
                            fallback,
                        };
                        match self.worker(len).map(|w| w.send(job)) {
                            Some(true) => {
                                self.stats.background_identifications += 1;
                                self.identifying.insert(file_id, [pid].into());
                            }
                            // Not remembered as read: the next reload tries again.
                            _ => self.stats.builds_dropped += 1,
                        }
                        return None;
                    }
                    None => {
                        // Identified and built here, from one parse of the file.
                        let parsed = crate::ehframe::ParsedElf::parse(&data).ok();
                        let key = match &parsed {
                            Some(elf) => Some(identity::digest_of_file(elf.file(), &data)),
                            // Not a 64-bit ELF file: no table, but an identity all
                            // the same.
                            None => content_digest(&data),
                        }
                        .map(ObjectKey::Content)
                        .unwrap_or(fallback);
                        if self.join_in_flight(&[pid].into(), &key, &file_id, stamp) {
                            return None;
                        }
                        let built = key.clone();
                        self.build_here(built, file_id, stamp, &m.path, &data, parsed.as_ref());
                        key
                    }
                }
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
                    let info = self.finish_build(&key, "[vdso]", &data, None, None);
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

#[cfg(test)]
mod tests {
    use super::*;
    use sframe_common::budget::MAX_MAPPINGS;

    fn entry(start: u64, object: u32, bias: u64) -> MappingEntry {
        MappingEntry {
            start,
            end: start + 0x1000,
            bias,
            object,
            flags: 0,
        }
    }

    #[test]
    fn copies_of_one_page_do_not_push_the_libraries_out() {
        // The storm of tests/hostile_storm.rs: the program (object 1, at the bottom),
        // 3000 copies of its first page below the C library (object 2, at the top).
        let mut all = vec![entry(0x5555_0000_0000, 1, 0x5555_0000_0000)];
        for i in 0..3000u64 {
            let start = 0x7f00_0000_0000 + i * 0x2000;
            all.push(entry(start, 1, start));
        }
        all.push(entry(0x7fff_f000_0000, 2, 0x7fff_e000_0000));
        all.push(entry(0x7fff_f100_0000, NO_OBJECT, 0));
        let n = all.len();
        let (kept, dropped) = choose_mappings(all);
        assert_eq!(kept.len(), MAX_MAPPINGS);
        assert_eq!(dropped, n - MAX_MAPPINGS);
        assert!(kept.windows(2).all(|w| w[0].start < w[1].start), "sorted");
        assert!(kept.iter().any(|e| e.object == 2), "the library is kept");
        assert!(kept.iter().any(|e| e.start == 0x5555_0000_0000));
        // The rest by address: the lowest copies.
        assert_eq!(kept[1].start, 0x7f00_0000_0000);
    }

    #[test]
    fn within_the_bound_every_mapping_is_kept_sorted() {
        let all: Vec<_> = (0..MAX_MAPPINGS as u64)
            .rev()
            .map(|i| entry(0x1000_0000 + i * 0x2000, NO_OBJECT, 0))
            .collect();
        let (kept, dropped) = choose_mappings(all);
        assert_eq!((kept.len(), dropped), (MAX_MAPPINGS, 0));
        assert!(kept.windows(2).all(|w| w[0].start < w[1].start));
    }
}
