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
use sframe_common::step::{Regs, TOP_REGS};

#[cfg(bpf_target_arch = "x86_64")]
fn is_user_mode(regs: &pt_regs) -> bool {
    // The low two bits of CS are the current privilege level: 3 is user mode.
    regs.cs & 3 == 3
}

/// PC, SP, FP.
#[cfg(bpf_target_arch = "x86_64")]
pub fn walk_regs(regs: &pt_regs) -> Regs {
    Regs {
        pc: regs.rip,
        sp: regs.rsp,
        fp: regs.rbp,
    }
}

/// The DWARF register file of the top frame (x86-64 numbering: rax rdx rcx rbx rsi rdi
/// rbp rsp r8..r15 rip).
#[cfg(bpf_target_arch = "x86_64")]
#[inline(always)]
pub fn dwarf_regs(r: &pt_regs, out: &mut [u64; TOP_REGS]) {
    // Word stores: a plain `[0; TOP_REGS]` becomes a call to `memset`, a byte loop on
    // the BPF target.
    let mut i = 17;
    while i < TOP_REGS {
        // SAFETY: `i` < TOP_REGS; volatile only keeps LLVM from forming a memset.
        unsafe { core::ptr::write_volatile(&mut out[i], 0) };
        i += 1;
    }
    out[0] = r.rax;
    out[1] = r.rdx;
    out[2] = r.rcx;
    out[3] = r.rbx;
    out[4] = r.rsi;
    out[5] = r.rdi;
    out[6] = r.rbp;
    out[7] = r.rsp;
    out[8] = r.r8;
    out[9] = r.r9;
    out[10] = r.r10;
    out[11] = r.r11;
    out[12] = r.r12;
    out[13] = r.r13;
    out[14] = r.r14;
    out[15] = r.r15;
    out[16] = r.rip;
}

#[cfg(bpf_target_arch = "aarch64")]
fn is_user_mode(regs: &pt_regs) -> bool {
    // PSTATE.M[3:0] == 0 is EL0t (user mode).
    regs.pstate & 0xf == 0
}

#[cfg(bpf_target_arch = "aarch64")]
pub fn walk_regs(regs: &pt_regs) -> Regs {
    Regs {
        pc: regs.pc,
        sp: regs.sp,
        fp: regs.regs[29],
    }
}

/// The DWARF register file of the top frame (AArch64: x0..x30, sp).
#[cfg(bpf_target_arch = "aarch64")]
#[inline(always)]
pub fn dwarf_regs(r: &pt_regs, out: &mut [u64; TOP_REGS]) {
    let mut i = 0;
    while i < 31 {
        out[i] = r.regs[i];
        i += 1;
    }
    out[31] = r.sp;
}

/// Where the registers came from.
#[derive(Clone, Copy, PartialEq, Eq)]
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
pub unsafe fn user_regs(ctx_regs: *const pt_regs) -> Option<(pt_regs, RegsSource)> {
    // SAFETY: the context pointer is valid for the program's lifetime; the kernel
    // verifies the read is inside the context.
    let regs = unsafe { &*ctx_regs };
    if is_user_mode(regs) {
        return Some((*regs, RegsSource::Interrupt));
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
    let user = walk_regs(&saved);
    // A kernel thread has no user registers: its saved block is all zero.
    if user.pc == 0 || user.sp == 0 {
        return None;
    }
    Some((saved, RegsSource::Task))
}
