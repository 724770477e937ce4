//! User space of the SFrame profiler.
//!
//! - [`ehframe`]: unwind rows derived from DWARF CFI (`.eh_frame`, `.debug_frame`) and PLTs.
//! - [`sframe`]: the SFrame reader (versions 1–3), lookup, objdump-style dump, writer.
//! - [`table`]: the in-memory unwind table of one object (normalized rules).
//! - [`bpf`]: loading the embedded eBPF object and forwarding its logs.
//! - [`sampler`]: attaching the perf-event program and reading raw samples.
//! - [`procfs`]: reading `/proc/PID/maps`.
//! - [`mapped`]: object files mapped read-only, guarded against truncation.
//! - [`perfscript`]: `perf record --call-graph dwarf` stacks, the walker's ground truth.
//! - [`privileges`]: whether this process may load BPF programs (used by tests to run
//!   for real or say clearly why they were skipped).
//!
//! It does not contain the kernel-side code (`sframe-ebpf`) nor the shared map layout
//! (`sframe-common`).

#[cfg(feature = "bpf")]
pub mod bpf;
pub mod cache;
pub mod cgroup;
pub mod cputime;
pub mod ehframe;
pub mod export;
pub mod flatten;
#[cfg(feature = "bpf")]
pub mod governor;
#[cfg(feature = "bpf")]
pub mod kmaps;
pub mod mapped;
#[cfg(feature = "bpf")]
pub mod objects;
pub mod objtable;
pub mod perfscript;
pub mod privileges;
pub mod procfs;
#[cfg(feature = "bpf")]
pub mod profiler;
pub mod safe_open;
#[cfg(feature = "bpf")]
pub mod sampler;
pub mod sanitize;
pub mod sframe;
pub mod symbolize;
pub mod table;
