//! User space of the SFrame profiler, and a library for reading unwind tables and
//! unwinding stacks without frame pointers.
//!
//! # The library (always built; stable Rust, no BPF toolchain)
//! - [`sframe`]: the SFrame reader (versions 1–3), lookup, objdump-style dump, writer.
//! - [`ehframe`]: unwind rows derived from DWARF CFI (`.eh_frame`, `.debug_frame`) and PLTs.
//! - [`objtable`]: the unwind table of one ELF object from the best source it has.
//! - [`table`]: the in-memory unwind table of one object (normalized rules).
//! - [`flatten`]: a table in the kernel's layout (pages, rows, shared rules).
//! - [`unwinder`]: unwinds a stack from ELF objects, registers and stack bytes, with the
//!   kernel walker's own frame step (`sframe_common::step`).
//! - [`mapped`]: object files mapped read-only, guarded against truncation.
//! - [`procfs`]: reading `/proc/PID/maps` and `/proc/PID/stat` (untrusted input).
//! - [`sanitize`]: names from untrusted sources made safe to print.
//! - [`segments`]: an ELF object's `PT_LOAD` segments and the bias of a mapping of it.
//!
//! # The profiler (feature `profiler`, on by default)
//! - `bpf`: loading the embedded eBPF object and forwarding its logs.
//! - `kmaps`: the kernel's table maps, written through mmap.
//! - `objects`: per-object tables: identity, building (a worker thread), residency.
//! - `cache`: the on-disk table cache.
//! - `profiler`: targets, lifecycle events, deferred samples, counts.
//! - `governor`: keeps the BPF and collection cost under `--max-overhead`.
//! - `sampler`: attaching the perf-event program and reading raw samples.
//! - `symbolize`: addresses to function names (blazesym, PLT stubs).
//! - `heap`: the allocator the profiler's binary installs, counting heap bytes per
//!   thread (the symbolizer's state is bounded in bytes with it).
//! - `export`: folded, SVG, pprof, top and Prometheus outputs.
//! - `cgroup`, `cputime`, `safe_open`: cgroup filters, CPU time, opening a
//!   process's files without following a path it chose.
//! - `perfscript`: `perf record --call-graph dwarf` stacks, the walker's ground truth.
//! - `privileges`: whether this process may load BPF programs (used by tests to run
//!   for real or say clearly why they were skipped).
//!
//! It does not contain the kernel-side code (`sframe-ebpf`) nor the kernel contract
//! (`sframe-common`: map layout, names, budgets, the frame step).

// Library code does not panic on what it reads: no `unwrap`/`expect`, no indexing or
// slicing that can fail (tests may; the few proven-safe hot loops say why they allow it).
#![cfg_attr(
    not(test),
    deny(clippy::unwrap_used, clippy::expect_used, clippy::indexing_slicing)
)]
// The library surface (without the profiler) documents every public item.
#![cfg_attr(not(feature = "profiler"), deny(missing_docs))]

pub mod ehframe;
pub mod flatten;
pub mod mapped;
pub mod objtable;
pub mod procfs;
pub mod sanitize;
pub mod segments;
pub mod sframe;
pub mod table;
pub mod unwinder;

#[cfg(feature = "profiler")]
pub mod bpf;
#[cfg(feature = "profiler")]
pub mod cache;
#[cfg(feature = "profiler")]
pub mod cgroup;
#[cfg(feature = "profiler")]
pub mod cputime;
#[cfg(feature = "profiler")]
pub mod export;
#[cfg(feature = "profiler")]
pub mod governor;
#[cfg(feature = "profiler")]
pub mod heap;
#[cfg(feature = "profiler")]
pub mod kmaps;
#[cfg(feature = "profiler")]
pub mod objects;
#[cfg(feature = "profiler")]
pub mod perfscript;
#[cfg(feature = "profiler")]
pub mod privileges;
#[cfg(feature = "profiler")]
pub mod profiler;
#[cfg(feature = "profiler")]
pub mod python;
#[cfg(feature = "profiler")]
pub mod safe_open;
#[cfg(feature = "profiler")]
pub mod sampler;
#[cfg(feature = "profiler")]
pub mod symbolize;

/// The unit tests count heap bytes per thread as the profiler's binary does.
#[cfg(all(test, feature = "profiler"))]
#[global_allocator]
static HEAP: heap::Counting = heap::Counting;
