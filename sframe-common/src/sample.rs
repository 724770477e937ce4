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
