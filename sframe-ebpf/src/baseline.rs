//! `fp_baseline`: the kernel's own frame-pointer walker (`bpf_get_stack` with
//! `BPF_F_USER_STACK`), the baseline `cargo xtask bench` measures the unwinder against.
//! It filters targets like `profile`, so both pay the same entry cost, and
//! counts the frames it got so that the bench can report a cost per frame.
//! `fp_baseline_record` runs the same walk and sends the frames to user space, for the
//! bench's accuracy comparison.

use core::ffi::c_void;

use aya_ebpf::{
    EbpfContext as _,
    bindings::BPF_F_USER_STACK,
    helpers::{bpf_get_current_pid_tgid, generated::bpf_get_stack},
    macros::map,
    maps::{PerCpuArray, RingBuf},
    programs::PerfEventContext,
};

use sframe_common::{
    budget::BASELINE_RING_BYTES,
    stack::{BASELINE_FRAMES, BaselineSample},
};

use crate::is_target;

/// The frames of one sample (only counted, never read).
#[repr(C)]
pub struct BaselineStack {
    ips: [u64; BASELINE_FRAMES],
}

#[map]
static FP_BASELINE_BUF: PerCpuArray<BaselineStack> = PerCpuArray::with_max_entries(1, 0);
/// Samples of target processes the baseline walked.
#[map]
static FP_BASELINE_SAMPLES: PerCpuArray<u64> = PerCpuArray::with_max_entries(1, 0);
/// Frames `bpf_get_stack` returned, summed over those samples.
#[map]
static FP_BASELINE_FRAMES: PerCpuArray<u64> = PerCpuArray::with_max_entries(1, 0);

#[inline(always)]
fn add(counter: &PerCpuArray<u64>, n: u64) {
    if let Some(p) = counter.get_ptr_mut(0) {
        // SAFETY: per-CPU slot; no concurrent writer on this CPU.
        unsafe { *p += n };
    }
}

pub fn fp_baseline(ctx: &PerfEventContext) -> u32 {
    let tgid = (bpf_get_current_pid_tgid() >> 32) as u32;
    if !is_target(tgid) {
        return 0;
    }
    let Some(buf) = FP_BASELINE_BUF.get_ptr_mut(0) else {
        return 0;
    };
    // SAFETY: `buf` is a per-CPU map value of exactly the size passed.
    let bytes = unsafe {
        bpf_get_stack(
            ctx.as_ptr(),
            buf as *mut c_void,
            size_of::<BaselineStack>() as u32,
            u64::from(BPF_F_USER_STACK),
        )
    };
    add(&FP_BASELINE_SAMPLES, 1);
    if bytes > 0 {
        add(&FP_BASELINE_FRAMES, bytes as u64 / 8);
    }
    0
}

/// The record being built on this CPU (too large for the BPF stack).
#[map]
static FP_RECORD_BUF: PerCpuArray<BaselineSample> = PerCpuArray::with_max_entries(1, 0);
/// `BaselineSample`s of target processes, for user space (about 1 KiB each).
#[map]
static FP_BASELINE_RING: RingBuf = RingBuf::with_byte_size(BASELINE_RING_BYTES, 0);

pub fn fp_baseline_record(ctx: &PerfEventContext) -> u32 {
    let pid_tgid = bpf_get_current_pid_tgid();
    let tgid = (pid_tgid >> 32) as u32;
    if !is_target(tgid) {
        return 0;
    }
    let Some(rec) = FP_RECORD_BUF.get_ptr_mut(0) else {
        return 0;
    };
    // SAFETY: `rec` is this CPU's map value; `frames` is exactly the size passed.
    let bytes = unsafe {
        bpf_get_stack(
            ctx.as_ptr(),
            (*rec).frames.as_mut_ptr() as *mut c_void,
            (BASELINE_FRAMES * 8) as u32,
            u64::from(BPF_F_USER_STACK),
        )
    };
    // SAFETY: as above; no other writer on this CPU.
    unsafe {
        (*rec).pid = tgid;
        (*rec).tid = pid_tgid as u32;
        (*rec).len = if bytes > 0 { bytes as u32 / 8 } else { 0 };
        (*rec)._pad = 0;
        let _ = FP_BASELINE_RING.output::<BaselineSample>(&*rec, 0);
    }
    0
}
