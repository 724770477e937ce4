//! `sframe-bench`: the measurements behind `cargo xtask bench` and `BENCHMARKS.md`.
//!
//! Prints a Markdown report on stdout (progress goes to stderr). Each figure stands next
//! to a baseline measured in the same run; nothing is asserted. Needs root (BPF, perf
//! events, `kernel.bpf_stats_enabled`), gcc, g++ and perf.
//!
//! 1. `cost`: BPF cost per sample and per frame: the `profile` program against the
//!    kernel's own frame-pointer walker (`fp_baseline`, `bpf_get_stack` with
//!    `BPF_F_USER_STACK`) on the same frame-pointer fixture processes, from the kernel's
//!    `run_time_ns` / `run_cnt`; the verifier's instruction counts.
//! 2. `objects`: kernel memory per row of real objects, beside their `.eh_frame` and a
//!    generated `.sframe`; `kmem`: the same objects in the maps, as the kernel reports
//!    their memory (memlock); the user-space table's heap bytes and the deriver's peak heap
//!    per row (counted by this binary's global allocator, `heap`).
//! 3. Table build time per object; `startup`: upload time to the kernel maps and time
//!    from exec to the first complete stack; `reader`: the SFrame reader's throughput and
//!    lookup time.
//! 4. `overhead`: a CPU-bound fixture's throughput unprofiled, under the profiler and
//!    under `perf record --call-graph dwarf`.
//! 5. `accuracy`: stacks against `perf record --call-graph dwarf` on python3, bash, C
//!    and C++ workloads, beside the kernel's frame-pointer walker.
//! 6. `busy`: whole-system profiling on a busy host (compile churn, long-lived spinners,
//!    python3), beside `perf record -a -g` and `--call-graph dwarf`. `--stress SECONDS`
//!    runs only that load (what `cargo xtask stress` is).
//! 7. `offcpu`: off-CPU profiling against the programs' own measurements.
//! 8. `fleet`: Prometheus at fleet scale: the busy host plus build churn, scraped by a
//!    real Prometheus as 20 hosts; series, bytes, exactness, the server's cost per host.

mod accuracy;
mod busy;
mod cost;
mod fixtures;
mod fleet;
mod heap;
mod kmem;
mod objects;
mod offcpu;
mod overhead;
mod python;
mod reader;
mod startup;
mod util;

use std::{
    fmt::Write as _,
    fs,
    process::Command,
    thread,
    time::{Duration, Instant},
};

use anyhow::Result;
use clap::{Parser, ValueEnum};

#[derive(Parser)]
#[command(name = "sframe-bench", about = "Measurements for BENCHMARKS.md")]
struct Args {
    /// Short runs (1 s windows, fewer repetitions): keeps the harness working in CI.
    #[arg(long)]
    quick: bool,
    /// Only the table sections (memory, build time, SFrame reader): no BPF, no root.
    #[arg(long, conflicts_with = "only")]
    tables_only: bool,
    /// Exit with an error when a section could not be measured (CI: the harness must
    /// work; the numbers are not checked).
    #[arg(long)]
    strict: bool,
    /// Only these sections (repeatable), e.g. to iterate on one measurement.
    #[arg(long, value_enum)]
    only: Vec<Section>,
    /// Run only the busy-host load for this many seconds (0: until killed), no report.
    #[arg(long)]
    stress: Option<u64>,
    /// With --stress: CPU hogs beside the load (default: one per CPU).
    #[arg(long)]
    hogs: Option<usize>,
    /// Section 8 with the profiler's `--prometheus-short-names`.
    #[arg(long)]
    short_names: bool,
}

/// A part of the report `--only` can select.
#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Section {
    /// Section 1: BPF cost per sample and per frame, and the verifier counts.
    BpfCost,
    /// Section 2: kernel memory per row (layout, maps' memlock, user-space tables).
    Memory,
    /// Section 3: table build time, upload, time to the first complete stack.
    Build,
    /// Section 3: the SFrame reader's throughput and lookups.
    Reader,
    /// Section 4: overhead on the profiled workload.
    Overhead,
    /// Section 5: accuracy against perf --call-graph dwarf.
    Accuracy,
    /// Section 6: a busy host.
    Busy,
    /// Section 7: off-CPU profiling.
    OffCpu,
    /// Section 8: Prometheus at fleet scale.
    Fleet,
    /// Section 9: Python frames (cost per frame, slowdown beside py-spy).
    Python,
}

impl Args {
    fn sample_time(&self) -> Duration {
        Duration::from_secs(if self.quick { 1 } else { 3 })
    }
    fn repetitions(&self) -> usize {
        if self.quick { 3 } else { 5 }
    }
    fn runs(&self, section: Section) -> bool {
        if self.tables_only {
            return matches!(section, Section::Memory | Section::Build | Section::Reader);
        }
        self.only.is_empty() || self.only.contains(&section)
    }
    /// Sections that need BPF (and root).
    fn bpf(&self) -> bool {
        !self.tables_only
    }
}

fn main() -> Result<()> {
    sframe_user::privileges::init_logging();
    let args = Args::parse();
    if let Some(seconds) = args.stress {
        let cpus = thread::available_parallelism().map_or(1, |n| n.get());
        return busy::stress(seconds, args.hogs.unwrap_or(cpus));
    }
    let started = Instant::now();
    let mut doc = String::new();
    header(&mut doc, &args);

    if args.runs(Section::BpfCost) {
        progress("1/5 BPF cost per sample and per frame");
        cost::section(&mut doc, &args);
    }
    let objects =
        if args.runs(Section::Memory) || args.runs(Section::Build) || args.runs(Section::Reader) {
            progress("2/5 kernel memory per row and table build time");
            objects::bench_objects(&args)
        } else {
            Vec::new()
        };
    if args.runs(Section::Memory) {
        objects::memory_section(&mut doc, &objects);
        if args.bpf() {
            progress("  kernel memory as the kernel reports it");
            kmem::section(&mut doc, &objects);
        }
        objects::table_memory_section(&mut doc, &objects);
    }
    if args.runs(Section::Build) {
        progress("3/5 table build, upload and time to the first complete stack");
        objects::build_section(&mut doc, &objects, &args);
        if args.bpf() {
            startup::upload_section(&mut doc, &objects, &args);
            startup::first_stack_section(&mut doc, &args);
        }
    }
    if args.runs(Section::Reader) {
        progress("3/5 SFrame reader throughput");
        reader::section(&mut doc, &objects, &args);
    }
    if args.runs(Section::Overhead) {
        progress("4/5 overhead on the profiled workload");
        overhead::section(&mut doc, &args);
    }
    if args.runs(Section::Accuracy) {
        progress("5/5 accuracy against perf --call-graph dwarf");
        accuracy::section(&mut doc, &args);
    }
    if args.runs(Section::Busy) && args.bpf() {
        progress("6/6 busy host");
        let seconds = if args.quick { 8.0 } else { 60.0 };
        match profiler_beside() {
            Some(exe) => {
                if let Err(err) = busy::section(&mut doc, seconds, &exe) {
                    let _ = writeln!(doc, "\n## 6. Busy host\n\nNot measured: {err:#}");
                }
            }
            None => {
                let _ = writeln!(
                    doc,
                    "\n## 6. Busy host\n\nNot measured: no sframe-user beside sframe-bench (cargo xtask bench builds both)"
                );
            }
        }
    }
    if args.runs(Section::OffCpu) && args.bpf() {
        progress("7/8 off CPU");
        offcpu::section(&mut doc, &args);
    }
    if args.runs(Section::Fleet) && args.bpf() {
        progress("8/8 Prometheus at fleet scale");
        let seconds = if args.quick { 25.0 } else { 600.0 };
        match profiler_beside() {
            Some(exe) => {
                let _ = fleet::section(&mut doc, seconds, &exe, args.short_names);
            }
            None => {
                let _ = writeln!(
                    doc,
                    "\n## 8. Prometheus at fleet scale\n\nNot measured: no sframe-user beside sframe-bench (cargo xtask bench builds both)"
                );
            }
        }
    }
    if args.runs(Section::Python) && args.bpf() {
        progress("9/9 Python frames");
        python::section(&mut doc, &args);
    }
    let _ = writeln!(
        doc,
        "\n_The whole run took {:.0} s._",
        started.elapsed().as_secs_f64()
    );
    print!("{doc}");
    if args.strict {
        let failed: Vec<&str> = doc
            .lines()
            .filter(|l| l.to_lowercase().contains("not measured:"))
            .collect();
        if !failed.is_empty() {
            anyhow::bail!(
                "{} figure(s) could not be measured:\n{}",
                failed.len(),
                failed.join("\n")
            );
        }
    }
    Ok(())
}

/// The `sframe-user` binary built beside this one.
fn profiler_beside() -> Option<std::path::PathBuf> {
    std::env::current_exe()
        .ok()
        .map(|e| e.with_file_name("sframe-user"))
        .filter(|p| p.exists())
}

fn progress(what: &str) {
    static START: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();
    let t = START.get_or_init(Instant::now).elapsed().as_secs_f64();
    eprintln!("sframe-bench: [{t:5.1} s] {what}");
}

// ---------------------------------------------------------------------------------------
// Report header

fn header(doc: &mut String, args: &Args) {
    let date = Command::new("date")
        .args(["-u", "+%Y-%m-%d %H:%M UTC"])
        .output()
        .ok()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_else(|| "unknown".into());
    let nproc = thread::available_parallelism().map_or(0, |n| n.get());
    let kernel = read_trim("/proc/sys/kernel/osrelease");
    let cpu = fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split_once(':'))
                .map(|(_, v)| v.trim().to_string())
        })
        .unwrap_or_else(|| "unknown".into());
    let load = read_trim("/proc/loadavg");
    let _ = writeln!(
        doc,
        "# Benchmarks\n\n\
         Written by `cargo xtask bench{}` (the `sframe-bench` binary of `sframe-user`); do not\n\
         edit by hand, except notes between `<!-- kept -->` and `<!-- /kept -->` lines, which\n\
         the next full run carries to the end of their section. Every figure stands beside a\n\
         baseline measured in the same run on the same machine; nothing here is asserted.\n\
         The machine is shared (other builds may run beside the bench), so single numbers\n\
         carry noise: medians and min–max are shown where repeated.\n\n\
         - date: {date}\n\
         - machine: {nproc} CPUs ({cpu}), kernel {kernel}\n\
         - load average at start: {load}",
        if args.quick { " --quick" } else { "" },
    );
}

fn read_trim(path: &str) -> String {
    fs::read_to_string(path)
        .map(|s| s.trim().to_string())
        .unwrap_or_else(|_| "unknown".into())
}
