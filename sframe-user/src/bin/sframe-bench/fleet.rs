//! Section 8: Prometheus at fleet scale. The busy-host load (section 6) plus build churn
//! (`make -j2` of a few hundred generated C files, again and again) runs while
//! `sframe-user --all --prometheus` profiles the machine; a real Prometheus server
//! (Debian's 2.42) scrapes the exporter every 5 s as 20 hosts (one target per host
//! label, `instance` relabeled), standing for 20 profiled hosts. Reported against the
//! goals of the fleet issue: active stack series per host, series created per hour,
//! bytes per scrape, the share of samples in exact (not remainder) series, the share of
//! frame-path nodes holding ≥ 0.1 % of the samples whose totals the series give exactly
//! (against the profiler's own folded profiles of the same intervals, `--interval`), and
//! the central server's head series and RSS per profiled host (over its RSS before the
//! first scrape).

use std::{
    collections::HashMap,
    fmt::Write as _,
    fs,
    io::{Read as _, Write as _},
    net::{SocketAddr, TcpStream},
    path::Path,
    process::{Command, Stdio},
    sync::{
        Arc,
        atomic::{AtomicBool, AtomicU64, Ordering},
    },
    thread,
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result, bail};

use sframe_user::export::prometheus::{
    text_format::longest_label_value, tree::without_parameters, url_encode,
};

use crate::{
    busy::{Load, kb, metric},
    util::Fixture,
};

/// Hosts the one exporter stands for.
const HOSTS: usize = 20;
/// The server's scrape interval.
const SCRAPE: Duration = Duration::from_secs(5);
/// A node is "exact" when the series give its total within this fraction (samples
/// whose stacks wait for names at a scrape are not in the series yet).
const EXACT_TOLERANCE: f64 = 0.02;

/// `make -j2` over generated files, repeated until stopped.
struct Build {
    stop: Arc<AtomicBool>,
    builds: Arc<AtomicU64>,
    thread: Option<thread::JoinHandle<()>>,
}

impl Build {
    fn start(dir: &Path, files: usize) -> Result<Self> {
        fs::create_dir_all(dir)?;
        let mut objects = String::new();
        for i in 0..files {
            let mut src = format!("volatile unsigned long sink_{i};\n");
            for f in 0..12 {
                let _ = writeln!(
                    src,
                    "unsigned long u{i}_{f}(unsigned long x) {{ unsigned long a[{n}]; for (int k = 0; k < {n}; k++) a[k] = x * k + {f}; sink_{i} += a[x % {n}]; return a[0] ^ x; }}",
                    n = 3 + f % 5
                );
            }
            fs::write(dir.join(format!("u{i}.c")), src)?;
            let _ = write!(objects, " u{i}.o");
        }
        fs::write(
            dir.join("Makefile"),
            format!("all:{objects}\n%.o: %.c\n\tgcc -O2 -c $< -o $@\nclean:\n\trm -f *.o\n"),
        )?;
        let stop = Arc::new(AtomicBool::new(false));
        let builds = Arc::new(AtomicU64::new(0));
        let (s, b, d) = (stop.clone(), builds.clone(), dir.to_owned());
        let thread = thread::spawn(move || {
            while !s.load(Ordering::Relaxed) {
                let ok = Command::new("sh")
                    .args(["-c", "make -s clean && make -s -j2"])
                    .current_dir(&d)
                    .stdout(Stdio::null())
                    .stderr(Stdio::null())
                    .status()
                    .is_ok_and(|st| st.success());
                if ok {
                    b.fetch_add(1, Ordering::Relaxed);
                }
            }
        });
        Ok(Self {
            stop,
            builds,
            thread: Some(thread),
        })
    }
}

impl Drop for Build {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn get(addr: SocketAddr, path: &str) -> Option<String> {
    let mut s = TcpStream::connect(addr).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(10))).ok()?;
    write!(s, "GET {path} HTTP/1.0\r\nHost: b\r\nAccept: application/openmetrics-text, application/json\r\n\r\n").ok()?;
    let mut out = String::new();
    s.read_to_string(&mut out).ok()?;
    Some(out.split_once("\r\n\r\n")?.1.to_owned())
}

/// An instant query's first value.
fn query(server: SocketAddr, promql: &str) -> Option<f64> {
    let body = get(
        server,
        &format!("/api/v1/query?query={}", url_encode(promql)),
    )?;
    let json: serde_json::Value = serde_json::from_str(&body).ok()?;
    json["data"]["result"][0]["value"][1].as_str()?.parse().ok()
}

/// The size of `text` gzip-compressed as the exporter sends it to Prometheus.
fn gzip_len(text: &str) -> usize {
    let mut enc = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    let _ = enc.write_all(text.as_bytes());
    enc.finish().map_or(0, |v| v.len())
}

/// Now, in seconds since the Unix epoch.
fn unix_now() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

/// `(comm, stack) → value` of an instant query at `time`.
fn query_vector(server: SocketAddr, promql: &str, time: f64) -> HashMap<(String, String), f64> {
    let mut out = HashMap::new();
    let Some(body) = get(
        server,
        &format!("/api/v1/query?query={}&time={time:.3}", url_encode(promql)),
    ) else {
        return out;
    };
    let Ok(json) = serde_json::from_str::<serde_json::Value>(&body) else {
        return out;
    };
    for r in json["data"]["result"].as_array().into_iter().flatten() {
        let (Some(comm), Some(stack)) =
            (r["metric"]["comm"].as_str(), r["metric"]["stack"].as_str())
        else {
            continue;
        };
        if let Some(v) = r["value"][1].as_str().and_then(|v| v.parse::<f64>().ok()) {
            out.insert((comm.to_owned(), stack.to_owned()), v);
        }
    }
    out
}

/// `(comm, stack) → value` of the stack series in an exposition (values without `"`
/// or `\` in labels only: the others are skipped).
fn stack_values(text: &str) -> HashMap<(String, String), f64> {
    let mut out = HashMap::new();
    for l in text.lines() {
        let Some(rest) = l.strip_prefix("sframe_stack_samples_total{comm=\"") else {
            continue;
        };
        let Some((comm, rest)) = rest.split_once("\",stack=\"") else {
            continue;
        };
        let Some((stack, value)) = rest.rsplit_once("\"} ") else {
            continue;
        };
        if comm.contains('\\') || stack.contains('\\') {
            continue;
        }
        if let Ok(v) = value.trim().parse::<f64>() {
            out.insert((comm.to_owned(), stack.to_owned()), v);
        }
    }
    out
}

/// Node totals (`comm;frame;…` → samples) from series: a remainder (`…;[other]`)
/// counts for its ancestors only, `[no frames]` for its program.
fn nodes_from_series(series: &HashMap<(String, String), f64>) -> HashMap<String, f64> {
    let mut nodes = HashMap::new();
    for ((comm, stack), v) in series {
        if comm == "[other]" {
            continue;
        }
        let mut path = comm.replace([' ', ';'], "_");
        *nodes.entry(path.clone()).or_default() += v;
        if stack == "[no frames]" {
            continue;
        }
        for frame in stack.split(';') {
            if frame == "[other]" {
                break;
            }
            path.push(';');
            path.push_str(frame);
            *nodes.entry(path.clone()).or_default() += v;
        }
    }
    nodes
}

/// Node totals from folded lines.
/// Node totals from folded lines; with `short`, frames named as short-name labels name
/// them (overloads merged).
fn nodes_from_folded(text: &str, short: bool) -> (HashMap<String, f64>, f64) {
    let mut nodes = HashMap::new();
    let mut total = 0.0;
    for line in text.lines() {
        let Some((stack, count)) = line.rsplit_once(' ') else {
            continue;
        };
        let Ok(count) = count.parse::<f64>() else {
            continue;
        };
        total += count;
        let mut path = String::new();
        for (i, frame) in stack.split(';').enumerate() {
            if i > 0 {
                path.push(';');
            }
            // The first frame is the program.
            path.push_str(if short && i > 0 {
                without_parameters(frame)
            } else {
                frame
            });
            *nodes.entry(path.clone()).or_default() += count;
        }
    }
    (nodes, total)
}

#[derive(Default)]
struct Figures {
    seconds: f64,
    builds: u64,
    compiles: u64,
    max_series: usize,
    mean_series: f64,
    max_bytes: usize,
    mean_bytes: f64,
    max_gzip: usize,
    max_label: usize,
    created: f64,
    created_after_minute: Option<(f64, f64)>,
    warmup: f64,
    exact_sample_share: Option<f64>,
    nodes: usize,
    nodes_exact: usize,
    nodes_equal: usize,
    /// The same from the central server's increase() over the compared intervals.
    prom_exact: usize,
    prom_median_error: f64,
    /// Over the compared intervals: samples dropped for want of names, and stacks
    /// waiting for names at the first and last scrape.
    unnamed: (f64, f64, f64),
    /// The series' increase over the compared intervals, summed.
    series_increase: f64,
    /// Intervals compared, and their length (s).
    compared: (usize, u64),
    median_error: f64,
    head_series: Option<f64>,
    server_rss_idle_kb: u64,
    server_rss_kb: u64,
    profiler_cpu: f64,
    samples: f64,
}

/// The section; the profile lasts `seconds`.
pub fn section(doc: &mut String, seconds: f64, profiler: &Path, short: bool) -> Result<()> {
    let _ = writeln!(doc, "\n## 8. Prometheus at fleet scale\n");
    if short {
        let _ = writeln!(doc, "With `--prometheus-short-names`.\n");
    }
    match measure(seconds, profiler, short) {
        Ok(f) => report(doc, &f),
        Err(err) => {
            let _ = writeln!(doc, "Not measured: {err:#}");
        }
    }
    Ok(())
}

fn measure(seconds: f64, profiler: &Path, short: bool) -> Result<Figures> {
    let works = Command::new("prometheus")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    if !works {
        bail!(
            "prometheus is not installed (apt-get install prometheus; cargo xtask setup installs it)"
        );
    }
    let dir = std::env::temp_dir().join(format!("sframe-fleet-{}", std::process::id()));
    let _ = fs::remove_dir_all(&dir);
    fs::create_dir_all(&dir)?;
    let free =
        || -> Result<SocketAddr> { Ok(std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?) };
    let exporter = free()?;
    let server_addr = free()?;
    let mut config = String::from(
        "global:\n  scrape_interval: 5s\n  scrape_timeout: 5s\nscrape_configs:\n  - job_name: sframe\n    static_configs:\n",
    );
    for h in 0..HOSTS {
        let _ = writeln!(
            config,
            "      - targets: ['{exporter}']\n        labels: {{host: h{h:02}}}"
        );
    }
    config.push_str(
        "    relabel_configs:\n      - source_labels: [host]\n        target_label: instance\n      - regex: host\n        action: labeldrop\n",
    );
    fs::write(dir.join("prometheus.yml"), &config)?;
    let server = Fixture {
        child: Command::new("prometheus")
            .arg(format!(
                "--config.file={}",
                dir.join("prometheus.yml").display()
            ))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.join("data").display()
            ))
            .arg(format!("--web.listen-address={server_addr}"))
            .stdout(Stdio::null())
            .stderr(fs::File::create(dir.join("prometheus.log"))?)
            .spawn()
            .context("starting prometheus")?,
    };
    let ready = Instant::now();
    while get(server_addr, "/-/ready").is_none() {
        if ready.elapsed() > Duration::from_secs(30) {
            bail!("prometheus did not become ready");
        }
        thread::sleep(Duration::from_millis(200));
    }
    let load = Load::start(&dir.join("load"), 0)?;
    let build = Build::start(&dir.join("build"), 300)?;
    thread::sleep(Duration::from_secs(3));
    // The server's own RSS with its targets down, before any series.
    let mut f = Figures {
        server_rss_idle_kb: kb(server.pid(), "VmRSS").unwrap_or(0),
        ..Figures::default()
    };
    // Ground truth: the profiler's own folded profile of each interval; the loop writes
    // an interval's file in the same turn as the page it serves, so a scrape as soon as
    // the file appears sees the same snapshot.
    let intervals = dir.join("intervals");
    fs::create_dir_all(&intervals)?;
    let interval = if seconds >= 300.0 { 60 } else { 5 };
    let mut child = Command::new(profiler)
        .args(["--all", "--frequency", "99", "--prometheus"])
        .arg(exporter.to_string())
        .args(short.then_some("--prometheus-short-names"))
        .args([
            "--format",
            "folded",
            "--interval",
            &interval.to_string(),
            "--output",
        ])
        .arg(intervals.join("fleet.folded"))
        .args(["--duration", &format!("{seconds}")])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .with_context(|| format!("starting {}", profiler.display()))?;
    let started = Instant::now();
    let mut last = String::new();
    let mut series_counts = Vec::new();
    let mut bytes = Vec::new();
    let mut gzip_bytes = Vec::new();
    let mut at_minute = None;
    // Series created in steady state: once the 5-minute window is full and planned
    // again (6 minutes; a third of a short run).
    let warmup = if seconds >= 600.0 {
        360.0
    } else {
        seconds / 3.0
    };
    f.warmup = warmup;
    // (interval file, the page scraped when it appeared), in order.
    let mut marks: Vec<(std::path::PathBuf, String, f64)> = Vec::new();
    let mut next_scrape = Instant::now() + SCRAPE;
    while started.elapsed().as_secs_f64() < seconds - 2.0 {
        thread::sleep(Duration::from_millis(100));
        let mut files: Vec<std::path::PathBuf> = fs::read_dir(&intervals)
            .map(|d| d.filter_map(|e| Some(e.ok()?.path())).collect())
            .unwrap_or_default();
        files.sort();
        if let Some(newest) = files.last()
            && marks.last().is_none_or(|(f, _, _)| f != newest)
            && let Some(text) = get(exporter, "/metrics")
        {
            marks.push((newest.clone(), text, unix_now()));
        }
        if Instant::now() < next_scrape {
            continue;
        }
        next_scrape += SCRAPE;
        let Some(text) = get(exporter, "/metrics") else {
            continue;
        };
        let lines: Vec<&str> = text
            .lines()
            .filter(|l| l.starts_with("sframe_stack_samples_total{"))
            .collect();
        series_counts.push(lines.len());
        bytes.push(text.len());
        gzip_bytes.push(gzip_len(&text));
        for l in &lines {
            f.max_label = f.max_label.max(longest_label_value(l));
        }
        let t = started.elapsed().as_secs_f64();
        if at_minute.is_none() && t >= warmup {
            at_minute =
                metric(&text, "sframe_stack_series_created_total{profile=\"cpu\"}").map(|c| (t, c));
        }
        last = text;
    }
    let last_at = started.elapsed().as_secs_f64();
    let window = format!("{:.0}s", last_at.max(10.0));
    f.exact_sample_share = query(
        server_addr,
        &format!(
            "sum(increase(sframe_stack_samples_total{{instance=\"h00\",stack!~\".*\\\\[other\\\\]\"}}[{window}])) / sum(increase(sframe_stack_samples_total{{instance=\"h00\"}}[{window}]))"
        ),
    );
    f.head_series =
        get(server_addr, "/metrics").and_then(|t| metric(&t, "prometheus_tsdb_head_series"));
    // What a query of the central server gives for the compared intervals (one host):
    // increase() over them, series that came and went meanwhile included.
    let skip = if marks.len() > 3 { 1 } else { 0 };
    let from_prometheus = match (marks.get(skip), marks.last()) {
        (Some((_, _, t0)), Some((_, _, t1))) if t1 > t0 => {
            let promql = format!(
                "sum by (comm, stack) (increase(sframe_stack_samples_total{{instance=\"h00\"}}[{}ms]))",
                ((t1 - t0) * 1000.0) as u64
            );
            query_vector(server_addr, &promql, *t1)
        }
        _ => HashMap::new(),
    };
    f.server_rss_kb = kb(server.pid(), "VmRSS").unwrap_or(0);
    f.profiler_cpu = crate::busy::wait_cpu(&mut child)?;
    f.seconds = started.elapsed().as_secs_f64();
    f.builds = build.builds.load(Ordering::Relaxed);
    f.compiles = load.compiles.load(Ordering::Relaxed);
    drop(build);
    drop(load);
    drop(server);
    f.max_series = series_counts.iter().copied().max().unwrap_or(0);
    f.mean_series = series_counts.iter().sum::<usize>() as f64 / series_counts.len().max(1) as f64;
    f.max_bytes = bytes.iter().copied().max().unwrap_or(0);
    f.mean_bytes = bytes.iter().sum::<usize>() as f64 / bytes.len().max(1) as f64;
    f.max_gzip = gzip_bytes.iter().copied().max().unwrap_or(0);
    f.created = metric(&last, "sframe_stack_series_created_total{profile=\"cpu\"}").unwrap_or(0.0);
    f.created_after_minute = at_minute.map(|(t, c)| (last_at - t, f.created - c));
    // Nodes: from the second interval's end to the last one's, the series' increase
    // (a series new since counts from zero; one dropped meanwhile is missing) against
    // the folded profiles of those intervals.
    let (from_series, truth, total) = match (marks.get(skip), marks.last()) {
        (Some((_, first, _)), Some((_, last, _))) if marks.len() > skip + 1 => {
            let before = stack_values(first);
            let after = stack_values(last);
            let increase: HashMap<(String, String), f64> = after
                .into_iter()
                .map(|(k, v)| {
                    let b = before.get(&k).copied().unwrap_or(0.0);
                    (k, if v >= b { v - b } else { v })
                })
                .collect();
            let mut text = String::new();
            for (file, _, _) in &marks[skip + 1..] {
                text += &fs::read_to_string(file).unwrap_or_default();
            }
            let (truth, total) = nodes_from_folded(&text, short);
            f.samples = total;
            // Samples that cannot be in the series: dropped for want of names, and the
            // change in those waiting for them.
            let m = |t: &str, name: &str| metric(t, name).unwrap_or(0.0);
            f.unnamed = (
                m(last, "sframe_unnamed_samples_dropped_total")
                    - m(first, "sframe_unnamed_samples_dropped_total"),
                m(first, "sframe_stacks_waiting_for_names"),
                m(last, "sframe_stacks_waiting_for_names"),
            );
            f.series_increase = increase.values().sum();
            f.compared = (marks.len() - skip - 1, interval);
            (nodes_from_series(&increase), truth, total)
        }
        _ => bail!("fewer than two interval files were scraped"),
    };
    let floor = total * 0.001;
    let mut errors = Vec::new();
    let mut prom_errors = Vec::new();
    let from_prometheus = nodes_from_series(&from_prometheus);
    for (node, &t) in &truth {
        if t < floor || t <= 0.0 {
            continue;
        }
        f.nodes += 1;
        let got = from_series.get(node).copied().unwrap_or(0.0);
        let err = (got - t).abs() / t;
        errors.push(err);
        if err <= EXACT_TOLERANCE {
            f.nodes_exact += 1;
        }
        if (got - t).abs() < 0.5 {
            f.nodes_equal += 1;
        }
        let got = from_prometheus.get(node).copied().unwrap_or(0.0);
        let err = (got - t).abs() / t;
        prom_errors.push(err);
        if err <= EXACT_TOLERANCE {
            f.prom_exact += 1;
        }
    }
    f.median_error = crate::util::median(&errors);
    f.prom_median_error = crate::util::median(&prom_errors);
    let _ = fs::remove_dir_all(&dir);
    Ok(f)
}

fn report(doc: &mut String, f: &Figures) {
    let _ = writeln!(
        doc,
        "Method: the busy-host load of section 6 plus `make -j2` of 300 generated C files in a \
         loop ({} builds, {} compile-loop jobs) for {:.0} s; `sframe-user --all --frequency 99 \
         --prometheus` with the default budgets, also writing its folded profile every {} s \
         (`--interval`); a Prometheus 2.42 server scrapes it every 5 s as {HOSTS} hosts (20 \
         targets, `instance` relabeled), and the bench scrapes it itself every 5 s and as soon \
         as an interval's file appears (the profiler writes the file and the page from the \
         same snapshot). Nodes: the frame paths `comm;frame;…` holding ≥ 0.1 % of the {:.0} \
         samples of the {} intervals after the first, by their folded files; a node is given \
         exactly when the series' increase over those intervals (a series created meanwhile \
         counts from zero, one dropped meanwhile is missing) sums to its total (within {:.0} \
         %: samples whose stacks wait for their names at a scrape; the count equal to the \
         sample is shown too), and is given by the central server when `sum by (comm, stack) \
         (increase(sframe_stack_samples_total{{instance=\"h00\"}}[SPAN]))` at the last compared \
         interval's end, over their span, does (series that came and went meanwhile count; \
         `increase()` extrapolates at the window's edges). The server's RSS per host is its RSS at the end less its RSS \
         before the first scrape, over {HOSTS}.\n",
        f.builds,
        f.compiles,
        f.seconds,
        f.compared.1,
        f.samples,
        f.compared.0,
        EXACT_TOLERANCE * 100.0
    );
    let per_hour = f
        .created_after_minute
        .filter(|(t, _)| *t > 0.0)
        .map(|(t, c)| c / t * 3600.0);
    let per_host_rss =
        f.server_rss_kb.saturating_sub(f.server_rss_idle_kb) as f64 / 1024.0 / HOSTS as f64;
    let node_share = f.nodes_exact as f64 / f.nodes.max(1) as f64;
    let met = |ok: bool| if ok { "met" } else { "**not met**" };
    let rows: Vec<(String, String, String)> = vec![
        (
            "active stack series per host (max; mean)".into(),
            format!("{}; {:.0}", f.max_series, f.mean_series),
            format!("≤ 1,000: {}", met(f.max_series <= 1000)),
        ),
        (
            "series created, whole run (startup plans included)".into(),
            format!("{:.0}", f.created),
            String::new(),
        ),
        (
            format!(
                "series created per hour in steady state (after the first {:.0} s)",
                f.warmup
            ),
            per_hour.map_or("–".into(), |h| format!("{h:.0}")),
            format!("≤ 2,000: {}", met(per_hour.is_some_and(|h| h <= 2000.0))),
        ),
        (
            "bytes per scrape (max; mean), uncompressed".into(),
            format!(
                "{:.0} KB; {:.0} KB",
                f.max_bytes as f64 / 1e3,
                f.mean_bytes / 1e3
            ),
            format!("≤ 512 KB: {}", met(f.max_bytes <= 512_000)),
        ),
        (
            "bytes per scrape on the wire (gzip, as Prometheus asks; max)".into(),
            format!("{:.0} KB", f.max_gzip as f64 / 1e3),
            String::new(),
        ),
        (
            "longest label value".into(),
            format!("{} bytes", f.max_label),
            format!("≤ 2,048: {}", met(f.max_label <= 2048)),
        ),
        (
            "samples in exact (not remainder) series".into(),
            f.exact_sample_share
                .map_or("–".into(), |s| format!("{:.1} %", s * 100.0)),
            String::new(),
        ),
        (
            "frame-path nodes ≥ 0.1 % given by the central server's increase() (within 2 %)".into(),
            format!(
                "{} of {} ({:.1} %; median error {:.2} %)",
                f.prom_exact,
                f.nodes,
                f.prom_exact as f64 / f.nodes.max(1) as f64 * 100.0,
                f.prom_median_error * 100.0
            ),
            format!("all: {}", met(f.nodes > 0 && f.prom_exact == f.nodes)),
        ),
        (
            "frame-path nodes ≥ 0.1 % given exactly by two scrapes (series alive at both)".into(),
            format!(
                "{} of {} ({:.1} %; {} to the sample; median error {:.2} %)",
                f.nodes_exact,
                f.nodes,
                node_share * 100.0,
                f.nodes_equal,
                f.median_error * 100.0
            ),
            String::new(),
        ),
        (
            "compared intervals: samples in the series / in the folded files".into(),
            format!(
                "{:.0} / {:.0} ({:.2} %); {:.0} samples dropped unnamed, stacks waiting for names {:.0} then {:.0}",
                f.series_increase,
                f.samples,
                f.series_increase / f.samples.max(1.0) * 100.0,
                f.unnamed.0,
                f.unnamed.1,
                f.unnamed.2
            ),
            String::new(),
        ),
        (
            format!("central server head series ({HOSTS} hosts)"),
            f.head_series.map_or("–".into(), |s| format!("{s:.0}")),
            String::new(),
        ),
        (
            "central server RSS per profiled host".into(),
            format!(
                "{per_host_rss:.1} MB ({:.0} MB at the end, {:.0} MB before)",
                f.server_rss_kb as f64 / 1024.0,
                f.server_rss_idle_kb as f64 / 1024.0
            ),
            format!("≤ 10 MB: {}", met(per_host_rss <= 10.0)),
        ),
        (
            "profiler CPU over the run (launch to report)".into(),
            format!(
                "{:.2} % of one CPU",
                f.profiler_cpu / f.seconds.max(1.0) * 100.0
            ),
            String::new(),
        ),
    ];
    let _ = writeln!(doc, "| measure | value | goal |\n|---|---|---|");
    for (a, b, c) in rows {
        let _ = writeln!(doc, "| {a} | {b} | {c} |");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nodes_from_series_and_folded_agree() {
        let mut series = HashMap::new();
        series.insert(("p q".into(), "main;a".into()), 3.0);
        series.insert(("p q".into(), "main;[other]".into()), 2.0);
        series.insert(("p q".into(), "[no frames]".into()), 1.0);
        series.insert(("[other]".into(), "[other]".into()), 4.0);
        let nodes = nodes_from_series(&series);
        assert_eq!(nodes["p_q"], 6.0);
        assert_eq!(nodes["p_q;main"], 5.0);
        assert_eq!(nodes["p_q;main;a"], 3.0);
        let (truth, total) = nodes_from_folded("p_q;main;a 3\np_q;main;b 2\np_q 1\nr;x 4\n", false);
        assert_eq!(total, 10.0);
        for k in ["p_q", "p_q;main", "p_q;main;a"] {
            assert_eq!(truth[k], nodes[k], "{k}");
        }
    }
}
