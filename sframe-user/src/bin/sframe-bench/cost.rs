//! Section 1: the BPF cost per sample and per frame of the `profile` program beside the
//! kernel's frame-pointer walker, and the verifier's instruction counts.

use sframe_common::names::{maps, programs};
use std::{
    fmt::Write as _,
    fs,
    path::{Path, PathBuf},
    process::Command,
    thread,
    time::Duration,
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
use sframe_common::{Counter, WalkOutcome};
use sframe_user::profiler::{Profiler, ProfilerConfig, SampleProgram};

use crate::{
    Args, progress,
    util::{BpfStats, Fixture, TempDir, fmt_opt, one_line, pct, ratio},
};

/// Sampling frequency of both programs (Hz).
const FREQUENCY: u64 = 999;
/// Frames of the fixture chains (functions from `main`'s callee to the spinning leaf).
const DEPTHS: [usize; 4] = [8, 32, 128, 256];
/// The chains `--quick` measures: the goal's depth and a truncated walk.
const QUICK_DEPTHS: [usize; 2] = [32, 256];
const BASELINE_PROGRAM: &str = programs::FP_BASELINE;

/// Section 1 and its verifier table.
pub fn section(doc: &mut String, args: &Args) {
    doc.push_str("\n## 1. BPF cost per sample and per frame\n\n");
    match bpf_cost(args) {
        Ok((filter_only, rows)) => cost_section(doc, &filter_only, &rows, args),
        Err(err) => {
            let _ = writeln!(doc, "Not measured: {err:#}.");
        }
    }
    doc.push_str("\n### Verifier\n\n");
    let known = VERIFIER.lock().ok().and_then(|mut v| v.take());
    let stats = match known {
        Some(stats) => Ok(stats),
        None => Profiler::start(FREQUENCY).map(|p| p.verifier_stats()),
    };
    match stats {
        Ok(mut stats) => {
            let _ = writeln!(
                doc,
                "Instructions processed by the verifier when loading each program on this \
                 kernel (limit 1,000,000; goal ≤ 50%):\n\n| program | instructions | share of limit |\n|---|---:|---:|"
            );
            stats.sort();
            for (name, count) in stats {
                match count {
                    Some(n) => {
                        let _ =
                            writeln!(doc, "| `{name}` | {n} | {:.2} % |", f64::from(n) / 10_000.0);
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

/// What one program did while it sampled one fixture.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct ProgramRun {
    run_time_ns: u64,
    run_count: u64,
    /// Samples of the fixture (the rest of `run_count` were other tasks, filtered out).
    pub(crate) samples: u64,
    /// Frames in the stacks the program produced, summed over `samples`.
    frames: u64,
    /// Samples whose walk was complete (the profiler only).
    complete: Option<u64>,
}

impl ProgramRun {
    /// Two windows of the same program as one.
    fn plus(&self, other: &ProgramRun) -> ProgramRun {
        ProgramRun {
            run_time_ns: self.run_time_ns + other.run_time_ns,
            run_count: self.run_count + other.run_count,
            samples: self.samples + other.samples,
            frames: self.frames + other.frames,
            complete: match (self.complete, other.complete) {
                (None, c) | (c, None) => c,
                (Some(a), Some(b)) => Some(a + b),
            },
        }
    }
    fn per_run_ns(&self) -> Option<f64> {
        ratio(self.run_time_ns as f64, self.run_count as f64)
    }
    /// Run time charged to the fixture's samples: all of it, so this is an upper bound
    /// that includes the filtering cost of the other tasks' samples.
    pub(crate) fn per_sample_ns(&self) -> Option<f64> {
        ratio(self.run_time_ns as f64, self.samples as f64)
    }
    pub(crate) fn frames_per_sample(&self) -> Option<f64> {
        ratio(self.frames as f64, self.samples as f64)
    }
    fn per_frame_ns(&self) -> Option<f64> {
        ratio(self.per_sample_ns()?, self.frames_per_sample()?)
    }
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
    /// The profiler's program without thread names (`profile_no_thread_names`).
    no_names: Result<ProgramRun>,
    /// The walker for kernels without `bpf_loop` (`profile_bounded`).
    bounded: Result<ProgramRun>,
    /// ns/sample of each A/B window: (with thread names, ns).
    name_windows: Vec<(bool, f64)>,
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

pub(crate) fn build_fixture(dir: &Path, depth: usize) -> Result<PathBuf> {
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

/// Windows of each side of the thread-name A/B per depth.
fn name_pairs(args: &Args) -> usize {
    if args.quick { 1 } else { 3 }
}

fn bpf_cost(args: &Args) -> Result<(FilterOnly, Vec<CostRow>)> {
    let _stats = BpfStats::enable()?;
    let dir = TempDir::new()?;
    let mut rows = Vec::new();
    let mut filter_only = None;
    let depths: &[usize] = if args.quick { &QUICK_DEPTHS } else { &DEPTHS };
    for &depth in depths {
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
        // The thread-name A/B and the walker without `bpf_loop` alternate their three
        // programs (ABC, CBA, …) so that a drift of the host's speed during the run
        // falls on all alike; each sums its windows.
        let pairs = name_pairs(args);
        let mut profiler: Result<ProgramRun> = Ok(ProgramRun::default());
        let mut no_names: Result<ProgramRun> = Ok(ProgramRun::default());
        let mut bounded: Result<ProgramRun> = Ok(ProgramRun::default());
        let mut name_windows = Vec::new();
        let order = [
            SampleProgram::Profile,
            SampleProgram::WithoutThreadNames,
            SampleProgram::Bounded,
        ];
        for window in 0..order.len() * pairs {
            let k = window % order.len();
            let program = if (window / order.len()).is_multiple_of(2) {
                order[k]
            } else {
                order[order.len() - 1 - k]
            };
            let total = match program {
                SampleProgram::Profile => &mut profiler,
                SampleProgram::WithoutThreadNames => &mut no_names,
                SampleProgram::Bounded => &mut bounded,
            };
            let run = measure_profiler_with(Some(fixture.pid()), args.sample_time(), program);
            if let Ok(r) = &run {
                if let Some(ns) = r.per_sample_ns()
                    && program != SampleProgram::Bounded
                {
                    name_windows.push((program == SampleProgram::Profile, ns));
                }
                progress(&format!(
                    "    window {window}, {}: {:.0} ns/sample",
                    program.name(),
                    r.per_sample_ns().unwrap_or(f64::NAN)
                ));
            }
            *total = match (std::mem::replace(total, Ok(ProgramRun::default())), run) {
                (Ok(sum), Ok(run)) => Ok(sum.plus(&run)),
                (Err(err), _) | (_, Err(err)) => Err(err),
            };
        }
        for (name, run) in [
            ("baseline", &baseline),
            ("profile", &profiler),
            ("profile, no thread names", &no_names),
            ("profile_bounded", &bounded),
        ] {
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
            no_names,
            bounded,
            name_windows,
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
    let mut targets: HashMap<&mut MapData, u32, u8> = HashMap::try_from(
        ebpf.map_mut(maps::TARGET_TGIDS)
            .context("map TARGET_TGIDS")?,
    )?;
    if let Some(pid) = pid {
        targets.insert(pid, 1, 0)?;
    }
    let (t0, n0) = program_stats(&ebpf, BASELINE_PROGRAM)?;
    let (s0, f0) = (
        per_cpu_sum(&ebpf, maps::FP_BASELINE_SAMPLES)?,
        per_cpu_sum(&ebpf, maps::FP_BASELINE_FRAMES)?,
    );
    thread::sleep(time);
    let (t1, n1) = program_stats(&ebpf, BASELINE_PROGRAM)?;
    let (s1, f1) = (
        per_cpu_sum(&ebpf, maps::FP_BASELINE_SAMPLES)?,
        per_cpu_sum(&ebpf, maps::FP_BASELINE_FRAMES)?,
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
/// Per program: instructions the verifier processed.
type VerifierStats = Vec<(String, Option<u32>)>;

/// Instructions the verifier processed per program, from the first profiler started
/// (loading the programs once more only for them costs seconds).
static VERIFIER: std::sync::Mutex<Option<VerifierStats>> = std::sync::Mutex::new(None);

pub(crate) fn measure_profiler(pid: Option<u32>, time: Duration) -> Result<ProgramRun> {
    measure_profiler_with(pid, time, SampleProgram::Profile)
}

fn measure_profiler_with(
    pid: Option<u32>,
    time: Duration,
    program: SampleProgram,
) -> Result<ProgramRun> {
    let mut profiler = Profiler::start_with(ProfilerConfig {
        program,
        ..ProfilerConfig::explicit(FREQUENCY)
    })
    .context("starting the profiler")?;
    if let Ok(mut v) = VERIFIER.lock() {
        v.get_or_insert_with(|| profiler.verifier_stats());
    }
    if let Some(pid) = pid {
        profiler
            .add_target(pid)
            .with_context(|| format!("adding target {pid}"))?;
    }
    // The loop runs as the command's does (lifecycle events, table loads, the runtimes'
    // recognition), first for a moment before the window.
    let pump = |profiler: &mut Profiler, d: Duration| {
        let end = std::time::Instant::now() + d;
        while std::time::Instant::now() < end {
            profiler.step();
            thread::sleep(Duration::from_millis(20));
        }
    };
    pump(&mut profiler, Duration::from_millis(300));
    let (t0, n0) = profiler
        .program_stats()
        .context("no run time for program profile")?;
    let (s0, f0, c0) = profiler_totals(&mut profiler);
    pump(&mut profiler, time);
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
         filtering cost alone. The profiler's windows alternate with windows of the same\n\
         walker without the thread name in the count keys (`profile_no_thread_names`, a\n\
         second instance of the same generic code without `bpf_get_current_comm`; the key\n\
         keeps its size), {} of each in the order ABBA…, each side's runs summed: what\n\
         recording each sample's thread costs.\n\n{}\n\n\
         Goals (issue 8): per frame ≤ 1.5× the kernel's frame-pointer walker; per sample at\n\
         32 frames ≤ 3 µs.\n",
        args.sample_time().as_secs(),
        name_pairs(args),
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
            ("`profile`, no thread names", &row.no_names),
            ("`profile_bounded` (no `bpf_loop`)", &row.bounded),
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
    let bounded: Vec<String> = rows
        .iter()
        .filter_map(|row| {
            let with_loop = row.profiler.as_ref().ok()?.per_frame_ns()?;
            let bounded = row.bounded.as_ref().ok()?.per_frame_ns()?;
            Some(format!(
                "{} frames {bounded:.1} against {with_loop:.1} ns/frame ({:.2}×)",
                row.depth,
                bounded / with_loop
            ))
        })
        .collect();
    if !bounded.is_empty() {
        let _ = writeln!(
            doc,
            "\nThe walker for kernels without `bpf_loop` (`profile_bounded`, global-function \
             calls in bounded loops; same run, windows alternated with `profile`'s; goal \
             ≤ 1.2× per frame): {}.",
            bounded.join(", ")
        );
    }
    let names: Vec<String> = rows
        .iter()
        .filter_map(|row| {
            let with = row.profiler.as_ref().ok()?.per_sample_ns()?;
            let without = row.no_names.as_ref().ok()?.per_sample_ns()?;
            let range = |names: bool| {
                let (lo, hi) = row
                    .name_windows
                    .iter()
                    .filter(|(n, _)| *n == names)
                    .fold((f64::INFINITY, 0.0f64), |(lo, hi), (_, ns)| {
                        (lo.min(*ns), hi.max(*ns))
                    });
                format!("{lo:.0}–{hi:.0}")
            };
            Some(format!(
                "{} frames {:+.0} ns ({:+.1} %; windows with names {} ns, without {} ns)",
                row.depth,
                with - without,
                (with / without - 1.0) * 100.0,
                range(true),
                range(false),
            ))
        })
        .collect();
    if !names.is_empty() {
        let _ = writeln!(
            doc,
            "\nRecording each sample's thread name (per sample, names on − off, same run): {}.",
            names.join(", ")
        );
    }
}
