//! The profiler: `sframe-user --pid PID ...`.

use std::{
    collections::HashMap,
    fmt::Write as _,
    io::Write as _,
    path::PathBuf,
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result, bail};
use clap::{Args, ValueEnum};
use sframe_common::{Counter, WalkOutcome};
use sframe_user::{
    procfs::{self, Mapping},
    profiler::{Profiler, Snapshot, symbolization_addresses},
    symbolize::Symbolizer,
};

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Format {
    /// The hottest stacks, symbolized, with totals per walk outcome.
    Top,
    /// One line per distinct stack: `comm;outermost;...;leaf COUNT` (flame graph input).
    Folded,
}

#[derive(Args, Debug)]
pub struct ProfileArgs {
    /// Process to profile, all its threads (repeatable).
    #[arg(long = "pid", value_name = "PID")]
    pub pids: Vec<u32>,
    /// Stop after this many seconds (default: run until Ctrl-C).
    #[arg(long, value_name = "SECS")]
    pub duration: Option<f64>,
    /// Sampling frequency in Hz (cpu-clock, every CPU).
    #[arg(long, default_value_t = 99, value_parser = clap::value_parser!(u64).range(1..=10_000))]
    pub frequency: u64,
    /// Output format.
    #[arg(long, value_enum, default_value_t = Format::Top)]
    pub format: Format,
    /// Write the report here instead of standard output.
    #[arg(long, value_name = "PATH")]
    pub output: Option<PathBuf>,
    /// Stacks shown by `--format top`.
    #[arg(long, default_value_t = 10)]
    pub top: usize,
}

/// A target and what is needed to symbolize it after it exits.
struct Target {
    pid: u32,
    comm: String,
    maps: Vec<Mapping>,
    alive: bool,
}

pub async fn run(args: ProfileArgs) -> Result<()> {
    if args.pids.is_empty() {
        bail!("no target: give at least one --pid PID (see --help)");
    }
    let mut profiler = Profiler::start(args.frequency).context("loading the BPF programs")?;
    let mut targets = Vec::new();
    for &pid in &args.pids {
        let report = profiler
            .add_target(pid)
            .with_context(|| format!("no process with pid {pid}"))?;
        log::info!("pid {pid}: {report:?}");
        targets.push(Target {
            pid,
            comm: comm(pid),
            maps: procfs::read_maps(pid).unwrap_or_default(),
            alive: true,
        });
    }
    let started = Instant::now();
    let deadline = args
        .duration
        .map(|s| started + Duration::from_secs_f64(s.max(0.0)));
    let mut tick = tokio::time::interval(Duration::from_millis(250));
    let mut last_refresh = Instant::now();
    let ctrl_c = tokio::signal::ctrl_c();
    tokio::pin!(ctrl_c);
    loop {
        tokio::select! {
            _ = &mut ctrl_c => break,
            _ = tick.tick() => {}
        }
        if last_refresh.elapsed() >= Duration::from_secs(1) {
            last_refresh = Instant::now();
            for t in targets.iter_mut().filter(|t| t.alive) {
                // New libraries (dlopen), exec: re-read the maps. Objects already loaded
                // cost only a lookup.
                match profiler.refresh(t.pid) {
                    Ok(_) => {
                        if let Ok(m) = procfs::read_maps(t.pid) {
                            t.maps = m;
                        }
                    }
                    Err(_) => {
                        eprintln!("sframe-user: pid {} exited; its samples are kept", t.pid);
                        t.alive = false;
                    }
                }
            }
            for pid in profiler.adopt_children() {
                log::info!("following child process {pid}");
                targets.push(Target {
                    pid,
                    comm: comm(pid),
                    maps: procfs::read_maps(pid).unwrap_or_default(),
                    alive: true,
                });
            }
            // Keep the kernel maps from filling up in long runs.
            profiler.collect();
        }
        if targets.iter().all(|t| !t.alive) {
            eprintln!("sframe-user: every target has exited");
            break;
        }
        if deadline.is_some_and(|d| Instant::now() >= d) {
            break;
        }
    }
    let snap = profiler.collect();
    let elapsed = started.elapsed();
    let stacks = symbolize(&profiler, &snap, &targets);
    let text = match args.format {
        Format::Folded => folded(&stacks),
        Format::Top => top(&stacks, &snap, elapsed, args.top),
    };
    match &args.output {
        Some(path) => {
            std::fs::write(path, text).with_context(|| format!("writing {}", path.display()))?
        }
        None => std::io::stdout().write_all(text.as_bytes())?,
    }
    Ok(())
}

fn comm(pid: u32) -> String {
    std::fs::read_to_string(format!("/proc/{pid}/comm"))
        .map(|s| s.trim().to_owned())
        .unwrap_or_else(|_| format!("pid{pid}"))
}

/// One distinct stack: frame names outermost first, with its count and outcome.
struct NamedStack {
    comm: String,
    pid: u32,
    frames: Vec<String>,
    count: u64,
    outcome: WalkOutcome,
}

fn symbolize(profiler: &Profiler, snap: &Snapshot, targets: &[Target]) -> Vec<NamedStack> {
    let mut sym = Symbolizer::new();
    let by_pid: HashMap<u32, &Target> = targets.iter().map(|t| (t.pid, t)).collect();
    let mut merged: HashMap<(u32, Vec<String>, u32), u64> = HashMap::new();
    for c in &snap.counts {
        let Some(target) = by_pid.get(&c.key.pid) else {
            continue;
        };
        let user = profiler.stack(c.key.user_stack).unwrap_or(&[]);
        let mut frames: Vec<String> = sym
            .symbolize_user(c.key.pid, &target.maps, &symbolization_addresses(user))
            .iter()
            .rev()
            .flat_map(|f| f.folded_names())
            .collect();
        if c.key.kernel_stack >= 0
            && let Some(kernel) = profiler.kernel_stack(c.key.kernel_stack)
        {
            frames.extend(
                sym.symbolize_kernel(&symbolization_addresses(kernel))
                    .iter()
                    .rev()
                    .map(|f| format!("{}_[k]", f.folded_name())),
            );
        }
        *merged
            .entry((c.key.pid, frames, c.key.outcome))
            .or_default() += c.count;
    }
    let mut out: Vec<NamedStack> = merged
        .into_iter()
        .map(|((pid, frames, outcome), count)| NamedStack {
            comm: by_pid.get(&pid).map(|t| t.comm.clone()).unwrap_or_default(),
            pid,
            frames,
            count,
            outcome: WalkOutcome::try_from(outcome).unwrap_or(WalkOutcome::Truncated),
        })
        .collect();
    out.sort_by(|a, b| b.count.cmp(&a.count).then_with(|| a.frames.cmp(&b.frames)));
    out
}

fn folded(stacks: &[NamedStack]) -> String {
    let mut lines: HashMap<String, u64> = HashMap::new();
    for s in stacks {
        let mut line = s.comm.replace([';', ' '], "_");
        for f in &s.frames {
            line.push(';');
            line.push_str(&f.replace(';', ":"));
        }
        *lines.entry(line).or_default() += s.count;
    }
    let mut lines: Vec<_> = lines.into_iter().collect();
    lines.sort();
    let mut out = String::new();
    for (line, count) in lines {
        let _ = writeln!(out, "{line} {count}");
    }
    out
}

fn top(stacks: &[NamedStack], snap: &Snapshot, elapsed: Duration, n: usize) -> String {
    let total: u64 = stacks.iter().map(|s| s.count).sum();
    let mut out = String::new();
    let _ = writeln!(
        out,
        "{total} samples in {:.1} s ({} in kernel mode)",
        elapsed.as_secs_f64(),
        snap.counters[Counter::SamplesInKernel as usize]
    );
    let _ = writeln!(out, "\nwalk outcomes:");
    for o in WalkOutcome::ALL {
        let count = snap.outcomes[o as usize];
        if count > 0 {
            let pct = 100.0 * count as f64 / total.max(1) as f64;
            let _ = writeln!(out, "  {:<22} {count:>8}  {pct:5.1}%", o.name());
        }
    }
    let _ = writeln!(
        out,
        "frames: {} from tables, {} from frame pointers",
        snap.counters[Counter::FramesFromTable as usize],
        snap.counters[Counter::FramesFromFramePointer as usize]
    );
    for (i, s) in stacks.iter().take(n).enumerate() {
        let pct = 100.0 * s.count as f64 / total.max(1) as f64;
        let _ = writeln!(
            out,
            "\n#{} {} samples ({pct:.1}%) {} pid {} [{}]",
            i + 1,
            s.count,
            s.comm,
            s.pid,
            s.outcome.name()
        );
        for f in s.frames.iter().rev() {
            let _ = writeln!(out, "    {f}");
        }
    }
    out
}
