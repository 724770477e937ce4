//! The profiler: the `profile` perf-event program attached on every CPU, the targets,
//! their tables, and reading the stack counts the kernel side accumulated.

use std::collections::{HashMap as StdHashMap, HashSet};

use aya::{
    Ebpf,
    maps::{HashMap, MapData, PerCpuArray, RingBuf, StackTraceMap},
};
use sframe_common::{
    Counter, WalkOutcome,
    stack::{CountKey, UserStack},
};

use crate::{
    bpf::{self, LoadError},
    kmaps::KernelTables,
    objects::{ObjectStore, ProcessReport},
};

const PROGRAM: &str = "profile";

/// One distinct sample key with its count, and its user stack.
#[derive(Clone, Debug)]
pub struct StackCount {
    pub key: CountKey,
    pub count: u64,
}

/// What the kernel side counted since the profiler started.
#[derive(Clone, Debug, Default)]
pub struct Snapshot {
    pub counts: Vec<StackCount>,
    pub outcomes: [u64; WalkOutcome::COUNT],
    pub counters: [u64; Counter::COUNT],
}

/// The addresses to symbolize for a user stack (innermost first): the sampled PC as is,
/// and each return address minus one, which lies in the call instruction. A call to a
/// function that does not return can be the last instruction of its caller, so the
/// return address itself may already belong to the next function.
pub fn symbolization_addresses(frames: &[u64]) -> Vec<u64> {
    frames
        .iter()
        .enumerate()
        .map(|(i, &a)| if i == 0 { a } else { a.saturating_sub(1) })
        .collect()
}

pub struct Profiler {
    ebpf: Ebpf,
    pub store: ObjectStore,
    targets: HashMap<MapData, u32, u8>,
    counts_map: HashMap<MapData, CountKey, u64>,
    stacks_map: HashMap<MapData, u64, UserStack>,
    outcomes_map: PerCpuArray<MapData, u64>,
    counters_map: PerCpuArray<MapData, u64>,
    kernel_stacks_map: StackTraceMap<MapData>,
    /// Kernel stacks by id, innermost first.
    kernel_stacks: StdHashMap<i32, Vec<u64>>,
    /// Targets whose tables are loaded.
    known: HashSet<u32>,
    /// Targets that exec'd (their mapping table was dropped by `on_exec`).
    exec_events: Option<RingBuf<MapData>>,
    /// Counts accumulated in user space (the kernel map is drained on each collect).
    counts: StdHashMap<CountKey, u64>,
    /// User stacks by key, innermost first.
    stacks: StdHashMap<u64, Vec<u64>>,
}

use crate::bpf::take_map as take;

impl Profiler {
    /// Loads the object and the `profile` program, and attaches cpu-clock sampling at
    /// `frequency` Hz on every online CPU. Only target processes are walked.
    pub fn start(frequency: u64) -> Result<Self, LoadError> {
        let mut ebpf = bpf::load()?;
        bpf::spawn_logger(&mut ebpf);
        bpf::load_perf_event(&mut ebpf, PROGRAM)?;
        let tables = KernelTables::new(&mut ebpf)?;
        let mut profiler = Self {
            store: ObjectStore::new(tables),
            targets: take(&mut ebpf, "TARGET_TGIDS")?,
            counts_map: take(&mut ebpf, "COUNTS")?,
            stacks_map: take(&mut ebpf, "STACKS")?,
            outcomes_map: take(&mut ebpf, "OUTCOMES")?,
            counters_map: take(&mut ebpf, "COUNTERS")?,
            kernel_stacks_map: take(&mut ebpf, "KERNEL_STACKS")?,
            kernel_stacks: StdHashMap::new(),
            known: HashSet::new(),
            exec_events: None,
            ebpf,
            counts: StdHashMap::new(),
            stacks: StdHashMap::new(),
        };
        profiler.attach(frequency)?;
        profiler.follow_forks();
        Ok(profiler)
    }

    /// Attaches `on_fork` so children of targets are sampled from their first
    /// instruction; without tracefs, children are not followed (logged).
    fn follow_forks(&mut self) {
        if bpf::fork_child_pid_offset().is_none() {
            log::warn!("sched_process_fork format unavailable: child processes are not followed");
            return;
        }
        if let Err(err) =
            bpf::attach_tracepoint(&mut self.ebpf, "on_fork", "sched", "sched_process_fork")
        {
            log::warn!("child processes are not followed: {err}");
        }
        let result =
            bpf::attach_tracepoint(&mut self.ebpf, "on_exec", "sched", "sched_process_exec");
        match result {
            Ok(()) => self.exec_events = take(&mut self.ebpf, "EXEC_EVENTS").ok(),
            Err(err) => log::warn!("exec is not tracked (tables refresh every second): {err}"),
        }
    }

    /// Reloads the tables of targets that exec'd since the last call; returns them.
    pub fn reload_execed(&mut self) -> Vec<u32> {
        let mut pids = Vec::new();
        if let Some(events) = self.exec_events.as_mut() {
            while let Some(item) = events.next() {
                if let Ok(bytes) = <[u8; 4]>::try_from(&item[..]) {
                    pids.push(u32::from_ne_bytes(bytes));
                }
            }
        }
        pids.sort_unstable();
        pids.dedup();
        pids.retain(|&pid| self.store.refresh_process(pid).is_ok());
        pids
    }

    /// Loads tables for children of targets that the kernel added to the targets since
    /// the last call, and drops thread ids it added; returns the new processes.
    pub fn adopt_children(&mut self) -> Vec<u32> {
        self.reload_execed();
        let ids: Vec<u32> = self.targets.keys().filter_map(Result::ok).collect();
        let mut adopted = Vec::new();
        for id in ids {
            if self.known.contains(&id) {
                continue;
            }
            if crate::procfs::thread_group_id(id) == Some(id)
                && self.store.refresh_process(id).is_ok()
            {
                self.known.insert(id);
                adopted.push(id);
            } else {
                // A thread of a target (the tracepoint sees thread creation too), or a
                // process that already exited.
                let _ = self.targets.remove(&id);
            }
        }
        adopted
    }

    fn attach(&mut self, frequency: u64) -> Result<(), LoadError> {
        bpf::attach_cpu_clock_all_cpus(&mut self.ebpf, PROGRAM, frequency)
    }

    /// Loads the tables of `pid`'s objects, then starts sampling it.
    pub fn add_target(&mut self, pid: u32) -> Result<ProcessReport, crate::procfs::MapsError> {
        let report = self.store.refresh_process(pid)?;
        self.known.insert(pid);
        if let Err(err) = self.targets.insert(pid, 1, 0) {
            log::warn!("pid {pid}: cannot add to targets: {err}");
        }
        Ok(report)
    }

    /// Re-reads `pid`'s mappings (new libraries, exec).
    pub fn refresh(&mut self, pid: u32) -> Result<ProcessReport, crate::procfs::MapsError> {
        self.store.refresh_process(pid)
    }

    /// Stops sampling `pid` and frees its mapping table.
    pub fn remove_target(&mut self, pid: u32) {
        self.known.remove(&pid);
        let _ = self.targets.remove(&pid);
        self.store.tables.remove_process(pid);
    }

    /// Moves the kernel's counts into user space and returns everything counted so far.
    pub fn collect(&mut self) -> Snapshot {
        let keys: Vec<CountKey> = self.counts_map.keys().filter_map(Result::ok).collect();
        let mut wanted = HashSet::new();
        let mut wanted_kernel = HashSet::new();
        for key in keys {
            // Read then delete: a sample landing in between is lost (rare, counted as
            // the difference between `samples` and the sum of counts).
            if let Ok(n) = self.counts_map.get(&key, 0) {
                *self.counts.entry(key).or_default() += n;
                if key.user_stack != 0 && !self.stacks.contains_key(&key.user_stack) {
                    wanted.insert(key.user_stack);
                }
                if key.kernel_stack >= 0 && !self.kernel_stacks.contains_key(&key.kernel_stack) {
                    wanted_kernel.insert(key.kernel_stack);
                }
            }
            let _ = self.counts_map.remove(&key);
        }
        for id in wanted {
            if let Ok(stack) = self.stacks_map.get(&id, 0) {
                let len = (stack.len as usize).min(stack.frames.len());
                self.stacks.insert(id, stack.frames[..len].to_vec());
                let _ = self.stacks_map.remove(&id);
            }
        }
        for id in wanted_kernel {
            // Kernel stack ids are stable while the stack stays in the map; copy it once.
            if let Ok(trace) = self.kernel_stacks_map.get(&(id as u32), 0) {
                let frames = trace.frames().iter().map(|f| f.ip).collect();
                self.kernel_stacks.insert(id, frames);
            }
        }
        let mut snap = Snapshot {
            counts: self
                .counts
                .iter()
                .map(|(k, &count)| StackCount { key: *k, count })
                .collect(),
            ..Snapshot::default()
        };
        for (i, slot) in snap.outcomes.iter_mut().enumerate() {
            if let Ok(v) = self.outcomes_map.get(&(i as u32), 0) {
                *slot = v.iter().sum();
            }
        }
        for (i, slot) in snap.counters.iter_mut().enumerate() {
            if let Ok(v) = self.counters_map.get(&(i as u32), 0) {
                *slot = v.iter().sum();
            }
        }
        snap
    }

    /// The frames of a kernel stack (innermost first) seen by `collect`.
    pub fn kernel_stack(&self, id: i32) -> Option<&[u64]> {
        self.kernel_stacks.get(&id).map(Vec::as_slice)
    }

    /// The frames of a user stack (innermost first) seen by `collect`.
    pub fn stack(&self, id: u64) -> Option<&[u64]> {
        self.stacks.get(&id).map(Vec::as_slice)
    }

    /// The `profile` program's accumulated run time (ns) and run count, as the kernel
    /// reports them while `kernel.bpf_stats_enabled` is 1 (`cargo xtask bench`).
    /// Instructions the verifier processed for each loaded program (its budget is 1M).
    pub fn verifier_stats(&self) -> Vec<(String, Option<u32>)> {
        self.ebpf
            .programs()
            .filter_map(|(name, program)| {
                let info = program.info().ok()?;
                Some((name.to_owned(), info.verified_instruction_count()))
            })
            .collect()
    }

    pub fn program_stats(&self) -> Option<(u64, u64)> {
        let info = self.ebpf.program(PROGRAM)?.info().ok()?;
        Some((info.run_time().as_nanos() as u64, info.run_count()))
    }
}
