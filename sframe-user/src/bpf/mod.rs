//! Loading the embedded eBPF object.

mod btf_map_type;

use aya::{Ebpf, EbpfLoader};
use log::warn;
use sframe_common::names::{globals, maps, programs};

/// The BPF object built by `build.rs` (aya-build) from `sframe-ebpf`.
pub static EBPF_OBJECT: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/sframe"));

#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    #[error("loading the eBPF object failed: {}", explain_object_error(.0))]
    Object(#[from] aya::EbpfError),
    #[error("preparing the eBPF object for this kernel: {0}")]
    ObjectPatch(String),
    /// A feature the running kernel cannot give (the message names what it lacks).
    #[error("{0}")]
    Unsupported(String),
    #[error("loading program {name} failed (verifier log follows if any): {source}")]
    Program {
        name: &'static str,
        #[source]
        source: aya::programs::ProgramError,
    },
    #[error("program {name} not found in the eBPF object")]
    MissingProgram { name: &'static str },
    #[error("map {name}: {source}")]
    Map {
        name: &'static str,
        #[source]
        source: aya::maps::MapError,
    },
    #[error("map {name} not found in the eBPF object")]
    MissingMap { name: &'static str },
    #[error("mapping BPF map {name} into memory: {source}")]
    Mmap {
        name: &'static str,
        #[source]
        source: std::io::Error,
    },
    /// A `--cgroup` target could not be resolved.
    #[error("target cgroup")]
    Cgroup(#[source] crate::cgroup::CgroupError),
    /// More cgroup v2 targets than the kernel side checks.
    #[error("at most {max} cgroup v2 targets, {given} given")]
    TooManyCgroups { max: u32, given: usize },
    /// A `--pid` target's mappings could not be read.
    #[error("target pid {pid}")]
    Pid {
        pid: u32,
        #[source]
        source: crate::procfs::MapsError,
    },
    #[error("attaching {what}: {source}")]
    Attach {
        what: String,
        #[source]
        source: aya::programs::ProgramError,
    },
}

/// What went wrong in loading the object, said as what it is: a permission the process
/// lacks, or a kernel feature the running kernel lacks (a map type it does not know is
/// refused with `EINVAL`, not `EPERM`: Linux 5.10 has no task storage).
fn explain_object_error(e: &aya::EbpfError) -> String {
    const PRIVILEGES: &str = "root or CAP_BPF+CAP_PERFMON needed";
    let aya::EbpfError::MapError(aya::maps::MapError::CreateError { name, io_error }) = e else {
        return format!("{e} (if the kernel denied it: {PRIVILEGES})");
    };
    match io_error.raw_os_error() {
        Some(libc::EPERM | libc::EACCES) => {
            format!("creating map {name}: {io_error} ({PRIVILEGES})")
        }
        _ => {
            let feature = match name.as_str() {
                maps::OFF_CPU_TASKS => "task storage maps (BPF_MAP_TYPE_TASK_STORAGE, Linux 5.11)",
                maps::EVENTS | maps::DEFERRED => {
                    "BPF ring buffers (BPF_MAP_TYPE_RINGBUF, Linux 5.8)"
                }
                _ => "the map's type, flags or size",
            };
            format!(
                "the kernel refused to create map {name}: {io_error}: this kernel ({}) lacks {feature}",
                kernel_release().as_deref().unwrap_or("release unknown")
            )
        }
    }
}

/// The running kernel's release (`uname -r`).
fn kernel_release() -> Option<String> {
    std::fs::read_to_string("/proc/sys/kernel/osrelease")
        .ok()
        .map(|s| s.trim().to_owned())
}

#[cfg(test)]
mod explain_tests {
    use super::*;

    fn create_error(name: &str, errno: i32) -> aya::EbpfError {
        aya::EbpfError::MapError(aya::maps::MapError::CreateError {
            name: name.to_owned(),
            io_error: std::io::Error::from_raw_os_error(errno),
        })
    }

    /// Linux 5.10 refuses the task storage map with EINVAL: the message names the
    /// feature, not a privilege (which the profiler, run as root, had).
    #[test]
    fn a_map_the_kernel_cannot_create_names_the_missing_feature_not_a_privilege() {
        let text = LoadError::Object(create_error(maps::OFF_CPU_TASKS, libc::EINVAL)).to_string();
        assert!(
            text.contains("task storage") && text.contains("5.11"),
            "{text}"
        );
        assert!(!text.contains("CAP_BPF"), "{text}");
        let text = LoadError::Object(create_error(maps::EVENTS, libc::EINVAL)).to_string();
        assert!(text.contains("ring buffers"), "{text}");
        // A permission error says so.
        let text = LoadError::Object(create_error(maps::COUNTS, libc::EPERM)).to_string();
        assert!(text.contains("CAP_BPF+CAP_PERFMON"), "{text}");
        assert!(!text.contains("lacks"), "{text}");
    }
}

/// What the kernel side is told at load time.
#[derive(Clone, Debug, Default)]
pub struct LoadConfig {
    /// `sframe_common::event::filter` bits.
    pub filter_flags: u32,
    /// Row capacity of `ROWS` (default: `budget::MAX_ROWS`).
    pub max_rows: Option<u32>,
    /// Page-entry capacity of `PAGES` (default: `budget::MAX_PAGES`).
    pub max_pages: Option<u32>,
    /// Entries of `TARGET_CGROUPS` user space fills before attaching.
    pub cgroup_filters: u32,
    pub sizes: MapSizes,
    /// Off-CPU: sleeps shorter than this (ns) are not walked.
    pub off_cpu_min_ns: u64,
}

/// Entries of the kernel maps whose need grows with the workload (`None`: the sizes in
/// `sframe_common::budget`). A full map is counted, never fatal: a process without
/// room in `PROCESSES` has its samples unwound in user space (deferred), a sample
/// without room in `STACKS` or `COUNTS` is counted as lost (`stack_map_full`,
/// `count_map_full`) until the next collection empties them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MapSizes {
    /// Processes with a mapping table (`PROCESSES`, 8 KiB each).
    pub processes: Option<u32>,
    /// Distinct user stacks between two collections (`STACKS`, 2 KiB each).
    pub stacks: Option<u32>,
    /// Distinct (thread, stack, outcome) keys between two collections (`COUNTS`).
    pub counts: Option<u32>,
    /// Kernel stacks (`KERNEL_STACKS`, emptied by user space when it fills up).
    pub kernel_stacks: Option<u32>,
}

/// Loads the object into the kernel (maps are created; programs are loaded on demand).
pub fn load() -> Result<Ebpf, LoadError> {
    load_with(&LoadConfig::default())
}

/// Loads the object with `config`: globals (filters, this process's tgid, tracepoint
/// record offsets from tracefs) and map sizes.
pub fn load_with(config: &LoadConfig) -> Result<Ebpf, LoadError> {
    use sframe_common::layout::{PAGE_BLOCK, ROW_BLOCK};
    raise_memlock_limit();
    ensure_tracefs();
    let offsets = TracepointOffsets::read();
    let self_tgid = std::process::id();
    let task_regs = u32::from(has_task_regs_helpers());
    let mut loader = EbpfLoader::new();
    loader
        .override_global(globals::FILTER_FLAGS, &config.filter_flags, true)
        .override_global(globals::SELF_TGID, &self_tgid, true)
        .override_global(globals::CGROUP_FILTER_COUNT, &config.cgroup_filters, true)
        .override_global(globals::NEWTASK_PID_OFFSET, &offsets.newtask_pid, true)
        .override_global(globals::NEWTASK_FLAGS_OFFSET, &offsets.newtask_flags, true)
        .override_global(
            globals::EXIT_GROUP_DEAD_OFFSET,
            &offsets.exit_group_dead,
            true,
        )
        .override_global(globals::MMAP_PROT_OFFSET, &offsets.mmap_prot, true)
        .override_global(globals::MMAP_FD_OFFSET, &offsets.mmap_fd, true)
        .override_global(globals::MMAP_RET_OFFSET, &offsets.mmap_ret, true)
        .override_global(globals::OFF_CPU_MIN_NS, &config.off_cpu_min_ns, true)
        .override_global(globals::TASK_REGS_HELPERS, &task_regs, true);
    if let Some(rows) = config.max_rows {
        loader.map_max_entries(maps::ROWS, rows.div_ceil(ROW_BLOCK as u32).max(1));
    }
    if let Some(pages) = config.max_pages {
        loader.map_max_entries(maps::PAGES, pages.div_ceil(PAGE_BLOCK as u32).max(1));
    }
    let sized = [
        (maps::PROCESSES, config.sizes.processes),
        (maps::STACKS, config.sizes.stacks),
        (maps::COUNTS, config.sizes.counts),
        (maps::KERNEL_STACKS, config.sizes.kernel_stacks),
    ];
    for (map, size) in sized {
        if let Some(n) = size {
            loader.map_max_entries(map, n.max(1));
        }
    }
    // `OFF_CPU_TASKS` is a task-storage map, which aya creates but has no type for
    // (the profiler never reads it).
    loader.allow_unsupported_maps();
    if has_task_storage() {
        return Ok(loader.load(EBPF_OBJECT)?);
    }
    // A kernel without task storage (before 5.11) would refuse the whole object: the
    // map is created as a hash map instead, which no program loaded there uses
    // (off-CPU profiling, its only user, is refused on such a kernel: see
    // `off_cpu_support`).
    let patched = btf_map_type::with_map_type(
        EBPF_OBJECT,
        maps::OFF_CPU_TASKS,
        aya::maps::MapType::Hash as u32,
    )
    .map_err(LoadError::ObjectPatch)?;
    loader.map_max_entries(maps::OFF_CPU_TASKS, 1);
    // The ELF reader wants the object aligned as the embedded one is.
    let mut aligned = vec![0u64; patched.len().div_ceil(8)];
    // SAFETY: `aligned` holds at least `patched.len()` bytes.
    let bytes =
        unsafe { std::slice::from_raw_parts_mut(aligned.as_mut_ptr().cast::<u8>(), patched.len()) };
    bytes.copy_from_slice(&patched);
    Ok(loader.load(bytes)?)
}

/// Offsets of the tracepoint record fields the lifecycle programs read (0: unknown on
/// this kernel, the program then does nothing).
#[derive(Clone, Copy, Debug, Default)]
pub struct TracepointOffsets {
    pub newtask_pid: u32,
    pub newtask_flags: u32,
    pub exit_group_dead: u32,
    pub mmap_prot: u32,
    pub mmap_fd: u32,
    pub mmap_ret: u32,
}

impl TracepointOffsets {
    pub fn read() -> Self {
        let field = |event: &str, name: &str| {
            tracepoint_format(event)
                .and_then(|f| tracepoint_field_offset(&f, name))
                .unwrap_or(0)
        };
        Self {
            newtask_pid: field("task/task_newtask", "pid"),
            newtask_flags: field("task/task_newtask", "clone_flags"),
            exit_group_dead: field("sched/sched_process_exit", "group_dead"),
            mmap_prot: field("syscalls/sys_enter_mmap", "prot"),
            mmap_fd: field("syscalls/sys_enter_mmap", "fd"),
            mmap_ret: field("syscalls/sys_exit_mmap", "ret"),
        }
    }
}

/// Where tracefs may be mounted, in the order the kernel's tools look.
const TRACEFS_ROOTS: [&str; 2] = ["/sys/kernel/tracing", "/sys/kernel/debug/tracing"];

/// The format file of tracepoint `category/event`, from tracefs.
pub fn tracepoint_format(event: &str) -> Option<String> {
    TRACEFS_ROOTS
        .iter()
        .find_map(|root| std::fs::read_to_string(format!("{root}/events/{event}/format")).ok())
}

/// Mounts tracefs on `/sys/kernel/tracing` when no tracefs is mounted (minimal VMs
/// and containers without systemd's automount), as perf does: the lifecycle
/// tracepoints are attached through it. Needs CAP_SYS_ADMIN; without it, or on a
/// kernel without tracefs, a warning says why and the lifecycle is then only seen
/// through walker misses and periodic checks.
pub fn ensure_tracefs() {
    if TRACEFS_ROOTS
        .iter()
        .any(|root| std::path::Path::new(root).join("events").is_dir())
    {
        return;
    }
    match mount_tracefs(TRACEFS_ROOTS[0]) {
        Ok(()) => log::info!("mounted tracefs on {}", TRACEFS_ROOTS[0]),
        Err(err) => warn!(
            "no tracefs mounted and mounting it on {} failed: {err}",
            TRACEFS_ROOTS[0]
        ),
    }
}

fn mount_tracefs(target: &str) -> std::io::Result<()> {
    let target = std::ffi::CString::new(target)?;
    let fstype = c"tracefs";
    // SAFETY: NUL-terminated strings that outlive the call; no mount data.
    let ret = unsafe {
        libc::mount(
            fstype.as_ptr(),
            target.as_ptr(),
            fstype.as_ptr(),
            libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC,
            std::ptr::null(),
        )
    };
    if ret == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

/// Parses `field:TYPE NAME;\toffset:N;` lines of a tracepoint format file.
pub fn tracepoint_field_offset(format: &str, name: &str) -> Option<u32> {
    format.lines().find_map(|line| {
        let decl = line.trim().strip_prefix("field:")?;
        let (decl, rest) = decl.split_once(';')?;
        if decl.split_whitespace().last()? != name {
            return None;
        }
        rest.trim()
            .strip_prefix("offset:")?
            .split(';')
            .next()?
            .parse()
            .ok()
    })
}

/// The perf-event program `name` of `ebpf`.
pub fn perf_event<'a>(
    ebpf: &'a mut Ebpf,
    name: &'static str,
) -> Result<&'a mut aya::programs::PerfEvent, LoadError> {
    ebpf.program_mut(name)
        .ok_or(LoadError::MissingProgram { name })?
        .try_into()
        .map_err(|source| LoadError::Program { name, source })
}

/// Loads the perf-event program `name` into the kernel (the verifier runs here).
pub fn load_perf_event(ebpf: &mut Ebpf, name: &'static str) -> Result<(), LoadError> {
    perf_event(ebpf, name)?
        .load()
        .map_err(|source| LoadError::Program { name, source })
}

/// Takes map `name` out of `ebpf` as a typed map.
pub fn take_map<T: TryFrom<aya::maps::Map, Error = aya::maps::MapError>>(
    ebpf: &mut Ebpf,
    name: &'static str,
) -> Result<T, LoadError> {
    let map = ebpf.take_map(name).ok_or(LoadError::MissingMap { name })?;
    T::try_from(map).map_err(|source| LoadError::Map { name, source })
}

/// Attaches perf-event program `name` to a software cpu-clock event sampling every task
/// of every online CPU at `frequency` Hz (the program filters targets itself).
pub fn attach_cpu_clock_all_cpus(
    ebpf: &mut Ebpf,
    name: &'static str,
    frequency: u64,
) -> Result<Vec<aya::programs::perf_event::PerfEventLinkId>, LoadError> {
    use aya::programs::perf_event::{PerfEventConfig, PerfEventScope, SamplePolicy, SoftwareEvent};
    let program = perf_event(ebpf, name)?;
    let cpus = aya::util::online_cpus().map_err(|(_, err)| LoadError::Attach {
        what: "reading online CPUs".into(),
        source: aya::programs::ProgramError::IOError(err),
    })?;
    let mut links = Vec::with_capacity(cpus.len());
    for cpu in cpus {
        let link = program
            .attach(
                PerfEventConfig::Software(SoftwareEvent::CpuClock),
                PerfEventScope::AllProcessesOneCpu { cpu },
                SamplePolicy::Frequency(frequency),
                false,
            )
            .map_err(|source| LoadError::Attach {
                what: format!("cpu-clock on cpu {cpu}"),
                source,
            })?;
        links.push(link);
    }
    Ok(links)
}

/// Loads and attaches the tracepoint program `name` to `category:event`.
pub fn attach_tracepoint(
    ebpf: &mut Ebpf,
    name: &'static str,
    category: &str,
    event: &str,
) -> Result<(), aya::programs::ProgramError> {
    let program: &mut aya::programs::TracePoint = ebpf
        .program_mut(name)
        .ok_or(aya::programs::ProgramError::NotLoaded)?
        .try_into()?;
    program.load()?;
    program.attach(category, event)?;
    Ok(())
}

/// Loads and attaches the raw tracepoint program `name` to `tracepoint`.
pub fn attach_raw_tracepoint(
    ebpf: &mut Ebpf,
    name: &'static str,
    tracepoint: &str,
) -> Result<aya::programs::raw_trace_point::RawTracePointLinkId, aya::programs::ProgramError> {
    let program: &mut aya::programs::RawTracePoint = ebpf
        .program_mut(name)
        .ok_or(aya::programs::ProgramError::NotLoaded)?
        .try_into()?;
    program.load()?;
    program.attach(tracepoint)
}

/// Loads and attaches the fexit program `name` to the kernel function `function` (the
/// kernel's BTF from /sys/kernel/btf/vmlinux).
pub fn attach_fexit(
    ebpf: &mut Ebpf,
    name: &'static str,
    function: &str,
) -> Result<aya::programs::fexit::FExitLinkId, aya::programs::ProgramError> {
    let btf = vmlinux_btf()?;
    let program: &mut aya::programs::FExit = ebpf
        .program_mut(name)
        .ok_or(aya::programs::ProgramError::NotLoaded)?
        .try_into()?;
    program.load(function, &btf)?;
    program.attach()
}

fn vmlinux_btf() -> Result<aya::Btf, aya::programs::ProgramError> {
    aya::Btf::from_sys_fs().map_err(|e| {
        aya::programs::ProgramError::IOError(std::io::Error::other(format!(
            "reading the kernel's BTF: {e}"
        )))
    })
}

/// Loads and attaches the BTF tracepoint program `name` to `function` (the kernel's
/// BTF from /sys/kernel/btf/vmlinux).
pub fn attach_btf_tracepoint(
    ebpf: &mut Ebpf,
    name: &'static str,
    function: &str,
) -> Result<aya::programs::tp_btf::BtfTracePointLinkId, aya::programs::ProgramError> {
    let btf = vmlinux_btf()?;
    let program: &mut aya::programs::BtfTracePoint = ebpf
        .program_mut(name)
        .ok_or(aya::programs::ProgramError::NotLoaded)?
        .try_into()?;
    program.load(function, &btf)?;
    program.attach()
}

/// Kernels before 5.11 charge BPF maps to RLIMIT_MEMLOCK; raise it so they load there too.
fn raise_memlock_limit() {
    let rlim = libc::rlimit {
        rlim_cur: libc::RLIM_INFINITY,
        rlim_max: libc::RLIM_INFINITY,
    };
    // SAFETY: setrlimit with a valid pointer to an initialized struct.
    let ret = unsafe { libc::setrlimit(libc::RLIMIT_MEMLOCK, &rlim) };
    if ret != 0 {
        log::debug!(
            "setrlimit(RLIMIT_MEMLOCK) failed: {}",
            std::io::Error::last_os_error()
        );
    }
}

/// Forwards the eBPF programs' aya-log records to the `log` crate on the current tokio
/// runtime. Without a runtime, or without log statements in the object, it does nothing.
pub fn spawn_logger(ebpf: &mut Ebpf) {
    let Ok(handle) = tokio::runtime::Handle::try_current() else {
        return;
    };
    let logger = match aya_log::EbpfLogger::init(ebpf) {
        Ok(logger) => logger,
        Err(err) => {
            warn!("eBPF logs unavailable: {err}");
            return;
        }
    };
    // SAFETY: the logger owns its ring-buffer map fd; it stays open and unchanged for the
    // logger's lifetime, which the AsyncFd owns.
    let registered = unsafe {
        tokio::io::unix::AsyncFd::register_with_interest(logger, tokio::io::Interest::READABLE)
    };
    let mut logger = match registered {
        Ok(fd) => fd,
        Err(err) => {
            warn!("eBPF logs unavailable: {err}");
            return;
        }
    };
    handle.spawn(async move {
        loop {
            let Ok(mut guard) = logger.readable_mut().await else {
                return;
            };
            guard.get_inner_mut().flush();
            guard.clear_ready();
        }
    });
}

#[cfg(test)]
mod tests {
    #[test]
    fn parses_tracepoint_format_offsets() {
        let format = "name: sched_process_fork\nformat:\n\tfield:unsigned short common_type;\toffset:0;\tsize:2;\tsigned:0;\n\n\tfield:__data_loc char[] parent_comm;\toffset:8;\tsize:4;\tsigned:0;\n\tfield:pid_t child_pid;\toffset:20;\tsize:4;\tsigned:1;\n";
        assert_eq!(
            super::tracepoint_field_offset(format, "child_pid"),
            Some(20)
        );
        assert_eq!(
            super::tracepoint_field_offset(format, "parent_comm"),
            Some(8)
        );
        assert_eq!(super::tracepoint_field_offset(format, "nope"), None);
    }

    /// The names user space looks things up by (`sframe_common::names`) are exactly the
    /// maps, load-time globals and programs of the embedded object: a rename on either
    /// side fails here, not at load time.
    #[test]
    fn the_object_has_exactly_the_maps_globals_and_programs_of_the_contract() {
        use object::{Object, ObjectSection, ObjectSymbol, SymbolKind};
        use sframe_common::names::{globals, maps, programs};
        use std::collections::BTreeSet;

        let file = object::File::parse(super::EBPF_OBJECT).expect("the embedded object parses");
        let (mut found_maps, mut found_globals, mut found_programs) =
            (BTreeSet::new(), BTreeSet::new(), BTreeSet::new());
        for sym in file.symbols() {
            let (Ok(name), Some(index)) = (sym.name(), sym.section_index()) else {
                continue;
            };
            let section = file.section_by_index(index).expect("symbol's section");
            let section = section.name().expect("section name");
            match (section, sym.kind()) {
                // aya-log's ring is aya-log's business (read by `EbpfLogger`).
                ("maps" | ".maps", _) if name == "AYA_LOGS" => false,
                ("maps" | ".maps", _) => found_maps.insert(name),
                // Besides ours: aya-log's level and the compiler's anonymous constants.
                (".rodata", _) if name == "AYA_LOG_LEVEL" || name.starts_with("anon.") => false,
                (".rodata", SymbolKind::Data) => found_globals.insert(name),
                (s, SymbolKind::Text) if s != ".text" && sym.is_global() => {
                    found_programs.insert(name)
                }
                _ => false,
            };
        }
        let want = |names: &[&'static str]| names.iter().copied().collect::<BTreeSet<_>>();
        assert_eq!(found_maps, want(maps::ALL), "maps");
        assert_eq!(found_globals, want(globals::ALL), "load-time globals");
        assert_eq!(found_programs, want(programs::ALL), "programs");
    }
}

/// How one program of the object fared in the kernel's verifier.
#[derive(Debug)]
pub struct ProgramCheck {
    pub name: String,
    /// `perf_event`, `tracepoint`, `raw_tracepoint`, `btf_tracepoint` or `fexit`.
    pub kind: &'static str,
    /// The profiler does without it where the kernel rejects it (a fallback exists).
    pub optional: bool,
    /// Instructions the verifier processed (its limit is 1,000,000), when the kernel
    /// reports it (5.16 and later).
    pub verified_instructions: Result<Option<u32>, String>,
}

/// What the running kernel offers the programs, probed once per process (each probe
/// loads a small program; the object is loaded many times by the benchmark).
struct KernelFeatures {
    task_storage: bool,
    task_regs_helpers: bool,
    bpf_loop: bool,
}

fn kernel_features() -> &'static KernelFeatures {
    use aya::{
        programs::ProgramType,
        sys::{BpfHelper, is_helper_supported},
    };
    static FEATURES: std::sync::OnceLock<KernelFeatures> = std::sync::OnceLock::new();
    // A probe that fails to run at all answers no.
    let helper = |h| is_helper_supported(ProgramType::PerfEvent, h).unwrap_or(false);
    FEATURES.get_or_init(|| KernelFeatures {
        task_storage: aya::sys::is_map_supported(aya::maps::MapType::TaskStorage).unwrap_or(false),
        task_regs_helpers: helper(BpfHelper::BPF_FUNC_get_current_task_btf)
            && helper(BpfHelper::BPF_FUNC_task_pt_regs),
        bpf_loop: helper(BpfHelper::BPF_FUNC_loop),
    })
}

/// Whether the running kernel has task-storage maps (Linux 5.11), which off-CPU
/// profiling keeps each sleeping thread's start in.
pub fn has_task_storage() -> bool {
    kernel_features().task_storage
}

/// Why off-CPU profiling cannot run on this kernel, if it cannot: the kernel features
/// its programs need and the kernel lacks (of those a probe can tell: `sched_switch`'s
/// `prev_state` argument, Linux 5.18, is found when its program loads).
pub fn off_cpu_support() -> Result<(), String> {
    let f = kernel_features();
    let mut missing = Vec::new();
    if !f.task_storage {
        missing.push("task storage maps (BPF_MAP_TYPE_TASK_STORAGE, Linux 5.11)");
    }
    if !f.task_regs_helpers {
        missing.push("bpf_get_current_task_btf (Linux 5.11) and bpf_task_pt_regs (5.15)");
    }
    if missing.is_empty() {
        return Ok(());
    }
    Err(format!(
        "off-CPU profiling needs {}; this kernel ({}) lacks them",
        missing.join(" and "),
        kernel_release().unwrap_or_else(|| "of unknown release".into())
    ))
}

/// Whether the running kernel has `bpf_get_current_task_btf` (Linux 5.11) and
/// `bpf_task_pt_regs` (5.15) for perf-event programs: the user registers of a sample
/// taken in kernel mode. Without them such a sample is counted `no_user_regs`.
pub fn has_task_regs_helpers() -> bool {
    kernel_features().task_regs_helpers
}

/// Whether the running kernel has the `bpf_loop` helper (Linux 5.17) for perf-event
/// programs (a probe program that calls it; without it `profile_bounded` walks).
pub fn has_bpf_loop() -> bool {
    kernel_features().bpf_loop
}

/// Loads every program of the object into the running kernel, without attaching any,
/// and reports what the verifier said of each: the answer to "does it run on this
/// kernel" (`sframe-user check-kernel`, and the VM test matrix).
pub fn check_kernel() -> Result<Vec<ProgramCheck>, LoadError> {
    use aya::programs::Program;
    let mut ebpf = load()?;
    let bpf_loop = has_bpf_loop();
    let off_cpu = off_cpu_support().is_ok();
    let btf = aya::Btf::from_sys_fs();
    let mut out = Vec::new();
    for (name, program) in ebpf.programs_mut() {
        let (kind, loaded) = match program {
            Program::PerfEvent(p) => ("perf_event", p.load()),
            Program::TracePoint(p) => ("tracepoint", p.load()),
            Program::RawTracePoint(p) => ("raw_tracepoint", p.load()),
            // The one BTF tracepoint, off CPU's, is on `sched_switch`.
            Program::BtfTracePoint(p) => (
                "btf_tracepoint",
                match &btf {
                    Ok(btf) => p.load("sched_switch", btf),
                    Err(e) => Err(aya::programs::ProgramError::IOError(std::io::Error::other(
                        format!("reading the kernel's BTF: {e}"),
                    ))),
                },
            ),
            // Off CPU's fexit of `schedule()`: where the kernel cannot trace it, the
            // profiler walks at `sys_exit` instead, so its absence is not a failure.
            Program::FExit(p) => {
                let loaded = match &btf {
                    Ok(btf) => p.load("schedule", btf),
                    Err(e) => Err(aya::programs::ProgramError::IOError(std::io::Error::other(
                        format!("reading the kernel's BTF: {e}"),
                    ))),
                };
                out.push(ProgramCheck {
                    name: name.to_owned(),
                    kind: "fexit",
                    optional: true,
                    verified_instructions: match loaded {
                        Ok(()) => Ok(program
                            .info()
                            .ok()
                            .and_then(|i| i.verified_instruction_count())),
                        Err(err) => Err(verifier_report(&err)),
                    },
                });
                continue;
            }
            other => {
                out.push(ProgramCheck {
                    name: name.to_owned(),
                    kind: "other",
                    optional: false,
                    verified_instructions: Err(format!(
                        "unexpected program type {:?}",
                        other.prog_type()
                    )),
                });
                continue;
            }
        };
        let verified_instructions = match loaded {
            Ok(()) => Ok(program
                .info()
                .ok()
                .and_then(|i| i.verified_instruction_count())),
            Err(err) => Err(verifier_report(&err)),
        };
        out.push(ProgramCheck {
            name: name.to_owned(),
            kind,
            // Where the kernel has no `bpf_loop`, `profile_bounded` walks (and the
            // benchmark's variant of `profile` does not run); where off-CPU profiling
            // is refused, its programs do not run.
            optional: (!bpf_loop
                && (name == programs::PROFILE || name == programs::PROFILE_NO_THREAD_NAMES))
                || (!off_cpu
                    && [
                        programs::OFF_CPU_SWITCH,
                        programs::OFF_CPU_RETURN,
                        programs::OFF_CPU_WAKE,
                    ]
                    .contains(&name)),
            verified_instructions,
        });
    }
    out.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(out)
}

/// An error with its verifier log, verbatim (aya puts the log in the error's source).
fn verifier_report(err: &aya::programs::ProgramError) -> String {
    let mut s = err.to_string();
    let mut source = std::error::Error::source(err);
    while let Some(e) = source {
        s.push('\n');
        s.push_str(&e.to_string());
        source = e.source();
    }
    s
}
