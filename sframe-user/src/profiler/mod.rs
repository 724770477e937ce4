//! The profiler: the `profile` perf-event program attached on every CPU, the targets,
//! their tables, and reading the stack counts the kernel side accumulated.

use sframe_common::names::{maps, programs};
use std::{
    collections::{HashMap as StdHashMap, HashSet},
    path::PathBuf,
    time::{Duration, Instant},
};

use aya::{
    Ebpf,
    maps::{Array, HashMap, MapData, RingBuf},
    programs::perf_event::PerfEventLinkId,
};
use sframe_common::{
    Counter, WalkOutcome,
    budget::MAX_CGROUP_FILTERS,
    event::{CgroupFilter, filter},
    layout::{PageBlock, RowBlock},
    stack::CountKey,
};

mod counts;
mod deferred;
mod kstacks;
mod lifecycle;
mod off_cpu;
mod python;

use counts::Counts;
use kstacks::KernelStacks;

use crate::{
    bpf::{self, LoadConfig, LoadError},
    cgroup::{self, Cgroup},
    kmaps::KernelTables,
    objects::{Build, ObjectStore, ProcessReport},
    procfs,
};

/// The perf-event program that walks and counts the samples.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum SampleProgram {
    /// `profile`: what the profiler ships and the CLI runs, where the kernel has
    /// `bpf_loop` (Linux 5.17); `profile_bounded` where it has not (see `resolve`).
    #[default]
    Profile,
    /// `profile_bounded`: the same walk, iterated by bounded loops of global-function
    /// calls, which kernels before `bpf_loop` verify (and later ones too).
    Bounded,
    /// `profile_no_thread_names`: the same walker without the thread name in the count
    /// keys (names then come only from `/proc`); for the benchmark's A/B of what
    /// recording each sample's thread costs.
    WithoutThreadNames,
}

impl SampleProgram {
    /// The program's name in the BPF object.
    pub fn name(self) -> &'static str {
        match self {
            Self::Profile => programs::PROFILE,
            Self::Bounded => programs::PROFILE_BOUNDED,
            Self::WithoutThreadNames => programs::PROFILE_NO_THREAD_NAMES,
        }
    }

    /// The program that runs on this kernel: `Bounded` in place of `Profile` where the
    /// kernel lacks `bpf_loop` (a probe program, as libbpf's).
    pub fn resolve(self) -> Self {
        match self {
            Self::Profile if !bpf::has_bpf_loop() => Self::Bounded,
            other => other,
        }
    }
}

/// One distinct sample key with its count, and its user stack.
#[derive(Clone, Debug)]
pub struct StackCount {
    pub key: CountKey,
    pub count: u64,
}

/// Samples of one process walked in user space (deferred: taken before its tables were
/// loaded), and how many of them were complete.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DeferredWalks {
    pub samples: u64,
    pub complete: u64,
}

/// What the kernel side counted since the profiler started.
#[derive(Clone, Debug, Default)]
pub struct Snapshot {
    pub counts: Vec<StackCount>,
    /// Off-CPU nanoseconds by key (with `--off-cpu`); the key's `outcome` carries the
    /// sleep state (`sframe_common::offcpu`).
    pub off_cpu: Vec<StackCount>,
    pub outcomes: [u64; WalkOutcome::COUNT],
    pub counters: [u64; Counter::COUNT],
}

/// What is known of process `pid` besides its mappings, read now.
fn target_info(pid: u32, maps: Vec<crate::procfs::Mapping>) -> TargetInfo {
    let ns_pid = procfs::namespace_pid(pid);
    TargetInfo {
        pid,
        comm: procfs::comm(pid).unwrap_or_else(|| format!("pid{pid}")),
        ns_pid,
        perf_map: perf_map(pid, ns_pid, &maps),
        python: None,
        maps,
        cgroup: crate::cgroup::process_cgroup(pid),
    }
}

/// The perf map of process `pid` if it maps JIT code (see
/// [`crate::symbolize::perfmap`]).
fn perf_map(
    pid: u32,
    ns_pid: Option<u32>,
    maps: &[crate::procfs::Mapping],
) -> Option<std::sync::Arc<crate::symbolize::PerfMap>> {
    match crate::symbolize::PerfMap::for_process(pid, ns_pid, maps)? {
        Ok(map) => Some(map),
        Err(e) => {
            log::debug!("no perf map: {e}");
            None
        }
    }
}

impl TargetInfo {
    /// The same process with the mappings read again (its perf map found if it maps JIT
    /// code now).
    fn with_maps(self, maps: Vec<crate::procfs::Mapping>) -> Self {
        let perf_map = self
            .perf_map
            .or_else(|| perf_map(self.pid, self.ns_pid, &maps));
        Self {
            maps,
            perf_map,
            ..self
        }
    }
}

/// A profiled process and what is needed to symbolize it after it exits.
#[derive(Clone, Debug)]
pub struct TargetInfo {
    pub pid: u32,
    pub comm: String,
    /// Its pid inside its own PID namespace (containers), when different.
    pub ns_pid: Option<u32>,
    /// Its mappings, as last read.
    pub maps: Vec<crate::procfs::Mapping>,
    /// Its perf map, when it maps JIT code: names of frames there.
    pub perf_map: Option<std::sync::Arc<crate::symbolize::PerfMap>>,
    /// Its CPython namer, when it runs CPython: names of interpreter frames.
    pub python: Option<std::sync::Arc<crate::python::PyNamer>>,
    /// Its cgroup v2 path when it was loaded (raw; sanitized in the outputs).
    pub cgroup: Option<String>,
}

/// The addresses to symbolize for a user stack's frame words (innermost first): the
/// sampled PC and exact PCs after a signal frame as they are, each return address minus
/// one ([`sframe_common::stack::lookup_address`], as the walker looks them up).
pub fn symbolization_addresses(frames: &[u64]) -> Vec<u64> {
    frames
        .iter()
        .enumerate()
        .map(|(i, &w)| sframe_common::stack::lookup_address(i, w))
        .collect()
}

/// The addresses to symbolize for a kernel stack (innermost first): the sampled PC as
/// is, each return address minus one.
pub fn kernel_symbolization_addresses(frames: &[u64]) -> Vec<u64> {
    frames
        .iter()
        .enumerate()
        .map(|(i, &a)| if i == 0 { a } else { a.saturating_sub(1) })
        .collect()
}

/// How often [`Profiler::step`] runs the periodic work.
pub const MAINTAIN_INTERVAL: Duration = Duration::from_secs(1);

/// How long ROWS and PAGES stay mapped into the profiler after their last use (a table
/// loaded, deferred samples walked): mapped, the whole arrays count in its RSS (see
/// [`crate::kmaps::KernelTables::unmap_if_idle`]); mapping them again costs about a
/// millisecond.
pub const TABLE_MAPPING_IDLE: Duration = Duration::from_secs(3);

/// Which processes to profile. Empty: only those given to `Profiler::add_target`.
#[derive(Clone, Debug, Default)]
pub struct TargetSpec {
    /// Processes given by pid (their children are followed).
    pub pids: Vec<u32>,
    /// Every process.
    pub all: bool,
    /// Processes whose command name (`/proc/PID/comm`) is one of these, now or after
    /// an exec.
    pub comms: Vec<String>,
    /// Processes in these cgroups (v2 or v1) and their sub-cgroups.
    pub cgroups: Vec<PathBuf>,
}

impl TargetSpec {
    /// Whether nothing is named (the command line then profiles the whole system).
    pub fn names_nothing(&self) -> bool {
        !self.all && self.pids.is_empty() && self.comms.is_empty() && self.cgroups.is_empty()
    }
}

/// How the profiler runs.
#[derive(Clone, Debug)]
pub struct ProfilerConfig {
    /// Samples per second per CPU.
    pub frequency: u64,
    pub targets: TargetSpec,
    /// Kernel memory for rows and page entries (bytes); `None`: the maps' built-in size.
    pub max_table_memory: Option<u64>,
    /// Exited processes whose mappings are kept for symbolizing their samples.
    pub max_exited: usize,
    /// Distinct counts (thread, stack, outcome) kept for the whole profile, a sixteenth
    /// per process (`None`: `counts::MAX_KEYS`).
    pub max_kept_counts: Option<usize>,
    /// Directory of the on-disk table cache (`None`: no cache).
    pub cache_dir: Option<PathBuf>,
    /// Sizes of the kernel maps that grow with the workload.
    pub map_sizes: bpf::MapSizes,
    /// The program attached to the perf events.
    pub program: SampleProgram,
    /// Sample on CPU (perf events); false profiles off-CPU time only.
    pub on_cpu: bool,
    /// Profile off-CPU time: sleeps of at least this long are walked and counted.
    pub off_cpu_min: Option<std::time::Duration>,
}

impl ProfilerConfig {
    /// Explicit targets only (`add_target`), at `frequency` Hz.
    pub fn explicit(frequency: u64) -> Self {
        Self {
            frequency,
            targets: TargetSpec::default(),
            max_table_memory: None,
            max_exited: 10_000,
            max_kept_counts: None,
            cache_dir: None,
            map_sizes: bpf::MapSizes::default(),
            program: SampleProgram::Profile,
            on_cpu: true,
            off_cpu_min: None,
        }
    }
}

/// Table memory below this is refused (a few small objects must fit).
pub const MIN_TABLE_MEMORY: u64 = 64 * 1024;

/// Rows and page entries for a table memory budget: 7/8 rows, 1/8 page entries (an
/// object has `budget::MIN_ROWS_PER_PAGE` rows per page on average, or pages of the
/// largest size).
pub fn table_capacity(bytes: u64) -> (u32, u32) {
    let rows = (bytes / 8 * 7) / size_of::<RowBlock>() as u64 * 8;
    let pages = (bytes / 8) / size_of::<PageBlock>() as u64 * 8;
    let clamp = |n: u64, max: u32| n.clamp(8, u64::from(max)) as u32;
    (
        clamp(rows, sframe_common::budget::MAX_ROWS),
        clamp(pages, sframe_common::budget::MAX_PAGES),
    )
}

/// Lifecycle activity since the start.
#[derive(Clone, Copy, Debug, Default)]
pub struct LifecycleStats {
    pub execs: u64,
    pub exits: u64,
    pub forks: u64,
    pub mmaps: u64,
    pub misses: u64,
    /// Mapping tables (re)loaded for processes.
    pub process_loads: u64,
    /// Processes whose maps could not be read (exited meanwhile, or no permission).
    pub load_failures: u64,
    /// Nanoseconds lifecycle events waited from the kernel's send to their handling,
    /// summed, and the longest wait.
    pub event_lag_ns: u64,
    pub event_lag_max_ns: u64,
    /// Exited processes forgotten with their samples: past `max_exited`, or earlier,
    /// oldest first, while the kept counts were near their bounds.
    pub exited_forgotten: u64,
}

/// A profiled process, alive or exited with samples.
struct Proc {
    info: TargetInfo,
    exited_at: Option<Instant>,
    loaded_at: Instant,
    /// What its last (re)load took: its next reload for new mappings waits in
    /// proportion ([`RELOAD_SHARE`]).
    load_cost: Duration,
    /// Reloads since its exec (or since it was first seen).
    reloads: u32,
    /// When it was loaded after its exec (or first seen): a young process's loader is
    /// mapping its libraries (see `lifecycle::reload_wait`).
    born: Instant,
}

pub struct Profiler {
    ebpf: Ebpf,
    /// The perf-event program attached (`profile` but in the benchmark).
    program: SampleProgram,
    store: ObjectStore,
    targets: HashMap<MapData, u32, u8>,
    counts: Counts,
    kernel_stacks: KernelStacks,
    /// Lifecycle events from the kernel side.
    events: Option<RingBuf<MapData>>,
    /// Samples the kernel side could not unwind for lack of tables, and those waiting.
    deferred: deferred::DeferredQueue,
    spec: TargetSpec,
    /// The kernel side decides who is a target (all processes, or cgroup v2 filters).
    kernel_filtered: bool,
    cgroups_v1: Vec<PathBuf>,
    procs: StdHashMap<u32, Proc>,
    /// Processes waiting for their first load.
    pending: lifecycle::FirstLoads,
    /// Processes with new mappings whose reload is throttled, and when it is due.
    reload_due: StdHashMap<u32, Instant>,
    /// What young processes' unthrottled reloads may still spend (see
    /// `lifecycle::YoungReloads`).
    young_reloads: lifecycle::YoungReloads,
    /// The last `handle_events` left events in the ring (it handles a bounded number).
    events_left: bool,
    /// Loads of a live process that found no maps (mid-exec), retried so far.
    load_retries: StdHashMap<u32, u8>,
    /// Failed loads by process (`LifecycleStats::load_failures` apart), at most
    /// `MAX_FAILED_LOADS_KEPT` processes (then forgotten all at once).
    failed_loads: StdHashMap<u32, u32>,
    /// Thread names (`/proc/PID/task/TID/comm`, raw) by tid, read when a thread's first
    /// samples are collected (a thread that is gone by then keeps no name).
    thread_names: StdHashMap<u32, String>,
    /// Exited processes in the order they exited (a pid may be listed again after
    /// reuse; entries of pids running again are skipped when trimming).
    exited_order: std::collections::VecDeque<u32>,
    /// This program's executable (children that have not exec'd yet run it).
    own_exe: Option<PathBuf>,
    max_exited: usize,
    last_liveness_check: Instant,
    /// When `step` last ran the periodic work.
    last_maintain: Instant,
    lifecycle: LifecycleStats,
    frequency: u64,
    links: Vec<PerfEventLinkId>,
    /// Samples on CPU (perf events attached).
    on_cpu: bool,
    /// Profiles off-CPU time.
    off_cpu: bool,
    /// The off-CPU programs, with `--off-cpu`.
    off_cpu_programs: Option<off_cpu::OffCpu>,
    /// Processes running CPython.
    python: python::PythonTargets,
}

use crate::bpf::take_map as take;

impl Profiler {
    /// Loads the object and the `profile` program, and attaches cpu-clock sampling at
    /// `frequency` Hz on every online CPU. Only processes given to `add_target` (and
    /// their children) are walked.
    pub fn start(frequency: u64) -> Result<Self, LoadError> {
        Self::start_with(ProfilerConfig::explicit(frequency))
    }

    /// Starts profiling what `config` names. Processes of the whole system, of cgroups
    /// and of command names are loaded when first needed (their first sample, or their
    /// exec); explicit pids and cgroup v1 members are loaded now.
    pub fn start_with(config: ProfilerConfig) -> Result<Self, LoadError> {
        let spec = config.targets.clone();
        let mut v2 = Vec::new();
        let mut cgroups_v1 = Vec::new();
        for path in &spec.cgroups {
            match cgroup::resolve(path) {
                Ok(Cgroup::V2 { filter, .. }) => v2.push(filter),
                Ok(Cgroup::V1 { path }) => cgroups_v1.push(path),
                Err(err) => return Err(LoadError::Cgroup(err)),
            }
        }
        if v2.len() > MAX_CGROUP_FILTERS as usize {
            return Err(LoadError::TooManyCgroups {
                max: MAX_CGROUP_FILTERS,
                given: v2.len(),
            });
        }
        let whole = spec.all;
        let mut flags = 0;
        if whole {
            flags |= filter::ALL;
        }
        if !v2.is_empty() {
            flags |= filter::CGROUPS;
        }
        if !spec.comms.is_empty() {
            flags |= filter::ALL_EXECS;
        }
        let (max_rows, max_pages) = match config.max_table_memory {
            Some(bytes) => {
                let (r, p) = table_capacity(bytes.max(MIN_TABLE_MEMORY));
                (Some(r), Some(p))
            }
            None => (None, None),
        };
        let mut ebpf = bpf::load_with(&LoadConfig {
            filter_flags: flags,
            max_rows,
            max_pages,
            cgroup_filters: v2.len() as u32,
            sizes: config.map_sizes,
            off_cpu_min_ns: config
                .off_cpu_min
                .map_or(0, |d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)),
        })?;
        bpf::spawn_logger(&mut ebpf);
        let program = config.program.resolve();
        if program != config.program {
            log::info!(
                "the kernel has no bpf_loop (Linux 5.17): walking with {}",
                program.name()
            );
        }
        bpf::load_perf_event(&mut ebpf, program.name())?;
        if !v2.is_empty() {
            let mut map: Array<MapData, CgroupFilter> = take(&mut ebpf, maps::TARGET_CGROUPS)?;
            for (i, f) in v2.iter().enumerate() {
                map.set(i as u32, *f, 0).map_err(|source| LoadError::Map {
                    name: maps::TARGET_CGROUPS,
                    source,
                })?;
            }
        }
        let tables = KernelTables::new(&mut ebpf)?;
        let mut store = ObjectStore::new(tables);
        if let Some(dir) = &config.cache_dir {
            match crate::cache::TableCache::open(dir) {
                Ok(cache) => store.set_cache(cache),
                Err(err) => log::error!("{err}"),
            }
        }
        let mut profiler = Self {
            program,
            store,
            targets: take(&mut ebpf, maps::TARGET_TGIDS)?,
            counts: Counts::new(&mut ebpf, config.max_kept_counts)?,
            kernel_stacks: KernelStacks::new(
                take(&mut ebpf, maps::KERNEL_STACKS)?,
                config
                    .map_sizes
                    .kernel_stacks
                    .unwrap_or(sframe_common::budget::MAX_KERNEL_STACKS),
            ),
            events: None,
            deferred: deferred::DeferredQueue::new(take(&mut ebpf, maps::DEFERRED).ok()),
            python: python::PythonTargets::new(&mut ebpf),
            ebpf,
            kernel_filtered: whole || !v2.is_empty(),
            spec,
            cgroups_v1,
            procs: StdHashMap::new(),
            pending: Default::default(),
            reload_due: StdHashMap::new(),
            young_reloads: lifecycle::YoungReloads::default(),
            events_left: false,
            load_retries: StdHashMap::new(),
            failed_loads: StdHashMap::new(),
            thread_names: StdHashMap::new(),
            exited_order: std::collections::VecDeque::new(),
            own_exe: std::fs::read_link("/proc/self/exe").ok(),
            max_exited: config.max_exited,
            last_liveness_check: Instant::now(),
            last_maintain: Instant::now(),
            lifecycle: LifecycleStats::default(),
            frequency: config.frequency,
            links: Vec::new(),
            on_cpu: config.on_cpu,
            off_cpu: config.off_cpu_min.is_some(),
            off_cpu_programs: None,
        };
        profiler.follow_lifecycle();
        for pid in profiler.spec.pids.clone() {
            profiler
                .add_target(pid)
                .map_err(|source| LoadError::Pid { pid, source })?;
        }
        profiler.scan_named_targets();
        if config.off_cpu_min.is_some() {
            bpf::off_cpu_support().map_err(LoadError::Unsupported)?;
            profiler.off_cpu_programs = Some(off_cpu::OffCpu::attach(&mut profiler.ebpf)?);
        }
        if config.on_cpu {
            profiler.links = bpf::attach_cpu_clock_all_cpus(
                &mut profiler.ebpf,
                profiler.program.name(),
                config.frequency,
            )?;
        }
        Ok(profiler)
    }

    /// Attaches the lifecycle programs (fork, exec, exit, executable mmap). Without
    /// one, that part of the lifecycle is only seen through the walker's misses and
    /// the periodic checks (logged).
    fn follow_lifecycle(&mut self) {
        for (program, category, event) in [
            (programs::ON_FORK, "task", "task_newtask"),
            (programs::ON_EXEC, "sched", "sched_process_exec"),
            (programs::ON_EXIT, "sched", "sched_process_exit"),
            (programs::ON_MMAP_ENTER, "syscalls", "sys_enter_mmap"),
            (programs::ON_MMAP_EXIT, "syscalls", "sys_exit_mmap"),
        ] {
            if let Err(err) = bpf::attach_tracepoint(&mut self.ebpf, program, category, event) {
                log::warn!("{category}:{event} not followed: {err}");
            }
        }
        self.events = take(&mut self.ebpf, maps::EVENTS).ok();
    }

    /// Adds processes named by `--comm` and members of v1 cgroups.
    fn scan_named_targets(&mut self) {
        let mut wanted: Vec<u32> = Vec::new();
        if !self.spec.comms.is_empty() {
            wanted.extend(
                procfs::all_pids()
                    .into_iter()
                    .filter(|&pid| self.comm_matches(pid)),
            );
        }
        for path in &self.cgroups_v1 {
            wanted.extend(cgroup::v1_pids(path));
        }
        let me = std::process::id();
        for pid in wanted {
            if pid != me && self.procs.get(&pid).is_none_or(|p| p.exited_at.is_some()) {
                let _ = self.add_target(pid);
            }
        }
    }

    fn comm_matches(&self, pid: u32) -> bool {
        !self.spec.comms.is_empty()
            && procfs::comm(pid).is_some_and(|c| self.spec.comms.contains(&c))
    }

    /// The sampling frequency now.
    pub fn frequency(&self) -> u64 {
        self.frequency
    }

    /// Whether it samples on CPU, and whether it profiles off-CPU time.
    pub fn modes(&self) -> (bool, bool) {
        (self.on_cpu, self.off_cpu)
    }

    /// 1 in how many sleeps the off-CPU programs time now.
    pub fn off_cpu_every(&self) -> u32 {
        self.off_cpu_programs
            .as_ref()
            .map_or(1, off_cpu::OffCpu::every)
    }

    /// Makes the off-CPU programs time 1 in `every` sleeps (at random), each timed one
    /// counting for `every` (the governor's sampling when the switch programs cost
    /// more than its budget); clamped to 1..=`MAX_OFF_CPU_EVERY`.
    pub fn set_off_cpu_every(&mut self, every: u32) -> Result<(), LoadError> {
        self.with_off_cpu(|o, ebpf| o.set_every(ebpf, every))
    }

    /// Runs `f` on the off-CPU programs, if they were loaded (else nothing to change).
    fn with_off_cpu(
        &mut self,
        f: impl FnOnce(&mut off_cpu::OffCpu, &mut aya::Ebpf) -> Result<(), LoadError>,
    ) -> Result<(), LoadError> {
        match &mut self.off_cpu_programs {
            Some(o) => f(o, &mut self.ebpf),
            None => Ok(()),
        }
    }

    /// The off-CPU pause factor: the programs watch one observation window in that
    /// many (1: always).
    pub fn off_cpu_pause(&self) -> u32 {
        self.off_cpu_programs
            .as_ref()
            .map_or(1, off_cpu::OffCpu::pause)
    }

    /// Sets the pause factor for sleeps that start from now on (clamped to
    /// 1..=`MAX_OFF_CPU_PAUSE`); the governor detaches and attaches the programs
    /// ([`Profiler::set_off_cpu_attached`]).
    pub fn set_off_cpu_pause(&mut self, pause: u32) -> Result<(), LoadError> {
        self.with_off_cpu(|o, ebpf| o.set_pause(ebpf, pause))
    }

    /// Whether the off-CPU programs are attached (not paused by the governor).
    pub fn off_cpu_attached(&self) -> bool {
        self.off_cpu_programs
            .as_ref()
            .is_some_and(off_cpu::OffCpu::attached)
    }

    /// Detaches the off-CPU programs (`false`: nothing runs at context switches) or
    /// attaches them again in a new observation window (`true`: sleeps that began
    /// before are not charged, `off_cpu_paused`).
    pub fn set_off_cpu_attached(&mut self, attached: bool) -> Result<(), LoadError> {
        self.with_off_cpu(|o, ebpf| {
            if attached {
                o.resume(ebpf)
            } else {
                o.suspend(ebpf)
            }
        })
    }

    /// The off-CPU program that walks woken threads: `OFF_CPU_WAKE` (fexit of
    /// `schedule`) or, where that cannot attach, `OFF_CPU_RETURN` (`sys_exit`).
    pub fn off_cpu_walker(&self) -> &'static str {
        self.off_cpu_programs
            .as_ref()
            .map_or(programs::OFF_CPU_RETURN, off_cpu::OffCpu::walker)
    }

    /// Run time (ns) and runs of the off-CPU programs together.
    pub fn off_cpu_program_stats(&self) -> Option<(u64, u64)> {
        let a = self.program_stats_of(programs::OFF_CPU_SWITCH)?;
        let b = self.program_stats_of(self.off_cpu_walker())?;
        Some((a.0 + b.0, a.1 + b.1))
    }

    /// Changes the sampling frequency (re-attaches the perf events).
    pub fn set_frequency(&mut self, frequency: u64) -> Result<(), LoadError> {
        let frequency = frequency.max(1);
        if frequency == self.frequency || !self.on_cpu {
            return Ok(());
        }
        let program = bpf::perf_event(&mut self.ebpf, self.program.name())?;
        for link in self.links.drain(..) {
            let _ = program.detach(link);
        }
        self.links =
            bpf::attach_cpu_clock_all_cpus(&mut self.ebpf, self.program.name(), frequency)?;
        self.frequency = frequency;
        Ok(())
    }

    /// The lifecycle ring buffer, for waiting on it (`AsyncFd`).
    pub fn events_fd(&self) -> Option<std::os::fd::BorrowedFd<'_>> {
        use std::os::fd::AsFd as _;
        self.events.as_ref().map(|e| e.as_fd())
    }

    fn is_listed(&self, pid: u32) -> bool {
        self.targets.get(&pid, 0).is_ok()
    }

    /// When the event loop must step again without a ring buffer event: now (pending
    /// work), when a throttled reload is due, or when the periodic work is.
    pub fn wake_at(&self) -> Instant {
        if self.has_pending() {
            return Instant::now();
        }
        let periodic = self.last_maintain + MAINTAIN_INTERVAL;
        let due = self
            .next_reload_due()
            .map_or(periodic, |reload| reload.min(periodic));
        let due = match self.python.next_retry() {
            Some(retry) => due.min(retry),
            None => due,
        };
        match self.python.next_drain() {
            Some(drain) => due.min(drain),
            None => due,
        }
    }

    /// One step of the event loop, the same for every caller (the command's async loop,
    /// the tests, the bench): lifecycle events, deferred samples and due reloads
    /// ([`Profiler::handle_events`]), then, once per [`MAINTAIN_INTERVAL`], the periodic
    /// work ([`Profiler::maintain`]). Returns the processes newly profiled.
    pub fn step(&mut self) -> Vec<u32> {
        // The loop runs: loads from here on must not wait for the disk (and the start,
        // with `--drop-privileges`, is over: threads may start).
        self.store.write_cache_in_background();
        self.python.start();
        self.retry_python();
        let mut added = self.handle_events();
        if self.python.drain_due() {
            // Code objects are read while their process lives: with Python processes
            // profiled, their new stacks are drained more often than once a second.
            self.drain();
        }
        if self.last_maintain.elapsed() >= MAINTAIN_INTERVAL {
            self.last_maintain = Instant::now();
            added.extend(self.maintain());
        }
        added
    }

    /// A synchronous loop's wait and step: waits at most `timeout` for the lifecycle or
    /// deferred-sample ring buffer, or until [`Profiler::wake_at`], then
    /// [`Profiler::step`]s.
    pub fn poll(&mut self, timeout: Duration) -> Vec<u32> {
        use std::os::fd::AsRawFd as _;
        let until = (Instant::now() + timeout).min(self.wake_at());
        let ms = until.saturating_duration_since(Instant::now()).as_millis();
        if ms > 0 {
            let mut fds: Vec<libc::pollfd> = [self.events_fd(), self.deferred_fd()]
                .into_iter()
                .flatten()
                .map(|fd| libc::pollfd {
                    fd: fd.as_raw_fd(),
                    events: libc::POLLIN,
                    revents: 0,
                })
                .collect();
            let ms = i32::try_from(ms).unwrap_or(i32::MAX);
            // SAFETY: `fds` is a valid array of pollfd for its length (possibly 0: then
            // poll only sleeps).
            unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, ms) };
        }
        self.step()
    }

    /// Periodic work (about once a second): the kernel's counts drained
    /// ([`Profiler::drain`]), the table maps' mappings dropped when idle
    /// ([`TABLE_MAPPING_IDLE`]), v1 cgroup members, and a
    /// liveness check that catches exits whose events were lost.
    pub fn maintain(&mut self) -> Vec<u32> {
        let mut added = Vec::new();
        self.drain();
        self.store.unmap_tables_if_idle(TABLE_MAPPING_IDLE);
        if self.reload_built(&mut added) {
            // Deferred samples that waited for these tables (exited processes' too).
            self.unwind_deferred();
        }
        if !self.cgroups_v1.is_empty() {
            let before: HashSet<u32> = self.procs.keys().copied().collect();
            self.scan_named_targets();
            added.extend(self.procs.keys().filter(|p| !before.contains(p)));
        }
        if self.last_liveness_check.elapsed() >= Duration::from_secs(5) {
            self.last_liveness_check = Instant::now();
            let gone: Vec<u32> = self
                .procs
                .iter()
                .filter(|&(&pid, p)| p.exited_at.is_none() && !procfs::exists(pid))
                .map(|(&pid, _)| pid)
                .collect();
            for pid in gone {
                self.exited(pid);
            }
        }
        added
    }

    /// Handles pending events; returns processes added since the last call (children of
    /// targets, exec'd processes). Kept for callers that poll.
    pub fn adopt_children(&mut self) -> Vec<u32> {
        let mut added = self.handle_events();
        added.extend(self.maintain());
        added
    }

    /// Process `pid` as profiled (alive, or exited and still kept for symbolization).
    pub fn target(&self, pid: u32) -> Option<&TargetInfo> {
        self.procs.get(&pid).map(|p| &p.info)
    }

    /// Every process profiled so far with the generation of its mapping table (it
    /// changes at each load; 0 before the first and once the table is dropped), without
    /// copying them: what changed since a caller last looked.
    pub fn target_generations(&self) -> impl Iterator<Item = (u32, u64)> + '_ {
        self.procs
            .keys()
            .map(|&pid| (pid, self.store.process_generation(pid).unwrap_or(0)))
    }

    /// How many processes [`Profiler::targets`] would list (without copying them).
    pub fn target_count(&self) -> usize {
        self.procs.len()
    }

    /// Every process profiled so far (alive, and exited ones still kept).
    pub fn targets(&self) -> Vec<TargetInfo> {
        let mut v: Vec<TargetInfo> = self.procs.values().map(|p| p.info.clone()).collect();
        v.sort_by_key(|t| t.pid);
        v
    }

    /// What the profiler saw of processes' lives so far.
    pub fn lifecycle(&self) -> LifecycleStats {
        self.lifecycle
    }

    /// Loads of process `pid` that failed (no maps to read: it had exited, or was a
    /// zombie), as far as they are remembered (the count of the busiest processes of a
    /// churning host is reset now and then; the total is in [`Profiler::lifecycle`]).
    pub fn failed_loads_of(&self, pid: u32) -> u32 {
        self.failed_loads.get(&pid).copied().unwrap_or(0)
    }

    /// Cumulative lifecycle and table counters, for metrics.
    pub fn fleet_counters(&self) -> Vec<(&'static str, u64)> {
        let l = self.lifecycle;
        let t = self.store.stats();
        vec![
            ("exec", l.execs),
            ("exit", l.exits),
            ("fork", l.forks),
            ("mmap", l.mmaps),
            ("miss", l.misses),
            ("process_load", l.process_loads),
            ("process_load_failure", l.load_failures),
            ("table_load", t.loads),
            ("table_eviction", t.evictions),
            ("table_full", t.full),
            ("table_background_build", t.background_builds),
            (
                "table_background_identification",
                t.background_identifications,
            ),
            ("table_build_dropped", t.builds_dropped),
            ("file_changed", t.files_changed),
            ("file_truncated_page", crate::mapped::truncated_pages()),
            ("process_table_full", t.process_table_full),
            ("count_folded", self.counts.folded()),
            ("exited_forgotten", l.exited_forgotten),
            ("kernel_stack_dropped", self.kernel_stacks.dropped),
            ("cache_hit", self.store.cache().map_or(0, |c| c.stats.hits)),
            (
                "cache_miss",
                self.store.cache().map_or(0, |c| c.stats.misses),
            ),
            (
                "cache_store",
                self.store.cache().map_or(0, |c| c.stats.stores),
            ),
            (
                "cache_rejected",
                self.store.cache().map_or(0, |c| c.stats.rejected),
            ),
        ]
    }

    /// Whether `pid` is profiled and has not exited (as far as the profiler has seen).
    pub fn is_alive(&self, pid: u32) -> bool {
        self.procs.get(&pid).is_some_and(|p| p.exited_at.is_none())
    }

    /// Processes alive now.
    pub fn alive_targets(&self) -> usize {
        self.procs
            .values()
            .filter(|p| p.exited_at.is_none())
            .count()
    }

    /// Whether the run has targets that can still appear (whole system, cgroups,
    /// command names) rather than only the listed pids and their children.
    pub fn open_ended(&self) -> bool {
        self.kernel_filtered || !self.spec.comms.is_empty() || !self.cgroups_v1.is_empty()
    }

    /// Makes `pid` a target without loading its tables: a process about to exec (the
    /// command of `sframe-user -- CMD`, held before its exec), whose exec event loads the
    /// new image's tables.
    pub fn watch_before_exec(&mut self, pid: u32) {
        if let Err(err) = self.targets.insert(pid, 1, 0) {
            log::warn!("pid {pid}: cannot add to targets: {err}");
        }
        self.procs.insert(
            pid,
            Proc {
                info: target_info(pid, Vec::new()),
                exited_at: None,
                loaded_at: Instant::now(),
                load_cost: Duration::ZERO,
                reloads: 0,
                born: Instant::now(),
            },
        );
    }

    /// Loads the tables of `pid`'s objects, then starts sampling it.
    pub fn add_target(&mut self, pid: u32) -> Result<ProcessReport, crate::procfs::MapsError> {
        let report = self.store.refresh_process(pid, Build::Now)?;
        self.lifecycle.process_loads += 1;
        if let Err(err) = self.targets.insert(pid, 1, 0) {
            log::warn!("pid {pid}: cannot add to targets: {err}");
        }
        let mut info = target_info(pid, report.maps.clone());
        self.python.install(&mut info);
        self.procs.insert(
            pid,
            Proc {
                info,
                exited_at: None,
                loaded_at: Instant::now(),
                load_cost: Duration::ZERO,
                reloads: 0,
                born: Instant::now(),
            },
        );
        Ok(report)
    }

    /// Re-reads `pid`'s mappings (new libraries, exec).
    pub fn refresh(&mut self, pid: u32) -> Result<ProcessReport, crate::procfs::MapsError> {
        let report = self.store.refresh_process(pid, Build::Now)?;
        if let Some(p) = self.procs.get_mut(&pid)
            && !report.maps.is_empty()
        {
            p.info.maps = report.maps.clone();
            p.loaded_at = Instant::now();
            self.python.install(&mut p.info);
        }
        Ok(report)
    }

    /// Stops sampling `pid` and frees its mapping table.
    pub fn remove_target(&mut self, pid: u32) {
        let _ = self.targets.remove(&pid);
        self.store.forget_process(pid);
        self.python.forget(pid);
        self.procs.remove(&pid);
    }

    /// Pids with an entry in the kernel's target list (explicit targets and children).
    pub fn listed_targets(&self) -> Vec<u32> {
        self.targets.keys().filter_map(Result::ok).collect()
    }

    /// Pids with a mapping table in the kernel.
    pub fn kernel_processes(&self) -> Vec<u32> {
        self.store.tables().process_ids()
    }

    /// The name of thread `tid`, if it was read when its samples were collected.
    pub fn thread_name(&self, tid: u32) -> Option<&str> {
        self.thread_names.get(&tid).map(String::as_str)
    }

    /// The name of thread `tid` of `pid` (`/proc/PID/task/TID/comm`), read on first use
    /// and kept (at most `MAX_THREAD_NAMES`, then all are forgotten and read again).
    fn read_thread_name(&mut self, pid: u32, tid: u32) -> Option<&str> {
        /// Names kept at most.
        const MAX_THREAD_NAMES: usize = 1 << 16;
        if tid != 0 && !self.thread_names.contains_key(&tid) {
            if self.thread_names.len() >= MAX_THREAD_NAMES {
                self.thread_names.clear();
            }
            let bytes = std::fs::read(format!("/proc/{pid}/task/{tid}/comm")).ok()?;
            let bytes = bytes.strip_suffix(b"\n").unwrap_or(&bytes);
            self.thread_names
                .insert(tid, String::from_utf8_lossy(bytes).into_owned());
        }
        self.thread_names.get(&tid).map(String::as_str)
    }

    /// The kernel's 16-byte, NUL-padded `comm` of a thread, from [`Self::read_thread_name`]
    /// (zeros when the thread is gone).
    fn thread_comm(&mut self, pid: u32, tid: u32) -> [u8; 16] {
        let mut comm = [0u8; 16];
        if let Some(name) = self.read_thread_name(pid, tid) {
            // At most 15 bytes: the last stays 0, as in the kernel's `comm`.
            for (to, from) in comm.iter_mut().zip(name.bytes().take(15)) {
                *to = from;
            }
        }
        comm
    }

    /// Moves the kernel's counts into user space and returns everything counted so far.
    pub fn collect(&mut self) -> Snapshot {
        let _cpu = crate::cputime::Timer::start(&crate::cputime::COLLECTION);
        self.make_room();
        let mut bound = StdHashMap::new();
        let procs = &self.procs;
        self.counts
            .collect(&mut self.kernel_stacks, &mut |pid, frames| {
                bind_python_words(procs, pid, frames, &mut bound)
            })
    }

    /// Looks again at the processes whose CPython file the finder was reading.
    fn retry_python(&mut self) {
        for pid in self.python.due() {
            match self.procs.get_mut(&pid) {
                Some(p) if p.exited_at.is_none() => self.python.install(&mut p.info),
                _ => self.python.forget(pid),
            }
        }
    }

    /// Binds the interpreter frames' words of a user stack of `pid` new to user space to
    /// the code objects their addresses hold now (`PyNamer::bind`: read while the process
    /// lives, a code object cannot be read after its exit); `bound`: the addresses
    /// checked this round, per process.
    fn bind_python_words(
        &self,
        pid: u32,
        frames: &mut [u64],
        bound: &mut StdHashMap<u32, std::collections::HashMap<u64, u8>>,
    ) {
        bind_python_words(&self.procs, pid, frames, bound);
    }

    /// Moves the kernel's counts and stacks into user space without a snapshot: done by
    /// [`Profiler::maintain`] once a second whoever runs the loop, so that the kernel's
    /// maps (a second or so of a busy machine's stacks) never fill between two
    /// [`Profiler::collect`]s far apart — a new stack would then be counted without its
    /// frames.
    pub fn drain(&mut self) {
        let _cpu = crate::cputime::Timer::start(&crate::cputime::COLLECTION);
        self.make_room();
        let mut bound = StdHashMap::new();
        let procs = &self.procs;
        self.counts
            .drain(&mut self.kernel_stacks, &mut |pid, frames| {
                bind_python_words(procs, pid, frames, &mut bound)
            });
    }

    /// The samples of process `pid` walked in user space so far (the deferred ones).
    pub fn deferred_walks(&self, pid: u32) -> DeferredWalks {
        self.counts.walked_of(pid)
    }

    /// Stacks stored in the kernel's `STACKS` map now, read key by key (tests and
    /// diagnostics): after [`Profiler::drain`], only those of samples counted since.
    pub fn kernel_stacks_stored(&self) -> usize {
        self.counts.stacks_in_kernel()
    }

    /// The frames of a kernel stack (innermost first) seen by `collect`.
    pub fn kernel_stack(&self, id: i32) -> Option<&[u64]> {
        self.kernel_stacks.get(id)
    }

    /// The object store: loaded objects, their kernel tables, the cache, statistics.
    pub fn store(&self) -> &ObjectStore {
        &self.store
    }

    /// The object store, for tests that hold its builds (`ObjectStore::hold_builds`).
    pub fn store_mut(&mut self) -> &mut ObjectStore {
        &mut self.store
    }

    /// The frames of a user stack (innermost first) seen by `collect`.
    pub fn stack(&self, id: u64) -> Option<&[u64]> {
        self.counts.stack(id)
    }

    /// Instructions the verifier processed for each loaded program (its budget is 1M;
    /// `None` where the kernel does not tell, before 5.16).
    pub fn verifier_stats(&self) -> Vec<(String, Option<u32>)> {
        self.ebpf
            .programs()
            .filter_map(|(name, program)| {
                let info = program.info().ok()?;
                Some((name.to_owned(), info.verified_instruction_count()))
            })
            .collect()
    }

    /// The sampling program's accumulated run time (ns) and run count, as the kernel
    /// reports them while `kernel.bpf_stats_enabled` is 1 (`cargo xtask bench`).
    pub fn program_stats(&self) -> Option<(u64, u64)> {
        self.program_stats_of(self.program.name())
    }

    /// Run time (ns) and run count of program `name` (with `kernel.bpf_stats_enabled`).
    pub fn program_stats_of(&self, name: &str) -> Option<(u64, u64)> {
        let info = self.ebpf.program(name)?.info().ok()?;
        Some((info.run_time().as_nanos() as u64, info.run_count()))
    }
}

/// [`Profiler::bind_python_words`] over `procs`.
fn bind_python_words(
    procs: &StdHashMap<u32, Proc>,
    pid: u32,
    frames: &mut [u64],
    bound: &mut StdHashMap<u32, std::collections::HashMap<u64, u8>>,
) {
    if !frames.iter().any(|&w| sframe_common::python::is_frame(w)) {
        return;
    }
    let Some(namer) = procs.get(&pid).and_then(|p| p.info.python.as_ref()) else {
        return;
    };
    let seen = bound.entry(pid).or_default();
    for w in frames
        .iter_mut()
        .filter(|w| sframe_common::python::is_frame(**w))
    {
        *w = namer.bind(*w, seen);
    }
}
