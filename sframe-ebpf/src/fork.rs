//! Process lifecycle: children of targets become targets (`sched_process_fork`), and
//! targets that exec get their tables reloaded (`sched_process_exec`).
//!
//! The tracepoint fires for new threads too; their thread id is added as well and user
//! space removes it (it is not a thread-group id), so the map never keeps stale entries.

use aya_ebpf::{
    bindings::BPF_NOEXIST,
    helpers::bpf_get_current_pid_tgid,
    macros::{map, tracepoint},
    maps::RingBuf,
    programs::TracePointContext,
};

use crate::{TARGET_TGIDS, unwind::PROCESSES};

/// Offset of `child_pid` in the tracepoint record; user space reads it from the
/// tracepoint's format file (it differs between kernel versions) before loading.
#[unsafe(no_mangle)]
static FORK_CHILD_PID_OFFSET: u32 = 0;

#[tracepoint]
pub fn on_fork(ctx: TracePointContext) -> u32 {
    let parent_tgid = (bpf_get_current_pid_tgid() >> 32) as u32;
    // SAFETY: map lookup of a plain integer key.
    if unsafe { TARGET_TGIDS.get(parent_tgid) }.is_none() {
        return 0;
    }
    // SAFETY: a read of a global set at load time.
    let offset = unsafe { core::ptr::read_volatile(&FORK_CHILD_PID_OFFSET) };
    if offset == 0 {
        return 0;
    }
    // SAFETY: read_at checks the offset against the tracepoint record.
    let Ok(child) = (unsafe { ctx.read_at::<i32>(offset as usize) }) else {
        return 0;
    };
    let child = child as u32;
    // Until it execs, a child has its parent's address space: give it the parent's
    // mapping table now, so its first samples unwind before user space adopts it.
    if let Some(parent) = PROCESSES.get_ptr(parent_tgid) {
        // SAFETY: a PROCESSES value, passed by reference (8 KiB: never on the BPF stack).
        let parent = unsafe { &*parent };
        #[allow(
            clippy::needless_borrows_for_generic_args,
            reason = "by value would copy 8 KiB onto the BPF stack"
        )]
        let _ = PROCESSES.insert(child, parent, u64::from(BPF_NOEXIST));
    }
    let _ = TARGET_TGIDS.insert(child, 2u8, u64::from(BPF_NOEXIST));
    0
}

/// Exec'd targets whose mapping tables were dropped, for user space to reload.
#[map]
pub(crate) static EXEC_EVENTS: RingBuf = RingBuf::with_byte_size(16 * 1024, 0);

/// `sched:sched_process_exec`: a target replaced its image, so its mapping table is
/// stale. Drop it (samples count as `UnknownProcess` with their PC, instead of being
/// walked with the old image's tables) and tell user space to reload it.
#[tracepoint]
pub fn on_exec(_ctx: TracePointContext) -> u32 {
    let tgid = (bpf_get_current_pid_tgid() >> 32) as u32;
    // SAFETY: map lookup of a plain integer key.
    if unsafe { TARGET_TGIDS.get(tgid) }.is_none() {
        return 0;
    }
    let _ = PROCESSES.remove(tgid);
    if let Some(mut event) = EXEC_EVENTS.reserve::<u32>(0) {
        event.write(tgid);
        event.submit(0);
    }
    0
}
