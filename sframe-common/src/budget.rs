//! Budgets of the kernel-side walker, stated once and checked at compile time.

/// Frames walked per sample (one `bpf_loop` iteration each).
pub const MAX_FRAMES: usize = 256;

/// Executable mappings per process in the kernel's per-process table.
pub const MAX_MAPPINGS: usize = 256;
/// Steps of the fixed-length binary search over a process's mappings.
pub const MAPPING_SEARCH_STEPS: u32 = 9;

/// Rows are grouped in pages of `1 << page_shift` bytes of code, the shift chosen per
/// object (`ObjectEntry::page_shift`) between [`MIN_PAGE_SHIFT`] and this; a row stores
/// the low `page_shift` bits of its address, and a page is searched in
/// [`ROW_SEARCH_STEPS`]. Finer pages shorten each frame's row search (one halving per
/// halving of the page) and cost a 4-byte page entry each: the flattener takes the
/// finest pages that leave [`MIN_ROWS_PER_PAGE`] rows per page on average.
pub const MAX_PAGE_SHIFT: u32 = 16;
/// The finest pages: 256 bytes of code.
pub const MIN_PAGE_SHIFT: u32 = 8;
/// Rows per page, on average over an object, below which its pages are not made finer
/// (page entries then add at most 4 bytes per this many rows: 1/16 byte per row).
pub const MIN_ROWS_PER_PAGE: u64 = 64;
/// A page holds at most one row per byte address: `1 << MAX_PAGE_SHIFT` rows.
pub const ROW_SEARCH_STEPS: u32 = MAX_PAGE_SHIFT + 1;

/// Objects with tables loaded at once.
pub const MAX_OBJECTS: u32 = 8192;
/// Total rows in the kernel (4 bytes each).
pub const MAX_ROWS: u32 = 1 << 22;
/// Total page entries in the kernel (4 bytes each).
pub const MAX_PAGES: u32 = 1 << 20;
/// Distinct rules, shared by all objects (a row's rule index is a `u16`).
pub const MAX_RULES: u32 = 1 << 16;

/// Processes with mapping tables.
pub const MAX_PROCESSES: u32 = 1024;
/// Distinct user stacks kept between two reads by user space.
pub const MAX_STACKS: u32 = 4096;
/// Distinct (process, thread, stack, kernel stack, outcome) counters between two reads.
pub const MAX_COUNTS: u32 = 32768;
/// Kernel stacks (`bpf_get_stackid`).
pub const MAX_KERNEL_STACKS: u32 = 8192;

/// Distinct off-CPU (process, thread, stack, state) counters between two reads.
pub const MAX_OFF_CPU_COUNTS: u32 = 16384;

/// Profiled processes named by pid (`TARGET_TGIDS`).
pub const MAX_TARGET_TGIDS: u32 = 4096;
/// Cgroup filters the kernel side checks (`TARGET_CGROUPS`).
pub const MAX_CGROUP_FILTERS: u32 = 8;
/// Threads inside an executable `mmap` at once (`MMAP_PENDING`, least recently used
/// dropped).
pub const MAX_MMAP_PENDING: u32 = 1024;
/// Processes whose last "unknown process" event time is kept (`MISS_SENT`, LRU).
pub const MAX_MISS_SENT: u32 = 4096;

/// Bytes of the lifecycle event ring (`EVENTS`).
pub const EVENTS_RING_BYTES: u32 = 256 * 1024;
/// Bytes of the ring of samples waiting for their tables (`DEFERRED`).
pub const DEFERRED_RING_BYTES: u32 = 4 << 20;
/// Bytes of the raw-sample ring (`RAW_SAMPLES`).
pub const RAW_SAMPLES_RING_BYTES: u32 = 256 * 1024;
/// Bytes of the frame-pointer recorder's ring (`FP_BASELINE_RING`, benchmarks).
pub const BASELINE_RING_BYTES: u32 = 256 * 1024;

/// The per-CPU scratch record may not exceed this (keep it cache- and map-friendly).
pub const MAX_SCRATCH_BYTES: usize = 32 * 1024;

const _: () = assert!(1usize << MAPPING_SEARCH_STEPS > MAX_MAPPINGS);
const _: () = assert!(MAX_MAPPINGS.is_power_of_two());
const _: () = assert!(1u64 << ROW_SEARCH_STEPS > 1u64 << MAX_PAGE_SHIFT);
const _: () = assert!(MIN_PAGE_SHIFT <= MAX_PAGE_SHIFT);
const _: () = assert!(MAX_RULES <= 1 << 16, "row rule index is a u16");
const _: () = assert!(MAX_PAGE_SHIFT <= 16, "row address is a u16");
const _: () = assert!(MAX_FRAMES <= 1 << 16);
const _: () = assert!(MAX_CGROUP_FILTERS.is_power_of_two());
const _: () = assert!(
    EVENTS_RING_BYTES.is_power_of_two()
        && DEFERRED_RING_BYTES.is_power_of_two()
        && RAW_SAMPLES_RING_BYTES.is_power_of_two()
        && BASELINE_RING_BYTES.is_power_of_two(),
    "ring buffer sizes are powers of two (of pages)"
);
