//! The names by which user space finds the kernel side's maps, load-time globals and
//! programs in the eBPF object. `sframe-ebpf` names its statics and functions the same
//! (aya takes a map's or global's name from its identifier); user space uses only these
//! constants, and a test of `sframe-user` reads the built object and checks that its maps,
//! globals and programs are exactly the ones listed here.

macro_rules! names {
    ($(#[$list_doc:meta])* $list:ident { $($(#[$doc:meta])* $name:ident = $value:literal,)* }) => {
        $($(#[$doc])* pub const $name: &str = $value;)*
        $(#[$list_doc])*
        pub const $list: &[&str] = &[$($name),*];
    };
}

/// BPF maps.
pub mod maps {
    names! {
        /// Every map of the object.
        ALL {
            /// Per-process mapping tables (tgid → `ProcessEntry`).
            PROCESSES = "PROCESSES",
            /// Object entries by object id.
            OBJECTS = "OBJECTS",
            /// Page entries of every object (mmapable).
            PAGES = "PAGES",
            /// Rows of every object (mmapable).
            ROWS = "ROWS",
            /// The shared rule dictionary.
            RULES = "RULES",
            /// Per-CPU walk state.
            SCRATCH = "SCRATCH",
            /// Per-CPU copy of the stack window a walk reads from.
            WINDOW = "WINDOW",
            /// Per-CPU words array indexes pass through (entry 0: `profile`, 1: the
            /// off-CPU walker), so that the verifier does not trace them back.
            INDEX_SLOTS = "INDEX_SLOTS",
            /// Distinct user stacks by key.
            STACKS = "STACKS",
            /// Sample counts by (process, thread, stacks, outcome).
            COUNTS = "COUNTS",
            /// Kernel stacks (`bpf_get_stackid`).
            KERNEL_STACKS = "KERNEL_STACKS",
            /// Per-CPU walk outcome counts.
            OUTCOMES = "OUTCOMES",
            /// Per-CPU event counters.
            COUNTERS = "COUNTERS",
            /// Samples whose walk needs a table user space has not loaded yet.
            DEFERRED = "DEFERRED",
            /// Profiled processes (tgid → 1).
            TARGET_TGIDS = "TARGET_TGIDS",
            /// Profiled cgroups.
            TARGET_CGROUPS = "TARGET_CGROUPS",
            /// Process lifecycle events (fork, exec, exit, executable mmap).
            EVENTS = "EVENTS",
            /// Threads inside an executable `mmap` (tid → 1).
            MMAP_PENDING = "MMAP_PENDING",
            /// When each process's last "unknown process" event was sent (rate limit).
            MISS_SENT = "MISS_SENT",
            /// Per-CPU copy of the interrupted user registers.
            USER_REGS = "USER_REGS",
            /// Off-CPU: sleeping target threads by task.
            OFF_CPU_TASKS = "OFF_CPU_TASKS",
            /// Off-CPU: the sleep to walk when its thread returns, per CPU.
            OFF_CPU_DUE = "OFF_CPU_DUE",
            /// Off-CPU: nanoseconds slept by (process, thread, stack, state).
            OFF_CPU_COUNTS = "OFF_CPU_COUNTS",
            /// Off-CPU: per-CPU walk state of the off-CPU walker.
            OFF_CPU_SCRATCH = "OFF_CPU_SCRATCH",
            /// Off-CPU: per-CPU stack window of the off-CPU walker.
            OFF_CPU_WINDOW = "OFF_CPU_WINDOW",
            /// Off-CPU: per-CPU copy of the returning thread's user registers.
            OFF_CPU_REGS = "OFF_CPU_REGS",
            /// Off-CPU: 1 in how many sleeps is timed (the governor's sampling).
            OFF_CPU_CONTROL = "OFF_CPU_CONTROL",
            /// Off-CPU: per-CPU buffer of the kernel stack of a sleep.
            OFF_CPU_KSTACK = "OFF_CPU_KSTACK",
            /// Python processes (tgid → `PyProcess`: the runtime's address and offsets).
            PY_PROCESSES = "PY_PROCESSES",
            /// Python thread states by (tgid, tid), as the walk last found them.
            PY_THREADS = "PY_THREADS",
            /// Per-CPU state of the Python walk between its loops' iterations.
            PY_WALK = "PY_WALK",
            /// Raw samples (registers and stack bytes) for host-side walks.
            RAW_SAMPLES = "RAW_SAMPLES",
            /// The frame-pointer baseline's per-CPU stack buffer (benchmarks).
            FP_BASELINE_BUF = "FP_BASELINE_BUF",
            /// The frame-pointer baseline's sample count (benchmarks).
            FP_BASELINE_SAMPLES = "FP_BASELINE_SAMPLES",
            /// The frame-pointer baseline's frame count (benchmarks).
            FP_BASELINE_FRAMES = "FP_BASELINE_FRAMES",
            /// The frame-pointer recorder's per-CPU record (benchmarks).
            FP_RECORD_BUF = "FP_RECORD_BUF",
            /// The frame-pointer recorder's stacks (benchmarks).
            FP_BASELINE_RING = "FP_BASELINE_RING",
        }
    }
}

/// Load-time globals (`.rodata`, set with `EbpfLoader::override_global`).
pub mod globals {
    names! {
        /// Every load-time global of the object.
        ALL {
            /// `FILTER_*` bits: which processes are sampled.
            FILTER_FLAGS = "FILTER_FLAGS",
            /// The profiler's own tgid (never sampled).
            SELF_TGID = "SELF_TGID",
            /// Entries of `TARGET_CGROUPS` in use.
            CGROUP_FILTER_COUNT = "CGROUP_FILTER_COUNT",
            /// Offset of `pid` in the `task_newtask` tracepoint record.
            NEWTASK_PID_OFFSET = "NEWTASK_PID_OFFSET",
            /// Offset of `clone_flags` in the `task_newtask` record.
            NEWTASK_FLAGS_OFFSET = "NEWTASK_FLAGS_OFFSET",
            /// Offset of `group_dead` in the `sched_process_exit` record (0: absent).
            EXIT_GROUP_DEAD_OFFSET = "EXIT_GROUP_DEAD_OFFSET",
            /// Offset of `prot` in the `sys_enter_mmap` record.
            MMAP_PROT_OFFSET = "MMAP_PROT_OFFSET",
            /// Offset of `fd` in the `sys_enter_mmap` record.
            MMAP_FD_OFFSET = "MMAP_FD_OFFSET",
            /// Offset of `ret` in the `sys_exit_mmap` record.
            MMAP_RET_OFFSET = "MMAP_RET_OFFSET",
            /// Off-CPU: sleeps shorter than this (ns) are not walked.
            OFF_CPU_MIN_NS = "OFF_CPU_MIN_NS",
            /// 1 where the kernel has `bpf_get_current_task_btf` and `bpf_task_pt_regs`
            /// (the user registers of samples taken in kernel mode).
            TASK_REGS_HELPERS = "TASK_REGS_HELPERS",
        }
    }
}

/// Programs.
pub mod programs {
    names! {
        /// Every program of the object.
        ALL {
            /// The perf-event walker.
            PROFILE = "profile",
            /// The perf-event walker for kernels without `bpf_loop` (before 5.17).
            PROFILE_BOUNDED = "profile_bounded",
            /// The perf-event walker without thread names.
            PROFILE_NO_THREAD_NAMES = "profile_no_thread_names",
            /// Raw samples for host-side walks.
            SAMPLE_RAW = "sample_raw",
            /// The frame-pointer baseline (benchmarks).
            FP_BASELINE = "fp_baseline",
            /// The frame-pointer recorder (benchmarks).
            FP_BASELINE_RECORD = "fp_baseline_record",
            /// `task:task_newtask`.
            ON_FORK = "on_fork",
            /// `sched:sched_process_exec`.
            ON_EXEC = "on_exec",
            /// `sched:sched_process_exit`.
            ON_EXIT = "on_exit",
            /// `syscalls:sys_enter_mmap`.
            ON_MMAP_ENTER = "on_mmap_enter",
            /// `syscalls:sys_exit_mmap`.
            ON_MMAP_EXIT = "on_mmap_exit",
            /// Off-CPU: BTF tracepoint `sched_switch`.
            OFF_CPU_SWITCH = "off_cpu_switch",
            /// Off-CPU: raw tracepoint `sys_exit`.
            OFF_CPU_RETURN = "off_cpu_return",
            /// Off-CPU: fexit of `schedule`, in place of `OFF_CPU_RETURN` where the
            /// kernel can attach it.
            OFF_CPU_WAKE = "off_cpu_wake",
        }
    }
}
