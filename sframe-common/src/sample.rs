//! Raw samples sent from the perf-event program to user space.

/// Flag: the sample interrupted the task in kernel mode, so the user registers were taken
/// from the task's saved user-mode registers (`bpf_task_pt_regs`) instead of the
/// interrupt frame.
pub const SAMPLE_FLAG_FROM_KERNEL: u32 = 1 << 0;
/// Flag: reading the word at the user stack pointer succeeded.
pub const SAMPLE_FLAG_STACK_WORD_OK: u32 = 1 << 1;
/// Flag: no user registers could be obtained (kernel thread, or the helper failed).
pub const SAMPLE_FLAG_NO_USER_REGS: u32 = 1 << 2;

/// One sample as the raw-sample program records it.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RawSample {
    /// Thread-group id (the process id user space knows).
    pub pid: u32,
    /// Thread id.
    pub tid: u32,
    /// CPU the sample was taken on.
    pub cpu: u32,
    /// `SAMPLE_FLAG_*` bits.
    pub flags: u32,
    /// User instruction pointer.
    pub ip: u64,
    /// User stack pointer.
    pub sp: u64,
    /// User frame pointer (rbp / x29).
    pub fp: u64,
    /// The 8 bytes at the user stack pointer, when `SAMPLE_FLAG_STACK_WORD_OK` is set.
    pub stack_word: u64,
}

#[cfg(feature = "user")]
// SAFETY: repr(C), only integer fields, no padding (asserted below).
unsafe impl aya::Pod for RawSample {}

const _: () = assert!(core::mem::size_of::<RawSample>() == 48);

/// Stack bytes a deferred sample carries: whole pages from the page of the stack pointer
/// up (pages are mapped or not as a whole, so a read never half-fails).
pub const DEFERRED_PAGES: usize = 4;
/// Bytes per page of a deferred sample's stack copy.
pub const DEFERRED_PAGE: usize = 4096;
/// Capacity of [`DeferredSample::stack`] in bytes.
pub const DEFERRED_STACK_BYTES: usize = DEFERRED_PAGES * DEFERRED_PAGE;

/// A sample the kernel side could not unwind for lack of tables (a process not loaded
/// yet, or a PC in a mapping loaded since): its registers and the top of its stack, for
/// user space to unwind with the same `walk_step` once the tables are there.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct DeferredSample {
    /// Process id (thread-group id).
    pub pid: u32,
    /// Thread id.
    pub tid: u32,
    /// Kernel stack id (`bpf_get_stackid`), or -1.
    pub kernel_stack: i32,
    /// Bytes of `stack` read, a multiple of `DEFERRED_PAGE`.
    pub stack_len: u32,
    /// Address of `stack[0]`: the page of the stack pointer.
    pub stack_base: u64,
    /// An off-CPU sleep (`sframe_common::offcpu`): its nanoseconds, 0 for an on-CPU
    /// sample.
    pub off_cpu_ns: u64,
    /// The off-CPU sleep's state flags (`OFF_CPU_UNINTERRUPTIBLE`).
    pub off_cpu_state: u32,
    /// Explicit padding; zero.
    pub _pad: u32,
    /// The off-CPU sleep's kernel stack, a key in `STACKS` (0: none).
    pub off_cpu_kernel_stack: u64,
    /// The registers the walk starts from (PC, SP and FP of the interrupted frame).
    pub regs: crate::step::Regs,
    /// DWARF registers of the interrupted frame (as
    /// [`WalkState::top`](crate::step::WalkState::top)).
    pub top: [u64; crate::step::TOP_REGS],
    /// Words of the interpreter frames the kernel side read at the sample (see
    /// [`crate::python`]), innermost first: `py_len` words from `py[py_skip]`. User
    /// space appends them to the native frames it walks.
    pub py: [u64; crate::python::MAX_PY_FRAMES as usize],
    /// Valid words of `py`.
    pub py_len: u32,
    /// Where in `py` they start (the kernel copies a fixed-size window of its stack).
    pub py_skip: u32,
    /// The stack bytes from `stack_base`; the first `stack_len` are valid.
    pub stack: [u8; DEFERRED_STACK_BYTES],
}

#[cfg(feature = "user")]
// SAFETY: repr(C), integers and byte arrays only, no implicit padding (asserted below).
unsafe impl aya::Pod for DeferredSample {}

const _: () = assert!(
    core::mem::size_of::<DeferredSample>()
        == 24
            + 24
            + 24
            + 8 * crate::step::TOP_REGS
            + 8 * crate::python::MAX_PY_FRAMES as usize
            + 8
            + DEFERRED_STACK_BYTES
);
