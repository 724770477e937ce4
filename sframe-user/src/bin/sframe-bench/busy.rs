//! Section 6: a busy host. A load the project generates — a compile loop (gcc, and
//! rustc when present: processes that come and go mapping objects from a few MB to
//! hundreds of MB), two long-lived no-frame-pointer CPU-bound programs and a python3
//! loop, plus optional CPU hogs — runs throughout; one window per tool, of the same
//! length, one after another: nothing, `sframe-user --all` at 99 Hz, `perf record -a -g`
//! and `perf record -a --call-graph dwarf` at 99 Hz. Reported: each tool's CPU and the
//! spinners' throughput against the window without a tool; for this profiler its peak
//! and steady RSS, BPF CPU, its CPU split into collecting samples, loading tables
//! (first-sight builds) and symbolizing and exporting, kernel table memory, the sampling frequency over
//! time, samples taken against due, complete stacks for the spinners and overall, and
//! every loss counter. The same [`Load`] is `cargo xtask stress`.

use std::{
    collections::BTreeMap,
    fmt::Write as _,
    fs,
    io::{Read as _, Write as _},
    net::TcpStream,
    os::unix::fs::FileExt as _,
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    sync::{
        Arc,
        atomic::{AtomicBool, AtomicU64, Ordering},
    },
    thread,
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result, bail};

/// A no-frame-pointer spinner: `main → spin_outer → spin_middle → spin_leaf`, writing
/// its iteration count (8 bytes) at offset 0 of the file named by its argument.
const SPINNER: &str = r#"
#include <fcntl.h>
#include <unistd.h>
volatile unsigned long sink;
static int fd;
static unsigned long done;
__attribute__((noinline)) void spin_leaf(void) { for (int i = 0; i < 4096; i++) sink += i; }
__attribute__((noinline)) void spin_middle(void) {
    for (int j = 0; j < 256; j++) spin_leaf();
    done += 256;
    pwrite(fd, &done, sizeof done, 0);
}
__attribute__((noinline)) void spin_outer(void) { for (;;) spin_middle(); }
int main(int argc, char **argv) {
    if (argc < 2 || (fd = open(argv[1], O_WRONLY | O_CREAT | O_TRUNC, 0644)) < 0) return 1;
    spin_outer();
}
"#;

/// A translation unit for the compile loop: enough functions that gcc takes a while.
fn c_source(n: usize) -> String {
    let mut s = String::from("volatile unsigned long sink;\n");
    for i in 0..n {
        let _ = writeln!(
            s,
            "unsigned long f{i}(unsigned long x) {{ unsigned long a[{}]; for (int k = 0; k < {}; k++) a[k] = x * k + {i}; sink += a[x % {}]; return a[0] ^ x; }}",
            4 + i % 9,
            4 + i % 9,
            4 + i % 9
        );
    }
    s
}

fn rust_source(n: usize) -> String {
    let mut s = String::new();
    for i in 0..n {
        let _ = writeln!(
            s,
            "pub fn f{i}(v: &[u64]) -> u64 {{ v.iter().map(|x| x.wrapping_mul({i}) ^ {i}).fold(0, |a, b| a.wrapping_add(b)) }}"
        );
    }
    s
}

/// The load; stopped (every process killed) on drop.
pub struct Load {
    dir: PathBuf,
    children: Vec<Child>,
    /// The spinners' progress files.
    spinners: Vec<PathBuf>,
    stop: Arc<AtomicBool>,
    compiler: Option<thread::JoinHandle<()>>,
    /// Compile jobs finished so far.
    pub compiles: Arc<AtomicU64>,
}

impl Load {
    /// Starts the load in `dir`; `hogs` more plain CPU hogs (for `cargo xtask stress`).
    pub fn start(dir: &Path, hogs: usize) -> Result<Self> {
        fs::create_dir_all(dir)?;
        let spin_src = dir.join("busy_spin.c");
        fs::write(&spin_src, SPINNER)?;
        let spin_exe = dir.join("busy_spin");
        let ok = Command::new("gcc")
            .args(["-O2", "-fomit-frame-pointer", "-o"])
            .arg(&spin_exe)
            .arg(&spin_src)
            .status()
            .context("running gcc")?
            .success();
        if !ok {
            bail!("gcc failed on the spinner");
        }
        fs::write(dir.join("gen.c"), c_source(1500))?;
        fs::write(dir.join("gen.rs"), rust_source(400))?;
        let mut load = Self {
            dir: dir.to_owned(),
            children: Vec::new(),
            spinners: Vec::new(),
            stop: Arc::new(AtomicBool::new(false)),
            compiler: None,
            compiles: Arc::new(AtomicU64::new(0)),
        };
        for i in 0..2 {
            let progress = dir.join(format!("spin{i}.count"));
            load.children.push(
                dies_with_parent(Command::new(&spin_exe).arg(&progress))
                    .spawn()
                    .context("starting a spinner")?,
            );
            load.spinners.push(progress);
        }
        load.children.push(
            dies_with_parent(Command::new("python3").args([
                "-c",
                "import time\nwhile True:\n    sum(i * i for i in range(20000)); time.sleep(0.01)",
            ]))
            .spawn()
            .context("starting python3")?,
        );
        for _ in 0..hogs {
            load.children.push(
                dies_with_parent(Command::new("sh").args(["-c", "while :; do :; done"]))
                    .spawn()
                    .context("starting a hog")?,
            );
        }
        let rustc = Command::new("rustc")
            .arg("--version")
            .stdout(Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
        let (stop, compiles, dir) = (load.stop.clone(), load.compiles.clone(), load.dir.clone());
        load.compiler = Some(thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                let mut gcc = Command::new("gcc");
                gcc.args(["-O2", "-c", "gen.c", "-o", "gen.o"]);
                let mut jobs = vec![gcc];
                if rustc {
                    let mut r = Command::new("rustc");
                    r.args(["-O", "--crate-type", "lib", "--edition", "2021", "gen.rs"])
                        .args(["--out-dir", "rust-out"]);
                    jobs.push(r);
                }
                for mut job in jobs {
                    if stop.load(Ordering::Relaxed) {
                        break;
                    }
                    let done = job
                        .current_dir(&dir)
                        .stdout(Stdio::null())
                        .stderr(Stdio::null())
                        .status();
                    if done.is_ok_and(|s| s.success()) {
                        compiles.fetch_add(1, Ordering::Relaxed);
                    }
                }
            }
        }));
        Ok(load)
    }

    /// The spinners' iterations so far (their sum).
    pub fn spun(&self) -> u64 {
        self.spinners
            .iter()
            .map(|p| {
                let mut b = [0u8; 8];
                fs::File::open(p)
                    .and_then(|f| f.read_exact_at(&mut b, 0))
                    .map_or(0, |()| u64::from_ne_bytes(b))
            })
            .sum()
    }
}

impl Drop for Load {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        for c in &mut self.children {
            let _ = c.kill();
            let _ = c.wait();
        }
        if let Some(t) = self.compiler.take() {
            let _ = t.join();
        }
        let _ = fs::remove_dir_all(self.dir.join("rust-out"));
    }
}

/// `cargo xtask stress`: the load for `seconds` (0: until killed), with `hogs` CPU hogs.
pub fn stress(seconds: u64, hogs: usize) -> Result<()> {
    let dir = std::env::temp_dir().join(format!("sframe-stress-{}", std::process::id()));
    let load = Load::start(&dir, hogs)?;
    eprintln!(
        "stress: compile loop, 2 spinners, python3 and {hogs} hogs running{}",
        if seconds > 0 {
            format!(" for {seconds} s")
        } else {
            " until killed".into()
        }
    );
    let started = Instant::now();
    while seconds == 0 || started.elapsed() < Duration::from_secs(seconds) {
        thread::sleep(Duration::from_millis(500));
    }
    eprintln!(
        "stress: {} compile jobs done",
        load.compiles.load(Ordering::Relaxed)
    );
    drop(load);
    let _ = fs::remove_dir_all(&dir);
    Ok(())
}

/// One metric sample from an OpenMetrics text: `name{labels} value`.
pub(crate) fn metric(text: &str, series: &str) -> Option<f64> {
    text.lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' '))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
}

fn scrape(addr: &str) -> Option<String> {
    let mut s = TcpStream::connect(addr).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    s.write_all(b"GET /metrics HTTP/1.1\r\nHost: b\r\nConnection: close\r\n\r\n")
        .ok()?;
    let mut out = String::new();
    s.read_to_string(&mut out).ok()?;
    Some(out.split_once("\r\n\r\n")?.1.to_owned())
}

pub(crate) fn kb(pid: u32, field: &str) -> Option<u64> {
    fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()?
        .lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))?
        .trim()
        .trim_end_matches(" kB")
        .parse()
        .ok()
}

/// What one window measured.
#[derive(Default)]
struct Window {
    tool: &'static str,
    seconds: f64,
    /// The tool's CPU seconds (user + system, children included), when it ran.
    cpu: Option<f64>,
    spun: u64,
    /// This profiler only.
    ours: Option<Ours>,
}

#[derive(Default)]
struct Ours {
    peak_rss_kb: u64,
    /// Median RSS over the second half of the window.
    steady_rss_kb: u64,
    /// Of the steady RSS (at the same sample): anonymous memory (heap) and file pages.
    steady_anon_kb: u64,
    steady_file_kb: u64,
    /// Loading CPU in the first quarter and in the rest (seconds).
    load_first: f64,
    load_rest: f64,
    cpu_first: f64,
    cpu_rest: f64,
    bpf: f64,
    /// User-space CPU collecting samples (seconds).
    collect: f64,
    table_bytes: f64,
    /// Heap the naming thread's symbolizer keeps at the end, and its evictions.
    symbolizer_bytes: f64,
    symbolizer_evictions: f64,
    /// Sampling frequency seen at each scrape.
    frequencies: Vec<f64>,
    outcomes: BTreeMap<String, f64>,
    events: BTreeMap<String, f64>,
    fleet: BTreeMap<String, f64>,
    /// Spinner samples, and those with the whole chain.
    spinner_samples: u64,
    spinner_complete: u64,
}

fn labelled(text: &str, prefix: &str) -> BTreeMap<String, f64> {
    text.lines()
        .filter_map(|l| {
            let rest = l.strip_prefix(prefix)?;
            let (label, value) = rest.split_once("\"} ")?;
            Some((
                label.to_owned(),
                value.split_whitespace().next()?.parse().ok()?,
            ))
        })
        .collect()
}

pub(crate) fn wait_cpu(child: &mut Child) -> Result<f64> {
    let mut status = 0;
    // SAFETY: zeroed rusage is a valid out-parameter.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: wait4 on our own child with valid out-pointers.
    let pid = unsafe { libc::wait4(child.id() as i32, &mut status, 0, &mut usage) };
    if pid < 0 {
        return Err(std::io::Error::last_os_error()).context("wait4");
    }
    let tv = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    Ok(tv(usage.ru_utime) + tv(usage.ru_stime))
}

fn run_ours(exe: &Path, dir: &Path, seconds: f64) -> Result<(f64, Ours)> {
    let port = 19464 + (std::process::id() % 1000) as u16;
    let addr = format!("127.0.0.1:{port}");
    let folded = dir.join("busy.folded");
    let mut child = Command::new(exe)
        .args(["--all", "--frequency", "99", "--no-cache"])
        .args(["--prometheus", &addr, "--format", "folded", "--output"])
        .arg(&folded)
        .args(["--duration", &format!("{seconds}")])
        .stderr(Stdio::null())
        .spawn()
        .with_context(|| format!("starting {}", exe.display()))?;
    let pid = child.id();
    let started = Instant::now();
    let mut ours = Ours::default();
    let mut rss = Vec::new();
    let mut last = String::new();
    let mut first_quarter: Option<(f64, f64)> = None;
    while started.elapsed().as_secs_f64() < seconds - 0.5 {
        thread::sleep(Duration::from_secs(1));
        let t = started.elapsed().as_secs_f64();
        if let Some(r) = kb(pid, "VmRSS")
            && t >= seconds / 2.0
        {
            rss.push((
                r,
                kb(pid, "RssAnon").unwrap_or(0),
                kb(pid, "RssFile").unwrap_or(0),
            ));
        }
        if let Some(h) = kb(pid, "VmHWM") {
            ours.peak_rss_kb = ours.peak_rss_kb.max(h);
        }
        if let Some(text) = scrape(&addr) {
            if let Some(f) = metric(&text, "sframe_sampling_frequency_hz") {
                ours.frequencies.push(f);
            }
            if first_quarter.is_none() && t >= seconds / 4.0 {
                first_quarter = metric(&text, "sframe_table_load_cpu_seconds_total")
                    .zip(metric(&text, "sframe_process_cpu_seconds_total"));
            }
            last = text;
        }
    }
    let cpu = wait_cpu(&mut child)?;
    rss.sort_unstable();
    let (steady, anon, file) = rss.get(rss.len() / 2).copied().unwrap_or_default();
    (ours.steady_rss_kb, ours.steady_anon_kb, ours.steady_file_kb) = (steady, anon, file);
    // A figure the exporter did not give is not measured (not a zero): `--strict`
    // refuses the run then.
    let need = |name: &str| {
        metric(&last, name).with_context(|| format!("the profiler's last scrape lacks {name}"))
    };
    let load = need("sframe_table_load_cpu_seconds_total")?;
    let own = need("sframe_process_cpu_seconds_total")?;
    let (load_q, own_q) =
        first_quarter.context("no scrape of the profiler's CPU after the first quarter")?;
    ours.load_first = load_q;
    ours.load_rest = load - load_q;
    ours.cpu_first = own_q;
    ours.cpu_rest = own - own_q;
    ours.bpf = need("sframe_bpf_run_time_seconds_total")?;
    ours.collect = need("sframe_collection_cpu_seconds_total")?;
    ours.table_bytes = need("sframe_table_bytes")?;
    ours.symbolizer_bytes = need("sframe_symbolizer_state_bytes")?;
    ours.symbolizer_evictions = need("sframe_symbolizer_evictions_total")?;
    ours.outcomes = labelled(&last, "sframe_walk_outcomes_total{outcome=\"");
    ours.events = labelled(&last, "sframe_events_total{event=\"");
    ours.fleet = labelled(&last, "sframe_fleet_events_total{event=\"");
    let text = fs::read_to_string(&folded).unwrap_or_default();
    for line in text.lines() {
        let Some((stack, count)) = line.rsplit_once(' ') else {
            continue;
        };
        let count: u64 = count.parse().unwrap_or(0);
        if stack.starts_with("busy_spin;") && stack.contains("spin_") {
            ours.spinner_samples += count;
            if stack.contains(";main;spin_outer;spin_middle") {
                ours.spinner_complete += count;
            }
        }
    }
    Ok((cpu, ours))
}

fn run_perf(dir: &Path, seconds: f64, dwarf: bool) -> Result<f64> {
    let mut cmd = Command::new("perf");
    cmd.args(["record", "-a", "-F", "99", "-q", "-o"])
        .arg(dir.join("perf.data"));
    if dwarf {
        cmd.args(["--call-graph", "dwarf"]);
    } else {
        cmd.arg("-g");
    }
    let mut child = cmd
        .args(["--", "sleep", &format!("{seconds}")])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .context("starting perf")?;
    let cpu = wait_cpu(&mut child)?;
    let _ = fs::remove_file(dir.join("perf.data"));
    Ok(cpu)
}

/// The section; `seconds` per window.
pub fn section(doc: &mut String, seconds: f64, profiler: &Path) -> Result<()> {
    let dir = std::env::temp_dir().join(format!("sframe-busy-{}", std::process::id()));
    let load = Load::start(&dir.join("load"), 0)?;
    // The load settles (first compiles, python3 started).
    thread::sleep(Duration::from_secs(2));
    let mut windows = Vec::new();
    for tool in [
        "nothing",
        "sframe-user --all",
        "perf record -a -g",
        "perf record -a --call-graph dwarf",
    ] {
        crate::progress(&format!("  busy host: {tool} for {seconds} s"));
        let before = load.spun();
        let started = Instant::now();
        let mut w = Window {
            tool,
            ..Window::default()
        };
        match tool {
            "nothing" => thread::sleep(Duration::from_secs_f64(seconds)),
            "sframe-user --all" => {
                let (cpu, ours) = run_ours(profiler, &dir, seconds)?;
                w.cpu = Some(cpu);
                w.ours = Some(ours);
            }
            t => w.cpu = Some(run_perf(&dir, seconds, t.contains("dwarf"))?),
        }
        w.seconds = started.elapsed().as_secs_f64();
        w.spun = load.spun().saturating_sub(before);
        windows.push(w);
    }
    let compiles = load.compiles.load(Ordering::Relaxed);
    drop(load);
    let _ = fs::remove_dir_all(&dir);
    report(doc, &windows, seconds, compiles);
    Ok(())
}

fn report(doc: &mut String, windows: &[Window], seconds: f64, compiles: u64) {
    let cpus = thread::available_parallelism().map_or(1, |n| n.get()) as f64;
    let base = windows
        .first()
        .map_or(1.0, |w| w.spun as f64 / w.seconds.max(1e-9));
    let _ = writeln!(
        doc,
        "\n## 6. Busy host\n\nThe project's load (`cargo xtask stress` without hogs): a compile loop \
         (gcc on a 1,500-function C file and rustc on a 400-function crate, one after the other: \
         processes mapping `cc1` and `librustc_driver`/`libLLVM`, hundreds of MB), two long-lived \
         no-frame-pointer spinners (`main → spin_outer → spin_middle → spin_leaf`) and a python3 \
         loop, on {cpus} CPUs; one {seconds:.0} s window per tool, one after another \
         ({compiles} compile jobs in all). Spinner throughput is their iterations per second \
         against the window without a tool.\n"
    );
    let _ = writeln!(
        doc,
        "| tool | CPU (% of one) | spinner throughput |\n|---|---|---|"
    );
    for w in windows {
        let _ = writeln!(
            doc,
            "| {} | {} | {:.1} % |",
            w.tool,
            w.cpu
                .map_or("–".into(), |c| format!("{:.2} %", 100.0 * c / w.seconds)),
            100.0 * (w.spun as f64 / w.seconds.max(1e-9)) / base.max(1e-9)
        );
    }
    let Some((w, o)) = windows.iter().find_map(|w| w.ours.as_ref().map(|o| (w, o))) else {
        return;
    };
    let samples: f64 = o.outcomes.values().sum();
    let complete = o.outcomes.get("complete").copied().unwrap_or(0.0);
    let due = 99.0 * cpus * seconds;
    let freq_min = o.frequencies.iter().copied().fold(f64::INFINITY, f64::min);
    let freq_last = o.frequencies.last().copied().unwrap_or(0.0);
    let pct = |a: f64, b: f64| if b > 0.0 { 100.0 * a / b } else { 0.0 };
    let mut lines = vec![
        (
            "peak RSS".to_owned(),
            format!("{:.1} MB", o.peak_rss_kb as f64 / 1024.0),
            "≤ 128 MB",
        ),
        (
            "steady RSS (median, second half)".into(),
            format!("{:.1} MB", o.steady_rss_kb as f64 / 1024.0),
            "≤ 64 MB",
        ),
        (
            "of which anonymous (heap) / file pages".into(),
            format!(
                "{:.1} MB / {:.1} MB",
                o.steady_anon_kb as f64 / 1024.0,
                o.steady_file_kb as f64 / 1024.0
            ),
            "",
        ),
        (
            "CPU, window (first-sight table builds included)".into(),
            format!("{:.2} % of one", pct(w.cpu.unwrap_or(0.0), w.seconds)),
            "≤ 5 %",
        ),
        (
            "CPU, window, without table loading (steady state)".into(),
            format!(
                "{:.2} % of one",
                pct(
                    (w.cpu.unwrap_or(0.0) - o.load_first - o.load_rest).max(0.0),
                    w.seconds
                )
            ),
            "≤ 2 %",
        ),
        (
            "of which collecting samples / loading tables / symbolizing and exporting".into(),
            format!(
                "{:.2} % / {:.2} % / {:.2} %",
                pct(o.collect, w.seconds),
                pct(o.load_first + o.load_rest, w.seconds),
                pct(
                    (o.cpu_first + o.cpu_rest - o.collect - o.load_first - o.load_rest).max(0.0),
                    w.seconds
                )
            ),
            "",
        ),
        (
            "BPF CPU".into(),
            format!("{:.3} % of one", pct(o.bpf, w.seconds)),
            "",
        ),
        (
            "kernel table memory".into(),
            format!("{:.1} MB", o.table_bytes / 1e6),
            "",
        ),
        (
            "naming symbolizer's heap at the end / evictions".into(),
            format!(
                "{:.1} MB / {:.0}",
                o.symbolizer_bytes / 1e6,
                o.symbolizer_evictions
            ),
            "≤ 64 MiB (its bound)",
        ),
        (
            "sampling frequency (lowest seen / at the end)".into(),
            format!("{freq_min:.0} Hz / {freq_last:.0} Hz"),
            "99 Hz held",
        ),
        (
            "samples walked / due (99 Hz × CPUs × window)".into(),
            format!("{samples:.0} / {due:.0} ({:.1} %)", pct(samples, due)),
            "",
        ),
        (
            "spinner samples complete".into(),
            format!(
                "{} of {} ({:.1} %)",
                o.spinner_complete,
                o.spinner_samples,
                pct(o.spinner_complete as f64, o.spinner_samples as f64)
            ),
            "≥ 95 %",
        ),
        (
            "all samples complete (every process, short-lived included)".into(),
            format!(
                "{complete:.0} of {samples:.0} ({:.1} %)",
                pct(complete, samples)
            ),
            "≥ 90 % (≥ 100 ms processes)",
        ),
    ];
    let losses: Vec<String> = o
        .outcomes
        .iter()
        .filter(|(k, v)| k.as_str() != "complete" && **v > 0.0)
        .map(|(k, v)| format!("{k} {v:.0}"))
        .chain(
            o.events
                .iter()
                .filter(|(k, v)| {
                    matches!(
                        k.as_str(),
                        "stack_map_full" | "count_map_full" | "kernel_stack_failed" | "no_scratch"
                    ) && **v > 0.0
                })
                .map(|(k, v)| format!("{k} {v:.0}")),
        )
        .chain(
            o.fleet
                .iter()
                .filter(|(k, v)| {
                    matches!(
                        k.as_str(),
                        "process_load_failure"
                            | "table_full"
                            | "table_build_dropped"
                            | "process_table_full"
                            | "count_folded"
                            | "kernel_stack_dropped"
                    ) && **v > 0.0
                })
                .map(|(k, v)| format!("{k} {v:.0}")),
        )
        .collect();
    lines.push((
        "losses (outcomes other than complete, full maps, drops)".into(),
        if losses.is_empty() {
            "none".into()
        } else {
            losses.join(", ")
        },
        "",
    ));
    let _ = writeln!(
        doc,
        "\nThis profiler in its window:\n\n| measure | value | goal |\n|---|---|---|"
    );
    for (what, value, goal) in lines {
        let _ = writeln!(doc, "| {what} | {value} | {goal} |");
    }
}

/// `cmd`, killed when this process dies (a stress run stopped with SIGTERM or killed
/// must not leave its load running).
fn dies_with_parent(cmd: &mut Command) -> &mut Command {
    use std::os::unix::process::CommandExt as _;
    // SAFETY: prctl is async-signal-safe; nothing else runs between fork and exec.
    unsafe {
        cmd.pre_exec(|| {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        })
    }
}
