//! Walk outcomes and event counters: defined once, counted per CPU by the kernel side,
//! summed by user space.

/// How a stack walk ended. Every sample of a target ends with exactly one.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum WalkOutcome {
    /// Reached the outermost frame (RA undefined, e.g. `_start`, `clone3`): a full stack.
    Complete = 0,
    /// Stopped after `MAX_FRAMES` frames.
    Truncated = 1,
    /// A PC outside every executable mapping known for the process.
    NoMapping = 2,
    /// A PC in a mapped object with no rule for it, and no usable frame pointer.
    NoRule = 3,
    /// Reading the saved RA, FP or a dereferenced CFA from the user stack failed.
    ReadFault = 4,
    /// The CFA was not above the stack pointer (no progress, or a corrupt stack).
    NoProgress = 5,
    /// A caller frame's rule needs registers only known in the top frame.
    TopFrameOnlyRule = 6,
    /// The frame-pointer chain ended (FP = 0) in code without tables.
    FramePointerEnd = 7,
    /// No user registers (kernel thread, or they could not be read).
    NoUserRegs = 8,
    /// The process has no mapping table yet (user space has not loaded it).
    UnknownProcess = 9,
    /// The per-CPU scratch space was unavailable (should never happen).
    NoScratch = 10,
    /// A return address of 0: many runtimes end stacks this way.
    ZeroReturnAddress = 11,
    /// The native walk reached the program's entry, but the sampled thread's interpreter
    /// frames could not all be read (a frame's memory unreadable, or a chain longer than
    /// `MAX_PY_FRAMES`): the stack ends its Python frames with
    /// [`PY_UNREAD`](crate::python::PY_UNREAD).
    PythonUnread = 12,
}

impl WalkOutcome {
    /// Number of outcomes (the length of [`WalkOutcome::ALL`]).
    pub const COUNT: usize = 13;
    /// Every outcome, in the order of their codes (`ALL[i] as usize == i`).
    pub const ALL: [WalkOutcome; Self::COUNT] = [
        Self::Complete,
        Self::Truncated,
        Self::NoMapping,
        Self::NoRule,
        Self::ReadFault,
        Self::NoProgress,
        Self::TopFrameOnlyRule,
        Self::FramePointerEnd,
        Self::NoUserRegs,
        Self::UnknownProcess,
        Self::NoScratch,
        Self::ZeroReturnAddress,
        Self::PythonUnread,
    ];

    /// The outcome's name in snake case (e.g. `no_mapping`), for reports and metrics.
    pub const fn name(self) -> &'static str {
        match self {
            Self::Complete => "complete",
            Self::Truncated => "truncated",
            Self::NoMapping => "no_mapping",
            Self::NoRule => "no_rule",
            Self::ReadFault => "read_fault",
            Self::NoProgress => "no_progress",
            Self::TopFrameOnlyRule => "top_frame_only_rule",
            Self::FramePointerEnd => "frame_pointer_end",
            Self::NoUserRegs => "no_user_regs",
            Self::UnknownProcess => "unknown_process",
            Self::NoScratch => "no_scratch",
            Self::ZeroReturnAddress => "zero_return_address",
            Self::PythonUnread => "python_unread",
        }
    }

    /// Stacks that reach the program's entry.
    pub const fn is_complete(self) -> bool {
        Self::is_complete_code(self as u32)
    }

    /// [`WalkOutcome::is_complete`] of an outcome's code (the kernel side's `u32`).
    pub const fn is_complete_code(code: u32) -> bool {
        code == Self::Complete as u32
            || code == Self::FramePointerEnd as u32
            || code == Self::ZeroReturnAddress as u32
    }

    /// The outcome of a stack whose native walk ended with `native`, when its
    /// interpreter frames could not all be read (`python_unread`): a complete native
    /// walk becomes [`WalkOutcome::PythonUnread`] (the program's own frames are
    /// missing); another keeps its own reason.
    pub const fn with_python(native: u32, python_unread: bool) -> u32 {
        if python_unread && Self::is_complete_code(native) {
            Self::PythonUnread as u32
        } else {
            native
        }
    }
}

impl TryFrom<u32> for WalkOutcome {
    type Error = u32;
    fn try_from(v: u32) -> Result<Self, u32> {
        Self::ALL.get(v as usize).copied().ok_or(v)
    }
}

/// Events counted per CPU besides the outcome.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Counter {
    /// Samples of target processes.
    Samples = 0,
    /// Samples that hit kernel mode (user registers from the task).
    SamplesInKernel = 1,
    /// Frames unwound with a table row.
    FramesFromTable = 2,
    /// Frames unwound by the frame-pointer fallback.
    FramesFromFramePointer = 3,
    /// The stack map was full: the sample was counted without its user stack.
    StackMapFull = 4,
    /// The count map was full: the sample was lost.
    CountMapFull = 5,
    /// `bpf_get_stackid` failed for the kernel stack.
    KernelStackFailed = 6,
    /// Samples of non-target tasks (and of kernel threads in whole-system or cgroup
    /// mode) that the program ignored.
    Ignored = 7,
    /// Lifecycle events lost because the `EVENTS` ring buffer was full.
    EventsLost = 8,
    /// Samples without tables handed to user space with their stack (`DEFERRED`), to be
    /// unwound there once the tables are loaded; their outcome is counted there.
    Deferred = 9,
    /// Samples that should have been deferred but found the ring buffer full (counted
    /// with the kernel's outcome instead).
    DeferredLost = 10,
    /// Off-CPU: target threads that went to sleep (their start time recorded).
    OffCpuBlocks = 11,
    /// Off-CPU: sleeps shorter than the threshold (no stack walk).
    OffCpuShort = 12,
    /// Off-CPU: sleeps at least as long as the threshold, walked when the thread left
    /// `schedule()` (or, with the `sys_exit` fallback, returned from its system call).
    OffCpuWalks = 13,
    /// Off-CPU: sleeps over the threshold lost because the thread ran user code before
    /// a system call returned (a sleep in a page fault) or was not seen waking.
    OffCpuLost = 14,
    /// Off-CPU: the count map was full (the sleep was lost).
    OffCpuMapFull = 15,
    /// Off-CPU: sleeps not timed because the governor samples sleeps (1 in
    /// `OFF_CPU_CONTROL[OFF_CPU_CONTROL_EVERY]`; those timed count for the others).
    OffCpuUnsampled = 16,
    /// Off-CPU: the sleeping task's kernel stack could not be taken (the sleep is
    /// counted without it). Apart from `KernelStackFailed`, which tells user space
    /// the stack-trace map is full.
    OffCpuKernelStackFailed = 17,
    /// Off-CPU: sleeps that began before the governor paused the off-CPU programs and
    /// ended after (not charged: their end, or a wake and another sleep, may have been
    /// missed).
    OffCpuPaused = 18,
    /// Interpreter frames recorded (CPython, `sframe_common::python`).
    PythonFrames = 19,
    /// Samples of a Python process whose thread has no thread state the walk found
    /// (a thread that never ran Python, or one the walk looked for past its bound).
    PythonNoThread = 20,
    /// Searches of an interpreter's thread list for the sampled thread's state: a thread
    /// not remembered (`PY_THREADS`), or remembered without one
    /// ([`PY_NO_THREAD_STATE`](crate::python::PY_NO_THREAD_STATE)) while the list had
    /// another head.
    PythonThreadSearches = 21,
}

impl Counter {
    /// Number of counters (the length of [`Counter::ALL`]).
    pub const COUNT: usize = 22;
    /// Every counter, in the order of their codes (`ALL[i] as usize == i`).
    pub const ALL: [Counter; Self::COUNT] = [
        Self::Samples,
        Self::SamplesInKernel,
        Self::FramesFromTable,
        Self::FramesFromFramePointer,
        Self::StackMapFull,
        Self::CountMapFull,
        Self::KernelStackFailed,
        Self::Ignored,
        Self::EventsLost,
        Self::Deferred,
        Self::DeferredLost,
        Self::OffCpuBlocks,
        Self::OffCpuShort,
        Self::OffCpuWalks,
        Self::OffCpuLost,
        Self::OffCpuMapFull,
        Self::OffCpuUnsampled,
        Self::OffCpuKernelStackFailed,
        Self::OffCpuPaused,
        Self::PythonFrames,
        Self::PythonNoThread,
        Self::PythonThreadSearches,
    ];

    /// The counter's name in snake case (e.g. `stack_map_full`), for reports and metrics.
    pub const fn name(self) -> &'static str {
        match self {
            Self::Samples => "samples",
            Self::SamplesInKernel => "samples_in_kernel",
            Self::FramesFromTable => "frames_from_table",
            Self::FramesFromFramePointer => "frames_from_frame_pointer",
            Self::StackMapFull => "stack_map_full",
            Self::CountMapFull => "count_map_full",
            Self::KernelStackFailed => "kernel_stack_failed",
            Self::Ignored => "ignored",
            Self::EventsLost => "events_lost",
            Self::Deferred => "deferred",
            Self::DeferredLost => "deferred_lost",
            Self::OffCpuBlocks => "off_cpu_blocks",
            Self::OffCpuShort => "off_cpu_short",
            Self::OffCpuWalks => "off_cpu_walks",
            Self::OffCpuLost => "off_cpu_lost",
            Self::OffCpuMapFull => "off_cpu_map_full",
            Self::OffCpuUnsampled => "off_cpu_unsampled",
            Self::OffCpuKernelStackFailed => "off_cpu_kernel_stack_failed",
            Self::OffCpuPaused => "off_cpu_paused",
            Self::PythonFrames => "python_frames",
            Self::PythonNoThread => "python_no_thread",
            Self::PythonThreadSearches => "python_thread_searches",
        }
    }
}

impl TryFrom<u32> for Counter {
    type Error = u32;
    fn try_from(v: u32) -> Result<Self, u32> {
        Self::ALL.get(v as usize).copied().ok_or(v)
    }
}

const _: () = {
    let mut i = 0;
    while i < WalkOutcome::COUNT {
        assert!(WalkOutcome::ALL[i] as usize == i);
        i += 1;
    }
    let mut i = 0;
    while i < Counter::COUNT {
        assert!(Counter::ALL[i] as usize == i);
        i += 1;
    }
};
