//! Process lifecycle, from kernel events rather than polling:
//! - `on_fork` (`task:task_newtask`): a new process (not a thread) of a target gets a
//!   copy of its parent's mapping table, so its first samples unwind; with explicit
//!   pids the child becomes a target.
//! - `on_exec` (`sched:sched_process_exec`): the target's mapping table is stale; drop
//!   it and tell user space to reload it.
//! - `on_exit` (`sched:sched_process_exit`, the last thread): drop every kernel entry
//!   of the process.
//! - `on_mmap_enter`/`on_mmap_exit` (`syscalls:sys_{enter,exit}_mmap`): a target mapped
//!   a file executable (dlopen): tell user space once the mapping exists.
//!
//! Every event user space must act on goes through the `EVENTS` ring buffer as a
//! `ProcEvent`; a full buffer is counted (`Counter::EventsLost`) and the walker's
//! `Miss` events recover from it.

use aya_ebpf::{
    bindings::{BPF_ANY, BPF_NOEXIST},
    helpers::{bpf_get_current_pid_tgid, bpf_ktime_get_ns},
    macros::{map, tracepoint},
    maps::{LruHashMap, RingBuf},
    programs::TracePointContext,
};
use sframe_common::{
    Counter,
    budget::{EVENTS_RING_BYTES, MAX_MISS_SENT, MAX_MMAP_PENDING},
    event::{MISS_INTERVAL_NS, ProcEvent, ProcEventKind, filter},
};

use crate::{
    TARGET_TGIDS, filter_flags, is_target,
    unwind::{PROCESSES, count},
};

/// Tracepoint record offsets, read by user space from tracefs format files before
/// loading (they differ between kernel versions). 0 = the field is unavailable.
#[unsafe(no_mangle)]
static NEWTASK_PID_OFFSET: u32 = 0;
#[unsafe(no_mangle)]
static NEWTASK_FLAGS_OFFSET: u32 = 0;
#[unsafe(no_mangle)]
static EXIT_GROUP_DEAD_OFFSET: u32 = 0;
#[unsafe(no_mangle)]
static MMAP_PROT_OFFSET: u32 = 0;
#[unsafe(no_mangle)]
static MMAP_FD_OFFSET: u32 = 0;
#[unsafe(no_mangle)]
static MMAP_RET_OFFSET: u32 = 0;

const CLONE_THREAD: u64 = 0x0001_0000;
const PROT_EXEC: u64 = 4;

/// Events for user space.
#[map]
pub(crate) static EVENTS: RingBuf = RingBuf::with_byte_size(EVENTS_RING_BYTES, 0);

/// Threads inside an executable file mmap (between syscall entry and exit).
#[map]
static MMAP_PENDING: LruHashMap<u32, u8> = LruHashMap::with_max_entries(MAX_MMAP_PENDING, 0);

/// When the last `Miss` event of a process was sent (ns, boot clock).
#[map]
static MISS_SENT: LruHashMap<u32, u64> = LruHashMap::with_max_entries(MAX_MISS_SENT, 0);

#[inline(always)]
fn global(g: &u32) -> u32 {
    // SAFETY: a read of a global set at load time.
    unsafe { core::ptr::read_volatile(g) }
}

#[inline(always)]
pub(crate) fn send(kind: ProcEventKind, pid: u32) {
    match EVENTS.reserve::<ProcEvent>(0) {
        Some(mut event) => {
            event.write(ProcEvent {
                kind: kind as u32,
                pid,
                // SAFETY: helper without arguments.
                ns: unsafe { bpf_ktime_get_ns() },
            });
            event.submit(0);
        }
        None => count(Counter::EventsLost, 1),
    }
}

/// Sends a `Miss` for `tgid` unless one was sent in the last `MISS_INTERVAL_NS`.
#[inline(always)]
pub(crate) fn send_miss(tgid: u32) {
    // SAFETY: helper without arguments.
    let now = unsafe { bpf_ktime_get_ns() };
    // SAFETY: map lookup of a plain integer key.
    if let Some(&last) = unsafe { MISS_SENT.get(tgid) }
        && now.wrapping_sub(last) < MISS_INTERVAL_NS
    {
        return;
    }
    let _ = MISS_SENT.insert(tgid, now, u64::from(BPF_ANY));
    send(ProcEventKind::Miss, tgid);
}

#[tracepoint]
pub fn on_fork(ctx: TracePointContext) -> u32 {
    let parent_tgid = (bpf_get_current_pid_tgid() >> 32) as u32;
    let pid_offset = global(&NEWTASK_PID_OFFSET);
    let flags_offset = global(&NEWTASK_FLAGS_OFFSET);
    if pid_offset == 0 || flags_offset == 0 || !is_target(parent_tgid) {
        return 0;
    }
    // SAFETY: read_at checks the offsets against the tracepoint record.
    let (Ok(child), Ok(flags)) = (unsafe { ctx.read_at::<i32>(pid_offset as usize) }, unsafe {
        ctx.read_at::<u64>(flags_offset as usize)
    }) else {
        return 0;
    };
    if flags & CLONE_THREAD != 0 {
        return 0; // a thread shares its process's table
    }
    let child = child as u32;
    // Until it execs, a child has its parent's address space: give it the parent's
    // mapping table now, so its first samples unwind before user space hears of it.
    let mut copied = false;
    if let Some(parent) = PROCESSES.get_ptr(parent_tgid) {
        // SAFETY: a PROCESSES value, passed by reference (8 KiB: never on the BPF stack).
        let parent = unsafe { &*parent };
        #[allow(
            clippy::needless_borrows_for_generic_args,
            reason = "by value would copy 8 KiB onto the BPF stack"
        )]
        let inserted = PROCESSES.insert(child, parent, u64::from(BPF_NOEXIST));
        copied = inserted.is_ok();
    }
    // SAFETY: map lookup of a plain integer key.
    let listed = unsafe { TARGET_TGIDS.get(parent_tgid) }.is_some();
    if listed {
        let _ = TARGET_TGIDS.insert(child, 2u8, u64::from(BPF_NOEXIST));
    }
    if copied || listed {
        send(ProcEventKind::Fork, child);
    }
    0
}

/// A target replaced its image, so its mapping table is stale. Drop it (samples count as
/// `UnknownProcess` with their PC, instead of being walked with the old image's tables)
/// and tell user space to load the new one.
#[tracepoint]
pub fn on_exec(_ctx: TracePointContext) -> u32 {
    let tgid = (bpf_get_current_pid_tgid() >> 32) as u32;
    if is_target(tgid) {
        let _ = PROCESSES.remove(tgid);
    } else if filter_flags() & filter::ALL_EXECS == 0 {
        return 0;
    }
    send(ProcEventKind::Exec, tgid);
    0
}

/// The last thread of a process exits: nothing of it may stay in the maps.
#[tracepoint]
pub fn on_exit(ctx: TracePointContext) -> u32 {
    let pid_tgid = bpf_get_current_pid_tgid();
    let tgid = (pid_tgid >> 32) as u32;
    let offset = global(&EXIT_GROUP_DEAD_OFFSET);
    let group_dead = if offset != 0 {
        // SAFETY: read_at checks the offset against the tracepoint record.
        matches!(unsafe { ctx.read_at::<u8>(offset as usize) }, Ok(v) if v != 0)
    } else {
        // Older kernels: the thread-group leader's exit stands for the process.
        pid_tgid as u32 == tgid
    };
    if !group_dead {
        return 0;
    }
    let had_table = PROCESSES.remove(tgid).is_ok();
    let listed = TARGET_TGIDS.remove(tgid).is_ok();
    let _ = MISS_SENT.remove(tgid);
    if had_table || listed {
        send(ProcEventKind::Exit, tgid);
    }
    0
}

#[tracepoint]
pub fn on_mmap_enter(ctx: TracePointContext) -> u32 {
    let pid_tgid = bpf_get_current_pid_tgid();
    let tgid = (pid_tgid >> 32) as u32;
    let (prot_offset, fd_offset) = (global(&MMAP_PROT_OFFSET), global(&MMAP_FD_OFFSET));
    if prot_offset == 0 || fd_offset == 0 {
        return 0;
    }
    // Targets, processes with a table, and with `--comm` every process (its exec event,
    // which makes it a target, comes first in the ring buffer).
    let wanted = filter_flags() & filter::ALL_EXECS != 0
        || is_target(tgid)
        || PROCESSES.get_ptr(tgid).is_some();
    if !wanted {
        return 0;
    }
    // SAFETY: read_at checks the offsets against the tracepoint record.
    let (Ok(prot), Ok(fd)) = (
        unsafe { ctx.read_at::<u64>(prot_offset as usize) },
        unsafe { ctx.read_at::<u64>(fd_offset as usize) },
    ) else {
        return 0;
    };
    // Executable file mappings only: anonymous executable memory (JIT) has no table.
    if prot & PROT_EXEC != 0 && fd as i64 >= 0 {
        let _ = MMAP_PENDING.insert(pid_tgid as u32, 1u8, u64::from(BPF_ANY));
    }
    0
}

#[tracepoint]
pub fn on_mmap_exit(ctx: TracePointContext) -> u32 {
    let pid_tgid = bpf_get_current_pid_tgid();
    let tid = pid_tgid as u32;
    // SAFETY: map lookup of a plain integer key.
    if unsafe { MMAP_PENDING.get(tid) }.is_none() {
        return 0;
    }
    let _ = MMAP_PENDING.remove(tid);
    let offset = global(&MMAP_RET_OFFSET);
    // SAFETY: read_at checks the offset against the tracepoint record.
    match unsafe { ctx.read_at::<i64>(offset as usize) } {
        Ok(ret) if ret >= 0 => send(ProcEventKind::Mmap, (pid_tgid >> 32) as u32),
        _ => {}
    }
    0
}
