//! Naming stacks off the profiler's event loop.
//!
//! The first time a stack reaches an object, the symbolizer opens and parses it
//! (symbol tables, DWARF line and inline information): milliseconds for a small
//! library, seconds for a compiler's hundreds of megabytes, and far more under
//! emulation or on a busy host. Done on the event loop, that held lifecycle events
//! back — a process that forked, executed and exited meanwhile was never read, and its
//! samples stayed without a table. The loop hands the addresses of new stacks to this
//! thread and picks the names up at a later update; the samples wait in the feed
//! meanwhile (bounded there).
//!
//! The thread has its own [`Symbolizer`] (blazesym's state is not `Send`), bounded
//! like every other; the loop's outputs (interval files, the final profile) keep theirs.

use std::{
    sync::{
        Arc,
        atomic::{AtomicU64, AtomicUsize, Ordering},
        mpsc::{self, Receiver, Sender},
    },
    thread,
};

use crate::{
    export::{Sleep, Stack},
    procfs::Mapping,
    symbolize::{Frame, Symbolizer},
};

/// (pid, user stack, kernel stack, off-CPU sleep): what a name is made of.
pub(super) type NameKey = (u32, u64, i32, Option<Sleep>);

/// One stack to name: the addresses to symbolize, innermost first.
pub(super) struct Job {
    pub key: NameKey,
    /// [`crate::profiler::symbolization_addresses`] of the user stack.
    pub user: Vec<u64>,
    /// [`crate::profiler::kernel_symbolization_addresses`] of the kernel stack.
    pub kernel: Vec<u64>,
}

/// The new stacks of one process, with its mappings as the loop last read them.
pub(super) struct Batch {
    pub pid: u32,
    pub maps: Vec<Mapping>,
    /// Its perf map (names of JIT code), if it has one.
    pub perf_map: Option<std::sync::Arc<crate::symbolize::PerfMap>>,
    /// Its CPython namer, if it runs CPython.
    pub python: Option<std::sync::Arc<crate::python::PyNamer>>,
    pub jobs: Vec<Job>,
}

/// Most stacks submitted and not named yet: the samples of further new stacks are
/// dropped and counted (`sframe_unnamed_samples_dropped`).
pub(super) const MAX_JOBS_IN_FLIGHT: usize = 65_536;

/// Most processes' batches submitted and not named yet (each holds a copy of its
/// process's executable mappings, up to the read bound): while a slow object holds
/// the thread, process churn cannot queue copies without end.
pub(super) const MAX_BATCHES_IN_FLIGHT: usize = 256;

/// The naming thread and its two channels. Dropping it closes the job channel: the
/// thread ends after the batch it is naming.
pub(super) struct Namer {
    jobs: Sender<Vec<Batch>>,
    names: Receiver<Vec<(NameKey, String)>>,
    /// Stacks submitted whose names have not been taken yet.
    jobs_in_flight: usize,
    /// Batches submitted that the thread has not finished (it counts them down).
    batches_in_flight: Arc<AtomicUsize>,
    /// The thread's symbolizer's figures, as of its last chunk.
    figures: Arc<Figures>,
}

/// What the naming thread's symbolizer keeps ([`crate::symbolize::SymbolizerStats`]).
#[derive(Default)]
struct Figures {
    state_bytes: AtomicU64,
    evictions: AtomicU64,
}

impl Namer {
    /// Its symbolizer names objects without line tables from the debug files
    /// `debuginfod` fetches, if given.
    pub fn spawn_with(
        debuginfod: Option<Arc<crate::symbolize::debuginfod::Debuginfod>>,
    ) -> std::io::Result<Self> {
        let (jobs, job_rx) = mpsc::channel::<Vec<Batch>>();
        let (name_tx, names) = mpsc::channel();
        let batches_in_flight = Arc::new(AtomicUsize::new(0));
        let finished = batches_in_flight.clone();
        let figures = Arc::new(Figures::default());
        let published = figures.clone();
        thread::Builder::new()
            .name("sframe-namer".into())
            .spawn(move || run(job_rx, name_tx, &finished, &published, debuginfod))?;
        Ok(Self {
            jobs,
            names,
            jobs_in_flight: 0,
            batches_in_flight,
            figures,
        })
    }

    /// Heap bytes the thread's symbolizer keeps (see [`crate::heap`]).
    pub fn state_bytes(&self) -> u64 {
        self.figures.state_bytes.load(Ordering::Relaxed)
    }

    /// Objects the thread's symbolizer dropped to stay within its bounds.
    pub fn evictions(&self) -> u64 {
        self.figures.evictions.load(Ordering::Relaxed)
    }

    /// Whether `jobs` more stacks in `batches` more batches than are in flight now
    /// stay within [`MAX_JOBS_IN_FLIGHT`] and [`MAX_BATCHES_IN_FLIGHT`].
    pub fn room(&self, jobs: usize, batches: usize) -> bool {
        self.jobs_in_flight.saturating_add(jobs) <= MAX_JOBS_IN_FLIGHT
            && self
                .batches_in_flight
                .load(Ordering::Relaxed)
                .saturating_add(batches)
                <= MAX_BATCHES_IN_FLIGHT
    }

    /// Queues `batches` (callers keep within [`Self::room`]). False if the thread is
    /// gone: what was in flight then stays counted, so no more is queued.
    pub fn submit(&mut self, batches: Vec<Batch>) -> bool {
        if batches.is_empty() {
            return true;
        }
        let jobs: usize = batches.iter().map(|b| b.jobs.len()).sum();
        self.jobs_in_flight = self.jobs_in_flight.saturating_add(jobs);
        self.batches_in_flight
            .fetch_add(batches.len(), Ordering::Relaxed);
        self.jobs.send(batches).is_ok()
    }

    /// The names made since the last call, without waiting.
    pub fn take_names(&mut self) -> Vec<(NameKey, String)> {
        let mut out = Vec::new();
        // Empty or disconnected: nothing more now.
        while let Ok(mut named) = self.names.try_recv() {
            out.append(&mut named);
        }
        self.jobs_in_flight = self.jobs_in_flight.saturating_sub(out.len());
        out
    }
}

/// Most addresses symbolized in one call (a chunk of one process's jobs): the frames of
/// a call are held at once, and the names of a chunk go back to the loop as it ends.
const CHUNK_ADDRESSES: usize = 8192;

/// The naming thread: names each batch a chunk of jobs at a time, one symbolizer call
/// for the user and one for the kernel addresses of a chunk (blazesym's cost per call
/// and per object, and the sort of the process's mappings, paid once per chunk rather
/// than per stack).
fn run(
    jobs: Receiver<Vec<Batch>>,
    names: Sender<Vec<(NameKey, String)>>,
    batches_in_flight: &AtomicUsize,
    figures: &Figures,
    debuginfod: Option<Arc<crate::symbolize::debuginfod::Debuginfod>>,
) {
    let mut symbolizer = Symbolizer::new();
    symbolizer.set_debuginfod(debuginfod);
    while let Ok(batches) = jobs.recv() {
        for batch in batches {
            let mut rest = batch.jobs;
            while !rest.is_empty() {
                let take = chunk_len(&rest, CHUNK_ADDRESSES);
                let chunk: Vec<Job> = rest.drain(..take).collect();
                let named = name_jobs(
                    &mut symbolizer,
                    batch.pid,
                    &batch.maps,
                    batch.perf_map.as_deref(),
                    batch.python.as_deref(),
                    chunk,
                );
                let stats = symbolizer.stats();
                figures
                    .state_bytes
                    .store(stats.state_bytes, Ordering::Relaxed);
                figures.evictions.store(stats.evictions, Ordering::Relaxed);
                if rest.is_empty() {
                    // Before its last names go: once the loop has them all, the
                    // batch is no longer counted.
                    batches_in_flight.fetch_sub(1, Ordering::Relaxed);
                }
                if names.send(named).is_err() {
                    return;
                }
            }
        }
        symbolizer.end_round();
    }
}

/// How many of the first `jobs` make one chunk: as many as hold at most `limit`
/// addresses together, and at least one.
fn chunk_len(jobs: &[Job], limit: usize) -> usize {
    let mut addresses = 0usize;
    jobs.iter()
        .take_while(|j| {
            addresses = addresses.saturating_add(j.user.len() + j.kernel.len());
            addresses <= limit
        })
        .count()
        .max(1)
}

/// Folded names (outermost first, `;` inside a name made `:`) of `jobs`, stacks of
/// process `pid` whose mappings are `maps`.
fn name_jobs(
    s: &mut Symbolizer,
    pid: u32,
    maps: &[Mapping],
    perf_map: Option<&crate::symbolize::PerfMap>,
    python: Option<&crate::python::PyNamer>,
    jobs: Vec<Job>,
) -> Vec<(NameKey, String)> {
    let user: Vec<u64> = jobs.iter().flat_map(|j| j.user.iter().copied()).collect();
    let kernel: Vec<u64> = jobs.iter().flat_map(|j| j.kernel.iter().copied()).collect();
    // One frame per address, in order: each job takes its own back.
    let mut user = if user.is_empty() {
        Vec::new()
    } else {
        s.symbolize_process(pid, maps, perf_map, python, &user)
    }
    .into_iter();
    let mut kernel = if kernel.is_empty() {
        Vec::new()
    } else {
        s.symbolize_kernel(&kernel)
    }
    .into_iter();
    jobs.into_iter()
        .map(|job| {
            let user: Vec<Frame> = user.by_ref().take(job.user.len()).collect();
            let mut user = crate::python::merge(&job.user, user);
            user.reverse();
            let mut kernel: Vec<Frame> = kernel.by_ref().take(job.kernel.len()).collect();
            kernel.reverse();
            let stack = Stack {
                tid: 0,
                thread: String::new(),
                user,
                kernel,
                count: 0,
                outcome: sframe_common::WalkOutcome::Complete,
                sleep: job.key.3,
            };
            let names: Vec<String> = stack.names().iter().map(|n| n.replace(';', ":")).collect();
            (job.key, names.join(";"))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The loop's side never waits for the symbolizer: while the naming thread is
    /// held up (as by a first parse of a large object), submitting and collecting
    /// return at once, and the names come once it goes on.
    #[test]
    fn the_loop_does_not_wait_for_a_busy_symbolizer() {
        let mut namer = Namer::spawn_with(None).unwrap();
        // The naming thread's symbolizer waits for this to call into blazesym.
        let held = crate::symbolize::hold_blazesym();
        let key: NameKey = (std::process::id(), 7, -1, None);
        let addr = the_loop_does_not_wait_for_a_busy_symbolizer as *const () as u64;
        let maps = crate::procfs::read_maps(std::process::id()).unwrap();
        assert!(namer.submit(vec![Batch {
            pid: std::process::id(),
            maps,
            perf_map: None,
            python: None,
            jobs: vec![Job {
                key,
                user: vec![addr],
                kernel: Vec::new(),
            }],
        }]));
        // Nothing can be named while the symbolizer is held; asking does not block.
        assert!(namer.take_names().is_empty());
        drop(held);
        // A guard against a hang only: the name comes as soon as the thread runs.
        let named = namer
            .names
            .recv_timeout(std::time::Duration::from_secs(60))
            .expect("no names from the naming thread");
        assert_eq!(named.len(), 1);
        assert_eq!(named[0].0, key);
        assert!(
            named[0]
                .1
                .contains("the_loop_does_not_wait_for_a_busy_symbolizer"),
            "{}",
            named[0].1
        );
        // Its symbolizer's state (this test binary's symbols and debug information:
        // counted, as the unit tests install the counting allocator) is published
        // before the names go.
        assert!(namer.state_bytes() > 0);
        assert_eq!(namer.evictions(), 0);
    }

    /// What is in flight is bounded (stacks and process batches) and given back as
    /// names are taken, not before: while the thread is held, nothing is given back.
    #[test]
    fn room_is_given_back_when_names_come() {
        let mut namer = Namer::spawn_with(None).unwrap();
        let held = crate::symbolize::hold_blazesym();
        let maps = crate::procfs::read_maps(std::process::id()).unwrap();
        let addr = room_is_given_back_when_names_come as *const () as u64;
        let batch = |n| Batch {
            pid: std::process::id(),
            maps: maps.clone(),
            perf_map: None,
            python: None,
            jobs: vec![job(n, vec![addr])],
        };
        assert!(namer.submit(vec![batch(1), batch(2)]));
        assert!(namer.room(MAX_JOBS_IN_FLIGHT - 2, MAX_BATCHES_IN_FLIGHT - 2));
        assert!(!namer.room(MAX_JOBS_IN_FLIGHT - 1, 0));
        assert!(!namer.room(0, MAX_BATCHES_IN_FLIGHT - 1));
        assert!(namer.take_names().is_empty());
        assert!(!namer.room(MAX_JOBS_IN_FLIGHT - 1, 0));
        drop(held);
        // A guard against a hang only: the names come as soon as the thread runs.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
        let mut named = 0;
        while named < 2 {
            assert!(std::time::Instant::now() < deadline, "no names after 60 s");
            let got = namer.take_names();
            if got.is_empty() {
                std::thread::sleep(std::time::Duration::from_millis(5));
            }
            named += got.len();
        }
        assert_eq!(named, 2);
        assert_eq!(namer.jobs_in_flight, 0);
        assert_eq!(namer.batches_in_flight.load(Ordering::Relaxed), 0);
        assert!(namer.room(MAX_JOBS_IN_FLIGHT, MAX_BATCHES_IN_FLIGHT));
    }

    fn job(n: u64, user: Vec<u64>) -> Job {
        Job {
            key: (std::process::id(), n, -1, None),
            user,
            kernel: Vec::new(),
        }
    }

    /// Chunks hold at most the limit, and one job over it goes alone.
    #[test]
    fn chunks_are_bounded_and_never_empty() {
        let jobs = vec![job(1, vec![0; 3]), job(2, vec![0; 4]), job(3, vec![0; 2])];
        assert_eq!(chunk_len(&jobs, 7), 2);
        assert_eq!(chunk_len(&jobs, 9), 3);
        assert_eq!(chunk_len(&jobs, 6), 1);
        assert_eq!(chunk_len(&jobs, 2), 1);
        assert_eq!(chunk_len(&jobs[2..], 100), 1);
    }

    /// Jobs named in one call each get their own frames back, in order, whatever
    /// their lengths (empty ones too).
    #[test]
    fn a_chunk_gives_each_stack_its_own_frames() {
        let a = chunk_len as *const () as u64;
        let b = name_jobs as *const () as u64;
        let pid = std::process::id();
        let maps = crate::procfs::read_maps(pid).unwrap();
        let mut s = Symbolizer::new();
        let named = name_jobs(
            &mut s,
            pid,
            &maps,
            None,
            None,
            vec![
                job(1, vec![a]),
                job(2, Vec::new()),
                job(3, vec![a, b]),
                job(4, vec![b]),
            ],
        );
        let keys: Vec<u64> = named.iter().map(|(k, _)| k.1).collect();
        assert_eq!(keys, [1, 2, 3, 4]);
        let leaf = |name: &str| name.rsplit(';').next().unwrap_or_default().to_owned();
        assert!(leaf(&named[0].1).contains("chunk_len"), "{}", named[0].1);
        assert!(named[1].1.is_empty(), "{}", named[1].1);
        // Innermost first in the job, outermost first in the name.
        assert!(leaf(&named[2].1).contains("chunk_len"), "{}", named[2].1);
        assert!(named[2].1.contains("name_jobs"), "{}", named[2].1);
        assert!(
            !named[2].1.starts_with(&leaf(&named[2].1)),
            "{}",
            named[2].1
        );
        assert!(leaf(&named[3].1).contains("name_jobs"), "{}", named[3].1);
        assert!(!named[3].1.contains("chunk_len"), "{}", named[3].1);
    }
}
