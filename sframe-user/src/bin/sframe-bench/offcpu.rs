//! Section 7: off-CPU profiling. What a context switch costs with `--off-cpu` (timing
//! only, and with every sleep walked), the slowdown of a switch-bound workload, how much
//! of a fixture's known sleeping time the profile charges to its stack; and the same for
//! libbpf-tools' `offcputime` (the CO-RE build of bcc's tool) in the same run.

use std::{
    fmt::Write as _,
    io::{BufRead as _, BufReader, Write as _},
    path::Path,
    process::{Command, Stdio},
    thread,
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result, bail};
use sframe_common::{Counter, names::programs};
use sframe_user::profiler::{Profiler, ProfilerConfig};

use crate::{
    Args,
    util::{BpfStats, Fixture, TempDir, fmt_opt, ratio},
};

/// Two threads passing a byte back and forth through two pipes, `argv[1]` round trips,
/// both on CPU 0 (each round trip is two context switches, not two wake-ups of an idle
/// CPU, whose latency would hide the cost); prints the nanoseconds per round trip.
const PINGPONG_C: &str = r#"
#define _GNU_SOURCE
#include <sched.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>
static int a[2], b[2];
static long n;
__attribute__((noinline)) void pong_loop(void) {
    char c;
    for (long i = 0; i < n; i++) {
        if (read(a[0], &c, 1) != 1 || write(b[1], &c, 1) != 1) exit(3);
    }
    __asm__ volatile("");
}
void *pong(void *arg) { pong_loop(); __asm__ volatile(""); return arg; }
__attribute__((noinline)) void ping_loop(void) {
    char c = 'x';
    for (long i = 0; i < n; i++) {
        if (write(a[1], &c, 1) != 1 || read(b[0], &c, 1) != 1) exit(4);
    }
    __asm__ volatile("");
}
int main(int argc, char **argv) {
    n = argc > 1 ? atol(argv[1]) : 100000;
    if (pipe(a) || pipe(b)) return 2;
    char go;
    if (read(0, &go, 1) != 1) return 5;
    cpu_set_t one;
    CPU_ZERO(&one);
    CPU_SET(0, &one);
    if (sched_setaffinity(0, sizeof one, &one)) return 6;
    pthread_t t;
    pthread_create(&t, 0, pong, 0);
    struct timespec s, e;
    clock_gettime(CLOCK_MONOTONIC, &s);
    ping_loop();
    clock_gettime(CLOCK_MONOTONIC, &e);
    pthread_join(t, 0);
    printf("%.1f\n", ((e.tv_sec - s.tv_sec) * 1e9 + (e.tv_nsec - s.tv_nsec)) / n);
    return 0;
}
"#;

/// After a byte on stdin, two call chains sleep at once: `main → nap_loop → nap →
/// nanosleep(10 ms)`, 200 times, and, in thread `reader`, `reader_loop → wait_input →
/// read` of a pipe that thread `feeder` writes every 20 ms, 100 times. Prints the time
/// each loop spent off CPU (wall-clock less the thread's CPU time), in ns: "NAP READ".
const SLEEPER_C: &str = r#"
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>
static double clock_s(clockid_t c) {
    struct timespec t;
    clock_gettime(c, &t);
    return t.tv_sec + t.tv_nsec / 1e9;
}
static double off_cpu_since(double wall, double cpu) {
    return (clock_s(CLOCK_MONOTONIC) - wall) - (clock_s(CLOCK_THREAD_CPUTIME_ID) - cpu);
}
static int fds[2];
static double read_off;
__attribute__((noinline)) void nap(void) {
    struct timespec t = {0, 10 * 1000 * 1000};
    nanosleep(&t, 0);
    __asm__ volatile("");
}
__attribute__((noinline)) void nap_loop(int n) {
    for (int i = 0; i < n; i++) nap();
    __asm__ volatile("");
}
__attribute__((noinline)) void wait_input(void) {
    char c;
    if (read(fds[0], &c, 1) != 1) exit(3);
    __asm__ volatile("");
}
__attribute__((noinline)) void reader_loop(int n) {
    for (int i = 0; i < n; i++) wait_input();
    __asm__ volatile("");
}
void *reader(void *arg) {
    double w = clock_s(CLOCK_MONOTONIC), c = clock_s(CLOCK_THREAD_CPUTIME_ID);
    reader_loop(100);
    read_off = off_cpu_since(w, c);
    return arg;
}
void *feeder(void *arg) {
    for (int i = 0; i < 100; i++) {
        struct timespec t = {0, 20 * 1000 * 1000};
        nanosleep(&t, 0);
        if (write(fds[1], "x", 1) != 1) exit(4);
    }
    return arg;
}
int main(void) {
    char go;
    if (read(0, &go, 1) != 1 || pipe(fds)) return 5;
    pthread_t r, f;
    pthread_create(&r, 0, reader, 0);
    pthread_create(&f, 0, feeder, 0);
    double w = clock_s(CLOCK_MONOTONIC), c = clock_s(CLOCK_THREAD_CPUTIME_ID);
    nap_loop(200);
    double nap_off = off_cpu_since(w, c);
    pthread_join(r, 0);
    pthread_join(f, 0);
    printf("%.0f %.0f\n", nap_off * 1e9, read_off * 1e9);
    return 0;
}
"#;

/// The fixture's two chains: (name, the frames that mark it in a folded stack, the
/// frame that marks it in `offcputime`'s stacks).
const CHAINS: [(&str, &str, &str); 2] = [
    ("`main → nap_loop → nap`", ";main;nap_loop;nap;", "nap"),
    (
        "`reader → reader_loop → wait_input`",
        ";reader;reader_loop;wait_input;",
        "wait_input",
    ),
];

const OFFCPUTIME: &str = "/usr/sbin/offcputime";

pub fn section(doc: &mut String, args: &Args) {
    doc.push_str("\n## 7. Off CPU\n\n");
    let _ = writeln!(
        doc,
        "`--off-cpu`: `off_cpu_switch` runs at every context switch of the machine (BTF \
         tracepoint `sched_switch`; past the threshold it also takes the kernel stack); the walker, \
         `off_cpu_wake` as every `schedule()` returns (fexit) or, where the kernel cannot \
         attach that (this machine's kernel: no fexit), `off_cpu_return` at every system \
         call return (`sys_exit`), walks only for a thread that slept at least \
         `--off-cpu-min`. The \
         workload: two threads of a no-frame-pointer C program passing a byte through two \
         pipes, both on one CPU (every round trip puts both to sleep: two context \
         switches); each configuration three times, one after another, the median shown. Beside it, libbpf-tools' `offcputime` \
         (CO-RE build of bcc's tool, Debian `libbpf-tools`), `-p PID`, its defaults \
         (sleeps of 1 us and more, user and kernel stacks by frame pointers).\n"
    );
    match measure(args) {
        Ok(text) => doc.push_str(&text),
        Err(err) => {
            let _ = writeln!(doc, "Not measured: {err:#}.");
        }
    }
}

fn compile(dir: &Path, name: &str, source: &str) -> Result<std::path::PathBuf> {
    let src = dir.join(format!("{name}.c"));
    let exe = dir.join(name);
    std::fs::write(&src, source)?;
    let out = Command::new("gcc")
        .args(["-O2", "-fomit-frame-pointer", "-pthread", "-o"])
        .arg(&exe)
        .arg(&src)
        .output()
        .context("running gcc")?;
    if !out.status.success() {
        bail!("gcc: {}", String::from_utf8_lossy(&out.stderr));
    }
    Ok(exe)
}

/// Starts `exe args`, held until [`go`] writes its start byte.
fn held(exe: &Path, args: &[&str]) -> Result<Fixture> {
    let child = Command::new(exe)
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .with_context(|| format!("starting {}", exe.display()))?;
    Ok(Fixture { child })
}

/// Lets the held fixture run and returns the numbers it prints.
fn go(f: &mut Fixture) -> Result<Vec<f64>> {
    f.child
        .stdin
        .take()
        .context("stdin")?
        .write_all(b"g")
        .context("starting the fixture")?;
    let mut line = String::new();
    BufReader::new(f.child.stdout.take().context("stdout")?).read_line(&mut line)?;
    let _ = f.child.wait();
    numbers(&line)
}

fn numbers(line: &str) -> Result<Vec<f64>> {
    let v = line
        .split_whitespace()
        .map(str::parse)
        .collect::<Result<Vec<f64>, _>>()
        .with_context(|| format!("fixture printed {line:?}"))?;
    if v.is_empty() {
        bail!("fixture printed nothing");
    }
    Ok(v)
}

/// One configuration's run of the ping-pong workload.
#[derive(Default)]
struct Run {
    ns_per_round_trip: f64,
    /// (run time ns, runs) of the switch and return programs.
    switch: Option<(u64, u64)>,
    ret: Option<(u64, u64)>,
    walks: u64,
    short: u64,
}

fn pingpong(exe: &Path, round_trips: &str, off_cpu_min: Option<Duration>) -> Result<Run> {
    let mut f = held(exe, &[round_trips])?;
    let Some(min) = off_cpu_min else {
        return Ok(Run {
            ns_per_round_trip: go(&mut f)?[0],
            ..Run::default()
        });
    };
    let mut config = ProfilerConfig::explicit(99);
    config.targets.pids = vec![f.pid()];
    config.on_cpu = false;
    config.off_cpu_min = Some(min);
    let mut profiler = Profiler::start_with(config).context("starting the profiler")?;
    let before = (
        profiler.program_stats_of(programs::OFF_CPU_SWITCH),
        profiler.program_stats_of(profiler.off_cpu_walker()),
    );
    let ns = go(&mut f)?[0];
    let after = (
        profiler.program_stats_of(programs::OFF_CPU_SWITCH),
        profiler.program_stats_of(profiler.off_cpu_walker()),
    );
    let delta = |a: Option<(u64, u64)>, b: Option<(u64, u64)>| match (a, b) {
        (Some(a), Some(b)) => Some((b.0 - a.0, b.1 - a.1)),
        _ => None,
    };
    let snap = profiler.collect();
    Ok(Run {
        ns_per_round_trip: ns,
        switch: delta(before.0, after.0),
        ret: delta(before.1, after.1),
        walks: snap.counters[Counter::OffCpuWalks as usize],
        short: snap.counters[Counter::OffCpuShort as usize],
    })
}

/// Run time and count of every loaded BPF program whose name is in `names` (another
/// process's: `offcputime`'s).
fn foreign_stats(names: &[&str]) -> Option<(u64, u64)> {
    let mut total = (0u64, 0u64);
    let mut found = false;
    for info in aya::programs::loaded_programs().filter_map(Result::ok) {
        let name = info.name_as_str().unwrap_or_default().to_owned();
        if names.iter().any(|n| name == *n) {
            found = true;
            total.0 += info.run_time().as_nanos() as u64;
            total.1 += info.run_count();
        }
    }
    found.then_some(total)
}

/// What the fixture printed, `offcputime`'s output, and its program's (run time ns,
/// runs) during the fixture's run.
type ToolRun = (Vec<f64>, String, Option<(u64, u64)>);

/// `offcputime -p PID -u SECS` while the held fixture runs; its output once it ends.
fn with_offcputime(f: &mut Fixture, secs: u64) -> Result<ToolRun> {
    let tool = Command::new(OFFCPUTIME)
        .args(["-p", &f.pid().to_string(), "-u", &secs.to_string()])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .context("starting offcputime")?;
    // Attached when its program shows up (it prints nothing before the end).
    let names = ["sched_switch"];
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut before = None;
    while Instant::now() < deadline {
        before = foreign_stats(&names);
        if before.is_some() {
            break;
        }
        thread::sleep(Duration::from_millis(50));
    }
    let before = before.context("offcputime's program never appeared")?;
    let value = go(f)?;
    let after = foreign_stats(&names);
    let out = tool.wait_with_output()?;
    let stats = after.map(|a| (a.0 - before.0, a.1 - before.1));
    Ok((
        value,
        String::from_utf8_lossy(&out.stdout).into_owned(),
        stats,
    ))
}

/// offcputime's stacks of the fixture: (microseconds of stacks that contain `frame`,
/// microseconds in all).
fn offcputime_totals(text: &str, frame: &str) -> (u64, u64) {
    let (mut with, mut all) = (0, 0);
    for block in text.split("\n\n") {
        let lines: Vec<&str> = block.lines().map(str::trim).collect();
        let Some(us) = lines.last().and_then(|l| l.parse::<u64>().ok()) else {
            continue;
        };
        all += us;
        if lines.contains(&frame) {
            with += us;
        }
    }
    (with, all)
}

fn measure(args: &Args) -> Result<String> {
    let dir = TempDir::new()?;
    let pp = compile(&dir.0, "pingpong", PINGPONG_C)?;
    let sleeper = compile(&dir.0, "sleeper", SLEEPER_C)?;
    let round_trips = if args.quick { "20000" } else { "200000" };
    let _stats = BpfStats::enable()?;
    let mut out = String::new();

    // Cost per switch: the configurations one after another, three times, medians.
    let (mut base, mut timing, mut walking, mut tool) = (vec![], vec![], vec![], vec![]);
    for _ in 0..3 {
        base.push(pingpong(&pp, round_trips, None)?);
        timing.push(pingpong(&pp, round_trips, Some(Duration::from_secs(3600)))?);
        walking.push(pingpong(&pp, round_trips, Some(Duration::ZERO))?);
        if Path::new(OFFCPUTIME).exists() {
            let mut f = held(&pp, &[round_trips])?;
            tool.push(with_offcputime(&mut f, if args.quick { 3 } else { 6 })?);
        }
    }
    let median = |mut runs: Vec<Run>| -> Run {
        runs.sort_by(|a, b| a.ns_per_round_trip.total_cmp(&b.ns_per_round_trip));
        let mid = runs.len() / 2;
        runs.swap_remove(mid)
    };
    let (base, timing, walking) = (median(base), median(timing), median(walking));
    tool.sort_by(|a, b| a.0[0].total_cmp(&b.0[0]));
    let tool = (!tool.is_empty()).then(|| {
        let mid = tool.len() / 2;
        tool.swap_remove(mid)
    });
    let per = |s: Option<(u64, u64)>| s.and_then(|(t, n)| ratio(t as f64, n as f64));
    let slowdown = |ns: f64| ratio(ns, base.ns_per_round_trip).map(|r| (r - 1.0) * 100.0);
    let _ = writeln!(
        out,
        "| configuration | round trip (ns) | slowdown | switch program ns/run | walker ns/run | sleeps walked | sleeps under the threshold |\n|---|---:|---:|---:|---:|---:|---:|"
    );
    let _ = writeln!(
        out,
        "| no profiler | {:.0} | | | | | |",
        base.ns_per_round_trip
    );
    for (name, r) in [
        ("`--off-cpu-min 1h` (timing only)", &timing),
        ("`--off-cpu-min 0` (every sleep walked)", &walking),
    ] {
        let _ = writeln!(
            out,
            "| {name} | {:.0} | {} % | {} | {} | {} | {} |",
            r.ns_per_round_trip,
            fmt_opt(slowdown(r.ns_per_round_trip), 1),
            fmt_opt(per(r.switch), 0),
            fmt_opt(per(r.ret), 0),
            r.walks,
            r.short
        );
    }
    let walk_ns = match (walking.ret, timing.ret) {
        (Some((t, _)), Some((t0, n0))) if walking.walks > 0 => {
            // The return program's time beyond what its runs cost without walks.
            let base_runs = walking.ret.map_or(0, |r| r.1) as f64 * (t0 as f64 / n0.max(1) as f64);
            Some((t as f64 - base_runs).max(0.0) / walking.walks as f64)
        }
        _ => None,
    };
    match &tool {
        Some((ns, _, stats)) => {
            let ns = ns[0];
            let _ = writeln!(
                out,
                "| `offcputime -p PID` | {ns:.0} | {} % | {} | | | |",
                fmt_opt(slowdown(ns), 1),
                fmt_opt(per(*stats), 0)
            );
        }
        None => {
            let _ = writeln!(out, "| `offcputime` | not installed | | | | | |");
        }
    }
    let _ = writeln!(
        out,
        "\nA walk costs about {} ns on top of the walker's check (its time with \
         every sleep walked, less its runs at the timing-only cost, per walk). Program \
         times from `kernel.bpf_stats_enabled`; the switch program's runs are every switch \
         of the machine during the run.\n",
        fmt_opt(walk_ns, 0)
    );

    // Accuracy: a known sleeping time.
    let profiler_exe = std::env::current_exe()?.with_file_name("sframe-user");
    let folded = dir.0.join("off.folded");
    let mut child = Command::new(&profiler_exe)
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
        .arg(&folded)
        .arg("--")
        .arg("sh")
        .arg("-c")
        .arg(format!("echo g | {}", sleeper.display()))
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .with_context(|| format!("starting {}", profiler_exe.display()))?;
    let mut line = String::new();
    BufReader::new(child.stdout.take().context("stdout")?).read_line(&mut line)?;
    let status = child.wait()?;
    if !status.success() {
        bail!("sframe-user --off-cpu: {status}");
    }
    let measured = numbers(&line)?;
    let text = std::fs::read_to_string(&folded)?;
    let _ = writeln!(
        out,
        "A no-frame-pointer fixture sleeps in two call chains at once — 200 × \
         `nanosleep(10 ms)` in `main → nap_loop → nap`, and 100 `read`s of a pipe fed \
         every 20 ms in thread `reader` → `reader_loop → wait_input` — and measures each \
         loop's time off CPU (wall-clock less the thread's CPU time):\n\n| tool | chain | \
         fixture measured (ms) | charged to the chain (ms) | share |\n|---|---|---:|---:|---:|"
    );
    for (i, (name, folded_chain, _)) in CHAINS.iter().enumerate() {
        let measured_ms = measured.get(i).copied().unwrap_or(f64::NAN) / 1e6;
        let in_chain_ms: f64 = text
            .lines()
            .filter(|l| l.contains(folded_chain))
            .filter_map(|l| l.rsplit_once(' ')?.1.parse::<f64>().ok())
            .sum::<f64>()
            / 1e3;
        let _ = writeln!(
            out,
            "| sframe-user `--off-cpu` | {name} | {measured_ms:.1} | {in_chain_ms:.1} | {} % |",
            fmt_opt(ratio(in_chain_ms * 100.0, measured_ms), 1)
        );
    }
    if Path::new(OFFCPUTIME).exists() {
        let mut f = held(&sleeper, &[])?;
        let secs = if args.quick { 4 } else { 6 };
        let (measured, text, _) = with_offcputime(&mut f, secs)?;
        for (i, (name, _, frame)) in CHAINS.iter().enumerate() {
            let measured_ms = measured.get(i).copied().unwrap_or(f64::NAN) / 1e6;
            let (with_frame, all) = offcputime_totals(&text, frame);
            let _ = writeln!(
                out,
                "| `offcputime -p PID` | {name} | {measured_ms:.1} | {:.1} (its stacks: {:.1} ms in all) | {} % |",
                with_frame as f64 / 1e3,
                all as f64 / 1e3,
                fmt_opt(ratio(with_frame as f64 / 1e3 * 100.0, measured_ms), 1)
            );
        }
        let shown: Vec<&str> = text
            .split("\n\n")
            .max_by_key(|b| {
                b.lines()
                    .last()
                    .and_then(|l| l.trim().parse::<u64>().ok())
                    .unwrap_or(0)
            })
            .unwrap_or("")
            .lines()
            .map(str::trim)
            .filter(|l| !l.is_empty())
            .collect();
        let _ = writeln!(
            out,
            "\n`offcputime`'s heaviest stack of the fixture (frame pointers: the user stack \
             stops in the libc wrapper):\n\n```\n{}\n```",
            shown.join("\n")
        );
    }
    Ok(out)
}
