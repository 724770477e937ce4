//! Off-CPU profiling: where threads of the targets sleep, and for how long.
//!
//! The kernel side follows each target thread that goes to sleep (`sched_switch` with a
//! sleeping state): its start time and the user PC and SP it will return to are kept by
//! task ([`OffCpuStart`]). When the thread is switched in again, the time it slept is
//! known; a sleep shorter than the threshold costs nothing more. A longer one is handed
//! to the CPU it runs on ([`OffCpuDue`]), and when the thread leaves `schedule()` (fexit;
//! where the kernel cannot attach that, when it returns from its system call, `sys_exit`
//! — in its own context either way, so its user memory can be read), its user stack
//! is walked with the same tables and frame step as the on-CPU samples, and the sleep's
//! nanoseconds are added to the stack's count.

/// Flag in an off-CPU count key's `outcome` (beside the `WalkOutcome` in its low byte):
/// the thread slept uninterruptibly (state D: most often disk I/O); without it, the
/// sleep was interruptible (state S: locks, sleeps, waits for input).
pub const OFF_CPU_UNINTERRUPTIBLE: u32 = 1 << 8;

/// The `WalkOutcome` code of an off-CPU key's `outcome`.
#[inline(always)]
pub const fn outcome_code(outcome: u32) -> u32 {
    outcome & 0xff
}

/// `TASK_INTERRUPTIBLE` of the task's state (Linux, every architecture).
pub const TASK_INTERRUPTIBLE: u32 = 0x1;
/// `TASK_UNINTERRUPTIBLE`.
pub const TASK_UNINTERRUPTIBLE: u32 = 0x2;

/// A sleeping thread, by task.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct OffCpuStart {
    /// When it went to sleep (ns, `bpf_ktime_get_ns`).
    pub start_ns: u64,
    /// Nanoseconds slept before, not charged yet (it was woken and went back to sleep
    /// before it returned from its system call).
    pub carried_ns: u64,
    /// The user PC and SP it will return to.
    pub pc: u64,
    /// The user stack pointer it will return to (see `pc`).
    pub sp: u64,
    /// Process id (thread-group id).
    pub pid: u32,
    /// Thread id.
    pub tid: u32,
    /// `OFF_CPU_UNINTERRUPTIBLE` or 0.
    pub state: u32,
    /// Sleeps this one stands for (1 in `weight` was timed: the governor's sampling,
    /// times its pause factor).
    pub weight: u32,
    /// The observation window it started in ([`OFF_CPU_CONTROL_WINDOW`]): a sleep is
    /// charged only if it ends in the same one.
    pub window: u32,
    /// Explicit padding; zero.
    pub _pad: u32,
}

/// The most sleeps one timed sleep stands for by sampling (the governor stops there).
pub const MAX_OFF_CPU_EVERY: u32 = 1024;
/// The governor's last resort, when even 1 in `MAX_OFF_CPU_EVERY` costs more than its
/// budget (what watching every context switch costs, whatever is sampled): the off-CPU
/// programs are attached for one observation window in `pause` and detached for the
/// rest; a sleep seen starting and ending in one window counts for `pause`. At most this.
pub const MAX_OFF_CPU_PAUSE: u32 = 8;
/// The most one timed sleep stands for (its time is capped at 2^50 ns, so the weighted
/// time fits 64 bits).
pub const MAX_OFF_CPU_WEIGHT: u32 = MAX_OFF_CPU_EVERY * MAX_OFF_CPU_PAUSE;
const _: () = assert!(MAX_OFF_CPU_WEIGHT <= 1 << 13);

/// Slots of the `OFF_CPU_CONTROL` array, written by user space's governor.
/// 1 in how many sleeps is timed (0 or 1: all).
pub const OFF_CPU_CONTROL_EVERY: u32 = 0;
/// The observation window: raised each time the programs are attached again after a
/// pause, so that a sleep that began before the pause is not charged (its end, or a
/// wake and another sleep, may have been missed).
pub const OFF_CPU_CONTROL_WINDOW: u32 = 1;
/// The pause factor (see [`MAX_OFF_CPU_PAUSE`]; 0 or 1: no pause).
pub const OFF_CPU_CONTROL_PAUSE: u32 = 2;
/// Slots of `OFF_CPU_CONTROL`.
pub const OFF_CPU_CONTROL_LEN: u32 = 3;

/// A sleep over the threshold, to be walked and charged when its thread returns to user
/// space on this CPU.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct OffCpuDue {
    /// The task (its `task_struct` address); 0 = none.
    pub task: u64,
    /// Nanoseconds slept, weighted by `weight`, plus those carried from earlier sleeps
    /// ([`OffCpuStart::carried_ns`]).
    pub ns: u64,
    /// The user PC the thread will return to (as [`OffCpuStart::pc`]).
    pub pc: u64,
    /// The user stack pointer the thread will return to (as [`OffCpuStart::sp`]).
    pub sp: u64,
    /// Process id (thread-group id).
    pub pid: u32,
    /// Thread id.
    pub tid: u32,
    /// [`OFF_CPU_UNINTERRUPTIBLE`] or 0 (as [`OffCpuStart::state`]).
    pub state: u32,
    /// As [`OffCpuStart::weight`] (`ns` is weighted already).
    pub weight: u32,
    /// Key in `STACKS` of the kernel stack it slept in (0: none).
    pub kernel_stack: u64,
}

/// Key of the off-CPU counts: as `CountKey`, with the kernel stack as a key in `STACKS`
/// (the sleeping task's stack, taken with `bpf_get_task_stack` when it is switched in;
/// the kernel's stack-trace map only takes the current task's).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct OffCpuKey {
    /// Process id (thread-group id).
    pub pid: u32,
    /// Thread id.
    pub tid: u32,
    /// Key of the user stack in `STACKS`; 0 = none.
    pub user_stack: u64,
    /// Key of the kernel stack in `STACKS`; 0 = none.
    pub kernel_stack: u64,
    /// A `WalkOutcome`, with `OFF_CPU_UNINTERRUPTIBLE`.
    pub outcome: u32,
    /// Explicit padding; zero.
    pub _pad: u32,
    /// The thread's name (`comm`, NUL-padded).
    pub comm: [u8; 16],
}

const _: () = assert!(core::mem::size_of::<OffCpuKey>() == 48);

/// Kernel frames kept of an off-CPU sleep (`bpf_get_task_stack`; the kernel's default
/// `perf_event_max_stack` is 127).
pub const OFF_CPU_KERNEL_FRAMES: usize = 64;

#[cfg(feature = "user")]
mod pod {
    use super::*;
    // SAFETY: repr(C), integers only, explicit padding.
    unsafe impl aya::Pod for OffCpuStart {}
    unsafe impl aya::Pod for OffCpuDue {}
    unsafe impl aya::Pod for OffCpuKey {}
}
