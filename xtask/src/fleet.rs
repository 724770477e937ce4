//! Whole-system profiling under process churn, with the release `sframe-user`:
//! - `cargo xtask soak [--minutes N]`: the profiler's RSS and kernel table bytes (from
//!   its own Prometheus metrics) over time while short processes come and go; fails if
//!   either grows between the second and the last quarter of the run.
//! - the cost table of `cargo xtask bench`: the profiler's own CPU and peak RSS when it
//!   profiles the whole machine at 19 and 99 Hz, with its BPF run time.

use std::{
    io::{BufRead as _, BufReader, Read as _, Write as _},
    net::TcpStream,
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    thread,
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result, bail};
use clap::Args;

use crate::{cmd, setup};

const CHURN_C: &str = r#"
#include <stdlib.h>
#include <time.h>
volatile unsigned long sink;
static double cpu(void) { struct timespec t; clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t); return t.tv_sec + t.tv_nsec / 1e9; }
__attribute__((noinline)) void soak_work(double secs) { double s = cpu(); while (cpu() - s < secs) for (int i = 0; i < 1000; i++) sink += i; }
int main(int argc, char **argv) { soak_work(argc > 1 ? atof(argv[1]) : 0.05); return 0; }
"#;

/// Builds the release profiler and the churn fixture; returns their paths.
pub fn prepare() -> Result<(PathBuf, PathBuf)> {
    let bin = cmd::build_sframe_user_bin("sframe-user", false)?;
    let dir = cmd::target_dir().join("soak");
    std::fs::create_dir_all(&dir)?;
    let src = dir.join("churn.c");
    std::fs::write(&src, CHURN_C)?;
    let exe = dir.join("churn");
    let mut gcc = Command::new("gcc");
    gcc.args(["-O2", "-fomit-frame-pointer", "-o"])
        .arg(&exe)
        .arg(&src);
    cmd::run(&mut gcc, "compile the churn fixture")?;
    Ok((bin, exe))
}

/// Short processes, `per_second` of them, each running `secs` of CPU, until `stop`.
fn churn(exe: &Path, per_second: f64, secs: f64, stop: Arc<AtomicBool>) -> thread::JoinHandle<u64> {
    let exe = exe.to_owned();
    thread::spawn(move || {
        let mut n = 0;
        let every = Duration::from_secs_f64(1.0 / per_second.max(0.1));
        let mut next = Instant::now();
        while !stop.load(Ordering::Relaxed) {
            if let Ok(mut c) = Command::new(&exe).arg(secs.to_string()).spawn() {
                n += 1;
                thread::spawn(move || c.wait());
            }
            next += every;
            thread::sleep(next.saturating_duration_since(Instant::now()));
        }
        n
    })
}

/// Starts the profiler with `args` plus a metrics server; returns it and the address.
fn start_profiler(bin: &Path, args: &[&str]) -> Result<(Child, String)> {
    let mut child = cmd::privileged(&bin.to_string_lossy())
        .args(args)
        .args(["--prometheus", "127.0.0.1:0"])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .context("start sframe-user")?;
    let stderr = child.stderr.take().expect("piped");
    let mut lines = BufReader::new(stderr).lines();
    let addr = loop {
        let Some(line) = lines.next() else {
            bail!("sframe-user exited before serving metrics");
        };
        let line = line?;
        eprintln!("{line}");
        if let Some(rest) = line.split("http://").nth(1) {
            break rest.trim_end_matches("/metrics").to_owned();
        }
    };
    // Keep draining its standard error.
    thread::spawn(move || lines.for_each(|l| eprintln!("{}", l.unwrap_or_default())));
    Ok((child, addr))
}

fn scrape(addr: &str) -> Result<String> {
    let mut s = TcpStream::connect(addr)?;
    s.set_read_timeout(Some(Duration::from_secs(5)))?;
    write!(s, "GET /metrics HTTP/1.0\r\nHost: {addr}\r\n\r\n")?;
    let mut out = String::new();
    s.read_to_string(&mut out)?;
    Ok(out)
}

fn metric(text: &str, name: &str) -> Option<f64> {
    text.lines()
        .find(|l| l.starts_with(name) && l[name.len()..].starts_with(' '))
        .and_then(|l| l.rsplit(' ').next()?.parse().ok())
}

fn stop(mut child: Child) -> Result<()> {
    // SAFETY: kill on our child's pid.
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    let status = child.wait()?;
    if !status.success() {
        bail!("sframe-user ended with {status}");
    }
    Ok(())
}

#[derive(Args)]
pub struct SoakArgs {
    /// Length of the run.
    #[arg(long, default_value_t = 10.0)]
    minutes: f64,
    /// Sampling frequency of the profiler.
    #[arg(long, default_value_t = 99)]
    frequency: u64,
    /// Short processes started per second.
    #[arg(long, default_value_t = 20.0)]
    rate: f64,
}

pub fn soak(args: SoakArgs) -> Result<()> {
    setup::setup()?;
    let (bin, exe) = prepare()?;
    let freq = args.frequency.to_string();
    let (profiler, addr) = start_profiler(
        &bin,
        &[
            "--all",
            "--frequency",
            &freq,
            "--max-table-memory",
            "16M",
            "--format",
            "top",
            "--top",
            "3",
        ],
    )?;
    let stop_flag = Arc::new(AtomicBool::new(false));
    let workload = churn(&exe, args.rate, 0.03, stop_flag.clone());
    let total = Duration::from_secs_f64(args.minutes * 60.0);
    let started = Instant::now();
    let mut points: Vec<(f64, f64, f64, f64)> = Vec::new();
    println!("| t (s) | profiler RSS (MiB) | kernel table bytes | processes | sampling Hz |");
    println!("|---:|---:|---:|---:|---:|");
    while started.elapsed() < total {
        thread::sleep(Duration::from_secs(10).min(total.saturating_sub(started.elapsed())));
        let text = scrape(&addr)?;
        let rss = metric(&text, "sframe_process_resident_memory_bytes").unwrap_or(0.0);
        let table = metric(&text, "sframe_table_bytes").unwrap_or(0.0);
        let procs = metric(&text, "sframe_processes").unwrap_or(0.0);
        let hz = metric(&text, "sframe_sampling_frequency_hz").unwrap_or(0.0);
        let t = started.elapsed().as_secs_f64();
        println!(
            "| {t:.0} | {:.1} | {table:.0} | {procs:.0} | {hz:.0} |",
            rss / 1048576.0
        );
        points.push((t, rss, table, procs));
    }
    stop_flag.store(true, Ordering::Relaxed);
    let spawned = workload.join().unwrap_or(0);
    stop(profiler)?;
    println!(
        "\n{spawned} processes in {:.0} s",
        started.elapsed().as_secs_f64()
    );
    let quarter = points.len() / 4;
    if quarter == 0 {
        bail!("run too short to compare quarters (use --minutes 2 or more)");
    }
    let median = |v: &mut Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    let second: Vec<_> = points[quarter..2 * quarter].to_vec();
    let last: Vec<_> = points[points.len() - quarter..].to_vec();
    for (name, pick) in [
        (
            "RSS",
            (|p: &(f64, f64, f64, f64)| p.1) as fn(&(f64, f64, f64, f64)) -> f64,
        ),
        ("kernel table bytes", |p| p.2),
    ] {
        let a = median(&mut second.iter().map(pick).collect());
        let b = median(&mut last.iter().map(pick).collect());
        let growth = if a > 0.0 { b / a } else { 1.0 };
        println!("{name}: median {a:.0} in the second quarter, {b:.0} in the last ({growth:.2}×)");
        if growth > 1.25 {
            bail!("{name} grew {growth:.2}× under churn");
        }
    }
    Ok(())
}

/// One measured run of whole-system profiling: the profiler's CPU (percent of one CPU),
/// peak RSS (MiB) and its BPF program's run time (percent of one CPU).
fn measure(bin: &Path, exe: &Path, frequency: u64, secs: f64) -> Result<(f64, f64, Option<f64>)> {
    // Two CPU-bound processes (every sample is a user stack to walk) and churn.
    let spinners: Vec<Child> = (0..2)
        .map(|_| Command::new(exe).arg((secs + 5.0).to_string()).spawn())
        .collect::<std::io::Result<_>>()?;
    let stop_flag = Arc::new(AtomicBool::new(false));
    let workload = churn(exe, 10.0, 0.02, stop_flag.clone());
    let mut child = cmd::privileged(&bin.to_string_lossy())
        .args(["--all", "--no-cache", "--max-overhead", "100", "--top", "1"])
        .args([
            "--frequency",
            &frequency.to_string(),
            "--duration",
            &secs.to_string(),
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()?;
    let mut stderr = String::new();
    child
        .stderr
        .take()
        .expect("piped")
        .read_to_string(&mut stderr)?;
    let mut status = 0;
    // SAFETY: wait4 on our child with valid out-pointers.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    let pid = unsafe { libc::wait4(child.id() as i32, &mut status, 0, &mut usage) };
    stop_flag.store(true, Ordering::Relaxed);
    let _ = workload.join();
    for mut s in spinners {
        let _ = s.kill();
        let _ = s.wait();
    }
    if pid < 0 || !libc::WIFEXITED(status) || libc::WEXITSTATUS(status) != 0 {
        bail!("sframe-user failed: {stderr}");
    }
    let tv = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    let cpu = tv(usage.ru_utime) + tv(usage.ru_stime);
    let bpf_ms = stderr.lines().find_map(|l| {
        l.split("runs, ")
            .nth(1)?
            .strip_suffix(" ms")?
            .parse::<f64>()
            .ok()
    });
    Ok((
        100.0 * cpu / secs,
        usage.ru_maxrss as f64 / 1024.0,
        bpf_ms.map(|ms| 100.0 * ms / 1000.0 / secs),
    ))
}

/// The "profiler's own cost" table of the bench report (markdown).
pub fn whole_system_table(quick: bool) -> Result<String> {
    let (bin, exe) = prepare()?;
    let secs = if quick { 3.0 } else { 30.0 };
    let runs = if quick { 1 } else { 3 };
    let mut out = String::from(
        "\n## Whole-system profiling: the profiler's own cost\n\n\
         Method: the release `sframe-user --all --no-cache --max-overhead 100` (governor\n\
         measuring only) runs for the stated time while two CPU-bound fixtures (no frame\n\
         pointers) keep both CPUs busy and 10 short processes a second come and go;\n\
         its user+system CPU and peak RSS from `wait4`, its BPF program's run time from\n\
         `bpf_stats`. Medians of the runs, min–max in brackets. Startup (loading the\n\
         tables of every sampled process, without the disk cache) is included.\n\n\
         | frequency | runs × s | user-space CPU (% of one CPU) | BPF (% of one CPU) | peak RSS (MiB) |\n\
         |---:|---:|---:|---:|---:|\n",
    );
    for frequency in [19, 99] {
        let mut cpu = Vec::new();
        let mut rss = Vec::new();
        let mut bpf = Vec::new();
        for _ in 0..runs {
            let (c, r, b) = measure(&bin, &exe, frequency, secs)?;
            cpu.push(c);
            rss.push(r);
            bpf.extend(b);
        }
        let fmt = |v: &mut Vec<f64>| {
            if v.is_empty() {
                return "not measured".to_owned();
            }
            v.sort_by(f64::total_cmp);
            format!("{:.2} [{:.2}–{:.2}]", v[v.len() / 2], v[0], v[v.len() - 1])
        };
        out += &format!(
            "| {frequency} Hz | {runs} × {secs:.0} | {} | {} | {} |\n",
            fmt(&mut cpu),
            fmt(&mut bpf),
            fmt(&mut rss)
        );
    }
    Ok(out)
}
