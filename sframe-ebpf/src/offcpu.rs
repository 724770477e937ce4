//! Off-CPU profiling (see `sframe_common::offcpu`): `off_cpu_switch` on the BTF
//! tracepoint `sched_switch` times the sleeps of target threads (and takes the kernel
//! stack of one that slept long enough, as it is switched in), and `off_cpu_return` on
//! the raw tracepoint `sys_exit` walks the stack of a thread that slept at least
//! `OFF_CPU_MIN_NS`, in its own context, and adds the nanoseconds to `OFF_CPU_COUNTS`.
//!
//! Tracepoints without a formatted record, the cheapest attachments for events this
//! frequent; tasks are told apart by their `task_struct` address, so no field of a
//! kernel structure is read at an offset that varies between kernels. `sched_switch`
//! is a BTF tracepoint for `bpf_get_task_stack`, which wants the task as a typed pointer.

use aya_ebpf::{
    bindings::task_struct,
    bindings::{BPF_NOEXIST, pt_regs},
    helpers::{
        bpf_get_current_pid_tgid, bpf_ktime_get_ns,
        generated::{
            bpf_get_current_task, bpf_get_current_task_btf, bpf_get_prandom_u32,
            bpf_get_task_stack, bpf_probe_read_kernel as bpf_probe_read_kernel_raw,
            bpf_task_pt_regs,
        },
    },
    macros::{btf_map, map},
    maps::{Array, HashMap, PerCpuArray},
    programs::{BtfTracePointContext, RawTracePointContext},
};
use sframe_common::{
    Counter, WalkOutcome,
    budget::MAX_OFF_CPU_COUNTS,
    offcpu::{
        MAX_OFF_CPU_EVERY, MAX_OFF_CPU_PAUSE, MAX_OFF_CPU_WEIGHT, OFF_CPU_CONTROL_EVERY,
        OFF_CPU_CONTROL_LEN, OFF_CPU_CONTROL_PAUSE, OFF_CPU_CONTROL_WINDOW, OFF_CPU_KERNEL_FRAMES,
        OFF_CPU_UNINTERRUPTIBLE, OffCpuDue, OffCpuKey, OffCpuStart, TASK_INTERRUPTIBLE,
        TASK_UNINTERRUPTIBLE,
    },
    stack::{CountKey, HASH_SEED, UserStack, finish, mix},
    step::WalkState,
    window::StackWindow,
};

use crate::{
    is_target, lifecycle, regs,
    task_storage::TaskStorage,
    unwind::{INDEX_SLOT_OFF_CPU, STACKS, count, defer, needs_tables, store_stack, walk_in},
    walker::Looped,
};

/// Sleeps shorter than this (ns) are not walked; set at load time.
#[unsafe(no_mangle)]
static OFF_CPU_MIN_NS: u64 = 0;

/// The sleep of each target thread, kept in the task itself (`start_ns` 0: awake): no
/// hashing at each context switch, no capacity shared between processes; created at a
/// thread's first timed sleep, freed with the thread (or the map).
#[btf_map]
static OFF_CPU_TASKS: TaskStorage<OffCpuStart> = TaskStorage::new();
#[map]
static OFF_CPU_DUE: PerCpuArray<OffCpuDue> = PerCpuArray::with_max_entries(1, 0);
/// The governor's settings (`OFF_CPU_CONTROL_*`): 1 in how many sleeps is timed (set
/// when the programs cost more than its budget; a timed sleep then counts for as
/// many), the observation window, the pause factor.
#[map]
static OFF_CPU_CONTROL: Array<u32> = Array::with_max_entries(OFF_CPU_CONTROL_LEN, 0);

/// A slot of `OFF_CPU_CONTROL` (0 if unreadable).
#[inline(always)]
fn control(slot: u32) -> u32 {
    OFF_CPU_CONTROL.get(slot).copied().unwrap_or(0)
}
#[map]
static OFF_CPU_COUNTS: HashMap<OffCpuKey, u64> = HashMap::with_max_entries(MAX_OFF_CPU_COUNTS, 0);
/// The kernel stack of this CPU's due sleep (`OffCpuDue::kernel_stack` is its key),
/// stored in `STACKS` only when the sleep is counted or deferred: a sleep lost on the
/// way (`off_cpu_lost`) would leave it there with no count naming it for user space's
/// drain.
#[repr(C)]
struct DueKernelStack {
    /// The key `stack` hashes to (0: none).
    key: u64,
    stack: UserStack,
}

#[map]
static OFF_CPU_KSTACK: PerCpuArray<DueKernelStack> = PerCpuArray::with_max_entries(1, 0);
/// The walker's own per-CPU state: `off_cpu_return` runs with interrupts enabled, and a
/// `profile` run in an interrupt on the same CPU uses `SCRATCH` and `WINDOW`.
#[map]
static OFF_CPU_SCRATCH: PerCpuArray<WalkState> = PerCpuArray::with_max_entries(1, 0);
#[map]
static OFF_CPU_WINDOW: PerCpuArray<StackWindow> = PerCpuArray::with_max_entries(1, 0);
#[map]
static OFF_CPU_REGS: PerCpuArray<pt_regs> = PerCpuArray::with_max_entries(1, 0);

/// `sched_switch(bool preempt, struct task_struct *prev, struct task_struct *next,
/// unsigned int prev_state)` (Linux 5.18 and later): `prev` is the current task.
#[inline(always)]
pub fn switch(ctx: &BtfTracePointContext) -> i32 {
    let preempt: u64 = ctx.arg(0);
    let prev_task: *mut task_struct = ctx.arg(1);
    let prev = prev_task as u64;
    let next_task: *mut task_struct = ctx.arg(2);
    let next = next_task as u64;
    let prev_state = ctx.arg::<u64>(3) as u32;
    let Some(due) = OFF_CPU_DUE.get_ptr_mut(0) else {
        return 0;
    };
    // SAFETY: this CPU's slot; sched_switch runs with interrupts off.
    let due = unsafe { &mut *due };
    // The thread leaving. A sleep it was woken from but did not return from yet (woken,
    // then back to sleep, or preempted, before its walk) is carried on.
    let carried = due.task != 0 && due.task == prev;
    let sleeps = preempt == 0 && prev_state & (TASK_INTERRUPTIBLE | TASK_UNINTERRUPTIBLE) != 0;
    if carried {
        due.task = 0;
        match OFF_CPU_TASKS.get_or_create(prev_task) {
            Some(slot) => {
                // SAFETY: the task's own value; this CPU runs the task's switches.
                unsafe {
                    *slot = OffCpuStart {
                        // SAFETY: helper without arguments.
                        start_ns: bpf_ktime_get_ns(),
                        carried_ns: due.ns,
                        pc: due.pc,
                        sp: due.sp,
                        pid: due.pid,
                        tid: due.tid,
                        state: due.state
                            | if sleeps && prev_state & TASK_UNINTERRUPTIBLE != 0 {
                                OFF_CPU_UNINTERRUPTIBLE
                            } else {
                                0
                            },
                        weight: due.weight,
                        window: control(OFF_CPU_CONTROL_WINDOW),
                        _pad: 0,
                    }
                };
            }
            None => count(Counter::OffCpuLost, 1),
        }
    } else if sleeps {
        leaving(prev_task, prev_state);
    }
    // The thread arriving: one pointer chase in the task for most switches of a busy
    // machine (no value, or not asleep).
    let Some(slot) = OFF_CPU_TASKS.get(next_task) else {
        return 0;
    };
    // SAFETY: the task's own value.
    let slot = unsafe { &mut *slot };
    if slot.start_ns == 0 {
        return 0;
    }
    let start = *slot;
    slot.start_ns = 0;
    if start.window != control(OFF_CPU_CONTROL_WINDOW) {
        // It began before a pause: its end, or a wake and another sleep, may have
        // been missed.
        count(Counter::OffCpuPaused, 1);
        return 0;
    }
    // SAFETY: helper without arguments.
    let now = unsafe { bpf_ktime_get_ns() };
    // The sleep, and the unsampled ones it stands for (what it carries is weighted
    // already).
    // (No 128-bit multiply on BPF: the time is capped at 2^50 ns, 13 days, and the
    // weight at MAX_OFF_CPU_WEIGHT, 2^13, so the product fits.)
    let slept = now.wrapping_sub(start.start_ns).min(1 << 50);
    let weight = u64::from(start.weight.clamp(1, MAX_OFF_CPU_WEIGHT));
    let ns = start.carried_ns.saturating_add(slept * weight);
    // SAFETY: a read of a global set at load time.
    let min = unsafe { core::ptr::read_volatile(&OFF_CPU_MIN_NS) };
    // The threshold applies to the sleep itself, not to what it stands for: both
    // sides weighted (no division: one would need a divide-by-zero path).
    if ns < min.min(1 << 50) * weight {
        count(Counter::OffCpuShort, 1);
        return 0;
    }
    if due.task != 0 {
        // The last one never reached its walk (with the `sys_exit` walker: it slept in
        // a page fault, or returned to user space without a system call).
        count(Counter::OffCpuLost, 1);
    }
    *due = OffCpuDue {
        task: next,
        ns,
        pc: start.pc,
        sp: start.sp,
        pid: start.pid,
        tid: start.tid,
        state: start.state,
        weight: start.weight,
        kernel_stack: capture_kernel_stack(next_task),
    };
    0
}

/// Copies the kernel stack `task` sleeps in to this CPU's `OFF_CPU_KSTACK`; returns
/// its key, or 0.
#[inline(always)]
fn capture_kernel_stack(task: *mut task_struct) -> u64 {
    let Some(buf) = OFF_CPU_KSTACK.get_ptr_mut(0) else {
        return 0;
    };
    // SAFETY: this CPU's buffer (sched_switch runs with interrupts off).
    unsafe { (*buf).key = 0 };
    let st = unsafe { &mut (*buf).stack };
    // SAFETY: `task` is the tracepoint's typed task pointer; the helper writes at most
    // the given size into the buffer's frames.
    let n = unsafe {
        bpf_get_task_stack(
            task,
            st.frames.as_mut_ptr().cast(),
            (OFF_CPU_KERNEL_FRAMES * 8) as u32,
            0,
        )
    };
    if n <= 0 {
        count(Counter::OffCpuKernelStackFailed, 1);
        return 0;
    }
    let len = (n as u64 / 8).min(OFF_CPU_KERNEL_FRAMES as u64) as u32;
    st.len = len;
    // Hashed as user stacks are, from another seed: kernel and user stacks share the
    // map.
    let mut h = !HASH_SEED;
    let mut i = 0;
    while i < OFF_CPU_KERNEL_FRAMES {
        if i as u32 >= len {
            break;
        }
        h = mix(h, st.frames[i]);
        i += 1;
    }
    let key = finish(h, len);
    // SAFETY: as above.
    unsafe { (*buf).key = key };
    key
}

/// Stores the due sleep's kernel stack, whose key is `key`, from this CPU's
/// `OFF_CPU_KSTACK` into `STACKS`; returns `key`, or 0 when it is not there any more (a
/// later sleep on this CPU took the buffer) or the map is full.
#[inline(always)]
fn store_kernel_stack(key: u64) -> u64 {
    if key == 0 {
        return 0;
    }
    let Some(buf) = OFF_CPU_KSTACK.get_ptr(0) else {
        return 0;
    };
    // SAFETY: this CPU's buffer.
    if unsafe { (*buf).key } != key {
        count(Counter::OffCpuKernelStackFailed, 1);
        return 0;
    }
    if STACKS.get_ptr(key).is_some() {
        return key;
    }
    // SAFETY: as above.
    let st = unsafe { &(*buf).stack };
    #[allow(
        clippy::needless_borrows_for_generic_args,
        reason = "by value would copy the stack onto the BPF stack"
    )]
    match STACKS.insert(key, st, u64::from(BPF_NOEXIST)) {
        Ok(()) => key,
        Err(e) if e == -crate::unwind::EEXIST => key,
        Err(_) => {
            count(Counter::StackMapFull, 1);
            0
        }
    }
}

/// Records that `task`, the current task, a thread going to sleep, leaves now.
#[inline(always)]
fn leaving(task: *mut task_struct, prev_state: u32) {
    let pid_tgid = bpf_get_current_pid_tgid();
    let tgid = (pid_tgid >> 32) as u32;
    if !is_target(tgid) {
        return;
    }
    // Over the governor's budget, 1 in `every` sleeps is timed, at random (a thread's
    // sleeps are not periodic with the sampling), and counts for `every`.
    let every = control(OFF_CPU_CONTROL_EVERY).clamp(1, MAX_OFF_CPU_EVERY);
    // SAFETY: helper without arguments.
    if every > 1 && unsafe { bpf_get_prandom_u32() } % every != 0 {
        count(Counter::OffCpuUnsampled, 1);
        return;
    }
    // Its user registers, where it will return: a kernel thread has none.
    // SAFETY: `task` is the tracepoint's typed pointer to the current task.
    let (pc, sp) = unsafe { regs::user_pc_sp(task) };
    if pc == 0 || sp == 0 {
        return;
    }
    count(Counter::OffCpuBlocks, 1);
    let Some(slot) = OFF_CPU_TASKS.get_or_create(task) else {
        // No memory for the task's value.
        count(Counter::OffCpuLost, 1);
        return;
    };
    let start = OffCpuStart {
        // SAFETY: helper without arguments.
        start_ns: unsafe { bpf_ktime_get_ns() },
        carried_ns: 0,
        pc,
        sp,
        pid: tgid,
        tid: pid_tgid as u32,
        state: if prev_state & TASK_UNINTERRUPTIBLE != 0 {
            OFF_CPU_UNINTERRUPTIBLE
        } else {
            0
        },
        // A pause factor k: the programs watch one window in k, and a sleep seen
        // whole in one stands for k.
        weight: every * control(OFF_CPU_CONTROL_PAUSE).clamp(1, MAX_OFF_CPU_PAUSE),
        window: control(OFF_CPU_CONTROL_WINDOW),
        _pad: 0,
    };
    // SAFETY: the task's own value; this CPU runs the task's switch.
    unsafe { *slot = start };
}

/// `sys_exit(struct pt_regs *regs, long ret)`: the current task returns to user space
/// with `regs`.
#[inline(always)]
pub fn ret(ctx: &RawTracePointContext) -> i32 {
    walk_due(|| ctx.arg(0))
}

/// After `schedule()` returns: the current task runs again, with its user registers
/// saved where `bpf_task_pt_regs` finds them.
#[inline(always)]
pub fn woken() -> i32 {
    walk_due(|| {
        // SAFETY: helper without arguments.
        let task = unsafe { bpf_get_current_task_btf() };
        if task.is_null() {
            return core::ptr::null();
        }
        // SAFETY: the current task as a typed pointer.
        unsafe { bpf_task_pt_regs(task) as *const pt_regs }
    })
}

/// Walks the current task's stack if it is this CPU's due task, from its user
/// registers at `user()` (asked for only then).
#[inline(always)]
fn walk_due(user: impl FnOnce() -> *const pt_regs) -> i32 {
    let Some(slot) = OFF_CPU_DUE.get_ptr_mut(0) else {
        return 0;
    };
    // SAFETY: this CPU's slot. Every sleep (or system call) of the machine passes here:
    // the test that it is not the due thread's comes first, one load (the rest of the
    // slot is read only for the due thread).
    let due_task = unsafe { core::ptr::read_volatile(core::ptr::addr_of!((*slot).task)) };
    if due_task == 0 {
        return 0;
    }
    // SAFETY: helper without arguments.
    let task = unsafe { bpf_get_current_task() };
    if due_task != task {
        return 0;
    }
    let user = user();
    if user.is_null() {
        return 0;
    }
    // SAFETY: as above.
    let due = unsafe { *slot };
    // SAFETY: as above; cleared before the walk, so it is charged once.
    unsafe { (*slot).task = 0 };
    let Some(regs_copy) = OFF_CPU_REGS.get_ptr_mut(0) else {
        return 0;
    };
    // SAFETY: `user` is the kernel's pt_regs of the returning task; read into this CPU's
    // map value with bpf_probe_read_kernel.
    let copied = unsafe {
        bpf_probe_read_kernel_raw(
            regs_copy.cast(),
            core::mem::size_of::<pt_regs>() as u32,
            user.cast(),
        )
    };
    if copied != 0 {
        count(Counter::OffCpuLost, 1);
        return 0;
    }
    // SAFETY: this CPU's copy.
    let pt = unsafe { &*regs_copy };
    let r = regs::walk_regs(pt);
    if r.pc != due.pc || r.sp != due.sp {
        // It ran user code since it went to sleep: the stack is not the sleep's.
        count(Counter::OffCpuLost, 1);
        return 0;
    }
    count(Counter::OffCpuWalks, 1);
    let mut key = OffCpuKey {
        pid: due.pid,
        tid: due.tid,
        user_stack: 0,
        kernel_stack: due.kernel_stack,
        outcome: WalkOutcome::NoUserRegs as u32,
        _pad: 0,
        comm: [0; 16],
    };
    // SAFETY: the helper writes at most `comm.len()` bytes into `key.comm`.
    unsafe {
        aya_ebpf::helpers::generated::bpf_get_current_comm(
            key.comm.as_mut_ptr().cast(),
            key.comm.len() as u32,
        )
    };
    let outcome = walk_in::<Looped>(
        &OFF_CPU_SCRATCH,
        &OFF_CPU_WINDOW,
        INDEX_SLOT_OFF_CPU,
        due.pid,
        pt,
    );
    // The interpreter frames where it slept, after the native ones (as on CPU).
    let py = crate::python::append_frames::<Looped>(
        &OFF_CPU_SCRATCH,
        due.pid,
        due.tid,
        crate::python::PY_WALK_OFF_CPU,
    );
    if needs_tables(&OFF_CPU_SCRATCH, outcome) {
        // No table yet for where it slept (a process or library new to user space): its
        // stack goes to user space to be walked once the tables are loaded, as an
        // on-CPU sample's does.
        lifecycle::send_miss(due.pid);
        let deferred = CountKey {
            pid: due.pid,
            tid: due.tid,
            user_stack: 0,
            kernel_stack: -1,
            outcome,
            comm: key.comm,
        };
        // (Not counted as `Deferred`, which counts on-CPU samples, whose outcomes
        // user space adds to the kernel's.)
        let kernel_stack = store_kernel_stack(due.kernel_stack);
        if defer(&deferred, pt, due.ns, due.state, kernel_stack, &py) {
            return 0;
        }
        // Counted below: the stored kernel stack is named by its key.
        key.kernel_stack = kernel_stack;
    } else {
        key.kernel_stack = store_kernel_stack(due.kernel_stack);
    }
    // Stored only now that it is counted (see `unwind::profile`).
    key.user_stack = store_stack(&OFF_CPU_SCRATCH);
    key.outcome = WalkOutcome::with_python(outcome, py.unread) | due.state;
    add(&key, due.ns);
    0
}

/// Adds `ns` to the key's count (one thread, one CPU at a time: see `unwind::bump`).
#[inline(always)]
fn add(key: &OffCpuKey, ns: u64) {
    if let Some(n) = OFF_CPU_COUNTS.get_ptr_mut(key) {
        // SAFETY: an OFF_CPU_COUNTS value.
        unsafe { *n += ns };
        return;
    }
    if OFF_CPU_COUNTS
        .insert(key, ns, u64::from(BPF_NOEXIST))
        .is_err()
    {
        count(Counter::OffCpuMapFull, 1);
    }
}
