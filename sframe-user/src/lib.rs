//! User space of the SFrame profiler.
//!
//! - [`table`]: the in-memory unwind table of one object (normalized rules).
//! - [`bpf`]: loading the embedded eBPF object and forwarding its logs.
//! - [`sampler`]: attaching the perf-event program and reading raw samples.
//! - [`procfs`]: reading `/proc/PID/maps`.
//! - [`privileges`]: whether this process may load BPF programs (used by tests to run
//!   for real or say clearly why they were skipped).
//!
//! It does not contain the kernel-side code (`sframe-ebpf`) nor the shared map layout
//! (`sframe-common`).

pub mod bpf;
pub mod privileges;
pub mod procfs;
pub mod sampler;
pub mod table;
