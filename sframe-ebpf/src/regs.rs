//! The interrupted task's user-mode registers.
//!
//! A cpu-clock sample may hit while the task runs in the kernel (a syscall, a page fault).
//! Then the perf-event context holds kernel registers, and the user registers are the
//! ones the kernel saved on entry, found with `bpf_task_pt_regs(current)`.

use aya_ebpf::{
    bindings::{pt_regs, task_struct},
    helpers::generated::{
        bpf_get_current_task_btf, bpf_probe_read_kernel as bpf_probe_read_kernel_raw,
        bpf_task_pt_regs,
    },
    macros::map,
    maps::PerCpuArray,
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
    use sframe_common::dwarf::AMD64;
    let mut i = usize::from(AMD64.count);
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
    out[usize::from(AMD64.fp)] = r.rbp;
    out[usize::from(AMD64.sp)] = r.rsp;
    out[8] = r.r8;
    out[9] = r.r9;
    out[10] = r.r10;
    out[11] = r.r11;
    out[12] = r.r12;
    out[13] = r.r13;
    out[14] = r.r14;
    out[15] = r.r15;
    out[usize::from(AMD64.ra)] = r.rip;
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
        fp: regs.regs[usize::from(sframe_common::dwarf::AARCH64.fp)],
    }
}

/// The DWARF register file of the top frame (AArch64: x0..x30, sp).
#[cfg(bpf_target_arch = "aarch64")]
#[inline(always)]
pub fn dwarf_regs(r: &pt_regs, out: &mut [u64; TOP_REGS]) {
    use sframe_common::dwarf::AARCH64;
    let mut i = 0;
    while i < usize::from(AARCH64.sp) {
        out[i] = r.regs[i];
        i += 1;
    }
    out[usize::from(AARCH64.sp)] = r.sp;
}

/// Where the registers came from.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum RegsSource {
    /// The sample interrupted user mode.
    Interrupt,
    /// The sample interrupted kernel mode; these are the task's saved user registers.
    Task,
}

/// Copies the context's register block field by field. A struct assignment becomes a
/// `memcpy` byte loop through a moved context pointer, which the verifier refuses
/// ("dereference of modified ctx ptr"): each load here has a constant offset.
macro_rules! copy_fields {
    ($dst:expr, $src:expr, [$($f:ident),*], [$($i:literal),*]) => {
        $(
            // SAFETY: a field of the context, at a constant offset.
            $dst.$f = unsafe { core::ptr::read_volatile(&$src.$f) };
        )*
        $(
            $dst.regs[$i] = unsafe { core::ptr::read_volatile(&$src.regs[$i]) };
        )*
    };
}

#[cfg(bpf_target_arch = "x86_64")]
#[inline(always)]
fn copy_from_ctx(dst: &mut pt_regs, src: &pt_regs) {
    copy_fields!(
        dst,
        src,
        [
            r15, r14, r13, r12, rbp, rbx, r11, r10, r9, r8, rax, rcx, rdx, rsi, rdi, orig_rax, rip,
            cs, eflags, rsp, ss
        ],
        []
    );
}

#[cfg(bpf_target_arch = "aarch64")]
#[inline(always)]
fn copy_from_ctx(dst: &mut pt_regs, src: &pt_regs) {
    copy_fields!(
        dst,
        src,
        [sp, pc, pstate],
        [
            0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23,
            24, 25, 26, 27, 28, 29, 30
        ]
    );
}

/// Whether the kernel has `bpf_get_current_task_btf` (Linux 5.11) and `bpf_task_pt_regs`
/// (5.15), set at load time. Without them a sample taken in kernel mode has no user
/// registers here: the branch that calls them is then dead code, which the verifier of
/// a kernel without them never visits (a read-only global is a known constant to it).
#[unsafe(no_mangle)]
static TASK_REGS_HELPERS: u32 = 1;

#[inline(always)]
fn task_regs_helpers() -> bool {
    // SAFETY: a read of a global set at load time.
    unsafe { core::ptr::read_volatile(&TASK_REGS_HELPERS) != 0 }
}

/// The copy of the sampled task's user registers: a per-CPU map value, not the BPF
/// stack (AArch64's register block alone is 272 of its 512 bytes).
#[map]
static USER_REGS: PerCpuArray<pt_regs> = PerCpuArray::with_max_entries(1, 0);

/// The user registers of the current task at the sample, or `None` for kernel threads
/// and when the saved registers cannot be read. The reference is to this CPU's copy,
/// valid until the next call on this CPU.
///
/// # Safety
/// `ctx_regs` must point to the perf-event context's register block.
#[inline(always)]
pub unsafe fn user_regs(ctx_regs: *const pt_regs) -> Option<(&'static pt_regs, RegsSource)> {
    let dst = USER_REGS.get_ptr_mut(0)?;
    // SAFETY: the context pointer is valid for the program's lifetime; the kernel
    // verifies the reads are inside the context.
    let regs = unsafe { &*ctx_regs };
    if is_user_mode(regs) {
        // SAFETY: `dst` is this CPU's map value.
        copy_from_ctx(unsafe { &mut *dst }, regs);
        return Some((unsafe { &*dst }, RegsSource::Interrupt));
    }
    if !task_regs_helpers() {
        return None;
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
    // SAFETY: `saved` is a kernel address, read with bpf_probe_read_kernel into the map
    // value (the user register block is the kernel's pt_regs' prefix on AArch64).
    let copied = unsafe {
        bpf_probe_read_kernel_raw(
            dst.cast(),
            core::mem::size_of::<pt_regs>() as u32,
            saved.cast(),
        )
    };
    if copied != 0 {
        return None;
    }
    let out = unsafe { &*dst };
    let user = walk_regs(out);
    // A kernel thread has no user registers: its saved block is all zero.
    if user.pc == 0 || user.sp == 0 {
        return None;
    }
    Some((out, RegsSource::Task))
}

/// The saved user PC and SP of `task` (a typed task pointer: a tracing program's
/// argument), read straight from the kernel's `pt_regs` (the verifier makes the loads
/// fault-safe): zeros for a kernel thread.
///
/// # Safety
/// `task` must be a typed task pointer the verifier knows as such.
#[inline(always)]
pub unsafe fn user_pc_sp(task: *mut task_struct) -> (u64, u64) {
    let saved = unsafe { bpf_task_pt_regs(task) } as *const pt_regs;
    if saved.is_null() {
        return (0, 0);
    }
    let (pc, sp) = pc_sp_fields(saved);
    // SAFETY: loads through a typed kernel pointer, checked by the verifier.
    unsafe { (core::ptr::read_volatile(pc), core::ptr::read_volatile(sp)) }
}

#[cfg(bpf_target_arch = "x86_64")]
#[inline(always)]
fn pc_sp_fields(r: *const pt_regs) -> (*const u64, *const u64) {
    // SAFETY: field addresses only; nothing is read here.
    unsafe { (core::ptr::addr_of!((*r).rip), core::ptr::addr_of!((*r).rsp)) }
}

#[cfg(bpf_target_arch = "aarch64")]
#[inline(always)]
fn pc_sp_fields(r: *const pt_regs) -> (*const u64, *const u64) {
    // SAFETY: field addresses only; nothing is read here.
    unsafe { (core::ptr::addr_of!((*r).pc), core::ptr::addr_of!((*r).sp)) }
}
