//! `fp_baseline`: the kernel's own frame-pointer walker (`bpf_get_stack` with
//! `BPF_F_USER_STACK`), the baseline `cargo xtask bench` measures the unwinder against.
//! It filters targets like `profile`, so both pay the same entry cost, and
//! counts the frames it got so that the bench can report a cost per frame.

use core::ffi::c_void;

use aya_ebpf::{
    EbpfContext as _,
    bindings::BPF_F_USER_STACK,
    helpers::{bpf_get_current_pid_tgid, generated::bpf_get_stack},
    macros::map,
    maps::PerCpuArray,
    programs::PerfEventContext,
};

use crate::is_target;

/// Frames `bpf_get_stack` may return: the kernel's default `perf_event_max_stack`.
const BASELINE_FRAMES: usize = 127;

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
