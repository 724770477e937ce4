//! `sframe-bench`: the measurements behind `cargo xtask bench` and `BENCHMARKS.md`.
//!
//! Prints a Markdown report on stdout (progress goes to stderr). Each figure stands next
//! to a baseline measured in the same run; nothing is asserted. Needs root (BPF, perf
//! events, `kernel.bpf_stats_enabled`) and gcc.
//!
//! 1. BPF cost per sample and per frame: the `profile` program against the kernel's own
//!    frame-pointer walker (`fp_baseline`, `bpf_get_stack` with `BPF_F_USER_STACK`) on the
//!    same frame-pointer fixture processes, from the kernel's `run_time_ns` / `run_cnt`.
//! 2. Kernel memory per row of real objects, beside their `.eh_frame` and a generated
//!    `.sframe`; the user-space table's heap bytes and the deriver's peak heap per row
//!    (counted by this binary's global allocator).
//! 3. Table build time per object, and the SFrame reader's throughput and lookup time,
//!    each beside its goal and a reference measured in the same run.

use std::{
    alloc::{GlobalAlloc, Layout, System},
    fmt::Write as _,
    fs,
    path::{Path, PathBuf},
    process::{Child, Command},
    sync::atomic::{AtomicUsize, Ordering::Relaxed},
    thread,
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result, bail};
use aya::{
    Ebpf,
    maps::{HashMap, MapData, PerCpuArray},
    programs::{
        PerfEvent,
        perf_event::{PerfEventConfig, PerfEventScope, SamplePolicy, SoftwareEvent},
    },
};
use clap::Parser;
use object::{Object as _, ObjectSection as _};
use sframe_common::{Counter, WalkOutcome, layout::RuleEntry};
use sframe_user::{
    flatten::{RuleDict, flatten},
    objtable::{ObjTableOptions, table_for_elf},
    profiler::Profiler,
    sframe::{Section, WriteOptions, WriteVersion, write_section},
    table::{Source, TableBuilder, UnwindTable},
};

/// Sampling frequency of both programs (Hz).
const FREQUENCY: u64 = 999;
/// Frames of the fixture chains (functions from `main`'s callee to the spinning leaf).
const DEPTHS: [usize; 4] = [8, 32, 128, 256];
/// Rows the SFrame reader benchmark section holds at least.
const READER_MIN_ROWS: usize = 100_000;
/// PCs looked up per `find_fre` timing run.
const LOOKUPS: usize = 200_000;
/// Goals of issues 3 and 4, printed beside the figures.
const GOAL_READER_MBPS: f64 = 500.0;
const GOAL_LOOKUP_NS: f64 = 100.0;
const GOAL_MEMORY_RATIO: f64 = 2.0;
const BASELINE_PROGRAM: &str = "fp_baseline";

/// The system allocator, counting the bytes allocated now and their high-water mark,
/// for the heap figures of section 2. (A global allocator is the only way to see every
/// allocation a library call makes; it is confined to this binary.)
struct CountingAlloc;

static HEAP_NOW: AtomicUsize = AtomicUsize::new(0);
static HEAP_PEAK: AtomicUsize = AtomicUsize::new(0);

fn heap_grew(bytes: usize) {
    let now = HEAP_NOW.fetch_add(bytes, Relaxed) + bytes;
    HEAP_PEAK.fetch_max(now, Relaxed);
}

fn heap_shrank(bytes: usize) {
    HEAP_NOW.fetch_sub(bytes, Relaxed);
}

// SAFETY: every method forwards its arguments unchanged to `System`, whose contract
// they satisfy because they satisfy `GlobalAlloc`'s; the counters never touch memory.
unsafe impl GlobalAlloc for CountingAlloc {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: forwarded (see the impl).
        let p = unsafe { System.alloc(layout) };
        if !p.is_null() {
            heap_grew(layout.size());
        }
        p
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        // SAFETY: forwarded (see the impl).
        let p = unsafe { System.alloc_zeroed(layout) };
        if !p.is_null() {
            heap_grew(layout.size());
        }
        p
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: forwarded (see the impl).
        unsafe { System.dealloc(ptr, layout) };
        heap_shrank(layout.size());
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: forwarded (see the impl).
        let p = unsafe { System.realloc(ptr, layout, new_size) };
        if !p.is_null() {
            // Counted as if old and new coexisted (a moving realloc does): the peak
            // errs high, never low.
            heap_grew(new_size);
            heap_shrank(layout.size());
        }
        p
    }
}

#[global_allocator]
static GLOBAL: CountingAlloc = CountingAlloc;

/// Runs `f` and returns its result with the most heap bytes that were allocated at once
/// during it, beyond those allocated before (its result included; single-threaded).
fn peak_heap<T>(f: impl FnOnce() -> T) -> (T, usize) {
    let before = HEAP_NOW.load(Relaxed);
    HEAP_PEAK.store(before, Relaxed);
    let out = f();
    (out, HEAP_PEAK.load(Relaxed).saturating_sub(before))
}

#[derive(Parser)]
#[command(name = "sframe-bench", about = "Measurements for BENCHMARKS.md")]
struct Args {
    /// Short runs (1 s per program, 3 repetitions): keeps the harness working in CI.
    #[arg(long)]
    quick: bool,
    /// Only the table sections (memory, build time, SFrame reader): no BPF, no root.
    #[arg(long, conflicts_with = "only")]
    tables_only: bool,
    /// Only this section (for iterating on one measurement).
    #[arg(long, value_enum)]
    only: Option<OnlySection>,
}

/// A section `--only` can select.
#[derive(Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum OnlySection {
    /// Section 1: BPF cost per sample and per frame, and the verifier counts.
    BpfCost,
}

impl Args {
    fn sample_time(&self) -> Duration {
        Duration::from_secs(if self.quick { 1 } else { 3 })
    }
    fn repetitions(&self) -> usize {
        if self.quick { 3 } else { 5 }
    }
}

fn main() -> Result<()> {
    sframe_user::privileges::init_logging();
    let args = Args::parse();
    let started = Instant::now();
    let mut doc = String::new();
    header(&mut doc, &args);

    if !args.tables_only {
        progress("1/3 BPF cost per sample and per frame");
        doc.push_str("\n## 1. BPF cost per sample and per frame\n\n");
        match bpf_cost(&args) {
            Ok((filter_only, rows)) => cost_section(&mut doc, &filter_only, &rows, &args),
            Err(err) => {
                let _ = writeln!(doc, "Not measured: {err:#}.");
            }
        }

        doc.push_str("\n### Verifier\n\n");
        match Profiler::start(FREQUENCY) {
            Ok(profiler) => {
                let _ = writeln!(
                    doc,
                    "Instructions processed by the verifier when loading each program on this \
                     kernel (limit 1,000,000; goal ≤ 50%):\n\n| program | instructions | share of limit |\n|---|---:|---:|"
                );
                let mut stats = profiler.verifier_stats();
                stats.sort();
                for (name, count) in stats {
                    match count {
                        Some(n) => {
                            let _ = writeln!(
                                doc,
                                "| `{name}` | {n} | {:.2} % |",
                                f64::from(n) / 10_000.0
                            );
                        }
                        None => {
                            let _ = writeln!(doc, "| `{name}` | not loaded or not reported | |");
                        }
                    }
                }
            }
            Err(err) => {
                let _ = writeln!(doc, "Not measured: {err:#}.");
            }
        }
    }

    if args.only == Some(OnlySection::BpfCost) {
        print!("{doc}");
        return Ok(());
    }

    progress("2/3 kernel memory per row and table build time");
    let objects = bench_objects(&args);
    memory_section(&mut doc, &objects);
    table_memory_section(&mut doc, &objects);
    build_section(&mut doc, &objects, &args);

    progress("3/3 SFrame reader throughput");
    doc.push_str("\n### SFrame reader throughput\n\n");
    match reader_bench(&objects, &args) {
        Ok(r) => reader_section(&mut doc, &r),
        Err(err) => {
            let _ = writeln!(doc, "Not measured: {err:#}.");
        }
    }
    not_measured(&mut doc);
    let _ = writeln!(
        doc,
        "\n_The whole run took {:.0} s._",
        started.elapsed().as_secs_f64()
    );
    print!("{doc}");
    Ok(())
}

fn progress(what: &str) {
    eprintln!("sframe-bench: {what}");
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
         edit by hand. Every figure stands beside a baseline measured in the same run on the\n\
         same machine; nothing here is asserted. The machine is shared (other builds may run\n\
         beside the bench), so single numbers carry noise: medians and min–max are shown\n\
         where repeated.\n\n\
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

// ---------------------------------------------------------------------------------------
// 1. BPF cost

/// What one program did while it sampled one fixture.
#[derive(Clone, Copy, Debug, Default)]
struct ProgramRun {
    run_time_ns: u64,
    run_count: u64,
    /// Samples of the fixture (the rest of `run_count` were other tasks, filtered out).
    samples: u64,
    /// Frames in the stacks the program produced, summed over `samples`.
    frames: u64,
    /// Samples whose walk was complete (the profiler only).
    complete: Option<u64>,
}

impl ProgramRun {
    fn per_run_ns(&self) -> Option<f64> {
        ratio(self.run_time_ns as f64, self.run_count as f64)
    }
    /// Run time charged to the fixture's samples: all of it, so this is an upper bound
    /// that includes the filtering cost of the other tasks' samples.
    fn per_sample_ns(&self) -> Option<f64> {
        ratio(self.run_time_ns as f64, self.samples as f64)
    }
    fn frames_per_sample(&self) -> Option<f64> {
        ratio(self.frames as f64, self.samples as f64)
    }
    fn per_frame_ns(&self) -> Option<f64> {
        ratio(self.per_sample_ns()?, self.frames_per_sample()?)
    }
}

fn ratio(a: f64, b: f64) -> Option<f64> {
    (b > 0.0).then(|| a / b)
}

/// Runs of both programs while no process is a target: what filtering costs.
struct FilterOnly {
    baseline: Result<ProgramRun>,
    profiler: Result<ProgramRun>,
}

struct CostRow {
    depth: usize,
    baseline: Result<ProgramRun>,
    profiler: Result<ProgramRun>,
}

/// Sets `kernel.bpf_stats_enabled` to 1 and puts the old value back when dropped.
struct BpfStats {
    old: String,
}

const BPF_STATS_SYSCTL: &str = "/proc/sys/kernel/bpf_stats_enabled";

impl BpfStats {
    fn enable() -> Result<Self> {
        let old = fs::read_to_string(BPF_STATS_SYSCTL)
            .with_context(|| format!("reading {BPF_STATS_SYSCTL}"))?;
        fs::write(BPF_STATS_SYSCTL, "1")
            .with_context(|| format!("writing 1 to {BPF_STATS_SYSCTL} (root needed)"))?;
        Ok(Self {
            old: old.trim().to_string(),
        })
    }
}

impl Drop for BpfStats {
    fn drop(&mut self) {
        if let Err(err) = fs::write(BPF_STATS_SYSCTL, &self.old) {
            eprintln!(
                "sframe-bench: could not restore {BPF_STATS_SYSCTL} to {}: {err}",
                self.old
            );
        }
    }
}

/// A running fixture process, killed when dropped.
struct Fixture {
    child: Child,
}

impl Fixture {
    fn pid(&self) -> u32 {
        self.child.id()
    }
}

impl Drop for Fixture {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A temporary directory, removed when dropped.
struct TempDir(PathBuf);

impl TempDir {
    fn new() -> Result<Self> {
        let dir = std::env::temp_dir().join(format!("sframe-bench-{}", std::process::id()));
        fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
        Ok(Self(dir))
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.0);
    }
}

/// C source of a chain of `depth` non-inlined frames, `main` → `f1` → … → `f<depth>`,
/// spinning in the leaf. `noipa` keeps gcc from inlining, cloning or proving the leaf
/// `noreturn`; the store after each call keeps it from turning calls into jumps.
fn fixture_source(depth: usize) -> String {
    let mut c = String::from(
        "volatile unsigned long sink;\nvolatile int stop;\n\
         __attribute__((noipa)) void f",
    );
    let _ = writeln!(c, "{depth}(void) {{ while (!stop) sink++; }}");
    for k in (1..depth).rev() {
        let _ = writeln!(
            c,
            "__attribute__((noipa)) void f{k}(void) {{ f{}(); sink++; }}",
            k + 1
        );
    }
    c.push_str("int main(void) { f1(); return (int)sink; }\n");
    c
}

fn build_fixture(dir: &Path, depth: usize) -> Result<PathBuf> {
    let src = dir.join(format!("chain{depth}.c"));
    let bin = dir.join(format!("chain{depth}"));
    fs::write(&src, fixture_source(depth)).with_context(|| format!("writing {}", src.display()))?;
    let out = Command::new("gcc")
        .args(["-O2", "-fno-omit-frame-pointer", "-o"])
        .arg(&bin)
        .arg(&src)
        .output()
        .context("running gcc")?;
    if !out.status.success() {
        bail!(
            "gcc failed on {}: {}",
            src.display(),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(bin)
}

fn bpf_cost(args: &Args) -> Result<(FilterOnly, Vec<CostRow>)> {
    let _stats = BpfStats::enable()?;
    let dir = TempDir::new()?;
    let mut rows = Vec::new();
    let mut filter_only = None;
    for depth in DEPTHS {
        let bin = build_fixture(&dir.0, depth)?;
        let fixture = Fixture {
            child: Command::new(&bin)
                .spawn()
                .with_context(|| format!("starting {}", bin.display()))?,
        };
        // Past the dynamic loader, spinning in the leaf.
        thread::sleep(Duration::from_millis(200));
        if filter_only.is_none() {
            progress("  no target (filtering only)");
            filter_only = Some(FilterOnly {
                baseline: measure_baseline(None, args.sample_time()),
                profiler: measure_profiler(None, args.sample_time()),
            });
        }
        progress(&format!("  chain of {depth} frames, pid {}", fixture.pid()));
        let baseline = measure_baseline(Some(fixture.pid()), args.sample_time());
        let profiler = measure_profiler(Some(fixture.pid()), args.sample_time());
        for (name, run) in [("baseline", &baseline), ("profile", &profiler)] {
            match run {
                Ok(r) => progress(&format!(
                    "    {name}: {} samples, {:.0} ns/sample, {:.1} frames/sample",
                    r.samples,
                    r.per_sample_ns().unwrap_or(f64::NAN),
                    r.frames_per_sample().unwrap_or(f64::NAN)
                )),
                Err(err) => progress(&format!("    {name}: {err:#}")),
            }
        }
        drop(fixture);
        rows.push(CostRow {
            depth,
            baseline,
            profiler,
        });
    }
    Ok((filter_only.context("no fixture ran")?, rows))
}

fn program_stats(ebpf: &Ebpf, name: &str) -> Result<(u64, u64)> {
    let info = ebpf
        .program(name)
        .with_context(|| format!("program {name} missing"))?
        .info()
        .with_context(|| format!("program {name}: reading its info"))?;
    Ok((info.run_time().as_nanos() as u64, info.run_count()))
}

fn per_cpu_sum(ebpf: &Ebpf, name: &str) -> Result<u64> {
    let map = ebpf
        .map(name)
        .with_context(|| format!("map {name} missing"))?;
    let array = PerCpuArray::<_, u64>::try_from(map).with_context(|| format!("map {name}"))?;
    let values = array
        .get(&0, 0)
        .with_context(|| format!("reading map {name}"))?;
    Ok(values.iter().sum())
}

/// The kernel's frame-pointer walker on `pid` (none: no target): attached like `profile`
/// (cpu-clock on every CPU, filtered by `TARGET_TGIDS`), detached when the object is
/// dropped.
fn measure_baseline(pid: Option<u32>, time: Duration) -> Result<ProgramRun> {
    let mut ebpf = sframe_user::bpf::load()?;
    let program: &mut PerfEvent = ebpf
        .program_mut(BASELINE_PROGRAM)
        .with_context(|| format!("program {BASELINE_PROGRAM} missing"))?
        .try_into()?;
    program
        .load()
        .with_context(|| format!("loading {BASELINE_PROGRAM}"))?;
    let cpus = aya::util::online_cpus().map_err(|(what, err)| anyhow::anyhow!("{what}: {err}"))?;
    for cpu in cpus {
        program
            .attach(
                PerfEventConfig::Software(SoftwareEvent::CpuClock),
                PerfEventScope::AllProcessesOneCpu { cpu },
                SamplePolicy::Frequency(FREQUENCY),
                false,
            )
            .with_context(|| format!("attaching {BASELINE_PROGRAM} on cpu {cpu}"))?;
    }
    let mut targets: HashMap<&mut MapData, u32, u8> =
        HashMap::try_from(ebpf.map_mut("TARGET_TGIDS").context("map TARGET_TGIDS")?)?;
    if let Some(pid) = pid {
        targets.insert(pid, 1, 0)?;
    }
    let (t0, n0) = program_stats(&ebpf, BASELINE_PROGRAM)?;
    let (s0, f0) = (
        per_cpu_sum(&ebpf, "FP_BASELINE_SAMPLES")?,
        per_cpu_sum(&ebpf, "FP_BASELINE_FRAMES")?,
    );
    thread::sleep(time);
    let (t1, n1) = program_stats(&ebpf, BASELINE_PROGRAM)?;
    let (s1, f1) = (
        per_cpu_sum(&ebpf, "FP_BASELINE_SAMPLES")?,
        per_cpu_sum(&ebpf, "FP_BASELINE_FRAMES")?,
    );
    Ok(ProgramRun {
        run_time_ns: t1 - t0,
        run_count: n1 - n0,
        samples: s1 - s0,
        frames: f1 - f0,
        complete: None,
    })
}

/// Samples, frames in their stacks, and complete walks counted so far.
fn profiler_totals(profiler: &mut Profiler) -> (u64, u64, u64) {
    let snap = profiler.collect();
    let frames = snap
        .counts
        .iter()
        .map(|c| {
            let len = profiler.stack(c.key.user_stack).map_or(0, <[u64]>::len);
            c.count * len as u64
        })
        .sum();
    (
        snap.counters[Counter::Samples as usize],
        frames,
        snap.outcomes[WalkOutcome::Complete as usize],
    )
}

/// The profiler on `pid` (none: no target).
fn measure_profiler(pid: Option<u32>, time: Duration) -> Result<ProgramRun> {
    let mut profiler = Profiler::start(FREQUENCY).context("starting the profiler")?;
    if let Some(pid) = pid {
        profiler
            .add_target(pid)
            .with_context(|| format!("adding target {pid}"))?;
    }
    let (t0, n0) = profiler
        .program_stats()
        .context("no run time for program profile")?;
    let (s0, f0, c0) = profiler_totals(&mut profiler);
    thread::sleep(time);
    let (t1, n1) = profiler
        .program_stats()
        .context("no run time for program profile")?;
    let (s1, f1, c1) = profiler_totals(&mut profiler);
    Ok(ProgramRun {
        run_time_ns: t1 - t0,
        run_count: n1 - n0,
        samples: s1 - s0,
        frames: f1 - f0,
        complete: Some(c1 - c0),
    })
}

fn cost_section(doc: &mut String, filter_only: &FilterOnly, rows: &[CostRow], args: &Args) {
    let _ = writeln!(
        doc,
        "Method: for each chain depth, gcc builds a C fixture (`-O2 -fno-omit-frame-pointer`,\n\
         `main` → `f1` → … → `fN` with every function `noipa`, spinning in `fN`), and one\n\
         process of it runs while two programs sample it in turn at {FREQUENCY} Hz for {} s\n\
         each (software cpu-clock on every CPU, other tasks filtered out by `TARGET_TGIDS`):\n\
         first the baseline `fp_baseline` (the kernel's frame-pointer walker,\n\
         `bpf_get_stack(ctx, buf, 127 * 8, BPF_F_USER_STACK)`), then the profiler\n\
         (`Profiler::start` + `add_target`, the `profile` program: SFrame-style tables loaded\n\
         from the process's objects, walked in `bpf_loop`). With\n\
         `kernel.bpf_stats_enabled=1`, the program's `run_time_ns` and `run_cnt` are read\n\
         before and after the window. Nothing is subtracted. Both programs run on every\n\
         CPU for every task, so their runs include other tasks' samples, which they only\n\
         filter out; a first window with the fixture running but no target measures that\n\
         filtering cost alone.\n\n{}\n\n\
         Goals (issue 8): per frame ≤ 1.5× the kernel's frame-pointer walker; per sample at\n\
         32 frames ≤ 3 µs.\n",
        args.sample_time().as_secs(),
        [
            "- *ns/run*: `run_time_ns / run_cnt` over all runs, filtered-out ones included (a",
            "  lower bound of the cost of one walk).",
            "- *ns/sample*: `run_time_ns` / samples of the fixture: every run's time charged to",
            "  the fixture's samples (an upper bound of the cost of one walk).",
            "- *frames/sample*: frames in the stacks each program produced (the baseline's",
            "  `bpf_get_stack` returns at most 127; the profiler walks at most 256 and goes on",
            "  through libc to `_start`, which has no frame pointers).",
            "- *ns/frame*: ns/sample ÷ frames/sample; *× baseline* compares ns/frame.",
        ]
        .join("\n"),
    );
    doc.push_str("Filtering only (no target):\n\n");
    for (name, run) in [
        ("`fp_baseline`", &filter_only.baseline),
        ("`profile`", &filter_only.profiler),
    ] {
        let _ = match run {
            Ok(r) => writeln!(
                doc,
                "- {name}: {} ns/run over {} runs",
                fmt_opt(r.per_run_ns(), 0),
                r.run_count
            ),
            Err(err) => writeln!(
                doc,
                "- {name}: not measured: {}",
                one_line(&format!("{err:#}"))
            ),
        };
    }
    doc.push_str(
        "\n| chain | program | fixture samples | runs (all) | ns/run | ns/sample | frames/sample | ns/frame | × baseline (per frame) | complete walks |\n\
         |---:|---|---:|---:|---:|---:|---:|---:|---:|---:|\n",
    );
    for row in rows {
        let base_frame = row
            .baseline
            .as_ref()
            .ok()
            .and_then(ProgramRun::per_frame_ns);
        for (name, run) in [
            ("`fp_baseline` (kernel FP walker)", &row.baseline),
            ("`profile` (this profiler)", &row.profiler),
        ] {
            match run {
                Ok(r) => {
                    let vs = match (r.per_frame_ns(), base_frame) {
                        (Some(a), Some(b)) if b > 0.0 => format!("{:.2}", a / b),
                        _ => "–".into(),
                    };
                    let complete = match r.complete {
                        Some(c) => pct(c as f64, r.samples as f64),
                        None => "–".into(),
                    };
                    let _ = writeln!(
                        doc,
                        "| {} | {name} | {} | {} | {} | {} | {} | {} | {vs} | {complete} |",
                        row.depth,
                        r.samples,
                        r.run_count,
                        fmt_opt(r.per_run_ns(), 0),
                        fmt_opt(r.per_sample_ns(), 0),
                        fmt_opt(r.frames_per_sample(), 1),
                        fmt_opt(r.per_frame_ns(), 1),
                    );
                }
                Err(err) => {
                    let _ = writeln!(
                        doc,
                        "| {} | {name} | not measured: {} |||||||",
                        row.depth,
                        one_line(&format!("{err:#}"))
                    );
                }
            }
        }
    }
    if let Some(row) = rows.iter().find(|r| r.depth == 32)
        && let Ok(p) = &row.profiler
        && let Some(ns) = p.per_sample_ns()
    {
        let _ = writeln!(
            doc,
            "\nAt 32 frames the profiler costs {:.2} µs per sample (goal ≤ 3 µs).",
            ns / 1000.0
        );
    }
}

fn fmt_opt(v: Option<f64>, decimals: usize) -> String {
    v.map_or_else(|| "–".into(), |v| format!("{v:.decimals$}"))
}

fn pct(a: f64, b: f64) -> String {
    ratio(a * 100.0, b).map_or_else(|| "–".into(), |p| format!("{p:.1} %"))
}

fn one_line(s: &str) -> String {
    s.replace(['\n', '|'], " ")
}

// ---------------------------------------------------------------------------------------
// 2. and 3. Objects: kernel memory and build time

struct ObjectBench {
    label: &'static str,
    path: PathBuf,
    result: Result<ObjectNumbers>,
}

struct ObjectNumbers {
    file_bytes: u64,
    source: Source,
    table: UnwindTable,
    rows: usize,
    functions: usize,
    flat_rows: usize,
    kernel_bytes: u64,
    rules: usize,
    eh_frame_bytes: Option<u64>,
    sframe: Result<(usize, u32)>,
    derive_ms: Vec<f64>,
    flatten_ms: Vec<f64>,
    /// `UnwindTable::heap_bytes()` of the table.
    table_heap: usize,
    /// Most heap bytes allocated at once by one `table_for_elf` run.
    peak_heap: usize,
}

fn bench_objects(args: &Args) -> Vec<ObjectBench> {
    let mut out = Vec::new();
    for (label, found) in [
        ("libc.so.6", find_libc()),
        ("libstdc++.so.6", find_library("libstdc++.so.6")),
        ("python3", fs::canonicalize("/usr/bin/python3").ok()),
        ("largest ELF", largest_elf()),
    ] {
        let Some(path) = found else {
            out.push(ObjectBench {
                label,
                path: PathBuf::new(),
                result: Err(anyhow::anyhow!("not found on this machine")),
            });
            continue;
        };
        progress(&format!("  {label}: {}", path.display()));
        let result = bench_object(&path, args);
        out.push(ObjectBench {
            label,
            path,
            result,
        });
    }
    out
}

fn bench_object(path: &Path, args: &Args) -> Result<ObjectNumbers> {
    let data = fs::read(path).with_context(|| format!("reading {}", path.display()))?;
    let opts = ObjTableOptions::default();
    let mut derive_ms = Vec::new();
    let mut table = None;
    for _ in 0..args.repetitions() {
        let t = Instant::now();
        let result = table_for_elf(&data, &opts);
        derive_ms.push(t.elapsed().as_secs_f64() * 1e3);
        table = Some(result.with_context(|| format!("table for {}", path.display()))?);
    }
    let table = table.context("no repetition ran")?;
    let table_heap = table.table.heap_bytes();
    let (again, peak_heap) = peak_heap(|| table_for_elf(&data, &opts));
    drop(again);
    let mut flatten_ms = Vec::new();
    let mut flat = None;
    let mut rules = 0;
    for _ in 0..args.repetitions() {
        let mut dict = RuleDict::default();
        let t = Instant::now();
        let result = flatten(&table.table, &mut dict);
        flatten_ms.push(t.elapsed().as_secs_f64() * 1e3);
        flat = Some(result.with_context(|| format!("flattening {}", path.display()))?);
        rules = dict.len();
    }
    let flat = flat.context("no repetition ran")?;
    let file = object::File::parse(&*data).context("parsing the ELF file")?;
    let eh_frame = file.section_by_name(".eh_frame");
    let eh_frame_bytes = eh_frame.as_ref().map(|s| s.size());
    let sframe_vaddr = eh_frame.as_ref().map_or(0, |s| s.address());
    let sframe = write_section(
        &table.table,
        &WriteOptions {
            version: WriteVersion::V3,
            section_vaddr: sframe_vaddr,
        },
    )
    .map(|(bytes, stats)| (bytes.len(), stats.fdes))
    .map_err(|e| anyhow::anyhow!("{e}"));
    Ok(ObjectNumbers {
        file_bytes: data.len() as u64,
        source: table.source,
        rows: table.table.row_count(),
        functions: table.table.functions().len(),
        flat_rows: flat.rows.len(),
        kernel_bytes: flat.kernel_bytes(),
        rules,
        eh_frame_bytes,
        sframe,
        derive_ms,
        flatten_ms,
        table_heap,
        peak_heap,
        table: table.table,
    })
}

/// The libc this process runs with.
fn find_libc() -> Option<PathBuf> {
    let maps = fs::read_to_string("/proc/self/maps").ok()?;
    maps.lines()
        .filter_map(|l| l.split_whitespace().nth(5))
        .find(|p| p.ends_with("/libc.so.6"))
        .and_then(|p| fs::canonicalize(p).ok())
        .or_else(|| find_library("libc.so.6"))
}

/// A library as the dynamic loader's cache names it, else in the usual directories.
fn find_library(name: &str) -> Option<PathBuf> {
    let from_cache = Command::new("ldconfig")
        .arg("-p")
        .output()
        .ok()
        .and_then(|o| {
            String::from_utf8_lossy(&o.stdout).lines().find_map(|l| {
                let (lhs, path) = l.trim().split_once(" => ")?;
                (lhs.split_whitespace().next() == Some(name) && lhs.contains("x86-64"))
                    .then(|| PathBuf::from(path.trim()))
            })
        });
    from_cache
        .into_iter()
        .chain(
            [
                "/lib/x86_64-linux-gnu",
                "/usr/lib/x86_64-linux-gnu",
                "/usr/lib64",
                "/usr/lib",
            ]
            .iter()
            .map(|d| Path::new(d).join(name)),
        )
        .find_map(|p| fs::canonicalize(p).ok())
}

/// The largest ELF shared object or executable under /usr/lib and the rustup home.
fn largest_elf() -> Option<PathBuf> {
    let mut roots = vec![PathBuf::from("/usr/lib")];
    if let Some(home) = std::env::var_os("RUSTUP_HOME") {
        roots.push(PathBuf::from(home));
    } else if let Some(home) = std::env::var_os("HOME") {
        roots.push(PathBuf::from(home).join(".rustup"));
    }
    let mut files = Vec::new();
    for root in roots {
        walk(&root, 0, &mut files);
    }
    files.sort_by_key(|f| std::cmp::Reverse(f.0));
    files
        .into_iter()
        .map(|(_, p)| p)
        .find(|p| is_elf_program(p))
}

fn walk(dir: &Path, depth: u32, out: &mut Vec<(u64, PathBuf)>) {
    if depth > 16 {
        return;
    }
    let Ok(entries) = fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let Ok(meta) = entry.metadata() else { continue };
        if meta.is_dir() {
            walk(&entry.path(), depth + 1, out);
        } else if meta.is_file() && meta.len() > 1 << 20 {
            out.push((meta.len(), entry.path()));
        }
    }
}

/// ET_EXEC or ET_DYN ELF (not a relocatable object or archive member).
fn is_elf_program(path: &Path) -> bool {
    use std::io::Read as _;
    let mut head = [0u8; 18];
    let ok = fs::File::open(path)
        .and_then(|mut f| f.read_exact(&mut head))
        .is_ok();
    ok && head[..4] == *b"\x7fELF" && matches!(u16::from_le_bytes([head[16], head[17]]), 2 | 3)
}

fn memory_section(doc: &mut String, objects: &[ObjectBench]) {
    let rule_bytes = size_of::<RuleEntry>();
    let _ = writeln!(
        doc,
        "\n## 2. Kernel memory per row\n\n\
         Method: `objtable::table_for_elf` builds each object's table (its `.sframe` when\n\
         valid, else rows derived from `.eh_frame`/`.debug_frame`, plus PLT rows);\n\
         `flatten::flatten` turns it into the kernel layout; *kernel bytes* is\n\
         `FlatObject::kernel_bytes()` (4-byte rows, 4-byte page entries, one object entry).\n\
         Rules are deduplicated into one table shared by all objects ({rule_bytes} bytes per\n\
         distinct rule), counted apart. Beside: the object's `.eh_frame` section, and a\n\
         version 3 `.sframe` the project's writer generates from the same table\n\
         (`sframe::write_section`). Bytes per row divide by the table's rows.\n\n\
         Goal (issues 5, 8): ≤ 4 bytes per row including the function entries, hard limit 8.\n"
    );
    doc.push_str(
        "| object | source | functions | rows | flattened rows | kernel bytes | bytes/row | bytes/function | distinct rules | `.eh_frame` bytes (/row) | generated `.sframe` v3 bytes (/row) |\n\
         |---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n",
    );
    for o in objects {
        let name = object_name(o);
        match &o.result {
            Ok(n) => {
                let per_row = |b: f64| ratio(b, n.rows as f64);
                let eh = n.eh_frame_bytes.map_or_else(
                    || "none".into(),
                    |b| format!("{b} ({})", fmt_opt(per_row(b as f64), 1)),
                );
                let sf = match &n.sframe {
                    Ok((b, _)) => format!("{b} ({})", fmt_opt(per_row(*b as f64), 1)),
                    Err(e) => format!("not written: {}", one_line(&e.to_string())),
                };
                let _ = writeln!(
                    doc,
                    "| {name} | {} | {} | {} | {} | {} | {} | {} | {} | {eh} | {sf} |",
                    source_name(n.source),
                    n.functions,
                    n.rows,
                    n.flat_rows,
                    n.kernel_bytes,
                    fmt_opt(per_row(n.kernel_bytes as f64), 2),
                    fmt_opt(ratio(n.kernel_bytes as f64, n.functions as f64), 1),
                    n.rules,
                );
            }
            Err(err) => {
                let _ = writeln!(
                    doc,
                    "| {name} | not measured: {} ||||||||||",
                    one_line(&format!("{err:#}"))
                );
            }
        }
    }
}

fn table_memory_section(doc: &mut String, objects: &[ObjectBench]) {
    let _ = writeln!(
        doc,
        "\n### Table memory in user space\n\n\
         Method: the same tables in the profiler's memory before flattening. *Table bytes*\n\
         is `UnwindTable::heap_bytes()`: 24 bytes per function, 8 per row (start offset,\n\
         rule index) and {} per distinct rule, vector capacities included. *Peak heap*\n\
         is the most heap bytes allocated at once while one `table_for_elf` runs (ELF\n\
         parse, CFI evaluation, assembly; the returned table included, the file's bytes\n\
         not), counted by this binary's global allocator. Both are compared with the size\n\
         of the same rows encoded as SFrame version 3 (the generated section of the table\n\
         above: what issue 4 derives rows into, and what `gen` writes).\n\n\
         Goal (issue 4): memory ≤ {GOAL_MEMORY_RATIO}× the size of the rows produced.\n",
        size_of::<sframe_common::UnwindRule>()
    );
    doc.push_str(
        "| object | source | rows | distinct rules | table bytes | bytes/row | × `.sframe` v3 (goal ≤ 2) | peak heap bytes | bytes/row | × `.sframe` v3 (goal ≤ 2) |\n\
         |---|---|---:|---:|---:|---:|---:|---:|---:|---:|\n",
    );
    for o in objects {
        let Ok(n) = &o.result else { continue };
        let sframe = n.sframe.as_ref().ok().map(|(b, _)| *b as f64);
        let per_row = |b: usize| fmt_opt(ratio(b as f64, n.rows as f64), 1);
        let times = |b: usize| {
            sframe
                .and_then(|sf| ratio(b as f64, sf))
                .map_or_else(|| "–".into(), |x| verdict(x, x <= GOAL_MEMORY_RATIO, 2))
        };
        let _ = writeln!(
            doc,
            "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |",
            o.label,
            source_name(n.source),
            n.rows,
            n.table.rules().len(),
            n.table_heap,
            per_row(n.table_heap),
            times(n.table_heap),
            n.peak_heap,
            per_row(n.peak_heap),
            times(n.peak_heap),
        );
    }
}

/// `value` with `decimals`, and whether it meets its goal.
fn verdict(value: f64, met: bool, decimals: usize) -> String {
    format!(
        "{value:.decimals$} ({})",
        if met { "met" } else { "not met" }
    )
}

fn object_name(o: &ObjectBench) -> String {
    if o.path.as_os_str().is_empty() {
        o.label.to_string()
    } else {
        format!("{} (`{}`)", o.label, o.path.display())
    }
}

fn source_name(s: Source) -> String {
    match s {
        Source::SFrame { version } => format!(".sframe v{version}"),
        Source::EhFrame => ".eh_frame".into(),
        Source::DebugFrame => ".debug_frame".into(),
        Source::Synthesized => "synthesized".into(),
    }
}

/// Median, min and max of `v` (sorted in place).
fn stats(v: &mut [f64]) -> Option<(f64, f64, f64)> {
    v.sort_by(f64::total_cmp);
    let (first, last) = (*v.first()?, *v.last()?);
    let mid = v.len() / 2;
    let median = if v.len() % 2 == 1 {
        v[mid]
    } else {
        (v[mid - 1] + v[mid]) / 2.0
    };
    Some((median, first, last))
}

fn fmt_stats(v: &[f64], decimals: usize) -> String {
    let mut v = v.to_vec();
    stats(&mut v).map_or_else(
        || "–".into(),
        |(m, lo, hi)| format!("{m:.decimals$} ({lo:.decimals$}–{hi:.decimals$})"),
    )
}

fn build_section(doc: &mut String, objects: &[ObjectBench], args: &Args) {
    let _ = writeln!(
        doc,
        "\n## 3. Table build time\n\n\
         Method: the object's bytes are in memory; `table_for_elf` (ELF parse, `.sframe`\n\
         validation or CFI derivation, PLT rows) and `flatten` (fresh rule dictionary) each\n\
         run {} times; median (min–max) in ms, and rows per second from the median. Upload\n\
         to the kernel maps is not included.\n",
        args.repetitions()
    );
    doc.push_str(
        "| object | file MB | rows | table_for_elf ms | rows/s | flatten ms | rows/s |\n\
         |---|---:|---:|---:|---:|---:|---:|\n",
    );
    for o in objects {
        let Ok(n) = &o.result else { continue };
        let rate = |v: &[f64]| {
            let mut v = v.to_vec();
            stats(&mut v)
                .and_then(|(m, _, _)| ratio(n.rows as f64, m / 1e3))
                .map_or_else(|| "–".into(), |r| format!("{:.2} M", r / 1e6))
        };
        let _ = writeln!(
            doc,
            "| {} | {:.1} | {} | {} | {} | {} | {} |",
            o.label,
            n.file_bytes as f64 / 1e6,
            n.rows,
            fmt_stats(&n.derive_ms, 1),
            rate(&n.derive_ms),
            fmt_stats(&n.flatten_ms, 1),
            rate(&n.flatten_ms),
        );
    }
}

// ---------------------------------------------------------------------------------------
// 3b. SFrame reader

struct ReaderBench {
    origin: String,
    copies: usize,
    rows: usize,
    functions: u32,
    bytes: usize,
    reps: usize,
    /// Open + validate + iterate every function, row and rule; no allocation per row.
    iterate_ms: Vec<f64>,
    /// Open + validate only, and the same through the careful reference decoders.
    open_ms: Vec<f64>,
    open_reference_ms: Vec<f64>,
    /// Open + validate + `to_table`.
    to_table_ms: Vec<f64>,
    lookups: Vec<LookupBench>,
}

/// `find_fre` on one section, and libsframe's search and scan on the same PCs.
struct LookupBench {
    what: String,
    bytes: usize,
    rows: usize,
    fast_ns: Vec<f64>,
    reference_ns: Vec<f64>,
    hits: usize,
    /// Both gave the same answer for every PC.
    agree: bool,
}

/// `table` repeated `copies` times, each copy moved past the previous one.
fn replicate(table: &UnwindTable, copies: usize) -> UnwindTable {
    let functions = table.functions();
    let lo = functions.first().map_or(0, |f| f.start);
    let hi = functions.iter().map(|f| f.end()).max().unwrap_or(lo);
    let span = (hi - lo + 0xffff) & !0xffff;
    let mut b = TableBuilder::new(table.arch, table.source);
    b.reserve(functions.len() * copies, table.row_count() * copies);
    for c in 0..copies as u64 {
        for f in functions {
            b.push(f.start + c * span, f.size, f.pc_type, table.rows(f));
        }
    }
    b.finish()
}

/// xorshift64*: reproducible PCs without a dependency.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
}

fn time_ms<T>(f: impl FnOnce() -> T) -> (T, f64) {
    let t = Instant::now();
    let out = f();
    (out, t.elapsed().as_secs_f64() * 1e3)
}

fn parse(bytes: &[u8]) -> Result<Section<'_>> {
    Section::parse(bytes, 0).map_err(|e| anyhow::anyhow!("parse: {e}"))
}

fn write_v3(table: &UnwindTable) -> Result<(Vec<u8>, u32)> {
    write_section(
        table,
        &WriteOptions {
            version: WriteVersion::V3,
            section_vaddr: 0,
        },
    )
    .map(|(b, s)| (b, s.fdes))
    .map_err(|e| anyhow::anyhow!("writing the section: {e}"))
}

fn reader_bench(objects: &[ObjectBench], args: &Args) -> Result<ReaderBench> {
    let reps = if args.quick { 7 } else { 21 };
    // The larger of libc's and python3's tables.
    let source = objects
        .iter()
        .filter(|o| matches!(o.label, "libc.so.6" | "python3"))
        .filter_map(|o| o.result.as_ref().ok().map(|n| (o, n)))
        .max_by_key(|(_, n)| n.rows)
        .context("neither libc nor python3 has a table")?;
    let rows = source.1.rows.max(1);
    let copies = READER_MIN_ROWS.div_ceil(rows);
    let table = replicate(&source.1.table, copies);
    let (bytes, functions) = write_v3(&table)?;
    let mut r = ReaderBench {
        origin: format!("{} (`{}`)", source.0.label, source.0.path.display()),
        copies,
        rows: table.row_count(),
        functions,
        bytes: bytes.len(),
        reps,
        iterate_ms: Vec::new(),
        open_ms: Vec::new(),
        open_reference_ms: Vec::new(),
        to_table_ms: Vec::new(),
        lookups: Vec::new(),
    };
    for _ in 0..reps {
        let (checksum, ms) = time_ms(|| -> Result<i64> {
            let section = parse(&bytes)?;
            let mut checksum = 0i64;
            for fde in section.functions() {
                for fre in section.rows(&fde) {
                    let rule = section.rule(&fde, &fre);
                    checksum = checksum.wrapping_add(i64::from(rule.cfa.offset));
                }
            }
            Ok(checksum)
        });
        std::hint::black_box(checksum?);
        r.iterate_ms.push(ms);
        let (section, ms) = time_ms(|| parse(&bytes));
        std::hint::black_box(section?);
        r.open_ms.push(ms);
        let (section, ms) = time_ms(|| Section::parse_reference(&bytes, 0));
        std::hint::black_box(section.map_err(|e| anyhow::anyhow!("parse: {e}"))?);
        r.open_reference_ms.push(ms);
        let (back, ms) = time_ms(|| {
            parse(&bytes)?
                .to_table()
                .map_err(|e| anyhow::anyhow!("to_table: {e}"))
        });
        let back = back?;
        r.to_table_ms.push(ms);
        if back.row_count() != r.rows {
            bail!("to_table gave {} rows of {}", back.row_count(), r.rows);
        }
    }
    r.lookups.push(lookup_bench(
        format!("the section above ({} FDEs)", r.functions),
        &table,
        &bytes,
        reps.min(9),
    )?);
    if let Some(libc) = objects
        .iter()
        .find(|o| o.label == "libc.so.6")
        .and_then(|o| o.result.as_ref().ok())
    {
        let (libc_bytes, fdes) = write_v3(&libc.table)?;
        r.lookups.push(lookup_bench(
            format!("libc's table as a v3 section ({fdes} FDEs)"),
            &libc.table,
            &libc_bytes,
            reps.min(9),
        )?);
    }
    Ok(r)
}

fn lookup_bench(
    what: String,
    table: &UnwindTable,
    bytes: &[u8],
    reps: usize,
) -> Result<LookupBench> {
    let section = parse(bytes)?;
    let fns = table.functions();
    if fns.is_empty() {
        bail!("no functions");
    }
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    let pcs: Vec<u64> = (0..LOOKUPS)
        .map(|_| {
            let f = &fns[(rng.next() % fns.len() as u64) as usize];
            f.start + rng.next() % u64::from(f.size.max(1))
        })
        .collect();
    let reference = |pc: u64| {
        section
            .find_fre_raw_linear(pc)
            .map(|(fde, fre)| (fde.index, section.rule(&fde, &fre)))
    };
    let agree = pcs.iter().all(|&pc| section.find_fre(pc) == reference(pc));
    let mut out = LookupBench {
        what,
        bytes: bytes.len(),
        rows: table.row_count(),
        fast_ns: Vec::new(),
        reference_ns: Vec::new(),
        hits: 0,
        agree,
    };
    let per_pc = |ms: f64| ms * 1e6 / LOOKUPS as f64;
    for _ in 0..reps {
        let (hits, ms) = time_ms(|| {
            pcs.iter()
                .filter(|&&pc| std::hint::black_box(section.find_fre(pc)).is_some())
                .count()
        });
        out.hits = hits;
        out.fast_ns.push(per_pc(ms));
        let (_, ms) = time_ms(|| {
            pcs.iter()
                .filter(|&&pc| std::hint::black_box(reference(pc)).is_some())
                .count()
        });
        out.reference_ns.push(per_pc(ms));
    }
    Ok(out)
}

fn median(v: &[f64]) -> f64 {
    let mut v = v.to_vec();
    stats(&mut v).map_or(f64::NAN, |s| s.0)
}

fn reader_section(doc: &mut String, r: &ReaderBench) {
    let mb = r.bytes as f64 / 1e6;
    let mbps = |v: &[f64]| ratio(mb, median(v) / 1e3);
    let ns_row = |v: &[f64]| ratio(median(v) * 1e6, r.rows as f64);
    let _ = writeln!(
        doc,
        "Method: the writer encodes the derived table of {} ({} cop{}, each moved past the\n\
         previous, to reach ≥ {READER_MIN_ROWS} rows) as one version 3 section of {} bytes,\n\
         {} FDEs and {} rows. Each figure is the median (min–max) of {} runs of wall-clock\n\
         time; MB/s are section bytes per second.\n\n\
         - *open + validate + iterate*: `Section::parse` (every check of the reader, one\n\
         \x20 pass), then `functions()`, `rows()` and `rule()` on every FDE and FRE (nothing\n\
         \x20 allocated per FDE or FRE).\n\
         - *reference validation*: `Section::parse_reference`, the careful decoders that\n\
         \x20 name the failed check, and that the fast pass falls back to on malformed input.\n\
         - *find_fre*: {LOOKUPS} pseudo-random PCs inside the functions; beside it, the same\n\
         \x20 PCs through libsframe's algorithm as written (`find_fde_libsframe`, then the\n\
         \x20 linear FRE scan of `find_fre_raw_linear`) on the same section.\n\n\
         Goals (issue 3): open + validate + iterate ≥ {GOAL_READER_MBPS} MB/s; `find_fre`\n\
         < {GOAL_LOOKUP_NS} ns per PC on libc-sized sections (O(log n), no allocation).\n",
        r.origin,
        r.copies,
        if r.copies == 1 { "y" } else { "ies" },
        r.bytes,
        r.functions,
        r.rows,
        r.reps,
    );
    doc.push_str("| measurement | ms | MB/s | ns/row | goal |\n|---|---:|---:|---:|---|\n");
    let met = mbps(&r.iterate_ms).is_some_and(|x| x >= GOAL_READER_MBPS);
    let goal = format!(
        "≥ {GOAL_READER_MBPS} MB/s: {}",
        if met { "met" } else { "not met" }
    );
    for (name, v, goal) in [
        ("open + validate + iterate", &r.iterate_ms, goal),
        ("open + validate", &r.open_ms, String::new()),
        (
            "open + reference validation",
            &r.open_reference_ms,
            "(baseline)".into(),
        ),
        (
            "open + validate + `to_table`",
            &r.to_table_ms,
            String::new(),
        ),
    ] {
        let _ = writeln!(
            doc,
            "| {name} | {} | {} | {} | {goal} |",
            fmt_stats(v, 2),
            fmt_opt(mbps(v), 0),
            fmt_opt(ns_row(v), 1),
        );
    }
    doc.push_str(
        "\n| `find_fre` on | bytes | rows | ns/PC | libsframe's algorithm, ns/PC | PCs found | same answers | goal |\n\
         |---|---:|---:|---:|---:|---:|---|---|\n",
    );
    for l in &r.lookups {
        let ns = median(&l.fast_ns);
        let _ = writeln!(
            doc,
            "| {} | {} | {} | {} | {} | {} | {} | < {GOAL_LOOKUP_NS} ns/PC: {} |",
            l.what,
            l.bytes,
            l.rows,
            fmt_stats(&l.fast_ns, 0),
            fmt_stats(&l.reference_ns, 0),
            pct(l.hits as f64, LOOKUPS as f64),
            if l.agree { "yes" } else { "NO" },
            if ns < GOAL_LOOKUP_NS {
                "met"
            } else {
                "not met"
            },
        );
    }
}

fn not_measured(doc: &mut String) {
    doc.push_str(
        "\n## Not measured yet (issue 8)\n\n\
         - Overhead on the profiled workload (throughput unprofiled, under this profiler and\n\
           under `perf record --call-graph dwarf` at 99 and 999 Hz).\n\
         - Accuracy against `perf record --call-graph dwarf` (python3, bash, C without frame\n\
           pointers, C++).\n\
         - Kernel memory from the maps as the kernel reports them (`bpftool map show`\n\
           memlock); section 2 counts the bytes the layout needs.\n\
         - Upload time of tables to the kernel maps, and time to the first complete stack\n\
           of a new process.\n",
    );
}
