//! Section 4: overhead on the profiled workload. The C workload runs a fixed number of
//! rounds and reports its own wall time, unprofiled, under this profiler and under
//! `perf record --call-graph dwarf`, the configurations interleaved round by round.

use std::{
    fmt::Write as _,
    fs,
    io::{Read as _, Write as _},
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    thread,
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result, bail};
use sframe_user::profiler::{Profiler, ProfilerConfig, TargetSpec};

use crate::{
    Args, fixtures, progress,
    util::{TempDir, fmt_stats, median, one_line},
};

/// The calibration run doubles its rounds until it lasts this long.
const CALIBRATION_SECS: f64 = 0.2;
/// perf's user stack copy per sample (its default for `--call-graph dwarf`).
const PERF_STACK_BYTES: u32 = 8192;
/// Goal of issue 8 at 99 Hz.
const GOAL_SLOWDOWN_PERCENT: f64 = 1.0;

#[derive(Clone, Copy, PartialEq, Eq)]
enum Tool {
    None,
    Profiler(u64),
    PerfDwarf(u64),
}

impl Tool {
    fn name(self) -> String {
        match self {
            Tool::None => "unprofiled (baseline)".into(),
            Tool::Profiler(hz) => format!("this profiler, {hz} Hz"),
            Tool::PerfDwarf(hz) => format!("`perf record --call-graph dwarf`, {hz} Hz"),
        }
    }
}

const TOOLS: [Tool; 5] = [
    Tool::None,
    Tool::Profiler(99),
    Tool::Profiler(999),
    Tool::PerfDwarf(99),
    Tool::PerfDwarf(999),
];

struct Measured {
    rounds: u64,
    /// Each run of the fixed work, per tool, one entry per interleaved round (`None`:
    /// that run failed).
    runs: Vec<Vec<Option<Run>>>,
    /// Why a tool could not be measured (first error).
    errors: Vec<Option<String>>,
}

pub fn section(doc: &mut String, args: &Args) {
    let reps = if args.quick { 1 } else { 7 };
    let target = if args.quick { 0.3 } else { 3.0 };
    let _ = writeln!(
        doc,
        "\n## 4. Overhead on the profiled workload\n\n\
         Method: gcc builds a C workload (`-O2 -fomit-frame-pointer`: `main` → `w0` → … →\n\
         `w{}` → `leaf`, the leaf mixing arithmetic with `memcpy` calls into libc). It waits\n\
         for a byte on its standard input, runs a fixed number of rounds (calibrated to about\n\
         {target} s unprofiled) and prints their wall-clock time; throughput is rounds per\n\
         second. Each configuration is set up before the byte is sent (tables loaded, events\n\
         attached and enabled), so only the work is timed:\n\n\
         - *this profiler*: `Profiler::start_with` with the workload as `--pid` target, as\n\
         \x20 the `sframe-user` command builds it (governor off, so the rate stays fixed), its\n\
         \x20 loop (lifecycle events, `maintain` and `collect` once a second) running in this\n\
         \x20 process meanwhile;\n\
         - *perf*: `perf record -e cpu-clock --call-graph dwarf,{PERF_STACK_BYTES} -F HZ -p PID`\n\
         \x20 writing to a temporary file, started with its events disabled and enabled\n\
         \x20 through `--control` (acknowledged) before the byte is sent; perf's own CPU while\n\
         \x20 it writes its data competes with the workload as it does in real use.\n\n\
         The {} configurations run interleaved (A B C D E, A B C D E, …), {reps} rounds. Ratios\n\
         are taken within a round (each run against the same round's unprofiled run), then\n\
         the median (min–max) over rounds; *slowdown* is 1 − the median throughput ratio,\n\
         *CPU overhead* the median CPU ratio − 1.\n\n\
         Goals (issue 8): ≤ {GOAL_SLOWDOWN_PERCENT} % slowdown at 99 Hz; less than perf dwarf at every rate.\n",
        fixtures::C_CHAIN - 1,
        TOOLS.len(),
    );
    // The profile program's own run time, beside the noisier whole-process figures.
    let stats = crate::util::BpfStats::enable();
    if let Err(err) = &stats {
        progress(&format!("  no bpf_stats: {err:#}"));
    }
    match measure(args, reps, target) {
        Ok(m) => table(doc, &m),
        Err(err) => {
            let _ = writeln!(doc, "Not measured: {}.", one_line(&format!("{err:#}")));
        }
    }
}

fn measure(args: &Args, reps: usize, target_secs: f64) -> Result<Measured> {
    let dir = TempDir::new()?;
    let exe = fixtures::c_workload(&dir.0, "overhead_c")?;
    let mut probe = 1000;
    let per_round = loop {
        let secs = run_once(&exe, probe, Tool::None, &dir.0)?.wall;
        if secs >= CALIBRATION_SECS || probe > 1 << 40 {
            break secs / probe as f64;
        }
        probe *= 2;
    };
    let rounds = ((target_secs / per_round).ceil() as u64).max(1);
    progress(&format!(
        "  {rounds} rounds per run ({:.2} µs per round unprofiled)",
        per_round * 1e6
    ));
    let _ = args;
    let mut m = Measured {
        rounds,
        runs: vec![Vec::new(); TOOLS.len()],
        errors: vec![None; TOOLS.len()],
    };
    for rep in 0..reps {
        for (i, &tool) in TOOLS.iter().enumerate() {
            match run_once(&exe, rounds, tool, &dir.0) {
                Ok(r) => {
                    progress(&format!(
                        "  round {}: {}: {:.3} s wall, {:.3} s CPU + {:.3} s tool CPU",
                        rep + 1,
                        tool.name(),
                        r.wall,
                        r.cpu,
                        r.tool_cpu
                    ));
                    m.runs[i].push(Some(r));
                }
                Err(err) => {
                    progress(&format!("  round {}: {}: {err:#}", rep + 1, tool.name()));
                    m.errors[i].get_or_insert_with(|| format!("{err:#}"));
                    // Keep rounds aligned with the baseline's.
                    m.runs[i].push(None);
                }
            }
        }
    }
    Ok(m)
}

/// The workload, blocked on its standard input until `go`.
struct Workload {
    child: Child,
    /// `wait4` reaped it: its pid may belong to another process now.
    reaped: bool,
}

impl Workload {
    fn start(exe: &Path, rounds: u64) -> Result<Self> {
        let child = Command::new(exe)
            .args(["--rounds", &rounds.to_string()])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .with_context(|| format!("starting {}", exe.display()))?;
        Ok(Self {
            child,
            reaped: false,
        })
    }

    fn go(&mut self) -> Result<()> {
        let mut stdin = self.child.stdin.take().context("workload stdin")?;
        stdin.write_all(b"g").context("starting the workload")?;
        Ok(())
    }

    /// Waits for the end of the work; `tick` runs about every second meanwhile. Returns
    /// the wall seconds the workload reported and its user + system CPU seconds.
    fn finish(mut self, mut tick: impl FnMut()) -> Result<(f64, f64)> {
        let mut last = Instant::now();
        loop {
            if let Some((status, cpu)) = wait4(&self.child, libc::WNOHANG)? {
                self.reaped = true;
                let mut out = String::new();
                self.child
                    .stdout
                    .take()
                    .context("workload stdout")?
                    .read_to_string(&mut out)?;
                if !libc::WIFEXITED(status) || libc::WEXITSTATUS(status) != 0 {
                    bail!("the workload failed (wait status {status:#x})");
                }
                let ns: f64 = out
                    .trim()
                    .parse()
                    .with_context(|| format!("workload output {out:?}"))?;
                return Ok((ns / 1e9, cpu));
            }
            if last.elapsed() >= Duration::from_secs(1) {
                tick();
                last = Instant::now();
            }
            thread::sleep(Duration::from_millis(5));
        }
    }
}

impl Drop for Workload {
    fn drop(&mut self) {
        if !self.reaped {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// `wait4` on `child`: its wait status and user + system CPU seconds once it has exited
/// (`None` with `WNOHANG` while it runs).
fn wait4(child: &Child, options: i32) -> Result<Option<(i32, f64)>> {
    let mut status = 0;
    // SAFETY: zeroed rusage is a valid out-parameter.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: wait4 on our own child with valid out-pointers.
    let pid = unsafe { libc::wait4(child.id() as i32, &mut status, options, &mut usage) };
    match pid {
        0 => Ok(None),
        p if p < 0 => Err(std::io::Error::last_os_error()).context("wait4"),
        _ => Ok(Some((status, cpu_secs(&usage)))),
    }
}

fn cpu_secs(usage: &libc::rusage) -> f64 {
    let tv = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    tv(usage.ru_utime) + tv(usage.ru_stime)
}

/// User + system CPU seconds of process `pid` so far (`/proc/PID/stat`, clock ticks).
fn process_cpu(pid: u32) -> Result<f64> {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat"))
        .with_context(|| format!("reading /proc/{pid}/stat"))?;
    // Fields after the command name (which may hold spaces) in parentheses.
    let rest = stat.rsplit_once(')').map_or("", |(_, r)| r);
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let ticks = |i: usize| fields.get(i).and_then(|f| f.parse::<f64>().ok());
    // utime and stime are fields 14 and 15 of the line, 12 and 13 after the name.
    let (Some(utime), Some(stime)) = (ticks(11), ticks(12)) else {
        bail!("unexpected /proc/{pid}/stat: {stat}");
    };
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as f64;
    Ok((utime + stime) / hz)
}

/// CPU seconds of the calling thread so far.
fn thread_cpu() -> f64 {
    // SAFETY: zeroed rusage is a valid out-parameter.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: getrusage with a valid out-pointer.
    unsafe { libc::getrusage(libc::RUSAGE_THREAD, &mut usage) };
    cpu_secs(&usage)
}

/// One run of the fixed work.
#[derive(Clone, Copy)]
struct Run {
    /// Wall seconds the workload reported.
    wall: f64,
    /// The workload's user + system CPU seconds (BPF programs run in its context).
    cpu: f64,
    /// The tool's own CPU seconds from `go` to the end of the work (perf's process,
    /// from `/proc/PID/stat`; the thread running the profiler's loop).
    tool_cpu: f64,
    /// The `profile` program's run time over the work (`bpf_stats`; this profiler only).
    bpf_secs: Option<f64>,
}

/// One run of the fixed work under `tool`.
fn run_once(exe: &Path, rounds: u64, tool: Tool, dir: &Path) -> Result<Run> {
    let mut w = Workload::start(exe, rounds)?;
    let pid = w.child.id();
    match tool {
        Tool::None => {
            w.go()?;
            let (wall, cpu) = w.finish(|| {})?;
            Ok(Run {
                wall,
                cpu,
                tool_cpu: 0.0,
                bpf_secs: None,
            })
        }
        Tool::Profiler(hz) => {
            let mut config = ProfilerConfig::explicit(hz);
            config.targets = TargetSpec {
                pids: vec![pid],
                ..TargetSpec::default()
            };
            let mut profiler = Profiler::start_with(config).context("starting the profiler")?;
            let cpu0 = thread_cpu();
            let bpf0 = profiler.program_stats();
            w.go()?;
            let (wall, cpu) = w.finish(|| {
                profiler.step();
                profiler.collect();
            })?;
            let snap = profiler.collect();
            let tool_cpu = thread_cpu() - cpu0;
            let bpf_secs = match (bpf0, profiler.program_stats()) {
                (Some((t0, _)), Some((t1, _))) if t1 > t0 => Some((t1 - t0) as f64 / 1e9),
                _ => None,
            };
            let samples = snap.counters[sframe_common::Counter::Samples as usize];
            if samples == 0 {
                bail!("the profiler took no sample of the workload");
            }
            Ok(Run {
                wall,
                cpu,
                tool_cpu,
                bpf_secs,
            })
        }
        Tool::PerfDwarf(hz) => {
            let perf = PerfControlled::start(pid, hz, dir)?;
            let perf_pid = perf.child.id();
            let cpu0 = process_cpu(perf_pid)?;
            w.go()?;
            let (wall, cpu) = w.finish(|| {})?;
            // Read at once: perf then writes its build-ids and exits, after the work.
            let tool_cpu = process_cpu(perf_pid)? - cpu0;
            perf.finish()?;
            Ok(Run {
                wall,
                cpu,
                tool_cpu,
                bpf_secs: None,
            })
        }
    }
}

/// `perf record` started with its events disabled, enabled through its control fifo.
struct PerfControlled {
    child: Child,
    reaped: bool,
    data: PathBuf,
    fifos: [PathBuf; 2],
}

fn mkfifo(path: &Path) -> Result<()> {
    let _ = fs::remove_file(path);
    let status = Command::new("mkfifo")
        .arg(path)
        .status()
        .context("running mkfifo")?;
    if !status.success() {
        bail!("mkfifo {} failed", path.display());
    }
    Ok(())
}

impl PerfControlled {
    fn start(pid: u32, hz: u64, dir: &Path) -> Result<Self> {
        let data = dir.join("overhead-perf.data");
        let ctl = dir.join("perf-ctl.fifo");
        let ack = dir.join("perf-ack.fifo");
        mkfifo(&ctl)?;
        mkfifo(&ack)?;
        let mut control = OsArg::from("fifo:");
        control.push(&ctl);
        control.push(",");
        control.push(&ack);
        let child = Command::new("perf")
            .args(["record", "-q", "-e", "cpu-clock", "-F", &hz.to_string()])
            .arg("--call-graph")
            .arg(format!("dwarf,{PERF_STACK_BYTES}"))
            .args(["-D", "-1", "--control"])
            .arg(&control)
            .arg("-o")
            .arg(&data)
            .args(["-p", &pid.to_string()])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .context("starting perf record")?;
        let mut me = Self {
            child,
            reaped: false,
            data,
            fifos: [ctl, ack],
        };
        me.enable()?;
        Ok(me)
    }

    /// Sends `enable` and waits for perf's `ack` (fails if perf exits first).
    fn enable(&mut self) -> Result<()> {
        let (ctl, ack) = (self.fifos[0].clone(), self.fifos[1].clone());
        let (tx, rx) = std::sync::mpsc::channel();
        // Opening a fifo blocks until perf opens the other end: on a thread, so that a
        // perf that dies early is noticed.
        thread::spawn(move || {
            let result = (|| -> std::io::Result<String> {
                fs::OpenOptions::new()
                    .write(true)
                    .open(&ctl)?
                    .write_all(b"enable\n")?;
                let mut answer = [0u8; 4];
                fs::File::open(&ack)?.read_exact(&mut answer)?;
                Ok(String::from_utf8_lossy(&answer).into_owned())
            })();
            let _ = tx.send(result);
        });
        let started = Instant::now();
        loop {
            match rx.recv_timeout(Duration::from_millis(20)) {
                Ok(Ok(answer)) if answer.starts_with("ack") => return Ok(()),
                Ok(Ok(answer)) => bail!("perf answered {answer:?} to enable"),
                Ok(Err(err)) => bail!("perf control fifo: {err}"),
                Err(_) => {}
            }
            if let Some(status) = self.child.try_wait()? {
                bail!("perf record exited before recording ({status})");
            }
            if started.elapsed() > Duration::from_secs(30) {
                bail!("perf record did not enable its events within 30 s");
            }
        }
    }

    /// perf stops by itself when the process it records exits; returns its CPU
    /// seconds (setup and post-processing included).
    fn finish(mut self) -> Result<f64> {
        let (status, cpu) = wait4(&self.child, 0)?.context("perf record did not end")?;
        self.reaped = true;
        let bytes = fs::metadata(&self.data).map_or(0, |m| m.len());
        if !libc::WIFEXITED(status) || libc::WEXITSTATUS(status) != 0 || bytes == 0 {
            bail!("perf record ended with wait status {status:#x}, {bytes} bytes of data");
        }
        Ok(cpu)
    }
}

impl Drop for PerfControlled {
    fn drop(&mut self) {
        if !self.reaped {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
        let _ = fs::remove_file(&self.data);
        for f in &self.fifos {
            let _ = fs::remove_file(f);
        }
    }
}

type OsArg = std::ffi::OsString;

fn table(doc: &mut String, m: &Measured) {
    let _ = writeln!(
        doc,
        "{} rounds per run. *Wall*: the workload's own timing, throughput = rounds / wall\n\
         seconds. *CPU*: the workload's user + system CPU seconds (`wait4`; the BPF programs\n\
         and perf's stack copies run in its context) plus the tool's own while the work ran\n\
         (perf's process from `/proc/PID/stat`, in 10 ms ticks; the profiler loop's thread\n\
         from `getrusage(RUSAGE_THREAD)`), divided by the\n\
         same round's unprofiled workload CPU: less sensitive than wall time to the other\n\
         tasks of this shared machine, which delay the workload without using its CPU time.\n\n\
         *BPF ÷ workload CPU*: the `profile` program's run time over the work\n\
         (`kernel.bpf_stats_enabled`; its runs for other tasks' samples, filtered out,\n\
         included) divided by the workload's CPU time: the walker's own share, without the\n\
         noise of the figures around it (the sampling interrupt itself is not included).\n\n\
         | configuration | wall s | rounds/s | throughput × baseline | slowdown (wall) | CPU × baseline | CPU overhead | BPF ÷ workload CPU | goal |\n\
         |---|---:|---:|---:|---:|---:|---:|---:|---|",
        m.rounds
    );
    let base = &m.runs[0];
    let ratios = |i: usize, f: &dyn Fn(&Run, &Run) -> f64| -> Vec<f64> {
        base.iter()
            .zip(&m.runs[i])
            .filter_map(|(b, r)| Some(f(b.as_ref()?, r.as_ref()?)))
            .filter(|x| x.is_finite())
            .collect()
    };
    let throughput = |i: usize| ratios(i, &|b, r| b.wall / r.wall);
    let cpu = |i: usize| ratios(i, &|b, r| (r.cpu + r.tool_cpu) / b.cpu);
    let pct_of = |v: &[f64], f: &dyn Fn(f64) -> f64| (!v.is_empty()).then(|| f(median(v)) * 100.0);
    let slow: Vec<Option<f64>> = (0..TOOLS.len())
        .map(|i| pct_of(&throughput(i), &|x| 1.0 - x))
        .collect();
    let over: Vec<Option<f64>> = (0..TOOLS.len())
        .map(|i| pct_of(&cpu(i), &|x| x - 1.0))
        .collect();
    let fmt_pct = |v: Option<f64>| v.map_or_else(|| "–".into(), |s| format!("{s:.1} %"));
    for (i, tool) in TOOLS.iter().enumerate() {
        let ok: Vec<Run> = m.runs[i].iter().flatten().copied().collect();
        if ok.is_empty() {
            let why = m.errors[i].as_deref().unwrap_or("no run");
            let _ = writeln!(
                doc,
                "| {} | not measured: {} ||||||||",
                tool.name(),
                one_line(why)
            );
            continue;
        }
        let wall: Vec<f64> = ok.iter().map(|r| r.wall).collect();
        let rate: Vec<f64> = ok.iter().map(|r| m.rounds as f64 / r.wall).collect();
        let goal = match *tool {
            Tool::None => String::new(),
            Tool::Profiler(hz) => {
                let perf = TOOLS.iter().position(|t| *t == Tool::PerfDwarf(hz));
                let mut g = Vec::new();
                for (what, mine, theirs) in [
                    (
                        "wall",
                        spread(&throughput(i), true),
                        perf.map(|j| spread(&throughput(j), true)),
                    ),
                    (
                        "CPU",
                        spread(&cpu(i), false),
                        perf.map(|j| spread(&cpu(j), false)),
                    ),
                ] {
                    let Some(mine) = mine else { continue };
                    let mut parts = Vec::new();
                    if hz == 99 {
                        let limit = Spread::at(GOAL_SLOWDOWN_PERCENT);
                        parts.push(format!(
                            "≤ {GOAL_SLOWDOWN_PERCENT} % {}",
                            mine.below(&limit)
                        ));
                    }
                    if let Some(Some(theirs)) = theirs {
                        parts.push(format!("< perf {}", mine.below(&theirs)));
                    }
                    g.push(format!("{what}: {}", parts.join(", ")));
                }
                g.join("; ")
            }
            Tool::PerfDwarf(_) => "(reference)".into(),
        };
        let (tp, cp) = if *tool == Tool::None {
            ("1".to_string(), "1".to_string())
        } else {
            (fmt_stats(&throughput(i), 3), fmt_stats(&cpu(i), 3))
        };
        let bpf: Vec<f64> = ok
            .iter()
            .filter_map(|r| Some(100.0 * r.bpf_secs? / r.cpu))
            .collect();
        let bpf = if bpf.is_empty() {
            "–".to_string()
        } else {
            format!("{} %", fmt_stats(&bpf, 2))
        };
        let _ = writeln!(
            doc,
            "| {} | {} | {} | {tp} | {} | {cp} | {} | {bpf} | {goal} |",
            tool.name(),
            fmt_stats(&wall, 3),
            fmt_stats(&rate, 0),
            fmt_pct(slow[i]),
            fmt_pct(over[i]),
        );
    }
    for (i, tool) in TOOLS.iter().enumerate() {
        if let Some(err) = &m.errors[i]
            && m.runs[i].iter().any(Option::is_some)
        {
            let _ = writeln!(
                doc,
                "\nSome runs of {} failed: {}.",
                tool.name(),
                one_line(err)
            );
        }
    }
}

/// A cost in percent over the rounds: median, least and most.
struct Spread {
    median: f64,
    min: f64,
    max: f64,
}

impl Spread {
    fn at(x: f64) -> Self {
        Self {
            median: x,
            min: x,
            max: x,
        }
    }

    /// Whether this cost is below `other`'s: "met" only when every round says so,
    /// "not met" when none does, else the medians decide, marked as within the noise.
    fn below(&self, other: &Spread) -> String {
        if self.max < other.min {
            "met".into()
        } else if self.min >= other.max {
            "not met".into()
        } else {
            format!(
                "{} by the medians, within the rounds' spread",
                if self.median < other.median {
                    "met"
                } else {
                    "not met"
                }
            )
        }
    }
}

/// Cost in percent from per-round ratios: a slowdown (1 − throughput ratio) or an
/// overhead (CPU ratio − 1).
fn spread(ratios: &[f64], slowdown: bool) -> Option<Spread> {
    let mut v: Vec<f64> = ratios
        .iter()
        .map(|r| {
            if slowdown {
                (1.0 - r) * 100.0
            } else {
                (r - 1.0) * 100.0
            }
        })
        .collect();
    let (median, min, max) = crate::util::stats(&mut v)?;
    Some(Spread { median, min, max })
}
