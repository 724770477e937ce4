//! Section 9: Python frames. The BPF cost per interpreter frame beside the native
//! walker's per frame, in the same run, and what a profiled Python program pays: its
//! slowdown under `sframe-user` beside its slowdown under py-spy at the same rate.

use std::{
    fmt::Write as _,
    path::{Path, PathBuf},
    process::Command,
    thread,
    time::Duration,
};

use anyhow::{Context as _, Result, bail};

use crate::{
    Args,
    cost::{ProgramRun, build_fixture, measure_profiler},
    progress,
    util::{BpfStats, Fixture, TempDir, fmt_opt, fmt_stats, median, one_line},
};

/// Python frames of the two recursive fixtures (the recursion, its leaf and `<module>`).
const PY_FRAMES: [usize; 2] = [32, 128];
/// Sampling rate of the slowdown runs (both profilers).
const RATE: u64 = 99;

/// A Python program spinning at the bottom of a recursion of `argv[1]` frames.
const RECURSE: &str = "import sys\n\
def spin():\n    s = 0\n    while True:\n        for i in range(1000):\n            s += i\n\
def f(n):\n    if n == 0:\n        spin()\n    else:\n        f(n - 1)\n\
f(int(sys.argv[1]))\n";

/// A fixed amount of Python work; writes its own wall-clock time in seconds to the file
/// `argv[2]`.
const WORK: &str = "import sys, time\n\
def work(n):\n    s = 0\n    for i in range(n):\n        s += i * i\n    return s\n\
t = time.perf_counter()\nwork(int(sys.argv[1]))\n\
open(sys.argv[2], 'w').write(str(time.perf_counter() - t))\n";

/// The CPython the section runs: pyenv's 3.12 if there, else Debian's `python3`.
fn interpreter() -> Option<PathBuf> {
    let root = Command::new("pyenv")
        .arg("root")
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| PathBuf::from(String::from_utf8_lossy(&o.stdout).trim()))
        .or_else(|| std::env::var_os("PYENV_ROOT").map(PathBuf::from))
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".pyenv")))
        .unwrap_or_default();
    let mut found: Vec<PathBuf> = std::fs::read_dir(root.join("versions"))
        .into_iter()
        .flatten()
        .filter_map(Result::ok)
        .map(|e| e.path())
        .filter(|p| {
            p.file_name()
                .is_some_and(|n| n.to_string_lossy().starts_with("3.12."))
        })
        .collect();
    found.sort();
    found
        .pop()
        .map(|d| d.join("bin/python3"))
        .or_else(|| Some(PathBuf::from("/usr/bin/python3")).filter(|p| p.exists()))
}

/// py-spy as `cargo xtask setup` installs it (from PyPI, under the target directory).
fn py_spy() -> Option<PathBuf> {
    let exe = std::env::current_exe().ok()?;
    exe.ancestors()
        .map(|a| a.join("tools/py-spy/bin/py-spy"))
        .find(|p| p.exists())
}

pub fn section(doc: &mut String, args: &Args) {
    doc.push_str("\n## 9. Python frames\n\n");
    let Some(python) = interpreter() else {
        doc.push_str("Not measured: no CPython 3.12 (pyenv) or /usr/bin/python3.\n");
        return;
    };
    let _ = writeln!(
        doc,
        "Interpreter: `{}` (CPython frames read from the interpreter, no flag).\n",
        python.display()
    );
    match frame_cost(&python, args) {
        Ok(text) => doc.push_str(&text),
        Err(err) => {
            let _ = writeln!(doc, "Not measured: {}.", one_line(&format!("{err:#}")));
        }
    }
    match slowdown(&python, args) {
        Ok(text) => doc.push_str(&text),
        Err(err) => {
            let _ = writeln!(
                doc,
                "\nSlowdown: not measured: {}.",
                one_line(&format!("{err:#}"))
            );
        }
    }
}

/// One measure of the `profile` program on a fixture run as `cmd`.
fn measure(cmd: &mut Command, time: Duration) -> Result<ProgramRun> {
    let fixture = Fixture {
        child: cmd.spawn().context("starting the fixture")?,
    };
    // Past the interpreter's start, spinning.
    thread::sleep(Duration::from_millis(500));
    measure_profiler(Some(fixture.pid()), time)
}

fn frame_cost(python: &Path, args: &Args) -> Result<String> {
    let _stats = BpfStats::enable()?;
    let dir = TempDir::new()?;
    let script = dir.0.join("recurse.py");
    std::fs::write(&script, RECURSE)?;
    let time = args.sample_time();
    let mut py = Vec::new();
    let mut native = Vec::new();
    for &frames in &PY_FRAMES {
        progress(&format!("  Python recursion of {frames} frames"));
        // f(n) holds n + 1 frames of `f`, with `spin` and `<module>`.
        let n = frames - 3;
        py.push(measure(
            Command::new(python).arg(&script).arg(n.to_string()),
            time,
        )?);
        progress(&format!("  C chain of {frames} frames"));
        let bin = build_fixture(&dir.0, frames)?;
        native.push(measure(&mut Command::new(&bin), time)?);
    }
    let marginal = |runs: &[ProgramRun]| -> Option<f64> {
        let (a, b) = (runs.first()?, runs.get(1)?);
        let ns = b.per_sample_ns()? - a.per_sample_ns()?;
        let frames = b.frames_per_sample()? - a.frames_per_sample()?;
        (frames > 0.0).then(|| ns / frames)
    };
    let (Some(py_frame), Some(native_frame)) = (marginal(&py), marginal(&native)) else {
        bail!("no frames measured");
    };
    let mut out = String::new();
    let _ = writeln!(
        out,
        "Method: a Python program spinning at the bottom of a recursion ({} and {} Python \
         frames, with about 20 native frames of the interpreter below them), and the C chain \
         of section 1 at the same depths (native frames only), each sampled by the profiler \
         at 999 Hz for {} s (`bpf_stats`). Per frame is the marginal cost: the difference \
         of ns/sample between the two depths over the difference of frames/sample, so the \
         fixed cost of a sample (and the native frames under the Python ones) cancels out.\n",
        PY_FRAMES[0],
        PY_FRAMES[1],
        time.as_secs()
    );
    out.push_str(
        "| fixture | frames | samples | ns/sample | frames/sample |\n|---|---:|---:|---:|---:|\n",
    );
    for (kind, runs) in [("Python", &py), ("C (native)", &native)] {
        for (frames, r) in PY_FRAMES.iter().zip(runs.iter()) {
            let _ = writeln!(
                out,
                "| {kind} | {frames} | {} | {} | {} |",
                r.samples,
                fmt_opt(r.per_sample_ns(), 0),
                fmt_opt(r.frames_per_sample(), 1)
            );
        }
    }
    let ratio = py_frame / native_frame;
    let _ = writeln!(
        out,
        "\nPer frame: Python {py_frame:.1} ns, native {native_frame:.1} ns: {ratio:.2}× \
         (goal ≤ 2×: {}).",
        if ratio <= 2.0 { "met" } else { "**not met**" }
    );
    Ok(out)
}

/// Seconds the work took under `wrap` (the command line before the interpreter's), as
/// the program measured them.
fn work_seconds(wrap: &[&str], python: &Path, script: &Path, n: u64) -> Result<f64> {
    let mut cmd = match wrap.split_first() {
        Some((first, rest)) => {
            let mut c = Command::new(first);
            c.args(rest);
            c.arg(python);
            c
        }
        None => Command::new(python),
    };
    let timed = script.with_extension("seconds");
    let _ = std::fs::remove_file(&timed);
    let out = cmd
        .arg(script)
        .arg(n.to_string())
        .arg(&timed)
        .output()
        .with_context(|| format!("running {wrap:?}"))?;
    if !out.status.success() {
        bail!(
            "{wrap:?} failed: {}",
            one_line(&String::from_utf8_lossy(&out.stderr))
        );
    }
    std::fs::read_to_string(&timed)
        .ok()
        .and_then(|t| t.trim().parse().ok())
        .context("the program wrote no time")
}

fn slowdown(python: &Path, args: &Args) -> Result<String> {
    let profiler = crate::profiler_beside().context("no sframe-user beside sframe-bench")?;
    let py_spy = py_spy().context("no py-spy (cargo xtask setup installs it from PyPI)")?;
    let dir = TempDir::new()?;
    let script = dir.0.join("work.py");
    std::fs::write(&script, WORK)?;
    // About 2 s of work (1 s with --quick) on this machine kind.
    let n: u64 = if args.quick { 6_000_000 } else { 12_000_000 };
    let runs = if args.quick { 1 } else { 5 };
    let rate = RATE.to_string();
    let folded = dir.0.join("out.folded");
    let raw = dir.0.join("out.txt");
    let profiler = profiler.to_string_lossy().into_owned();
    let folded = folded.to_string_lossy().into_owned();
    let py_spy = py_spy.to_string_lossy().into_owned();
    let raw = raw.to_string_lossy().into_owned();
    let ours = [
        profiler.as_str(),
        "--no-debuginfod",
        "--frequency",
        &rate,
        "--format",
        "folded",
        "--output",
        &folded,
        "--",
    ];
    let spy = [
        py_spy.as_str(),
        "record",
        "--rate",
        &rate,
        "--format",
        "raw",
        "--output",
        &raw,
        "--",
    ];
    let mut alone = Vec::new();
    let mut with_ours = Vec::new();
    let mut with_spy = Vec::new();
    // Interleaved, so that a drift of the host's speed falls on the three alike.
    for i in 0..runs {
        progress(&format!("  slowdown run {}/{runs}", i + 1));
        alone.push(work_seconds(&[], python, &script, n)?);
        with_ours.push(work_seconds(&ours, python, &script, n)?);
        with_spy.push(work_seconds(&spy, python, &script, n)?);
    }
    let (a, o, s) = (median(&alone), median(&with_ours), median(&with_spy));
    let range = |v: &[f64]| {
        let lo = v.iter().copied().fold(f64::INFINITY, f64::min);
        let hi = v.iter().copied().fold(0.0f64, f64::max);
        (lo, hi)
    };
    let (alo, ahi) = range(&alone);
    // Run-to-run noise: the spread of the runs alone, in % of their median.
    let noise = (ahi - alo) / a * 100.0;
    let (ours_pct, spy_pct) = ((o / a - 1.0) * 100.0, (s / a - 1.0) * 100.0);
    let verdict = if ours_pct <= spy_pct {
        "met".to_owned()
    } else if ours_pct - spy_pct <= noise {
        format!(
            "not distinguishable: the difference ({:.1} points) is within the runs' own \
             spread alone ({noise:.1} %)",
            ours_pct - spy_pct
        )
    } else {
        "**not met**".to_owned()
    };
    let mut out = String::new();
    let _ = writeln!(
        out,
        "\nSlowdown: a Python loop of {n} iterations timed by itself (`perf_counter`), run \
         alone, under `sframe-user --frequency {RATE} -- python3 …` and under `py-spy record \
         --rate {RATE} -- python3 …` (py-spy's default: it pauses the process at each sample), \
         interleaved, {runs} run(s) each; median (min–max):\n\n\
         | run | seconds | slowdown (medians) |\n|---|---:|---:|\n\
         | alone | {} | |\n\
         | sframe-user | {} | {ours_pct:+.1} % |\n\
         | py-spy | {} | {spy_pct:+.1} % |\n\n\
         Goal: a lower slowdown than py-spy's at the same rate: {verdict}.",
        fmt_stats(&alone, 3),
        fmt_stats(&with_ours, 3),
        fmt_stats(&with_spy, 3),
    );
    Ok(out)
}
