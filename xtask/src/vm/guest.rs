//! The tests that run inside each kernel of the matrix (`xtask vm-guest`, started by the
//! guest's `/init`; on the host kernel, started directly).
//!
//! Each test starts a workload, starts the release `sframe-user` on it, waits until the
//! workload has used a given amount of **its own CPU time** (not wall-clock time: under
//! emulation everything is slow, and on a busy host the workload may barely run), scrapes
//! the profiler's Prometheus endpoint, stops the profiler with SIGINT and checks its
//! report: the workload's stacks must be complete and equal to the call chain the
//! fixture builds. Results go to standard output as `SFRAME-VM: ...` lines, which the
//! host reads from the serial console.

use std::{
    collections::HashMap,
    io::{BufRead as _, BufReader, Read as _, Write as _},
    net::TcpStream,
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    sync::mpsc,
    thread,
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result, bail};
use clap::Args;

#[derive(Args)]
pub struct GuestArgs {
    /// The release sframe-user binary.
    #[arg(long)]
    profiler: PathBuf,
    /// The directory of the compiled fixtures.
    #[arg(long)]
    fixtures: PathBuf,
    /// Workload CPU seconds each test profiles.
    #[arg(long, default_value_t = 2.0)]
    cpu_seconds: f64,
    /// Wall-clock seconds after which a test is failed (a safety net only: the tests
    /// wait for CPU time, and under emulation 1 s of guest CPU takes several).
    #[arg(long, default_value_t = 240)]
    limit_seconds: u64,
    /// Only the tests whose name contains this.
    #[arg(long)]
    only: Option<String>,
    /// Share of the short-lived processes' samples that must be complete (lifecycle).
    /// On the host 0.9 holds (98-100 % measured). The guests pass 0.8: under emulation
    /// a child whose exec and dynamic loading outrun the profiler's reload loses its
    /// first samples (95-98 % measured in the x86-64 and arm64 guests with stack
    /// naming off the event loop; one child is about 6 % of the samples).
    #[arg(long, default_value_t = 0.9)]
    lifecycle_min_complete: f64,
    /// Share of those samples that must be through the children's chain (lifecycle):
    /// each child also starts up (ld.so), dlopens and reads the clock, a share of its
    /// life that emulation and a loaded host stretch (host 90 %; guests 72-83 % quiet,
    /// 29-51 % under `cargo xtask stress`, the lowest on arm64 where ld.so's start-up
    /// took most of each child's samples); the guests pass 0.15, half the lowest. That
    /// share is start-up's, not the unwinder's: the samples in the dlopen'd library
    /// itself must be 95 % complete through the chain everywhere (99.5-100 % measured
    /// on 6.1, x86-64 and arm64).
    #[arg(long, default_value_t = 0.6)]
    lifecycle_min_chain: f64,
}

/// Prefix of every line the host parses.
pub const TAG: &str = "SFRAME-VM:";

pub fn guest(args: GuestArgs) -> Result<()> {
    let ctx = Ctx {
        profiler: args.profiler,
        fixtures: args.fixtures,
        cpu: args.cpu_seconds,
        limit: Duration::from_secs(args.limit_seconds),
        lifecycle_min_complete: args.lifecycle_min_complete,
        lifecycle_min_chain: args.lifecycle_min_chain,
    };
    let release = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    println!("{TAG} kernel {}", release.trim());
    // The kernel's per-program run time (restored at the end): the profiler prints its
    // `profile` program's runs and time when it stops, for the cost line of each kernel.
    const STATS: &str = "/proc/sys/kernel/bpf_stats_enabled";
    let stats_before = std::fs::read_to_string(STATS).unwrap_or_default();
    let _ = std::fs::write(STATS, "1");
    let result = run_tests(&ctx, args.only.as_deref());
    if !stats_before.trim().is_empty() {
        let _ = std::fs::write(STATS, stats_before.trim());
    }
    result
}

fn run_tests(ctx: &Ctx, only: Option<&str>) -> Result<()> {
    let tests: &[(&str, TestFn)] = &[
        ("programs_load", programs_load),
        ("c_sframe", c_sframe),
        ("c_eh_frame", c_eh_frame),
        ("c_frame_pointers", c_frame_pointers),
        ("cpp", cpp),
        ("python3", python3),
        ("deep_recursion", deep_recursion),
        ("kernel_mode", kernel_mode),
        ("lifecycle", lifecycle),
        ("deferred", deferred),
        ("plt_call", plt_call),
        ("pac", pac),
        ("off_cpu", off_cpu),
    ];
    let mut failed = 0;
    for (name, test) in tests {
        if only.is_some_and(|o| !name.contains(o)) {
            continue;
        }
        // Pointer authentication is AArch64's: the test does not exist elsewhere (a
        // skip is a failure under CI).
        if *name == "pac" && !cfg!(target_arch = "aarch64") {
            continue;
        }
        let started = Instant::now();
        let result = test(ctx);
        let secs = started.elapsed().as_secs_f64();
        match result {
            Ok(detail) if detail.starts_with("SKIP") => {
                println!("{TAG} test {name} skip {secs:.0}s {}", one_line(&detail));
            }
            Ok(detail) => println!("{TAG} test {name} pass {secs:.0}s {}", one_line(&detail)),
            Err(err) => {
                failed += 1;
                for line in format!("{err:#}").lines().take(80) {
                    println!("{TAG} detail {name}: {line}");
                }
                println!(
                    "{TAG} test {name} fail {secs:.0}s {}",
                    one_line(&format!("{err}"))
                );
            }
        }
        let _ = std::io::stdout().flush();
    }
    println!("{TAG} tests done, {failed} failed");
    if failed > 0 {
        bail!("{failed} VM test(s) failed");
    }
    Ok(())
}

fn one_line(s: &str) -> String {
    let s: String = s.lines().next().unwrap_or("").chars().take(300).collect();
    s
}

type TestFn = fn(&Ctx) -> Result<String>;

struct Ctx {
    profiler: PathBuf,
    fixtures: PathBuf,
    cpu: f64,
    limit: Duration,
    lifecycle_min_complete: f64,
    lifecycle_min_chain: f64,
}

impl Ctx {
    fn fixture(&self, name: &str) -> PathBuf {
        self.fixtures.join(name)
    }
}

/// Kills (and reaps) a child when dropped.
struct Guard(Child);

impl Drop for Guard {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn spawn(cmd: &mut Command) -> Result<Guard> {
    let child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .spawn()
        .with_context(|| format!("starting {}", crate::cmd::display(cmd)))?;
    Ok(Guard(child))
}

/// CPU seconds of `pid` and of its children it has waited for.
fn cpu_seconds(pid: u32) -> Option<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let rest = &stat[stat.rfind(')')? + 2..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    // After the comm: state(3) ... utime(14) stime(15) cutime(16) cstime(17).
    let ticks: u64 = f
        .get(11..15)?
        .iter()
        .filter_map(|v| v.parse::<u64>().ok())
        .sum();
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as f64;
    Some(ticks as f64 / hz)
}

/// A running profiler and the port of its metrics endpoint.
struct Profiler {
    child: Guard,
    port: u16,
    stderr: mpsc::Receiver<String>,
    log: Vec<String>,
}

fn start_profiler(ctx: &Ctx, args: &[&str]) -> Result<Profiler> {
    let mut cmd = Command::new(&ctx.profiler);
    cmd.args(args)
        .args(["--prometheus", "127.0.0.1:0", "--no-cache", "--top", "400"])
        // The checks find the workload's series by its pid (opt-in label).
        .arg("--prometheus-pid-label")
        .args(["--max-overhead", "0"])
        .env("RUST_LOG", "warn")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = cmd.spawn().context("starting sframe-user")?;
    let stderr = child.stderr.take().context("stderr")?;
    let (tx, rx) = mpsc::channel();
    thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    let mut p = Profiler {
        child: Guard(child),
        port: 0,
        stderr: rx,
        log: Vec::new(),
    };
    let deadline = Instant::now() + ctx.limit;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match p.stderr.recv_timeout(left) {
            Ok(line) => {
                if let Some(rest) = line.split("serving metrics on http://").nth(1) {
                    let addr = rest.split('/').next().unwrap_or("");
                    p.port = addr
                        .rsplit(':')
                        .next()
                        .and_then(|s| s.parse().ok())
                        .with_context(|| format!("no port in {line:?}"))?;
                    p.log.push(line);
                    return Ok(p);
                }
                p.log.push(line);
            }
            Err(_) => {
                let status = p.child.0.try_wait().ok().flatten();
                bail!(
                    "sframe-user did not start ({}):\n{}",
                    status
                        .map(|s| s.to_string())
                        .unwrap_or("still running".into()),
                    p.log.join("\n")
                );
            }
        }
    }
}

impl Profiler {
    fn scrape(&self) -> Result<String> {
        let mut s = TcpStream::connect(("127.0.0.1", self.port)).context("connect to /metrics")?;
        s.set_read_timeout(Some(Duration::from_secs(60)))?;
        s.write_all(b"GET /metrics HTTP/1.0\r\nHost: localhost\r\nAccept: text/plain\r\n\r\n")?;
        let mut body = String::new();
        s.read_to_string(&mut body)?;
        if !body.starts_with("HTTP/1.") || !body.contains(" 200 ") {
            bail!("scrape failed: {}", one_line(&body));
        }
        Ok(body)
    }

    /// SIGINT, then the report it prints.
    fn stop(mut self, limit: Duration) -> Result<Report> {
        let pid = self.child.0.id() as i32;
        // SAFETY: plain signal to our own child.
        unsafe { libc::kill(pid, libc::SIGINT) };
        let mut stdout = self.child.0.stdout.take().context("stdout")?;
        let (tx, rx) = mpsc::channel();
        thread::spawn(move || {
            let mut s = String::new();
            let _ = stdout.read_to_string(&mut s);
            let _ = tx.send(s);
        });
        let out = rx
            .recv_timeout(limit)
            .context("sframe-user did not exit after SIGINT")?;
        let status = self.child.0.wait()?;
        while let Ok(line) = self.stderr.try_recv() {
            self.log.push(line);
        }
        if !status.success() {
            bail!("sframe-user exited with {status}:\n{}", self.log.join("\n"));
        }
        let mut report = Report::parse(&out)?;
        report.log = std::mem::take(&mut self.log);
        Ok(report)
    }
}

/// Waits until `pid` (with its waited-for children) has used `secs` more CPU seconds.
fn wait_cpu(ctx: &Ctx, pid: u32, secs: f64) -> Result<()> {
    let start = cpu_seconds(pid).context("workload exited early")?;
    let deadline = Instant::now() + ctx.limit;
    loop {
        let now = cpu_seconds(pid).context("workload exited early")?;
        if now - start >= secs {
            return Ok(());
        }
        if Instant::now() > deadline {
            bail!(
                "the workload used only {:.2} of {secs} CPU seconds in {} s",
                now - start,
                ctx.limit.as_secs()
            );
        }
        thread::sleep(Duration::from_millis(100));
    }
}

#[derive(Debug)]
struct Stack {
    count: u64,
    comm: String,
    pid: u32,
    outcome: String,
    /// Innermost first, as the report prints them.
    frames: Vec<String>,
}

impl Stack {
    fn complete(&self) -> bool {
        matches!(
            self.outcome.as_str(),
            "complete" | "frame_pointer_end" | "zero_return_address"
        )
    }
    /// User frames, outermost first (kernel frames end in `_[k]`).
    fn user(&self) -> Vec<&str> {
        self.frames
            .iter()
            .rev()
            .map(String::as_str)
            .filter(|f| !f.ends_with("_[k]"))
            .collect()
    }
    fn has_kernel(&self) -> bool {
        self.frames.iter().any(|f| f.ends_with("_[k]"))
    }
    fn describe(&self) -> String {
        format!(
            "{} x [{}] {} pid {}: {}",
            self.count,
            self.outcome,
            self.comm,
            self.pid,
            self.user().join(";")
        )
    }
}

#[derive(Debug, Default)]
struct Report {
    samples: u64,
    in_kernel: u64,
    outcomes: HashMap<String, u64>,
    stacks: Vec<Stack>,
    /// Per pid: samples walked in user space (deferred) and how many were complete.
    deferred: HashMap<u32, (u64, u64)>,
    log: Vec<String>,
}

impl Report {
    fn parse(text: &str) -> Result<Self> {
        let mut r = Report::default();
        let mut lines = text.lines().peekable();
        let first = lines.next().unwrap_or("");
        // "N samples in T s (K in kernel mode)"
        r.samples = first
            .split_whitespace()
            .next()
            .and_then(|n| n.parse().ok())
            .with_context(|| format!("not a report: {first:?}"))?;
        r.in_kernel = first
            .rsplit('(')
            .next()
            .and_then(|s| s.split_whitespace().next())
            .and_then(|n| n.parse().ok())
            .unwrap_or(0);
        let mut in_outcomes = false;
        while let Some(line) = lines.next() {
            if line.starts_with("walk outcomes:") {
                in_outcomes = true;
                continue;
            }
            if in_outcomes {
                let f: Vec<&str> = line.split_whitespace().collect();
                if line.starts_with("  ") && f.len() >= 2 {
                    r.outcomes
                        .insert(f[0].to_owned(), f[1].parse().unwrap_or(0));
                    continue;
                }
                in_outcomes = false;
            }
            // "walked in user space: pid 42 comm: 17 samples, 17 complete"
            if let Some(rest) = line.strip_prefix("walked in user space: pid ") {
                let (pid, rest) = rest.split_once(' ').unwrap_or(("", ""));
                let (_, counts) = rest.rsplit_once(": ").unwrap_or(("", ""));
                let mut nums = counts
                    .split(|c: char| !c.is_ascii_digit())
                    .filter(|w| !w.is_empty())
                    .filter_map(|w| w.parse::<u64>().ok());
                if let (Ok(pid), Some(n), Some(complete)) = (pid.parse(), nums.next(), nums.next())
                {
                    r.deferred.insert(pid, (n, complete));
                }
                continue;
            }
            if let Some(rest) = line.strip_prefix('#') {
                // "#1 123 samples (12.3%) comm pid 42[ (pid 1 in its namespace)] [complete]"
                let mut words = rest.split_whitespace();
                let _rank = words.next();
                let count = words.next().and_then(|c| c.parse().ok()).unwrap_or(0);
                let after_pct = rest.split_once("%) ").map(|x| x.1).unwrap_or("");
                let (comm, pid_rest) = after_pct.rsplit_once(" pid ").unwrap_or(("", ""));
                let pid = pid_rest
                    .split_whitespace()
                    .next()
                    .and_then(|p| p.parse().ok())
                    .unwrap_or(0);
                let outcome = line
                    .rsplit_once('[')
                    .map(|x| x.1.trim_end_matches(']').to_owned())
                    .unwrap_or_default();
                let mut frames = Vec::new();
                while let Some(f) = lines.peek() {
                    if let Some(name) = f.strip_prefix("    ") {
                        frames.push(name.trim().to_owned());
                        lines.next();
                    } else {
                        break;
                    }
                }
                r.stacks.push(Stack {
                    count,
                    comm: comm.trim().to_owned(),
                    pid,
                    outcome,
                    frames,
                });
            }
        }
        Ok(r)
    }

    fn of<'a>(&'a self, which: &'a dyn Fn(&Stack) -> bool) -> impl Iterator<Item = &'a Stack> {
        self.stacks.iter().filter(move |s| which(s))
    }

    fn summary(&self, which: &dyn Fn(&Stack) -> bool) -> String {
        let mut v: Vec<&Stack> = self.of(which).collect();
        v.sort_by_key(|s| std::cmp::Reverse(s.count));
        v.iter()
            .take(12)
            .map(|s| s.describe())
            .collect::<Vec<_>>()
            .join("\n")
    }
}

/// The sum of the values of metric lines named `name` whose labels include each of
/// `labels` (`key="value"`).
fn metric(text: &str, name: &str, labels: &[&str]) -> f64 {
    text.lines()
        .filter(|l| {
            l.starts_with(name)
                && matches!(l.as_bytes().get(name.len()), Some(b'{') | Some(b' '))
                && labels.iter().all(|k| l.contains(k))
        })
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// What a workload's stacks must look like.
struct Expect<'a> {
    /// Names (substrings) that must appear in this order among the user frames,
    /// outermost first.
    chain: &'a [&'a str],
    /// The innermost user frame must contain this.
    leaf: Option<&'a str>,
    /// When set, the user frames from `main` on must be exactly a prefix of `chain`
    /// (from its `main`): no frame is missing, none is made up.
    exact_from_main: bool,
    /// Share of samples that must be complete and end at `_start`.
    min_complete: f64,
    /// Share of samples that must also hold the whole chain.
    min_chain: f64,
}

fn contains_in_order(frames: &[&str], chain: &[&str]) -> bool {
    let mut it = frames.iter();
    chain.iter().all(|want| it.any(|f| f.contains(want)))
}

fn check(report: &Report, which: &dyn Fn(&Stack) -> bool, e: &Expect) -> Result<String> {
    let total: u64 = report.of(which).map(|s| s.count).sum();
    let min_samples = 20;
    if total < min_samples {
        bail!(
            "only {total} samples of the workload (outcomes {:?}); profiler log:\n{}",
            report.outcomes,
            report.log.join("\n")
        );
    }
    let mut complete = 0;
    let mut chain = 0;
    let mut wrong = Vec::new();
    for s in report.of(which) {
        let user = s.user();
        // The bottom of a stack: the program's `_start`, or, while the dynamic loader
        // starts the program, the loader's own entry (stripped: shown by offset).
        let bottom = user
            .first()
            .is_some_and(|f| *f == "_start" || f.starts_with("[ld-linux"));
        if !s.complete() || !bottom {
            continue;
        }
        complete += s.count;
        if e.exact_from_main
            && let Some(i) = user.iter().position(|f| *f == "main")
        {
            let tail = &user[i..];
            let from = e.chain.iter().position(|c| *c == "main").unwrap_or(0);
            let want = &e.chain[from..];
            if tail.len() > want.len() || tail.iter().zip(want).any(|(a, b)| a != b) {
                wrong.push(s.describe());
                continue;
            }
        }
        if contains_in_order(&user, e.chain)
            && e.leaf
                .is_none_or(|l| user.last().is_some_and(|f| f.contains(l)))
        {
            chain += s.count;
        }
    }
    let summary = report.summary(which);
    if !wrong.is_empty() {
        bail!(
            "complete stacks that differ from the fixture's call chain {:?}:\n{}",
            e.chain,
            wrong.join("\n")
        );
    }
    let (c, h) = (complete as f64 / total as f64, chain as f64 / total as f64);
    if c < e.min_complete || h < e.min_chain {
        bail!(
            "{complete} of {total} samples complete ({:.0} %, want {:.0} %), {chain} through {:?} ({:.0} %, want {:.0} %); hottest:\n{summary}",
            100.0 * c,
            100.0 * e.min_complete,
            e.chain,
            100.0 * h,
            100.0 * e.min_chain
        );
    }
    Ok(format!(
        "{total} samples, {:.1} % complete, {:.1} % through {}",
        100.0 * c,
        100.0 * h,
        e.chain.join(";")
    ))
}

/// Profiles `workload` (started first) with `args` + `--pid PID` until it used the CPU
/// budget; returns the report and the metrics scraped just before the stop.
fn profile_pid(ctx: &Ctx, workload: &mut Command, extra: &[&str]) -> Result<(u32, Report, String)> {
    let w = spawn(workload)?;
    let pid = w.0.id().to_string();
    let mut args = vec!["--pid", pid.as_str()];
    args.extend_from_slice(extra);
    profile_run(ctx, w, &args, ctx.cpu, &[], |_| Ok(()))
}

/// The one flow of every test: the profiler started with `args` on the running workload
/// `w`, `attached(w)` once it serves its metrics, the workload's `cpu` seconds waited
/// for, the metrics scraped once they hold the workload (and each `wanted`), the profiler
/// stopped; returns the workload's pid, the report and the scrape.
fn profile_run(
    ctx: &Ctx,
    mut w: Guard,
    args: &[&str],
    cpu: f64,
    wanted: &[(&str, &str)],
    attached: impl FnOnce(&mut Guard) -> Result<()>,
) -> Result<(u32, Report, String)> {
    let pid = w.0.id();
    let p = start_profiler(ctx, args)?;
    attached(&mut w)?;
    wait_cpu(ctx, pid, cpu)?;
    let metrics = scrape_until(ctx, &p, wanted)?;
    let report = p.stop(ctx.limit)?;
    drop(w);
    Ok((pid, report, metrics))
}

/// The metrics once the exporter has published the workload. The profiler's loop
/// refreshes the page about once a second, after symbolizing the new stacks; under
/// emulation the first refresh (blazesym reading libc and the fixture's DWARF for the
/// first time) takes seconds of guest CPU, shared with the workload. Waits for it up to
/// the test's wall-clock limit; the checks then judge what was published. Also waits
/// for each `(metric, label)` in `also` to be positive.
fn scrape_until(ctx: &Ctx, p: &Profiler, also: &[(&str, &str)]) -> Result<String> {
    let deadline = Instant::now() + ctx.limit;
    loop {
        let metrics = p.scrape()?;
        // The workload's own stack series: the samples of the first second are in the
        // host's remainder (`comm="[other]"`) until the series are first planned.
        let planned = metrics.lines().any(|l| {
            l.starts_with("sframe_stack_samples_total{")
                && !l.starts_with("sframe_stack_samples_total{comm=\"[other]\"")
                && l.rsplit(' ').next().and_then(|v| v.parse::<f64>().ok()) > Some(0.0)
        });
        let published = metric(&metrics, "sframe_events_total", &["event=\"samples\""]) > 0.0
            && metrics.contains("sframe_objects_by_source{")
            && planned
            && also.iter().all(|(m, l)| metric(&metrics, m, &[l]) > 0.0);
        if published || Instant::now() > deadline {
            return Ok(metrics);
        }
        thread::sleep(Duration::from_millis(250));
    }
}

const CHAIN: &[&str] = &["main", "level1", "level2", "level3", "leaf_spin"];

/// What the chain fixtures must give: 95 % complete, 80 % through `CHAIN` ending in
/// `leaf_spin`; `exact_from_main`: nothing else below `main`.
fn chain_expect(exact_from_main: bool) -> Expect<'static> {
    Expect {
        chain: CHAIN,
        leaf: Some("leaf_spin"),
        exact_from_main,
        min_complete: 0.95,
        min_chain: 0.80,
    }
}

fn chain_test(ctx: &Ctx, exe: &str, source: &str) -> Result<String> {
    let (pid, report, metrics) = profile_pid(ctx, &mut Command::new(ctx.fixture(exe)), &[])?;
    let detail = check(&report, &|s| s.pid == pid, &chain_expect(true))?;
    let source_label = format!("source=\"{source}\"");
    let from_source = metric(&metrics, "sframe_objects_by_source", &[&source_label]);
    if from_source < 1.0 {
        bail!(
            "no object loaded from {source}:\n{}",
            metrics_lines(&metrics, "sframe_objects_by_source")
        );
    }
    let pid_label = format!("pid=\"{pid}\"");
    let scraped = metric(
        &metrics,
        "sframe_stack_samples_total",
        &[&pid_label, "main;level1;level2;level3;leaf_spin"],
    );
    if scraped < 1.0 {
        bail!(
            "the scrape has no sample of the chain:\n{}",
            metrics_lines(&metrics, "sframe_stack_samples_total")
        );
    }
    let fresh = format!("scrape: {scraped} samples of the chain, tables from {source}");
    let cost = report
        .log
        .iter()
        .find_map(|l| l.split("profile program: ").nth(1))
        .and_then(|rest| {
            // "N runs, X ms"
            let mut w = rest.split_whitespace();
            let runs: f64 = w.next()?.parse().ok()?;
            let ms: f64 = w.nth(1)?.parse().ok()?;
            (runs > 0.0).then(|| ms * 1e6 / runs)
        });
    let cost = match cost {
        Some(ns) => {
            println!("{TAG} cost {exe} {ns:.0}");
            format!("; profile program {ns:.0} ns per run")
        }
        None => String::new(),
    };
    Ok(format!("{detail}; {fresh}{cost}"))
}

fn metrics_lines(metrics: &str, name: &str) -> String {
    metrics
        .lines()
        .filter(|l| l.starts_with(name))
        .take(20)
        .collect::<Vec<_>>()
        .join("\n")
}

fn programs_load(ctx: &Ctx) -> Result<String> {
    let out = Command::new(&ctx.profiler)
        .arg("check-kernel")
        .output()
        .context("running sframe-user check-kernel")?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    let mut programs = Vec::new();
    for line in stdout.lines() {
        let f: Vec<&str> = line.split_whitespace().collect();
        if f.len() == 4 && f[0] == "program" {
            println!("{TAG} verifier {} {}", f[1], f[3]);
            programs.push(format!("{}={}", f[1], f[3]));
        }
    }
    if !out.status.success() {
        let stderr = String::from_utf8_lossy(&out.stderr);
        // The verifier's log is long; its end says what was rejected.
        let tail: Vec<&str> = stderr.lines().rev().take(60).collect();
        bail!(
            "check-kernel failed ({}): {}\n{}",
            out.status,
            programs.join(" "),
            tail.into_iter().rev().collect::<Vec<_>>().join("\n")
        );
    }
    if programs.is_empty() {
        bail!("check-kernel listed no program:\n{stdout}");
    }
    Ok(programs.join(" "))
}

fn c_sframe(ctx: &Ctx) -> Result<String> {
    chain_test(ctx, "chain_sframe", "sframe")
}

fn c_eh_frame(ctx: &Ctx) -> Result<String> {
    chain_test(ctx, "chain_eh", "eh_frame")
}

/// Code built with frame pointers: unwound by its `.eh_frame` (CFA from the frame
/// pointer), and, in a copy without any unwind table, by the frame-pointer fallback.
fn c_frame_pointers(ctx: &Ctx) -> Result<String> {
    let with_tables = chain_test(ctx, "chain_fp", "eh_frame")?;
    let (pid, report, _) = profile_pid(ctx, &mut Command::new(ctx.fixture("chain_fp_only")), &[])?;
    let fallback = check(
        &report,
        &|s| s.pid == pid,
        &chain_expect(
            // A sample in a prologue, before its frame record exists, skips the caller:
            // complete but one frame short, which only the floor below allows for.
            false,
        ),
    )?;
    Ok(format!(
        "with .eh_frame: {with_tables}; frame pointers only: {fallback}"
    ))
}

fn cpp(ctx: &Ctx) -> Result<String> {
    let (pid, report, _) = profile_pid(ctx, &mut Command::new(ctx.fixture("cpp_worker")), &[])?;
    check(
        &report,
        &|s| s.pid == pid,
        &Expect {
            chain: &["main", "Worker::run", "cpp_leaf"],
            leaf: Some("cpp_leaf"),
            exact_from_main: false,
            min_complete: 0.95,
            min_chain: 0.70,
        },
    )
}

fn python3(ctx: &Ctx) -> Result<String> {
    let Some(python) = ["/usr/bin/python3", "/usr/local/bin/python3"]
        .into_iter()
        .map(Path::new)
        .find(|p| p.exists())
    else {
        return Ok("SKIP: no python3 in this system".into());
    };
    let script = "def spin():\n    s = 0\n    for i in range(20000):\n        s += i\n    return s\n\
                  def loop():\n    while True:\n        spin()\nloop()\n";
    let (pid, report, _) = profile_pid(ctx, Command::new(python).args(["-S", "-c", script]), &[])?;
    check(
        &report,
        &|s| s.pid == pid,
        &Expect {
            // The Python frames in place of the evaluation loop's (`name (file:line)`).
            chain: &["main", "Py_RunMain", "<module> (", "loop (", "spin ("],
            leaf: None,
            exact_from_main: false,
            min_complete: 0.90,
            min_chain: 0.80,
        },
    )
}

fn deep_recursion(ctx: &Ctx) -> Result<String> {
    let (pid, report, _) = profile_pid(ctx, &mut Command::new(ctx.fixture("deep")), &[])?;
    let detail = check(
        &report,
        &|s| s.pid == pid,
        &Expect {
            chain: &["main", "recurse", "deep_spin"],
            leaf: Some("deep_spin"),
            exact_from_main: false,
            min_complete: 0.95,
            min_chain: 0.90,
        },
    )?;
    // Every complete stack holds the whole recursion: 221 frames of `recurse`.
    let depths: Vec<usize> = report
        .stacks
        .iter()
        .filter(|s| s.pid == pid && s.complete())
        .map(|s| s.user().iter().filter(|f| **f == "recurse").count())
        .collect();
    let min = depths.iter().copied().min().unwrap_or(0);
    if min < 221 {
        bail!("a complete stack has {min} recurse frames, want 221: {depths:?}");
    }
    let frames = report
        .stacks
        .iter()
        .filter(|s| s.pid == pid)
        .map(|s| s.frames.len())
        .max()
        .unwrap_or(0);
    Ok(format!("{detail}; {frames} frames"))
}

fn kernel_mode(ctx: &Ctx) -> Result<String> {
    let (pid, report, _) = profile_pid(ctx, &mut Command::new(ctx.fixture("sysloop")), &[])?;
    let detail = check(
        &report,
        &|s| s.pid == pid,
        &Expect {
            chain: &["main", "sys_loop"],
            leaf: None,
            exact_from_main: false,
            min_complete: 0.95,
            min_chain: 0.80,
        },
    )?;
    let total: u64 = report
        .stacks
        .iter()
        .filter(|s| s.pid == pid)
        .map(|s| s.count)
        .sum();
    let kernel: u64 = report
        .stacks
        .iter()
        .filter(|s| s.pid == pid && s.has_kernel() && s.complete())
        .map(|s| s.count)
        .sum();
    if (kernel as f64) < 0.2 * total as f64 || report.in_kernel == 0 {
        bail!(
            "{kernel} of {total} samples have kernel frames and a complete user stack ({} in kernel mode); hottest:\n{}",
            report.in_kernel,
            report.summary(&|s| s.pid == pid)
        );
    }
    Ok(format!("{detail}; {kernel} with kernel frames"))
}

fn lifecycle(ctx: &Ctx) -> Result<String> {
    let lib = ctx.fixture("libdlspin.so");
    // The spawner waits until the profiler has loaded it: a child forked before its
    // parent's tables were loaded gets no copy of them, and its samples taken inside
    // exec (the old image's registers) can only be unwound after the image is gone.
    let w = Guard(
        Command::new(ctx.fixture("spawner"))
            .arg(ctx.fixture("dl_child"))
            .arg(&lib)
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .spawn()
            .context("starting the spawner")?,
    );
    let pid = w.0.id().to_string();
    // The events of the children must be published too before the scrape is judged.
    let labels: Vec<String> = ["fork", "exec", "exit", "mmap"]
        .iter()
        .map(|e| format!("event=\"{e}\""))
        .collect();
    let wanted: Vec<(&str, &str)> = labels
        .iter()
        .map(|l| ("sframe_fleet_events_total", l.as_str()))
        .collect();
    // Three budgets: the first child, which starts while the profiler itself is still
    // warming up, should weigh little.
    let (_, report, metrics) =
        profile_run(ctx, w, &["--pid", &pid], 3.0 * ctx.cpu, &wanted, |w| {
            w.0.stdin
                .take()
                .context("spawner stdin")?
                .write_all(b"g")
                .context("starting the spawner's loop")
        })?;
    let detail = check(
        &report,
        &|s| s.comm == "dl_child",
        &Expect {
            chain: &["main", "run_lib", "dl_spin", "dl_leaf"],
            leaf: None,
            exact_from_main: false,
            min_complete: ctx.lifecycle_min_complete,
            // Each child also starts up (ld.so), dlopens and reads the clock: the
            // chain itself holds most of its samples, not nearly all.
            min_chain: ctx.lifecycle_min_chain,
        },
    )
    .map_err(|e| {
        // Whether the event loop fell behind the children (their exec handled after
        // they exited leaves their samples without maps).
        anyhow::anyhow!(
            "{e:#}\nlongest lifecycle event wait {:.3} s, {:.3} s in all\nprofiler log:\n{}",
            metric(&metrics, "sframe_event_lag_max_seconds", &[]),
            metric(&metrics, "sframe_event_lag_seconds_total", &[]),
            report.log.join("\n")
        )
    })?;
    // The dlopen'd library's own samples (its code at the leaf), apart from the share
    // start-up takes under emulation: each walks complete through the whole chain.
    let chain = ["main", "run_lib", "dl_spin", "dl_leaf"];
    let (mut in_lib, mut through) = (0u64, 0u64);
    for st in report.of(&|s| s.comm == "dl_child") {
        let user = st.user();
        if !user.last().is_some_and(|f| {
            f.contains("dl_leaf") || f.contains("dl_spin") || f.contains("libdlspin")
        }) {
            continue;
        }
        in_lib += st.count;
        if st.complete() && user.first() == Some(&"_start") && contains_in_order(&user, &chain) {
            through += st.count;
        }
    }
    if in_lib < 20 || (through as f64) < 0.95 * in_lib as f64 {
        bail!(
            "{through} of the {in_lib} samples in the dlopen'd library complete through {chain:?} \
             (want 95 %, of at least 20); hottest:\n{}",
            report.summary(&|s| s.comm == "dl_child")
        );
    }
    let detail = format!(
        "{detail}; in the dlopen'd library {through} of {in_lib} ({:.1} %) through the chain",
        100.0 * through as f64 / in_lib as f64
    );
    // What the incomplete ones were (the console keeps it for a passing run too).
    let incomplete = report.summary(&|s| {
        s.comm == "dl_child" && !(s.complete() && s.user().first() == Some(&"_start"))
    });
    if !incomplete.is_empty() {
        println!("SFRAME-VM: lifecycle, hottest incomplete or not from _start:\n{incomplete}");
    }
    let mut events = Vec::new();
    for event in ["fork", "exec", "exit", "mmap"] {
        let n = metric(
            &metrics,
            "sframe_fleet_events_total",
            &[&format!("event=\"{event}\"")],
        );
        if n < 1.0 {
            bail!(
                "no {event} event:\n{}",
                metrics_lines(&metrics, "sframe_fleet_events_total")
            );
        }
        events.push(format!("{event}={n}"));
    }
    Ok(format!(
        "{detail}; events {}; longest event wait {:.3} s",
        events.join(" "),
        metric(&metrics, "sframe_event_lag_max_seconds", &[])
    ))
}

fn deferred(ctx: &Ctx) -> Result<String> {
    // A process already running when whole-system profiling starts is loaded at its
    // first sample: that sample, and those until the load ends, are deferred to user
    // space and must come out complete all the same.
    let w = spawn(&mut Command::new(ctx.fixture("chain_eh")))?;
    let (pid, report, metrics) = profile_run(ctx, w, &["--all"], ctx.cpu, &[], |_| Ok(()))?;
    let detail = check(&report, &|s| s.pid == pid, &chain_expect(true)).map_err(|e| {
        anyhow::anyhow!(
            "{e:#}\nevents:\n{}\nprofiler log:\n{}",
            metrics_lines(&metrics, "sframe_events_total"),
            report.log.join("\n")
        )
    })?;
    // The workload's own deferred samples (the report lists them per process), not the
    // machine's: each one walked in user space, and complete.
    let Some(&(deferred, deferred_complete)) = report.deferred.get(&pid) else {
        bail!(
            "no deferred sample of the workload (pid {pid}); per process: {:?}\n{}",
            report.deferred,
            metrics_lines(&metrics, "sframe_events_total")
        );
    };
    if deferred_complete * 100 < deferred * 95 {
        bail!(
            "{deferred_complete} of the workload's {deferred} deferred samples complete (want 95 %)"
        );
    }
    // What the incomplete ones were (the console keeps it for a passing run too).
    let incomplete =
        report.summary(&|s| s.pid == pid && !(s.complete() && s.user().first() == Some(&"_start")));
    if !incomplete.is_empty() {
        println!("{TAG} deferred, hottest incomplete:\n{incomplete}");
    }
    let lost = metric(
        &metrics,
        "sframe_events_total",
        &["event=\"deferred_lost\""],
    );
    Ok(format!(
        "{detail}; the workload's deferred samples: {deferred_complete} of {deferred} complete; {lost} lost machine-wide"
    ))
}

fn plt_call(ctx: &Ctx) -> Result<String> {
    let (pid, report, _) = profile_pid(ctx, &mut Command::new(ctx.fixture("plt_main")), &[])?;
    check(
        &report,
        &|s| s.pid == pid,
        &Expect {
            chain: &["main", "plt_loop", "lib_work", "lib_leaf"],
            leaf: None,
            exact_from_main: false,
            min_complete: 0.95,
            min_chain: 0.80,
        },
    )
}

/// AArch64: return addresses signed with pointer authentication (`paciasp`), the walk
/// strips the code before using them.
fn pac(ctx: &Ctx) -> Result<String> {
    let exe = ctx.fixture("chain_pac");
    if !exe.exists() {
        return Ok("SKIP: pointer authentication is AArch64's".into());
    }
    let (pid, report, _) = profile_pid(ctx, &mut Command::new(exe), &[])?;
    check(&report, &|s| s.pid == pid, &chain_expect(true))
}

/// Off CPU (`--off-cpu`, raw tracepoints on `sched_switch` and `sys_exit`): the
/// fixture's 50 sleeps of 40 ms are charged to their complete stack, within 5 % of the
/// time the fixture measured off CPU (wall-clock less CPU time of its loop).
fn off_cpu(ctx: &Ctx) -> Result<String> {
    let out_path = std::env::temp_dir().join("off-cpu.folded");
    let mut child = Command::new(&ctx.profiler)
        .env(
            "RUST_LOG",
            "sframe_user=info,sframe_user::cli::profile=debug",
        )
        .args([
            "--off-cpu",
            "--no-on-cpu",
            "--no-cache",
            "--format",
            "folded",
            "--max-overhead",
            "0",
        ])
        .arg("--output")
        .arg(&out_path)
        .arg("--")
        .arg(ctx.fixture("sleeper"))
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .context("starting sframe-user")?;
    let deadline = Instant::now() + ctx.limit;
    while child.try_wait()?.is_none() {
        if Instant::now() > deadline {
            let _ = child.kill();
            let out = child.wait_with_output()?;
            bail!(
                "sframe-user did not end in {:?}:\n{}",
                ctx.limit,
                String::from_utf8_lossy(&out.stderr)
            );
        }
        thread::sleep(Duration::from_millis(100));
    }
    let out = child.wait_with_output()?;
    let stderr = String::from_utf8_lossy(&out.stderr);
    if !out.status.success() {
        bail!("sframe-user: {}:\n{stderr}", out.status);
    }
    let stdout = String::from_utf8_lossy(&out.stdout);
    let fixture_us = stdout
        .lines()
        .find_map(|l| l.strip_prefix("nap "))
        .and_then(|v| v.trim().parse::<f64>().ok())
        .with_context(|| format!("no measurement in {stdout:?}"))?
        / 1e3;
    let folded = std::fs::read_to_string(&out_path).context("the off-CPU profile")?;
    // Complete from `_start` (the guest's libc has no symbol for the frame between
    // `__libc_start_main` and `main`).
    let chain = ";main;nap_loop;nap;";
    let reported: f64 = folded
        .lines()
        .filter(|l| l.starts_with("sleeper;_start;") && l.contains(chain))
        // With the kernel stack it slept in.
        .filter(|l| l.contains("_[k];[sleep S] "))
        .filter_map(|l| l.rsplit_once(' ')?.1.parse::<f64>().ok())
        .sum();
    // Of the fixture's time off CPU, what it waited runnable may be a preemption while
    // it ran (not a sleep, not counted) or the wait after a wake-up (part of the
    // sleep, counted): the profile lies between the two, within 5 %. On a quiet
    // machine the wait is a few milliseconds; on a loaded host (the guest's vCPUs
    // descheduled, the profiler's own start-up on the same CPUs) it is what the
    // fixture measured, not a guess.
    let delay_us = stdout
        .lines()
        .find_map(|l| l.strip_prefix("delay "))
        .and_then(|v| v.trim().parse::<f64>().ok())
        .map_or(0.0, |ns| ns / 1e3)
        .min(fixture_us);
    // And of the time off CPU beyond what the sleeps asked for (each lasts at least
    // that), part is the scheduler's own path between the thread's last CPU time and
    // the switch (emulated, and stretched when the host deschedules the guest's vCPU
    // there), which the fixture counts and the profiler does not: the profile must
    // hold at least what was asked, within 5 %, or all the fixture measured if less.
    let asked_us = stdout
        .lines()
        .find_map(|l| l.strip_prefix("asked "))
        .and_then(|v| v.trim().parse::<f64>().ok())
        .with_context(|| format!("no asked time in {stdout:?}"))?
        / 1e3;
    let low = 0.95 * (fixture_us - delay_us).min(asked_us);
    let high = 1.05 * fixture_us;
    if reported < low || reported > high {
        bail!(
            "{reported:.0} us off CPU in {chain} against the {fixture_us:.0} us the fixture \
             measured ({delay_us:.0} us of it runnable, {asked_us:.0} us asked for; want \
             {low:.0}-{high:.0}):\n{folded}\n{stderr}"
        );
    }
    // Where the kernel can trace `schedule()` (x86-64; arm64 from Linux 6.4, which
    // brought ftrace direct calls there), the walk runs as it returns, not at every
    // system call's return.
    let fexit = stderr.contains("as schedule() returns (fexit)");
    let release = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    let version: Vec<u32> = release
        .split(|c: char| !c.is_ascii_digit())
        .take(2)
        .filter_map(|v| v.parse().ok())
        .collect();
    let want_fexit = cfg!(target_arch = "x86_64") || version >= vec![6, 4];
    // Debian's kernels (the matrix's guests) allow fexit as above; the host row runs on
    // whatever kernel this machine has (this CI machine's refuses fexit): either walker
    // is right there, and the report says which.
    let debian = release.contains("-cloud-");
    if debian && fexit != want_fexit {
        bail!(
            "on {} {}, the off-CPU walker is {} (want {}):\n{stderr}",
            std::env::consts::ARCH,
            release.trim(),
            if fexit { "fexit schedule" } else { "sys_exit" },
            if want_fexit {
                "fexit schedule"
            } else {
                "sys_exit"
            },
        );
    }
    Ok(format!(
        "{reported:.0} us off CPU in the chain, the fixture measured {fixture_us:.0} us \
         ({delay_us:.0} us of it runnable, {asked_us:.0} us asked for; walked {})",
        if fexit {
            "as schedule() returns"
        } else {
            "at system call returns"
        }
    ))
}
