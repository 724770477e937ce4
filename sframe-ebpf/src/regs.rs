//! The interrupted task's user-mode registers.
//!
//! A cpu-clock sample may hit while the task runs in the kernel (a syscall, a page fault).
//! Then the perf-event context holds kernel registers, and the user registers are the
//! ones the kernel saved on entry, found with `bpf_task_pt_regs(current)`.

use aya_ebpf::{
    bindings::pt_regs,
    helpers::{
        bpf_probe_read_kernel,
        generated::{bpf_get_current_task_btf, bpf_task_pt_regs},
    },
};

/// The registers an unwinder needs.
#[derive(Clone, Copy)]
pub struct UserRegs {
    pub ip: u64,
    pub sp: u64,
    pub fp: u64,
}

#[cfg(bpf_target_arch = "x86_64")]
fn is_user_mode(regs: &pt_regs) -> bool {
    // The low two bits of CS are the current privilege level: 3 is user mode.
    regs.cs & 3 == 3
}

#[cfg(bpf_target_arch = "x86_64")]
fn from_pt_regs(regs: &pt_regs) -> UserRegs {
    UserRegs {
        ip: regs.rip,
        sp: regs.rsp,
        fp: regs.rbp,
    }
}

#[cfg(bpf_target_arch = "aarch64")]
fn is_user_mode(regs: &pt_regs) -> bool {
    // PSTATE.M[3:0] == 0 is EL0t (user mode).
    regs.pstate & 0xf == 0
}

#[cfg(bpf_target_arch = "aarch64")]
fn from_pt_regs(regs: &pt_regs) -> UserRegs {
    UserRegs {
        ip: regs.pc,
        sp: regs.sp,
        fp: regs.regs[29],
    }
}

/// Where the registers came from.
pub enum RegsSource {
    /// The sample interrupted user mode.
    Interrupt,
    /// The sample interrupted kernel mode; these are the task's saved user registers.
    Task,
}

/// The user registers of the current task at the sample, or `None` for kernel threads
/// and when the saved registers cannot be read.
///
/// # Safety
/// `ctx_regs` must point to the perf-event context's register block.
#[inline(always)]
pub unsafe fn user_regs(ctx_regs: *const pt_regs) -> Option<(UserRegs, RegsSource)> {
    // SAFETY: the context pointer is valid for the program's lifetime; the kernel
    // verifies the read is inside the context.
    let regs = unsafe { &*ctx_regs };
    if is_user_mode(regs) {
        return Some((from_pt_regs(regs), RegsSource::Interrupt));
    }
    // SAFETY: plain helper calls; the verifier checks their arguments.
    let task = unsafe { bpf_get_current_task_btf() };
    if task.is_null() {
        return None;
    }
    let saved = unsafe { bpf_task_pt_regs(task) } as *const pt_regs;
    if saved.is_null() {
        return None;
    }
    // SAFETY: `saved` is a kernel address; bpf_probe_read_kernel checks it.
    let saved = unsafe { bpf_probe_read_kernel(saved) }.ok()?;
    let user = from_pt_regs(&saved);
    // A kernel thread has no user registers: its saved block is all zero.
    if user.ip == 0 || user.sp == 0 {
        return None;
    }
    Some((user, RegsSource::Task))
}
