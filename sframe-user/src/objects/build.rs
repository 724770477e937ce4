//! Building objects' tables: on the event loop (small objects, explicit targets) or on
//! the build thread (`sframe-build`: large objects first seen by a load from an event,
//! identified then derived off the loop), from the disk cache when it has them, then
//! flattened and copied into the kernel.

use std::time::{Duration, Instant};

use super::{
    Build, ObjectError, ObjectInfo, ObjectStore, RETRY_FULL,
    identity::{FileId, FileStamp, ObjectKey, content_digest, file_id},
};
use crate::{
    ehframe::ParsedElf,
    flatten::{RuleDict, flatten},
    mapped::ObjectBytes,
    objtable::{ObjTableOptions, table_for_elf, table_for_parsed},
    procfs::Mapping,
    segments,
    table::Source,
};

/// Jobs waiting for the build thread at most (objects to identify or to build); more
/// are dropped (counted in [`super::StoreStats::builds_dropped`]) and tried again at their
/// process's next reload. Each holds a file mapping, not its bytes.
pub const MAX_QUEUED_BUILDS: usize = 64;

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

/// CPU seconds spent loading tables so far (reading maps, opening, hashing, deriving,
/// flattening and copying tables into the kernel), on the loop and the build thread.
/// The overhead governor leaves it out of the sampling budget: it scales with process
/// churn, not with the sampling rate.
pub fn load_cpu_seconds() -> f64 {
    crate::cputime::seconds(&crate::cputime::LOADING)
}

pub(super) fn load_timer() -> crate::cputime::Timer {
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
pub(super) struct Derived {
    /// The object's segments, from the parse its table was built from.
    segments: Vec<crate::segments::Segment>,
    source: Source,
    table_rows: usize,
    flat: crate::flatten::FlatObject,
    rules: RuleDict,
}

/// The CFI/SFrame derivation and flattening of one object. A mapped file truncated
/// meanwhile read partly as zeros: what came of it is refused.
/// `parsed`: `data` parsed already (its headers gave the object's identity).
pub(super) fn derive(
    data: &ObjectBytes,
    parsed: Option<&ParsedElf<'_>>,
    options: &ObjTableOptions,
) -> Result<Derived, ObjectError> {
    let derived = data
        .releasing(|| match parsed {
            Some(elf) => table_for_parsed(elf, options),
            None => table_for_elf(data, options),
        })
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
        segments: t.segments,
        source: t.source,
        table_rows: t.table.row_count(),
        flat,
        rules,
    })
}

/// What the build thread is asked to do.
pub(super) enum Job {
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

pub(super) enum Done {
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

/// How long a job may wait while others go first: past it the oldest job goes next, so
/// a stream of small new objects (which any user can make) cannot starve a large one.
const MAX_JOB_WAIT: Duration = Duration::from_secs(2);

/// The job to take among `jobs` (each one's [`Job::order`] and when it was queued): the
/// oldest if it has waited `MAX_JOB_WAIT`, else the first in order.
fn pick(jobs: impl Iterator<Item = ((u8, usize), Instant)> + Clone, now: Instant) -> Option<usize> {
    let (oldest, (_, at)) = jobs.clone().enumerate().min_by_key(|(_, (_, at))| *at)?;
    if now.saturating_duration_since(at) >= MAX_JOB_WAIT {
        return Some(oldest);
    }
    jobs.enumerate()
        .min_by_key(|(_, (order, _))| *order)
        .map(|(i, _)| i)
}

/// The jobs waiting for the build thread (with when each was queued), and whether its
/// owner is gone.
#[derive(Default)]
pub(super) struct JobQueue {
    jobs: Vec<(Instant, Job)>,
    closed: bool,
}

/// One thread identifying and deriving objects off the event loop, from a bounded
/// queue, smallest first (but none waits more than `MAX_JOB_WAIT` behind later ones).
pub(super) struct Worker {
    queue: std::sync::Arc<(std::sync::Mutex<JobQueue>, std::sync::Condvar)>,
    done: std::sync::mpsc::Receiver<Done>,
}

/// Objects larger than this are identified and built on a thread of their own: a
/// library of a few MB (libc is 2) must not wait seconds behind a compiler's hundreds.
pub const LARGE_OBJECT_BYTES: usize = 8 << 20;

/// The build thread for an object of `len` bytes: 0 for small ones, 1 for large ones.
fn lane(len: usize) -> usize {
    usize::from(len > LARGE_OBJECT_BYTES)
}

impl Worker {
    fn spawn(name: &str) -> Option<Self> {
        let queue = std::sync::Arc::new((
            std::sync::Mutex::new(JobQueue::default()),
            std::sync::Condvar::new(),
        ));
        let (done_tx, done) = std::sync::mpsc::channel();
        let shared = queue.clone();
        std::thread::Builder::new()
            .name(name.into())
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
                            derived: derive(&data, None, &options),
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
            let jobs = q.jobs.iter().map(|(at, j)| (j.order(), *at));
            if let Some(i) = pick(jobs, Instant::now()) {
                return Some(q.jobs.swap_remove(i).1);
            }
            q = ready
                .wait(q)
                .unwrap_or_else(std::sync::PoisonError::into_inner);
        }
    }

    /// Queues `job`; false (the job dropped) if the queue is full.
    pub(super) fn send(&self, job: Job) -> bool {
        let (queue, ready) = &*self.queue;
        let mut q = queue
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if q.jobs.len() >= MAX_QUEUED_BUILDS {
            return false;
        }
        q.jobs.push((Instant::now(), job));
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

impl ObjectStore {
    /// The build thread for an object of `len` bytes, started on first use (so that it
    /// inherits the privileges the process has then, e.g. after `--drop-privileges`).
    pub(super) fn worker(&mut self, len: usize) -> Option<&Worker> {
        let lane = lane(len);
        let slot = self.workers.get_mut(lane)?;
        if slot.is_none() {
            *slot = Worker::spawn(if lane == 0 {
                "sframe-build"
            } else {
                "sframe-build-large"
            });
        }
        slot.as_ref()
    }

    /// Loads the tables the worker finished; returns the processes to reload (they map
    /// those objects).
    pub fn poll_builds(&mut self) -> Vec<u32> {
        let _timer = load_timer();
        let mut reload = Vec::new();
        if self.builds_held {
            return reload;
        }
        let finished: Vec<Done> = self
            .workers
            .iter()
            .flatten()
            .flat_map(|w| w.done.try_iter())
            .collect();
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
                    let info = self.finish_build(&key, &path, &data, None, Some(derived));
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
    pub(super) fn building(&self, m: &Mapping) -> bool {
        let id = file_id(m);
        self.identifying.contains_key(&id)
            || self
                .files
                .get(&id)
                .is_some_and(|(k, _)| self.in_flight.contains_key(k))
    }

    /// With its key known, takes a file's object: joins its build if it is on the worker,
    /// or builds it (here, or on the worker if it is large, `build` allows it and its table
    /// is not cached) unless it is loaded already. Returns whether it is usable now;
    /// otherwise `pids` are reloaded when its build is done (or tried again at their next
    /// reload if the worker's queue was full).
    #[allow(clippy::too_many_arguments)]
    pub(super) fn take_object(
        &mut self,
        pids: &std::collections::HashSet<u32>,
        key: ObjectKey,
        file: FileId,
        stamp: FileStamp,
        path: &str,
        data: ObjectBytes,
        build: Build,
    ) -> bool {
        if self.join_in_flight(pids, &key, &file, stamp) {
            return false;
        }
        if !self.usable(&key) {
            let options = self.options.clone();
            if data.len() > SYNC_BUILD_BYTES
                && build == Build::Background
                && !self.cached(&key)
                && let Some(worker) = self.worker(data.len())
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
        }
        self.build_here(key, file, stamp, path, &data, None);
        true
    }

    /// When the object is being built on the worker (for another path or inode),
    /// adds `pids` to those reloaded when it is done, remembers it as the file's and
    /// returns true.
    pub(super) fn join_in_flight(
        &mut self,
        pids: &std::collections::HashSet<u32>,
        key: &ObjectKey,
        file: &FileId,
        stamp: FileStamp,
    ) -> bool {
        let Some(waiting) = self.in_flight.get_mut(key) else {
            return false;
        };
        waiting.extend(pids);
        self.files.insert(file.clone(), (key.clone(), stamp));
        true
    }

    /// Builds the object here (on the loop) unless it is usable already, and
    /// remembers it as the file's. `parsed`: its bytes parsed already.
    pub(super) fn build_here(
        &mut self,
        key: ObjectKey,
        file: FileId,
        stamp: FileStamp,
        path: &str,
        data: &ObjectBytes,
        parsed: Option<&ParsedElf<'_>>,
    ) {
        if !self.usable(&key) {
            let info = self.finish_build(&key, path, data, parsed, None);
            self.objects.insert(key.clone(), info);
        }
        self.files.insert(file, (key, stamp));
    }

    /// Whether the disk cache holds this object's table (then loading it is quick).
    pub(super) fn cached(&self, key: &ObjectKey) -> bool {
        match (&self.cache, key) {
            (Some(cache), ObjectKey::Content(digest)) => cache.contains(digest),
            _ => false,
        }
    }

    /// Builds the object's kernel table from the disk cache, else from `derived` (the
    /// result of `derive` on `data`, computed on the worker) or derived now (from
    /// `parsed`, `data` parsed already, when given).
    pub(super) fn finish_build(
        &mut self,
        key: &ObjectKey,
        path: &str,
        data: &ObjectBytes,
        parsed: Option<&ParsedElf<'_>>,
        derived: Option<Result<Derived, ObjectError>>,
    ) -> ObjectInfo {
        let started = Instant::now();
        let mut info = ObjectInfo {
            path: path.to_owned(),
            placement: None,
            source: None,
            error: None,
            segments: Vec::new(),
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
                .unwrap_or_else(|| derive(data, parsed, &self.options))
                .and_then(|d| {
                    info.segments = d.segments;
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
        // From a cache hit, or a derivation that failed: the segments' own parse.
        if info.segments.is_empty() {
            info.segments = match parsed {
                Some(elf) => segments::of_file(elf.file()),
                None => segments::segments(data),
            };
        }
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
        self.build_time += started.elapsed();
        info
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn identifications_then_the_smallest_object_go_first_but_none_waits_for_ever() {
        let t0 = Instant::now();
        let at = |ms: u64| t0 + Duration::from_millis(ms);
        // A large build queued first, then a small build and an identification.
        let jobs = [
            ((1, 300 << 20), at(0)),
            ((1, 2 << 20), at(10)),
            ((0, 50 << 20), at(20)),
        ];
        assert_eq!(pick(jobs.iter().copied(), at(100)), Some(2));
        let rest = [jobs[0], jobs[1]];
        assert_eq!(pick(rest.iter().copied(), at(100)), Some(1));
        // Small objects keep coming: once the large one has waited MAX_JOB_WAIT it goes.
        let late = at(0) + MAX_JOB_WAIT;
        let stream = [jobs[0], ((1, 1 << 20), late), ((0, 1 << 20), late)];
        assert_eq!(pick(stream.iter().copied(), late), Some(0));
        assert_eq!(pick(std::iter::empty(), late), None);
    }
}
