//! The profiler: `sframe-user --pid PID ...`.

use std::{
    io::{IsTerminal as _, Write as _},
    net::SocketAddr,
    path::{Path, PathBuf},
    time::{Duration, Instant, SystemTime},
};

use anyhow::{Context as _, Result, bail};
use clap::Args;
use sframe_user::{
    export::{
        self, Format, Profile, TargetInfo,
        prometheus::{self, Feed, Metrics, server},
        snapshot_delta, timestamped_path,
    },
    procfs,
    profiler::{Profiler, Snapshot},
    symbolize::Symbolizer,
};

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
    /// Write one file per interval of this many seconds, named after `--output` with
    /// the interval's start time (UTC) before the extension (`flame-20250102T030405Z.svg`).
    #[arg(long, value_name = "SECS", requires = "output")]
    pub interval: Option<f64>,
    /// Stacks shown by `--format top`.
    #[arg(long, default_value_t = 10)]
    pub top: usize,
    /// Serve Prometheus metrics (OpenMetrics text) on GET http://ADDR/metrics, e.g.
    /// 127.0.0.1:9464. Nothing listens unless this is given.
    #[arg(long, value_name = "ADDR")]
    pub prometheus: Option<SocketAddr>,
    /// Stack series per process exported to Prometheus (the others are summed into
    /// `stack="[other]"`).
    #[arg(long, value_name = "K", default_value_t = 100)]
    pub prometheus_top_k: usize,
}

/// A target and whether it still runs.
struct Target {
    info: TargetInfo,
    alive: bool,
}

impl Target {
    fn new(pid: u32) -> Self {
        Self {
            info: TargetInfo {
                pid,
                comm: comm(pid),
                maps: procfs::read_maps(pid).unwrap_or_default(),
            },
            alive: true,
        }
    }
}

/// The Prometheus side of a run.
struct Exporter {
    metrics: Metrics,
    feed: Feed,
    exposition: server::Exposition,
    server: tokio::task::JoinHandle<()>,
}

/// The `--interval` state: the counts at the start of the current interval.
struct Intervals {
    every: Duration,
    base: PathBuf,
    started: Instant,
    started_at: SystemTime,
    previous: Snapshot,
}

pub async fn run(args: ProfileArgs) -> Result<()> {
    if args.pids.is_empty() {
        bail!("no target: give at least one --pid PID (see --help)");
    }
    if args.output.is_none() && args.format.is_binary() && std::io::stdout().is_terminal() {
        bail!(
            "--format {} is binary: give --output PATH or redirect standard output",
            args.format.name()
        );
    }
    let interval = match args.interval {
        Some(s) if !(s >= 1.0 && s.is_finite()) => bail!("--interval must be at least 1 second"),
        Some(s) => Some(Duration::from_secs_f64(s)),
        None => None,
    };
    let mut profiler = Profiler::start(args.frequency).context("loading the BPF programs")?;
    let mut targets = Vec::new();
    for &pid in &args.pids {
        let report = profiler
            .add_target(pid)
            .with_context(|| format!("no process with pid {pid}"))?;
        log::info!("pid {pid}: {report:?}");
        targets.push(Target::new(pid));
    }
    let mut exporter = match args.prometheus {
        Some(addr) => {
            let listener = server::bind(addr).await?;
            let local = listener.local_addr().unwrap_or(addr);
            eprintln!("sframe-user: serving metrics on http://{local}/metrics");
            let exposition = server::Exposition::default();
            let metrics =
                Metrics::new(args.prometheus_top_k, prometheus::WINDOW, prometheus::GRACE);
            exposition.set(metrics.render());
            Some(Exporter {
                server: tokio::spawn(server::serve(listener, exposition.clone())),
                metrics,
                feed: Feed::default(),
                exposition,
            })
        }
        None => None,
    };
    let mut symbolizer = Symbolizer::new();
    let started = Instant::now();
    let started_at = SystemTime::now();
    let mut intervals = interval.map(|every| Intervals {
        every,
        base: args.output.clone().unwrap_or_default(),
        started,
        started_at,
        previous: Snapshot::default(),
    });
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
                // A zombie still has a /proc entry, with no mappings: keep the last
                // mappings read, to symbolize its samples.
                let maps = profiler
                    .refresh(t.info.pid)
                    .ok()
                    .map(|report| report.maps)
                    .filter(|m| !m.is_empty());
                match maps {
                    Some(m) => t.info.maps = m,
                    None => {
                        eprintln!(
                            "sframe-user: pid {} exited; its samples are kept",
                            t.info.pid
                        );
                        t.alive = false;
                        if let Some(e) = &mut exporter {
                            e.metrics.exited(t.info.pid, Instant::now());
                        }
                    }
                }
            }
            for pid in profiler.adopt_children() {
                log::info!("following child process {pid}");
                targets.push(Target::new(pid));
            }
            // Keep the kernel maps from filling up in long runs.
            let snap = profiler.collect();
            if let Some(e) = &mut exporter {
                let infos: Vec<TargetInfo> = targets.iter().map(|t| t.info.clone()).collect();
                e.feed.update(
                    &mut e.metrics,
                    Instant::now(),
                    &profiler,
                    &snap,
                    &infos,
                    &mut symbolizer,
                );
                e.exposition.set(e.metrics.render());
            }
            if let Some(iv) = &mut intervals
                && iv.started.elapsed() >= iv.every
            {
                write_interval(iv, &profiler, &snap, &targets, &mut symbolizer, &args)?;
            }
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
    if let Some(e) = exporter.take() {
        e.server.abort();
    }
    if let Some(iv) = &mut intervals {
        return write_interval(iv, &profiler, &snap, &targets, &mut symbolizer, &args);
    }
    let infos: Vec<TargetInfo> = targets.into_iter().map(|t| t.info).collect();
    let profile = Profile::build(
        &profiler,
        &snap,
        &infos,
        &mut symbolizer,
        started_at,
        started.elapsed(),
        args.frequency,
    );
    match &args.output {
        Some(path) => write_file(path, &profile, &args),
        None => {
            let mut out = std::io::stdout().lock();
            export::write(&profile, args.format, args.top, &mut out)?;
            out.flush()?;
            Ok(())
        }
    }
}

/// Writes the samples of the interval that ends now to its own file.
fn write_interval(
    iv: &mut Intervals,
    profiler: &Profiler,
    snap: &Snapshot,
    targets: &[Target],
    symbolizer: &mut Symbolizer,
    args: &ProfileArgs,
) -> Result<()> {
    let delta = snapshot_delta(snap, &iv.previous);
    let infos: Vec<TargetInfo> = targets.iter().map(|t| t.info.clone()).collect();
    let profile = Profile::build(
        profiler,
        &delta,
        &infos,
        symbolizer,
        iv.started_at,
        iv.started.elapsed(),
        args.frequency,
    );
    let path = timestamped_path(&iv.base, iv.started_at);
    write_file(&path, &profile, args)?;
    eprintln!("sframe-user: wrote {}", path.display());
    iv.previous = snap.clone();
    iv.started = Instant::now();
    iv.started_at = SystemTime::now();
    Ok(())
}

fn write_file(path: &Path, profile: &Profile, args: &ProfileArgs) -> Result<()> {
    let mut buf = Vec::new();
    export::write(profile, args.format, args.top, &mut buf)?;
    std::fs::write(path, buf).with_context(|| format!("writing {}", path.display()))
}

fn comm(pid: u32) -> String {
    std::fs::read_to_string(format!("/proc/{pid}/comm"))
        .map(|s| s.trim().to_owned())
        .unwrap_or_else(|_| format!("pid{pid}"))
}
