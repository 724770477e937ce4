//! Process lifecycle events the kernel side sends user space (ring buffer `EVENTS`), and
//! the target filters user space gives the kernel side.

/// One event: what happened to which process (thread-group id).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ProcEvent {
    /// A `ProcEventKind`.
    pub kind: u32,
    /// Process id (thread-group id) the event is about.
    pub pid: u32,
    /// When it was sent (`bpf_ktime_get_ns`, CLOCK_MONOTONIC): user space measures how
    /// long events wait for its loop.
    pub ns: u64,
}

/// What a `ProcEvent` reports.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ProcEventKind {
    /// A target replaced its image (`sched_process_exec`); its mapping table was dropped.
    Exec = 1,
    /// The last thread of a target exited (`sched_process_exit`, `group_dead`); its
    /// kernel entries were removed.
    Exit = 2,
    /// A target mapped a file executable (`mmap` with `PROT_EXEC` returned): dlopen.
    Mmap = 3,
    /// A sample of a target found no mapping table for the process, or a PC outside its
    /// known mappings (rate-limited per process, `MISS_INTERVAL_NS`).
    Miss = 4,
    /// A target forked (not a thread): the child got a copy of the parent's mapping
    /// table and is a target.
    Fork = 5,
}

impl TryFrom<u32> for ProcEventKind {
    type Error = u32;
    fn try_from(v: u32) -> Result<Self, u32> {
        Ok(match v {
            1 => Self::Exec,
            2 => Self::Exit,
            3 => Self::Mmap,
            4 => Self::Miss,
            5 => Self::Fork,
            other => return Err(other),
        })
    }
}

/// At most one `Miss` event per process per this many nanoseconds.
pub const MISS_INTERVAL_NS: u64 = 50_000_000;

/// A cgroup (v2) whose processes, and those of its descendants, are targets: the
/// sampled task's ancestor at `level` must have id `id` (the cgroup directory's inode).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CgroupFilter {
    /// Cgroup id: the inode number of the cgroup's directory.
    pub id: u64,
    /// Depth of the cgroup below the root of its cgroup2 mount (the root is 0): the
    /// ancestor level passed to `bpf_get_current_ancestor_cgroup_id`.
    pub level: u32,
    /// Explicit padding; zero.
    pub _pad: u32,
}

/// Bits of the `FILTER_FLAGS` global.
pub mod filter {
    /// Every process is a target (except the profiler itself).
    pub const ALL: u32 = 1;
    /// Processes in a cgroup of `TARGET_CGROUPS` are targets.
    pub const CGROUPS: u32 = 2;
    /// Send `Exec` for every process that execs, target or not (`--comm` needs the new
    /// command name of every process).
    pub const ALL_EXECS: u32 = 4;
}

#[cfg(feature = "user")]
mod pod {
    // SAFETY: plain `repr(C)` integers, no padding bytes left implicit.
    unsafe impl aya::Pod for super::ProcEvent {}
    // SAFETY: as above, padding explicit.
    unsafe impl aya::Pod for super::CgroupFilter {}
}

const _: () = {
    assert!(size_of::<ProcEvent>() == 16);
    assert!(size_of::<CgroupFilter>() == 16);
};
