//! Samples the kernel side deferred (no tables for their process yet, or an object
//! still being built): copied with their stack bytes into the `DEFERRED` ring, kept here
//! until their process's tables are loaded (a bounded wait), then walked in user space
//! with the same `sframe_common::step::walk` over the same tables, and counted like the
//! kernel side would have.

use std::{
    collections::{HashMap as StdHashMap, VecDeque},
    time::{Duration, Instant},
};

use aya::maps::{MapData, RingBuf};
use sframe_common::{
    WalkOutcome,
    layout::MappingEntry,
    sample::{DEFERRED_STACK_BYTES, DeferredSample},
    stack::CountKey,
    step::WalkState,
};

use super::Profiler;
use crate::{kmaps::KernelTables, procfs};

/// How long a deferred sample waits for its process's first load (or a reload after a
/// new mapping). Generous: on a busy host (or under emulation) the event loop can be
/// held for seconds; the backlog bound caps the memory.
const DEFERRED_PATIENCE: Duration = Duration::from_secs(10);
/// Deferred samples kept waiting at most (16 KiB each).
const MAX_DEFERRED_BACKLOG: usize = 1024;
/// Of those, at most this many of one process: a process whose samples wait for a long
/// build (a compiler's hundreds of MB, or a large file any user can map and spin in)
/// cannot take every place and leave other new processes' samples to be walked at
/// once, without their tables.
const MAX_DEFERRED_PER_PROCESS: usize = MAX_DEFERRED_BACKLOG / 4;
/// How long a process's liveness (`/proc/PID/stat`), read for its waiting samples, is
/// taken as known: rounds run at every batch of events, and reading it for every waiting
/// process at each took most of the profiler's CPU on a busy host's start (its exit,
/// when the event comes, forgets it at once).
const LIVENESS_TTL: Duration = Duration::from_millis(250);

/// A deferred sample waiting: when it arrived, and the process table generation it
/// was last walked over without finding its PC's mapping (it is walked again only over
/// a newer one: a process whose samples find no mapping cannot make every round walk
/// them all again).
struct Waiting {
    seen: Instant,
    walked_over: Option<u64>,
    rec: Box<DeferredSample>,
}

/// The kernel's ring of deferred samples and the samples taken from it that wait for
/// their process's tables.
pub(super) struct DeferredQueue {
    ring: Option<RingBuf<MapData>>,
    backlog: VecDeque<Waiting>,
    /// Samples waiting in `backlog`, per process.
    per_process: StdHashMap<u32, usize>,
    /// Liveness of the processes with samples waiting, and when it was read.
    liveness: StdHashMap<u32, (Instant, procfs::Liveness)>,
}

impl DeferredQueue {
    pub(super) fn new(ring: Option<RingBuf<MapData>>) -> Self {
        Self {
            ring,
            backlog: VecDeque::new(),
            per_process: StdHashMap::new(),
            liveness: StdHashMap::new(),
        }
    }

    /// The ring buffer, for waiting on it (`AsyncFd`).
    pub(super) fn fd(&self) -> Option<std::os::fd::BorrowedFd<'_>> {
        use std::os::fd::AsFd as _;
        self.ring.as_ref().map(|r| r.as_fd())
    }

    /// Samples waiting.
    pub(super) fn waiting(&self) -> usize {
        self.backlog.len()
    }

    /// The process of each sample waiting.
    pub(super) fn pids(&self) -> impl Iterator<Item = u32> + '_ {
        self.backlog.iter().map(|w| w.rec.pid)
    }

    /// Whether one more sample of `pid` may wait.
    fn has_room_for(&self, pid: u32) -> bool {
        self.backlog.len() < MAX_DEFERRED_BACKLOG
            && self.per_process.get(&pid).copied().unwrap_or(0) < MAX_DEFERRED_PER_PROCESS
    }

    /// Forgets what was read of `pid`'s liveness (it exited).
    pub(super) fn forget_liveness(&mut self, pid: u32) {
        self.liveness.remove(&pid);
    }

    /// Puts a sample (back) to wait.
    fn wait(&mut self, w: Waiting) {
        *self.per_process.entry(w.rec.pid).or_default() += 1;
        self.backlog.push_back(w);
    }

    /// Every sample: those waiting first, then those in the ring (arrived now); `None`
    /// without a ring.
    fn take(&mut self) -> Option<Vec<Waiting>> {
        let ring = self.ring.as_mut()?;
        let now = Instant::now();
        let mut records: Vec<_> = std::mem::take(&mut self.backlog).into();
        self.per_process.clear();
        while let Some(item) = ring.next() {
            if let Some(rec) = record(&item) {
                records.push(Waiting {
                    seen: now,
                    walked_over: None,
                    rec,
                });
            }
        }
        Some(records)
    }

    /// Moves the samples in the ring into the backlog (up to its bound); returns their
    /// processes.
    pub(super) fn drain(&mut self) -> Vec<u32> {
        let Some(ring) = self.ring.as_mut() else {
            return Vec::new();
        };
        let now = Instant::now();
        let mut pids = Vec::new();
        while self.backlog.len() < MAX_DEFERRED_BACKLOG {
            let Some(item) = ring.next() else {
                break;
            };
            if let Some(rec) = record(&item) {
                pids.push(rec.pid);
                *self.per_process.entry(rec.pid).or_default() += 1;
                self.backlog.push_back(Waiting {
                    seen: now,
                    walked_over: None,
                    rec,
                });
            }
        }
        pids
    }
}

/// The sample in one ring record (`None` if it is short).
fn record(item: &[u8]) -> Option<Box<DeferredSample>> {
    if item.len() < size_of::<DeferredSample>() {
        return None;
    }
    // SAFETY: the kernel wrote a DeferredSample (integers and bytes only), and the
    // record holds that many bytes.
    Some(Box::new(unsafe {
        (item.as_ptr() as *const DeferredSample).read_unaligned()
    }))
}

/// Walks a deferred sample over its process's mapping table (`None`: none is known —
/// the process exited before it could be read —, then only the PC is kept, as the
/// kernel side does), reading the stack bytes the sample carries.
fn walk_record(
    rec: &DeferredSample,
    entries: Option<&[MappingEntry]>,
    tables: &KernelTables,
) -> (Box<WalkState>, WalkOutcome) {
    let mut st = Box::<WalkState>::default();
    st.top = rec.top;
    let base = rec.stack_base;
    let len = (rec.stack_len as usize).min(DEFERRED_STACK_BYTES) as u64;
    let mut read = |addr: u64| {
        let off = addr.checked_sub(base)?;
        if off.checked_add(8)? > len {
            return None;
        }
        let o = usize::try_from(off).ok()?;
        let bytes: [u8; 8] = rec.stack.get(o..o + 8)?.try_into().ok()?;
        Some(u64::from_le_bytes(bytes))
    };
    let mut view = tables.view(entries.unwrap_or(&[]));
    let outcome = sframe_common::step::walk(&mut st, rec.regs, &mut view, &mut read);
    // The interpreter frames the kernel side read at the sample follow the native ones,
    // as in a sample walked there.
    let skip = rec.py_skip as usize;
    let words = rec
        .py
        .get(skip..skip.saturating_add(rec.py_len as usize))
        .unwrap_or_default();
    let mut unread = false;
    for &word in words {
        let i = st.stack.len as usize;
        if !sframe_common::python::is_frame(word) {
            continue;
        }
        unread |= sframe_common::python::is_unread(word);
        let Some(slot) = st.stack.frames.get_mut(i) else {
            break;
        };
        *slot = word;
        st.stack.len += 1;
        st.hash = sframe_common::stack::mix(st.hash, word);
    }
    match entries {
        Some(_) => {
            let outcome = WalkOutcome::with_python(outcome as u32, unread);
            (
                st,
                WalkOutcome::try_from(outcome).unwrap_or(WalkOutcome::PythonUnread),
            )
        }
        None => (st, WalkOutcome::UnknownProcess),
    }
}

impl Profiler {
    /// The deferred-sample ring buffer, for waiting on it (`AsyncFd`).
    pub fn deferred_fd(&self) -> Option<std::os::fd::BorrowedFd<'_>> {
        self.deferred.fd()
    }

    /// Unwinds the samples the kernel side deferred, with the same `walk_step` over the
    /// same tables (read from the maps) and the stack bytes the sample carries, and counts
    /// them like the kernel side would have.
    pub(super) fn unwind_deferred(&mut self) {
        self.unwind_deferred_rounds(false, None);
    }

    /// [`Profiler::unwind_deferred`] for the samples of `pid` alone (it exited: they are
    /// walked with its tables before they go); the others wait on, untouched (one round
    /// over every waiting sample at each exit made process churn cost the product of the
    /// two).
    pub(super) fn unwind_deferred_of(&mut self, pid: u32) {
        self.unwind_deferred_rounds(false, Some(pid));
    }

    /// Waits (at most `timeout`) for the tables the deferred samples still wait for to be
    /// built, then walks every deferred sample with what there is (the profile ends).
    pub fn flush_deferred(&mut self, timeout: Duration) {
        let deadline = Instant::now() + timeout;
        // Processes whose samples wait for their first load (queued behind others'):
        // load them now, while they are there to be read.
        let mut unloaded: Vec<u32> = self
            .deferred
            .pids()
            .filter(|&pid| self.store.process_entries(pid).is_none())
            .collect();
        unloaded.sort_unstable();
        unloaded.dedup();
        let mut added = Vec::new();
        for pid in unloaded {
            if Instant::now() >= deadline {
                break;
            }
            if !self.procs.contains_key(&pid) && procfs::alive_not_zombie(pid) {
                self.load(pid, &mut added, true);
            }
        }
        self.unwind_deferred();
        while Instant::now() < deadline
            && self.deferred.pids().any(|pid| self.store.awaits_build(pid))
        {
            std::thread::sleep(Duration::from_millis(10));
            // A live process's samples are walked with its reloaded table, not the one
            // from before the build.
            self.reload_built(&mut added);
            self.unwind_deferred();
        }
        self.unwind_deferred_rounds(true, None);
    }

    /// `unwind_deferred`; `last`: walk every record now, waiting for nothing; `only`:
    /// that process's records alone (the others wait on, where there is room).
    fn unwind_deferred_rounds(&mut self, last: bool, only: Option<u32>) {
        let _cpu = crate::cputime::Timer::start(&crate::cputime::COLLECTION);
        let now = Instant::now();
        // Records still waiting for their process's first load come first.
        let Some(records) = self.deferred.take() else {
            return;
        };
        // Tables of exited processes, rebuilt from the mappings they had (once per call).
        let mut exited_entries: StdHashMap<u32, Vec<MappingEntry>> = StdHashMap::new();
        // Whether a process can still be loaded (alive, not a zombie: a zombie has
        // `/proc/PID` but no mappings, and waiting for its load would retry it every
        // round until the patience ran out; any user can leave zombies), or is still
        // there at all (a zombie whose exit has not been handled yet: its samples wait
        // for that, then go with the mappings it had). Read at most once per process per
        // LIVENESS_TTL.
        let mut liveness = std::mem::take(&mut self.deferred.liveness);
        liveness.retain(|_, (at, _)| now.duration_since(*at) < LIVENESS_TTL);
        let mut live = |pid: u32| {
            liveness
                .entry(pid)
                .or_insert_with(|| (Instant::now(), procfs::liveness(pid)))
                .1
        };
        // Code objects checked in this round, per process (`PyNamer::bind`).
        let mut bound = StdHashMap::new();
        for mut w in records {
            if only.is_some_and(|p| p != w.rec.pid) && self.deferred.has_room_for(w.rec.pid) {
                self.deferred.wait(w);
                continue;
            }
            let (seen, rec) = (w.seen, &w.rec);
            // A sample waits at most DEFERRED_PATIENCE, or for as long as its process is
            // queued for its first load or one of its objects is being built: both end
            // (a busy or emulated host can take longer than the patience to get there;
            // the backlog's bounds, in all and per process, cap the memory either way).
            let building = self.store.awaits_build(rec.pid);
            let held = building || self.pending.contains(rec.pid);
            let patient = !last
                && (held || now.duration_since(seen) < DEFERRED_PATIENCE)
                && self.deferred.has_room_for(rec.pid);
            // Its first load has not run yet; or an object it maps is being built on the
            // worker (walked now, the sample would stop there; a short process can have
            // exited meanwhile: its mappings are kept, the walk waits for the table).
            let waiting = patient
                && (building
                    || (self.store.process_entries(rec.pid).is_none()
                        && match live(rec.pid) {
                            procfs::Liveness::Alive => true,
                            procfs::Liveness::Zombie => self.is_alive(rec.pid),
                            procfs::Liveness::Gone => false,
                        }));
            if waiting {
                // Its tables are not loaded yet (queued behind other first loads): make
                // sure it is queued, and try again next round.
                if (self.kernel_filtered || self.is_listed(rec.pid))
                    && !self.procs.contains_key(&rec.pid)
                    && live(rec.pid) == procfs::Liveness::Alive
                {
                    self.queue_first_load(rec.pid);
                }
                self.deferred.wait(w);
                continue;
            }
            let generation = self.store.process_generation(rec.pid);
            if patient && generation.is_some() && w.walked_over == generation {
                // It found no mapping over this table; its process has not been
                // reloaded since.
                self.deferred.wait(w);
                continue;
            }
            let exited = match self.procs.get(&rec.pid) {
                Some(p)
                    if p.exited_at.is_some() && self.store.process_entries(rec.pid).is_none() =>
                {
                    Some(
                        exited_entries
                            .entry(rec.pid)
                            .or_insert_with(|| self.store.exited_entries(&p.info.maps))
                            .as_slice(),
                    )
                }
                _ => None,
            };
            let entries = self.store.process_entries(rec.pid).or(exited);
            let (mut st, outcome) = walk_record(rec, entries, self.store.tables());
            // A PC in a mapping made after the process's tables were read (dlopen): its
            // mmap event reloads the process; wait for that as for a first load.
            let retry = outcome == WalkOutcome::NoMapping
                && st.frames_from_fp == 0
                && patient
                && live(rec.pid) != procfs::Liveness::Gone;
            if retry {
                w.walked_over = generation;
                self.deferred.wait(w);
                continue;
            }
            let user_stack = st.stack_key();
            let len = (st.stack.len as usize).min(st.stack.frames.len());
            let frames = st.stack.frames.get_mut(..len).unwrap_or_default();
            self.bind_python_words(rec.pid, frames, &mut bound);
            let key = CountKey {
                pid: rec.pid,
                tid: rec.tid,
                // Not in the record: the thread's name, read once per thread (it was
                // sampled moments ago), not once per deferred sample.
                comm: self.thread_comm(rec.pid, rec.tid),
                user_stack,
                kernel_stack: self
                    .kernel_stacks
                    .intern(rec.kernel_stack, &mut StdHashMap::new()),
                outcome: outcome as u32,
            };
            if rec.off_cpu_ns > 0 {
                let kernel_stack = self
                    .counts
                    .off_cpu_kernel_stack(rec.off_cpu_kernel_stack, &mut self.kernel_stacks);
                self.counts.add_walked_off_cpu(
                    CountKey {
                        kernel_stack,
                        ..key
                    },
                    rec.off_cpu_state & sframe_common::offcpu::OFF_CPU_UNINTERRUPTIBLE,
                    rec.off_cpu_ns,
                    frames,
                );
            } else {
                self.counts.add_walked(key, frames);
            }
        }
        self.deferred.liveness = liveness;
    }

    /// Moves the deferred samples the kernel handed over into the backlog (up to its
    /// bound), counting them for their processes' first loads.
    pub(super) fn drain_deferred_ring(&mut self) {
        for pid in self.deferred.drain() {
            self.pending.count_sample(pid);
        }
    }

    /// Deferred samples waiting for their process's tables.
    pub fn deferred_waiting(&self) -> usize {
        self.deferred.waiting()
    }

    /// Deferred samples of process `pid` waiting for its tables.
    pub fn deferred_waiting_of(&self, pid: u32) -> usize {
        self.deferred.pids().filter(|&p| p == pid).count()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(pid: u32) -> Box<DeferredSample> {
        // SAFETY: DeferredSample is plain integers and bytes: all zeros is a value.
        let mut rec: Box<DeferredSample> = Box::new(unsafe { std::mem::zeroed() });
        rec.pid = pid;
        rec
    }

    #[test]
    fn one_process_cannot_take_every_place_of_the_backlog() {
        let mut q = DeferredQueue::new(None);
        let now = Instant::now();
        while q.has_room_for(1) {
            q.wait(Waiting {
                seen: now,
                walked_over: None,
                rec: sample(1),
            });
        }
        assert_eq!(q.waiting(), MAX_DEFERRED_PER_PROCESS);
        // Others still find room, up to the whole bound.
        let mut pid = 2;
        while q.waiting() < MAX_DEFERRED_BACKLOG {
            assert!(q.has_room_for(pid), "pid {pid} at {}", q.waiting());
            for _ in 0..MAX_DEFERRED_PER_PROCESS {
                if q.has_room_for(pid) {
                    q.wait(Waiting {
                        seen: now,
                        walked_over: None,
                        rec: sample(pid),
                    });
                }
            }
            pid += 1;
        }
        assert!(!q.has_room_for(pid), "the whole bound holds");
        assert_eq!(
            q.pids().filter(|&p| p == 1).count(),
            MAX_DEFERRED_PER_PROCESS
        );
    }
}
