//! BPF programs of the profiler.
#![no_std]
#![no_main]

mod baseline;
mod lifecycle;
mod offcpu;
mod python;
mod regs;
mod task_storage;
mod unwind;
mod walker;

use aya_ebpf::{
    bindings::pt_regs,
    helpers::generated::bpf_get_current_ancestor_cgroup_id,
    helpers::{bpf_get_current_pid_tgid, bpf_get_smp_processor_id, bpf_probe_read_user},
    macros::{btf_tracepoint, fexit, map, perf_event, raw_tracepoint},
    maps::{Array, HashMap, RingBuf},
    programs::{BtfTracePointContext, FExitContext, PerfEventContext, RawTracePointContext},
};
use aya_log_ebpf::warn;
use sframe_common::sample::{
    RawSample, SAMPLE_FLAG_FROM_KERNEL, SAMPLE_FLAG_NO_USER_REGS, SAMPLE_FLAG_STACK_WORD_OK,
};
use sframe_common::{
    budget::{MAX_CGROUP_FILTERS, MAX_TARGET_TGIDS, RAW_SAMPLES_RING_BYTES},
    event::{CgroupFilter, filter},
};

use crate::regs::RegsSource;

/// Walks and counts the user stack of each sample of a target (see `unwind`).
#[perf_event]
pub fn profile(ctx: PerfEventContext) -> u32 {
    unwind::profile::<true, walker::Looped>(&ctx)
}

/// `profile` for kernels without `bpf_loop` (before Linux 5.17): the same walk, its
/// iterations bounded loops of calls to global functions (see `walker`).
#[perf_event]
pub fn profile_bounded(ctx: PerfEventContext) -> u32 {
    unwind::profile::<true, walker::ProfileCalls>(&ctx)
}

/// The same program without the thread name in the count keys (no
/// `bpf_get_current_comm`; the key keeps its size, the name stays zero). Never attached by
/// the profiler: `cargo xtask bench` runs it beside `profile` to measure what recording
/// each sample's thread costs. A second instance of the same generic code, so `profile`
/// itself is the code the profiler ships, with no branch added for the measurement.
#[perf_event]
pub fn profile_no_thread_names(ctx: PerfEventContext) -> u32 {
    unwind::profile::<false, walker::Looped>(&ctx)
}

/// Off-CPU: times the sleeps of target threads (see `offcpu`).
#[btf_tracepoint(function = "sched_switch")]
pub fn off_cpu_switch(ctx: BtfTracePointContext) -> i32 {
    offcpu::switch(&ctx)
}

/// Off-CPU: walks the stack of a thread that slept long enough, as it returns.
#[raw_tracepoint(tracepoint = "sys_exit")]
pub fn off_cpu_return(ctx: RawTracePointContext) -> i32 {
    offcpu::ret(&ctx)
}

/// Off-CPU: the same, as `schedule()` returns (where the kernel can trace it: once per
/// sleep rather than at every system call of the machine).
#[fexit(function = "schedule")]
pub fn off_cpu_wake(_ctx: FExitContext) -> i32 {
    offcpu::woken()
}

/// The baseline of `cargo xtask bench`: the kernel's frame-pointer walker
/// (`bpf_get_stack` with `BPF_F_USER_STACK`) on the same targets (see `baseline`).
#[perf_event]
pub fn fp_baseline(ctx: PerfEventContext) -> u32 {
    baseline::fp_baseline(&ctx)
}

/// The same walker, sending each target sample's frames to user space (the bench's
/// accuracy comparison; `fp_baseline` only counts, to measure the cost alone).
#[perf_event]
pub fn fp_baseline_record(ctx: PerfEventContext) -> u32 {
    baseline::fp_baseline_record(&ctx)
}

/// Thread-group ids to sample (value unused). The program runs for every sample of the
/// perf events it is attached to; this map, `FILTER_FLAGS` and `TARGET_CGROUPS` keep
/// only the targets.
#[map]
pub(crate) static TARGET_TGIDS: HashMap<u32, u8> = HashMap::with_max_entries(MAX_TARGET_TGIDS, 0);

/// `sframe_common::event::filter` bits, set by user space at load time.
#[unsafe(no_mangle)]
static FILTER_FLAGS: u32 = 0;
/// The profiler's own process, never a target.
#[unsafe(no_mangle)]
static SELF_TGID: u32 = 0;
/// Entries of `TARGET_CGROUPS` in use.
#[unsafe(no_mangle)]
static CGROUP_FILTER_COUNT: u32 = 0;

/// Cgroups (v2) whose processes are targets (with `filter::CGROUPS`).
#[map]
static TARGET_CGROUPS: Array<CgroupFilter> = Array::with_max_entries(MAX_CGROUP_FILTERS, 0);

#[inline(always)]
pub(crate) fn filter_flags() -> u32 {
    // SAFETY: a read of a global set at load time.
    unsafe { core::ptr::read_volatile(&FILTER_FLAGS) }
}

/// Whether samples and events of process `tgid` (the current task's) concern the
/// profiler: a listed pid, or every process, or a process in a target cgroup.
#[inline(always)]
pub(crate) fn is_target(tgid: u32) -> bool {
    // SAFETY: map lookup of a plain integer key.
    if unsafe { TARGET_TGIDS.get(tgid) }.is_some() {
        return true;
    }
    let flags = filter_flags();
    // SAFETY: a read of a global set at load time.
    let self_tgid = unsafe { core::ptr::read_volatile(&SELF_TGID) };
    if tgid == 0 || tgid == self_tgid {
        return false;
    }
    if flags & filter::ALL != 0 {
        return true;
    }
    if flags & filter::CGROUPS != 0 {
        // SAFETY: as above.
        let n = unsafe { core::ptr::read_volatile(&CGROUP_FILTER_COUNT) };
        let mut i = 0;
        while i < MAX_CGROUP_FILTERS {
            if i >= n {
                break;
            }
            if let Some(f) = TARGET_CGROUPS.get(i) {
                // SAFETY: helper call; the level is a plain integer.
                let id = unsafe { bpf_get_current_ancestor_cgroup_id(f.level as i32) };
                if id == f.id {
                    return true;
                }
            }
            i += 1;
        }
    }
    false
}

/// Raw samples for user space (the diagnostic path; counting happens in the kernel).
#[map]
static RAW_SAMPLES: RingBuf = RingBuf::with_byte_size(RAW_SAMPLES_RING_BYTES, 0);

/// Records the sampled task's user registers and the word at its user stack pointer.
#[perf_event]
pub fn sample_raw(ctx: PerfEventContext) -> u32 {
    let pid_tgid = bpf_get_current_pid_tgid();
    let tgid = (pid_tgid >> 32) as u32;
    // SAFETY: map lookup of a plain integer key.
    if unsafe { TARGET_TGIDS.get(tgid) }.is_none() {
        return 0;
    }
    let Some(mut entry) = RAW_SAMPLES.reserve::<RawSample>(0) else {
        return 0;
    };
    let mut sample = RawSample {
        pid: tgid,
        tid: pid_tgid as u32,
        // SAFETY: helper without arguments.
        cpu: unsafe { bpf_get_smp_processor_id() },
        ..RawSample::default()
    };
    // SAFETY: `regs` is the first member of bpf_perf_event_data.
    let ctx_regs: *const pt_regs = unsafe { core::ptr::addr_of!((*ctx.ctx).regs) };
    match unsafe { regs::user_regs(ctx_regs) } {
        Some((pt, source)) => {
            let user = regs::walk_regs(pt);
            sample.ip = user.pc;
            sample.sp = user.sp;
            sample.fp = user.fp;
            if let RegsSource::Task = source {
                sample.flags |= SAMPLE_FLAG_FROM_KERNEL;
            }
            // SAFETY: bpf_probe_read_user validates the user address.
            if let Ok(word) = unsafe { bpf_probe_read_user(user.sp as *const u64) } {
                sample.stack_word = word;
                sample.flags |= SAMPLE_FLAG_STACK_WORD_OK;
            }
        }
        None => {
            sample.flags |= SAMPLE_FLAG_NO_USER_REGS;
            warn!(&ctx, "no user registers for tid {}", sample.tid);
        }
    }
    entry.write(sample);
    entry.submit(0);
    0
}

#[cfg(not(test))]
#[panic_handler]
fn panic(_info: &core::panic::PanicInfo) -> ! {
    loop {}
}

#[unsafe(link_section = "license")]
#[unsafe(no_mangle)]
static LICENSE: [u8; 13] = *b"Dual MIT/GPL\0";
