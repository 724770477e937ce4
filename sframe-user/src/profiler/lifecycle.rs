//! A process's life as the profiler follows it: lifecycle events from the kernel side
//! (exec, fork, mmap, exit, and misses of processes it has no table for), first loads
//! (busiest waiting process first, within a time budget), reloads for new mappings
//! (throttled to a share of the loop), and exits (mappings kept for symbolization, a
//! bounded number of exited processes remembered).

use std::{
    collections::{HashMap, HashSet, VecDeque},
    time::{Duration, Instant},
};

use sframe_common::event::{ProcEvent, ProcEventKind};

use super::{Proc, Profiler, target_info};
use crate::{objects::Build, procfs};

/// How long after its last load a process's reload for new mappings waits: the first
/// reload after its exec not at all (the dynamic loader has just mapped its libraries,
/// which its code is about to run: a short process on a cold machine, whose first load
/// read cold files, otherwise exited before the reload was due and lost every frame in
/// its libraries); a young process's next ones (fewer than `YOUNG_RELOADS`, in its first
/// `YOUNG_AGE`: its loader maps one library after another, and a compiler pass of 30 ms
/// that waited `RELOAD_INTERVAL` for its second reload exited first, its libraries
/// unknown) only in proportion to what reloading it costs (`RELOAD_SHARE`), while
/// [`YoungReloads`] allows; later ones `RELOAD_INTERVAL`, or longer in proportion to
/// the cost, so that a process mapping code in a loop gets a bounded share.
fn reload_wait(load_cost: Duration, reloads: u32, young: bool) -> Duration {
    if reloads == 0 {
        return Duration::ZERO;
    }
    let cost = load_cost.as_secs_f64();
    let share = Duration::from_secs_f64(cost / RELOAD_SHARE - cost);
    if young {
        return share;
    }
    RELOAD_INTERVAL.max(share)
}

/// Reloads of a young process that wait only for their cost share.
const YOUNG_RELOADS: u32 = 16;
/// How long a process counts as young after its exec.
const YOUNG_AGE: Duration = Duration::from_millis(500);
/// The loop time young processes' reloads may take, per second, over all processes (a
/// storm of new processes mapping libraries gets no more: its reloads then wait as a
/// grown process's do). A reload of a process that maps a few libraries takes about
/// 60 µs in a release build, 300-500 µs in a debug one: 30 ms ran out in the debug
/// build's test of 60 processes of 30 ms (79 % of their samples through their plugins
/// instead of 96 %).
const YOUNG_RELOAD_BUDGET: Duration = Duration::from_millis(100);

/// A token bucket of loop time for young processes' reloads: `YOUNG_RELOAD_BUDGET` per
/// second, at most one second's worth saved.
#[derive(Debug)]
pub(super) struct YoungReloads {
    /// Time left to spend (may go below zero by one reload's cost), in seconds.
    left: f64,
    at: Instant,
}

impl Default for YoungReloads {
    fn default() -> Self {
        Self {
            left: YOUNG_RELOAD_BUDGET.as_secs_f64(),
            at: Instant::now(),
        }
    }
}

impl YoungReloads {
    /// Whether a young process's reload may skip the grown process's wait now.
    fn allows(&mut self) -> bool {
        let now = Instant::now();
        let budget = YOUNG_RELOAD_BUDGET.as_secs_f64();
        self.left = (self.left + now.duration_since(self.at).as_secs_f64() * budget).min(budget);
        self.at = now;
        self.left > 0.0
    }

    /// A young process's reload took `cost`.
    fn spend(&mut self, cost: Duration) {
        self.left -= cost.as_secs_f64();
    }
}

impl super::Proc {
    /// Whether its reloads may wait only for their cost share (see `reload_wait`).
    fn is_young(&self) -> bool {
        self.reloads < YOUNG_RELOADS && self.born.elapsed() < YOUNG_AGE
    }
}

/// Reloads of one process for misses are at least this far apart (a miss that persists
/// comes back from the kernel side every `MISS_INTERVAL_NS`), but a young process's.
const RELOAD_INTERVAL: Duration = Duration::from_millis(40);
/// Time `handle_events` spends on first loads of processes seen through misses.
const PENDING_BUDGET: Duration = Duration::from_millis(50);
/// Loads of a live process that found no executable mappings (read mid-exec) are tried
/// again this many times, `RELOAD_INTERVAL` apart, before it is taken for gone.
const MAX_LOAD_RETRIES: u8 = 5;
/// Reloads of one process for new mappings take at most this share of one CPU: after a
/// reload that took `t`, the next waits `max(RELOAD_INTERVAL, t / RELOAD_SHARE - t)`;
/// mmap events meanwhile are coalesced into that one reload. So a process that maps and
/// unmaps code in a loop costs the profiler a bounded share, whatever its rate and
/// however many mappings it has, and the others' loads go on.
const RELOAD_SHARE: f64 = 0.1;
/// Processes whose failed loads are counted apart at most (`Profiler::failed_loads_of`).
const MAX_FAILED_LOADS_KEPT: usize = 4096;
/// Lifecycle events handled per `handle_events` call at most (the rest wait for the
/// next call: a flood of events cannot hold the loop, nor a signal to stop).
const MAX_EVENTS_PER_CALL: usize = 8192;

/// Processes seen through misses or deferred samples, waiting for their first load,
/// with the samples seen of each: the busiest is loaded first.
#[derive(Default)]
pub(super) struct FirstLoads {
    order: VecDeque<u32>,
    weight: HashMap<u32, u32>,
}

impl FirstLoads {
    /// Queues `pid`, or counts one more sample of it if queued.
    fn queue(&mut self, pid: u32) {
        let w = self.weight.entry(pid).or_insert(0);
        if *w == 0 {
            self.order.push_back(pid);
        }
        *w = w.saturating_add(1);
    }

    /// Counts one more sample of `pid` if it is queued.
    pub(super) fn count_sample(&mut self, pid: u32) {
        if let Some(w) = self.weight.get_mut(&pid) {
            *w = w.saturating_add(1);
        }
    }

    pub(super) fn contains(&self, pid: u32) -> bool {
        self.weight.contains_key(&pid)
    }

    fn is_empty(&self) -> bool {
        self.order.is_empty()
    }

    /// Orders the queue by samples seen, most first (ties: first come first).
    fn busiest_first(&mut self) {
        let weight = &self.weight;
        self.order
            .make_contiguous()
            .sort_by_key(|pid| std::cmp::Reverse(weight.get(pid).copied().unwrap_or(0)));
    }

    /// Takes the process at the head of the queue.
    fn pop(&mut self) -> Option<u32> {
        let pid = self.order.pop_front()?;
        self.weight.remove(&pid);
        Some(pid)
    }
}

impl Profiler {
    /// Handles the lifecycle events the kernel side sent since the last call; returns
    /// the processes added.
    pub fn handle_events(&mut self) -> Vec<u32> {
        let mut batch = Vec::new();
        if let Some(events) = self.events.as_mut() {
            while batch.len() < MAX_EVENTS_PER_CALL
                && let Some(item) = events.next()
            {
                if item.len() >= size_of::<ProcEvent>() {
                    // SAFETY: the kernel wrote a ProcEvent (two u32, any bits valid).
                    let e = unsafe { (item.as_ptr() as *const ProcEvent).read_unaligned() };
                    batch.push(e);
                }
            }
        }
        self.events_left = batch.len() >= MAX_EVENTS_PER_CALL;
        // Execs and forks of new processes are the most urgent loads (short-lived
        // processes); exits come last, after the deferred samples of the exited
        // processes were unwound with their tables.
        let priority = |e: &ProcEvent| match ProcEventKind::try_from(e.kind) {
            Ok(ProcEventKind::Exec | ProcEventKind::Fork) => 0,
            Ok(ProcEventKind::Mmap) => 1,
            Ok(ProcEventKind::Exit) => 3,
            _ => 2,
        };
        batch.sort_by_key(priority);
        let mut added = Vec::new();
        let first_exit = batch
            .iter()
            .position(|e| e.kind == ProcEventKind::Exit as u32)
            .unwrap_or(batch.len());
        // The processes that mapped libraries are reloaded once each, after the batch's
        // mmap events (a loader maps several at once) and before its misses and exits.
        let after_mmaps = batch
            .iter()
            .position(|e| priority(e) > 1)
            .unwrap_or(batch.len());
        let mut mapped: Vec<u32> = Vec::new();
        for (i, e) in batch.into_iter().enumerate() {
            if i == after_mmaps {
                self.reload_mapped(&mut mapped, &mut added);
            }
            if i == first_exit {
                self.load_pending(&mut added);
                self.unwind_deferred();
            }
            let Ok(kind) = ProcEventKind::try_from(e.kind) else {
                continue;
            };
            let pid = e.pid;
            let lag = crate::cputime::monotonic_ns().saturating_sub(e.ns);
            self.lifecycle.event_lag_ns = self.lifecycle.event_lag_ns.saturating_add(lag);
            self.lifecycle.event_lag_max_ns = self.lifecycle.event_lag_max_ns.max(lag);
            log::debug!(
                "pid {pid}: {kind:?} handled {:.1} ms after it was sent",
                lag as f64 / 1e6
            );
            let known = self.procs.get(&pid).is_some_and(|p| p.exited_at.is_none());
            match kind {
                ProcEventKind::Exec => {
                    self.lifecycle.execs += 1;
                    if known || self.kernel_filtered {
                        self.load_as(pid, &mut added, true, true);
                    } else if self.comm_matches(pid) && self.add_target(pid).is_ok() {
                        added.push(pid);
                    }
                }
                ProcEventKind::Exit => {
                    self.lifecycle.exits += 1;
                    self.exited(pid);
                }
                ProcEventKind::Fork => {
                    self.lifecycle.forks += 1;
                    self.load(pid, &mut added, true);
                }
                ProcEventKind::Mmap => {
                    // A library was mapped (one event per executable segment): reload
                    // now, a starting process is about to run it; unless it was
                    // reloaded just before (then once, when its throttle allows).
                    self.lifecycle.mmaps += 1;
                    if known {
                        if !mapped.contains(&pid) {
                            mapped.push(pid);
                        }
                    } else if self.kernel_filtered || self.is_listed(pid) {
                        self.load(pid, &mut added, true);
                    }
                }
                ProcEventKind::Miss => {
                    self.lifecycle.misses += 1;
                    if known {
                        // At most one reload per RELOAD_INTERVAL; the kernel side repeats
                        // a miss that persists every MISS_INTERVAL_NS. A process the full
                        // kernel map refused waits until another one leaves it (its
                        // samples are unwound in user space meanwhile).
                        if !self.store.waiting_for_room(pid) {
                            self.load(pid, &mut added, false);
                        }
                    } else if self.kernel_filtered || self.is_listed(pid) {
                        self.queue_first_load(pid);
                    }
                }
            }
        }
        self.reload_mapped(&mut mapped, &mut added);
        self.load_pending(&mut added);
        self.run_due_reloads(&mut added);
        self.reload_built(&mut added);
        self.unwind_deferred();
        added
    }

    /// Takes in the tables the worker finished and reloads the live processes that map
    /// them (their mapping tables point at the new objects then); returns whether any
    /// build finished.
    pub(super) fn reload_built(&mut self, added: &mut Vec<u32>) -> bool {
        let built = self.store.poll_builds();
        for &pid in &built {
            if self.is_alive(pid) {
                self.load(pid, added, true);
            }
        }
        !built.is_empty()
    }

    /// [`Profiler::request_reload`] for each process of `mapped` (emptied).
    fn reload_mapped(&mut self, mapped: &mut Vec<u32>, added: &mut Vec<u32>) {
        for pid in mapped.drain(..) {
            self.request_reload(pid, added);
        }
    }

    /// When `p`'s next reload for new mappings may run (see `reload_wait`).
    fn reload_at(&mut self, pid: u32) -> Option<Instant> {
        let p = self.procs.get(&pid)?;
        let young = p.is_young() && self.young_reloads.allows();
        Some(p.loaded_at + reload_wait(p.load_cost, p.reloads, young))
    }

    /// Reloads `pid` for new mappings now if its throttle allows, else once when it does.
    fn request_reload(&mut self, pid: u32, added: &mut Vec<u32>) {
        if self.reload_due.contains_key(&pid) {
            return;
        }
        let Some(due) = self.reload_at(pid) else {
            return self.load(pid, added, true);
        };
        if due <= Instant::now() {
            self.load(pid, added, true);
        } else {
            self.reload_due.insert(pid, due);
        }
    }

    /// Runs the throttled reloads that are due.
    fn run_due_reloads(&mut self, added: &mut Vec<u32>) {
        if self.reload_due.is_empty() {
            return;
        }
        let now = Instant::now();
        let due: Vec<u32> = self
            .reload_due
            .iter()
            .filter(|&(_, &at)| at <= now)
            .map(|(&pid, _)| pid)
            .collect();
        for pid in due {
            self.reload_due.remove(&pid);
            if self.procs.get(&pid).is_some_and(|p| p.exited_at.is_none()) {
                self.load(pid, added, true);
            }
        }
    }

    /// When the next throttled reload is due (call `handle_events` then).
    pub fn next_reload_due(&self) -> Option<Instant> {
        self.reload_due.values().min().copied()
    }

    /// Loads processes first seen through a miss, for at most `PENDING_BUDGET` per call
    /// (a process with a huge object must not hold up exec and exit handling).
    /// The busiest waiting process (most samples seen) first: on a busy host the queue
    /// can be long, and a hot process must not wait behind processes sampled once.
    /// Between loads, the kernel's deferred samples are moved into the backlog, so that
    /// a long load does not let the kernel's ring overflow.
    fn load_pending(&mut self, added: &mut Vec<u32>) {
        let started = Instant::now();
        self.pending.busiest_first();
        while started.elapsed() < PENDING_BUDGET {
            let Some(pid) = self.pending.pop() else {
                break;
            };
            if self.procs.get(&pid).is_none_or(|p| p.exited_at.is_some()) && !self.is_own_child(pid)
            {
                self.load(pid, added, true);
                self.drain_deferred_ring();
            }
        }
    }

    /// Queues `pid` for its first load, or counts one more sample of it if queued.
    pub(super) fn queue_first_load(&mut self, pid: u32) {
        self.pending.queue(pid);
    }

    /// A child of the profiler that has not exec'd yet (its image is the profiler's own:
    /// loading it would only slow the loop; its exec event follows).
    fn is_own_child(&self, pid: u32) -> bool {
        self.own_exe.is_some()
            && std::fs::read_link(format!("/proc/{pid}/exe")).ok() == self.own_exe
    }

    /// Processes waiting for their first load, or events not handled yet (call
    /// `handle_events` again soon).
    pub fn has_pending(&self) -> bool {
        !self.pending.is_empty() || self.events_left
    }

    /// (Re)loads `pid`'s mapping table; a reload within `RELOAD_INTERVAL` of the last is
    /// deferred to `maintain` unless `now` (exec, fork: the table is missing).
    pub(super) fn load(&mut self, pid: u32, added: &mut Vec<u32>, now: bool) {
        self.load_as(pid, added, now, false);
    }

    /// `load`; `renamed`: the process exec'd (its command name changed).
    fn load_as(&mut self, pid: u32, added: &mut Vec<u32>, now: bool, renamed: bool) {
        if pid == std::process::id() {
            return;
        }
        if let Some(p) = self.procs.get(&pid)
            && p.exited_at.is_none()
            && !now
            && !(p.is_young() && self.young_reloads.allows())
            && p.loaded_at.elapsed() < RELOAD_INTERVAL
        {
            return;
        }
        let young = self
            .procs
            .get(&pid)
            .is_some_and(|p| p.exited_at.is_none() && p.reloads > 0 && p.is_young());
        let new = self.procs.get(&pid).is_none_or(|p| p.exited_at.is_some());
        let started = Instant::now();
        // Between its objects (each built on the loop if it is small), the kernel's
        // deferred samples are moved into the backlog, as between process loads.
        let (deferred, pending) = (&mut self.deferred, &mut self.pending);
        let refreshed = self
            .store
            .refresh_process_with(pid, Build::Background, &mut || {
                for pid in deferred.drain() {
                    pending.count_sample(pid);
                }
            });
        let load_cost = started.elapsed();
        if young {
            self.young_reloads.spend(load_cost);
        }
        match refreshed {
            Ok(report) if !report.maps.is_empty() => {
                log::debug!(
                    "pid {pid}: {} executable mappings loaded in {load_cost:?} ({})",
                    report.maps.len(),
                    if renamed { "exec" } else { "reload" }
                );
                let build_time = report.build_time;
                self.lifecycle.process_loads += 1;
                self.load_retries.remove(&pid);
                let (info, reloads, born) = match self.procs.remove(&pid) {
                    // A reload without exec: same command and namespace.
                    Some(p) if !new && !renamed => (
                        p.info.with_maps(report.maps),
                        p.reloads.saturating_add(1),
                        p.born,
                    ),
                    _ => (target_info(pid, report.maps), 0, Instant::now()),
                };
                let mut info = info;
                self.python.install(&mut info);
                self.procs.insert(
                    pid,
                    Proc {
                        info,
                        exited_at: None,
                        loaded_at: Instant::now(),
                        // What reloading it costs: building the tables of objects seen
                        // for the first time is paid once, not at every reload (a new
                        // process on a cold cache would otherwise wait seconds for the
                        // reload after its first dlopen, and exit first).
                        load_cost: load_cost.saturating_sub(build_time),
                        reloads,
                        born,
                    },
                );
                if new {
                    added.push(pid);
                }
            }
            // No maps, but alive and not a zombie: read in the middle of an exec (the
            // event of an earlier exec handled while the next one runs). Try again
            // shortly, a few times, instead of taking it for exited.
            // A process already seen exiting is not retried (it may read empty while
            // its exit runs, before it is a zombie).
            Ok(_) | Err(_)
                if self.procs.get(&pid).is_some_and(|p| p.exited_at.is_none())
                    && procfs::alive_not_zombie(pid)
                    && self.load_retries.get(&pid).copied().unwrap_or(0) < MAX_LOAD_RETRIES =>
            {
                // The empty table just installed goes; the retry installs the real one.
                self.store.forget_process(pid);
                *self.load_retries.entry(pid).or_default() += 1;
                self.reload_due
                    .entry(pid)
                    .or_insert_with(|| Instant::now() + RELOAD_INTERVAL);
            }
            // No maps: a zombie (or gone). Keep what we knew for symbolization.
            Ok(_) | Err(_) => {
                log::debug!("pid {pid}: no mappings to load, taken for exited");
                self.lifecycle.load_failures += 1;
                if self.failed_loads.len() >= MAX_FAILED_LOADS_KEPT {
                    self.failed_loads.clear();
                }
                *self.failed_loads.entry(pid).or_default() += 1;
                self.load_retries.remove(&pid);
                // Its deferred samples are walked while its tables are still there.
                self.unwind_deferred_of(pid);
                self.store.forget_process(pid);
                if !procfs::exists(pid) || self.procs.contains_key(&pid) {
                    self.exited(pid);
                }
            }
        }
    }

    /// `pid` exited: release its tables, keep its mappings for symbolization.
    pub(super) fn exited(&mut self, pid: u32) {
        // Samples it left in the kernel's deferred ring are walked with its tables
        // before they go (a short process can exit while its first load runs).
        self.deferred.forget_liveness(pid);
        self.unwind_deferred_of(pid);
        self.store.forget_process(pid);
        self.python.forget(pid);
        self.reload_due.remove(&pid);
        self.load_retries.remove(&pid);
        let _ = self.targets.remove(&pid);
        if let Some(p) = self.procs.get_mut(&pid)
            && p.exited_at.is_none()
        {
            p.exited_at = Some(Instant::now());
            // Symbolization needs only the executable mappings.
            p.info.maps.retain(|m| m.executable);
            p.info.maps.shrink_to_fit();
            self.exited_order.push_back(pid);
        }
        // Past the limit by a tenth, forget the oldest exited processes with their
        // samples down to the limit, so memory stays bounded under endless churn (in
        // batches: dropping their counts walks all counts).
        if self.exited_order.len() > self.max_exited + self.max_exited / 10 {
            let excess = self.exited_order.len() - self.max_exited;
            self.forget_oldest_exited(excess);
        }
    }

    /// Forgets the `n` oldest exited processes with their samples.
    fn forget_oldest_exited(&mut self, n: usize) {
        let mut gone = HashSet::new();
        for _ in 0..n {
            let Some(old) = self.exited_order.pop_front() else {
                break;
            };
            if self.procs.get(&old).is_some_and(|p| p.exited_at.is_some()) {
                self.procs.remove(&old);
                gone.insert(old);
            }
        }
        self.lifecycle.exited_forgotten += gone.len() as u64;
        self.counts.forget(&gone);
    }

    /// Near the bounds of the counts kept (7/8 of the keys or stack words), forgets the
    /// oldest exited processes with their samples, as many as hold what is kept beyond
    /// 3/4 of the bounds (by their charges), or all if they hold less. On
    /// a busy host, thousands of exited processes (a build's compilers, kept for the
    /// report up to `max_exited`) would otherwise fill the bounds, and every new stack
    /// of the running processes would be folded to its process's root: what is running
    /// now is worth more than what ran long ago. A process's own room stays bounded
    /// (`counts::MAX_KEYS_PER_PROCESS`), so running processes cannot be evicted this way
    /// by one that makes stacks at will.
    pub(super) fn make_room(&mut self) {
        if !self.counts.crowded(7, 8) {
            return;
        }
        let (mut keys, mut words) = self.counts.excess(3, 4);
        let mut n = 0;
        for pid in &self.exited_order {
            if keys == 0 && words == 0 {
                break;
            }
            let (k, w) = self.counts.charge(*pid);
            keys = keys.saturating_sub(k);
            words = words.saturating_sub(w);
            n += 1;
        }
        self.forget_oldest_exited(n);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn first_loads_take_the_busiest_process_first_and_ties_in_arrival_order() {
        let mut q = FirstLoads::default();
        for pid in [10, 20, 30, 40] {
            q.queue(pid);
        }
        q.queue(30); // a second miss
        q.count_sample(40); // two deferred samples
        q.count_sample(40);
        q.count_sample(99); // not queued: not counted, not queued
        assert!(!q.contains(99));
        q.busiest_first();
        let order: Vec<u32> = std::iter::from_fn(|| q.pop()).collect();
        assert_eq!(order, [40, 30, 10, 20]);
        assert!(q.is_empty() && !q.contains(40));
        // Taken, then seen again: queued again from a weight of one.
        q.queue(40);
        assert!(q.contains(40));
    }

    #[test]
    fn the_first_reload_after_an_exec_waits_for_nothing_later_ones_pay_their_cost() {
        let slow = Duration::from_millis(100);
        assert_eq!(reload_wait(slow, 0, false), Duration::ZERO);
        assert_eq!(reload_wait(Duration::ZERO, 1, false), RELOAD_INTERVAL);
        // Nine times the cost: reloading takes at most a tenth of the time.
        let w = reload_wait(slow, 1, false);
        assert!((w.as_secs_f64() - 0.9).abs() < 1e-6, "{w:?}");
        assert_eq!(reload_wait(slow, 7, false), w);
        // A young process: its cost share only, not the interval.
        let cheap = Duration::from_micros(60);
        let young = reload_wait(cheap, 3, true);
        assert!(young < Duration::from_millis(1), "{young:?}");
        assert_eq!(reload_wait(cheap, 3, false), RELOAD_INTERVAL);
        assert_eq!(reload_wait(slow, 3, true), w);
    }

    #[test]
    fn young_reloads_share_a_budget_of_loop_time() {
        let mut b = YoungReloads::default();
        assert!(b.allows());
        // A storm of new processes spends it: then their reloads wait as grown ones do.
        b.spend(YOUNG_RELOAD_BUDGET * 2);
        assert!(!b.allows());
        // It comes back at its rate: a second's worth at most.
        b.at -= Duration::from_secs(2);
        assert!(b.allows());
        assert!(b.left <= YOUNG_RELOAD_BUDGET.as_secs_f64() + 1e-9);
    }
}
