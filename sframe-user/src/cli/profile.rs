//! The profiler: `sframe-user --pid PID ...`.

use std::{
    collections::HashMap,
    path::Path,
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result, bail};
use clap::Args;
use sframe_common::{RawSample, sample::SAMPLE_FLAG_FROM_KERNEL};
use sframe_user::{
    procfs,
    sampler::{RawSampler, Scope},
};

#[derive(Args, Debug)]
pub struct ProfileArgs {
    /// Process to profile (repeatable).
    #[arg(long = "pid", value_name = "PID")]
    pub pids: Vec<u32>,
    /// Stop after this many seconds (default: run until Ctrl-C).
    #[arg(long, value_name = "SECS")]
    pub duration: Option<f64>,
    /// Sampling frequency in Hz (cpu-clock).
    #[arg(long, default_value_t = 99, value_parser = clap::value_parser!(u64).range(1..=100_000))]
    pub frequency: u64,
    /// How many of the hottest addresses to print.
    #[arg(long, default_value_t = 20)]
    pub top: usize,
}

pub async fn run(cli: ProfileArgs) -> Result<()> {
    if cli.pids.is_empty() {
        bail!("no target: give at least one --pid PID (see --help)");
    }
    for &pid in &cli.pids {
        if !Path::new(&format!("/proc/{pid}")).exists() {
            bail!("no process with pid {pid}");
        }
    }
    let mut sampler = RawSampler::load().context("loading the BPF programs")?;
    for &pid in &cli.pids {
        sampler.add_target(pid)?;
        sampler.attach(Scope::Process { pid }, cli.frequency)?;
    }
    let started = Instant::now();
    let deadline = cli
        .duration
        .map(|s| started + Duration::from_secs_f64(s.max(0.0)));
    let mut samples = Vec::new();
    let mut tick = tokio::time::interval(Duration::from_millis(100));
    let ctrl_c = tokio::signal::ctrl_c();
    tokio::pin!(ctrl_c);
    let mut maps = HashMap::new();
    loop {
        tokio::select! {
            _ = &mut ctrl_c => break,
            _ = tick.tick() => {}
        }
        sampler.drain(&mut samples);
        for &pid in &cli.pids {
            // Keep the last good maps of each target to symbolize after it exits.
            match procfs::read_maps(pid) {
                Ok(m) => {
                    maps.insert(pid, m);
                }
                Err(_)
                    if maps.contains_key(&pid) || !Path::new(&format!("/proc/{pid}")).exists() => {}
                Err(err) => log::warn!("{err}"),
            }
        }
        let alive = cli
            .pids
            .iter()
            .any(|p| Path::new(&format!("/proc/{p}")).exists());
        if !alive {
            eprintln!("sframe-user: every target process has exited; reporting what was sampled");
            break;
        }
        if deadline.is_some_and(|d| Instant::now() >= d) {
            break;
        }
    }
    sampler.drain(&mut samples);
    report(&samples, &maps, started.elapsed(), cli.top);
    Ok(())
}

fn report(
    samples: &[RawSample],
    maps: &HashMap<u32, Vec<procfs::Mapping>>,
    elapsed: Duration,
    top: usize,
) {
    println!(
        "{} samples in {:.1} s",
        samples.len(),
        elapsed.as_secs_f64()
    );
    let in_kernel = samples
        .iter()
        .filter(|s| s.flags & SAMPLE_FLAG_FROM_KERNEL != 0)
        .count();
    println!("{in_kernel} samples hit kernel mode (user registers from the task)");
    let mut per_thread: HashMap<(u32, u32), usize> = HashMap::new();
    let mut per_location: HashMap<String, usize> = HashMap::new();
    for s in samples {
        *per_thread.entry((s.pid, s.tid)).or_default() += 1;
        let location = maps
            .get(&s.pid)
            .and_then(|m| procfs::find(m, s.ip))
            .map(|m| {
                let name = Path::new(&m.path)
                    .file_name()
                    .map(|n| n.to_string_lossy().into_owned())
                    .unwrap_or_else(|| m.path.clone());
                format!("[{name}+{:#x}]", s.ip - m.start + m.offset)
            })
            .unwrap_or_else(|| format!("[unknown {:#x}]", s.ip));
        *per_location.entry(location).or_default() += 1;
    }
    let mut threads: Vec<_> = per_thread.into_iter().collect();
    threads.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
    println!("\nsamples per thread:");
    for ((pid, tid), n) in threads {
        println!("  pid {pid} tid {tid}: {n}");
    }
    let mut locations: Vec<_> = per_location.into_iter().collect();
    locations.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
    println!("\nhottest user instruction addresses:");
    for (location, n) in locations.into_iter().take(top) {
        println!("  {n:8}  {location}");
    }
}
