//! The outputs end to end: the `sframe-user` binary profiles a compiled C fixture and
//! writes svg and pprof files, and serves Prometheus metrics that a plain TCP client
//! scrapes. Google's `pprof` tool (built from Debian's sources) reads the pprof files.

mod support;

use std::{
    io::{BufRead as _, BufReader, Read as _, Write as _},
    net::{SocketAddr, TcpStream},
    path::{Path, PathBuf},
    process::{Command, Stdio},
    sync::mpsc,
    thread,
    time::{Duration, Instant},
};

use prost::Message as _;
use sframe_user::export::pprof::proto;
use support::{KillOnDrop, bpf_or_skip, compile_c};

const BIN: &str = env!("CARGO_BIN_EXE_sframe-user");

/// `main → f0 → f1 → f2 → leaf`, spinning in `leaf`; -O2 without frame pointers, with
/// line tables.
fn chain_fixture() -> PathBuf {
    let src = "volatile unsigned long sink;\n\
        __attribute__((noinline)) void leaf(void) { for (;;) sink++; }\n\
        __attribute__((noinline)) void f2(void) { leaf(); sink += 2; }\n\
        __attribute__((noinline)) void f1(void) { f2(); sink += 1; }\n\
        __attribute__((noinline)) void f0(void) { f1(); sink += 3; }\n\
        int main(void) { f0(); return (int)sink; }\n";
    compile_c("chain", src, &["-O2", "-fomit-frame-pointer", "-g"])
}

const CHAIN: &str = "main;f0;f1;f2;leaf";

fn spawn_chain() -> KillOnDrop {
    let chain = KillOnDrop::spawn(&mut Command::new(chain_fixture()));
    // Let it reach `leaf`.
    thread::sleep(Duration::from_millis(200));
    chain
}

fn run_profiler(args: &[&str]) {
    let out = Command::new(BIN)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .expect("run sframe-user");
    assert!(
        out.status.success(),
        "sframe-user {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

fn http_get(addr: SocketAddr, path: &str) -> String {
    let mut s = TcpStream::connect(addr).expect("connect to the exporter");
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: test\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).expect("read the response");
    out
}

/// The value of the first exposition line that starts with `prefix` and passes `filter`.
fn value_of(text: &str, prefix: &str, filter: impl Fn(&str) -> bool) -> Option<f64> {
    text.lines()
        .filter(|l| l.starts_with(prefix) && filter(l))
        .find_map(|l| l.rsplit(' ').next()?.parse().ok())
}

/// Runs the profiler on `pid` with `--prometheus 127.0.0.1:0` and `args`; returns it and
/// the address it announced. Its stderr is echoed.
fn start_exporter(pid: &str, args: &[&str]) -> (KillOnDrop, SocketAddr) {
    let mut profiler = KillOnDrop::spawn(
        Command::new(BIN)
            .args([
                "--pid",
                pid,
                "--prometheus",
                "127.0.0.1:0",
                "--format",
                "folded",
            ])
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped()),
    );
    let stderr = profiler.0.stderr.take().unwrap();
    let (tx, rx) = mpsc::channel();
    thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            eprintln!("sframe-user: {line}");
            let _ = tx.send(line);
        }
    });
    let addr = loop {
        let line = rx
            .recv_timeout(Duration::from_secs(60))
            .expect("the profiler announces its metrics address");
        if let Some(rest) = line.strip_prefix("sframe-user: serving metrics on http://") {
            break rest.trim_end_matches("/metrics").parse().expect("address");
        }
    };
    (profiler, addr)
}

#[test]
fn prometheus_exporter_serves_fixture_stacks() {
    if !bpf_or_skip("prometheus_exporter_serves_fixture_stacks") {
        return;
    }
    let chain = spawn_chain();
    let pid = chain.pid().to_string();
    let (profiler, addr) = start_exporter(
        &pid,
        &[
            "--duration",
            "20",
            "--frequency",
            "499",
            "--prometheus-top-k",
            "3",
        ],
    );
    let deadline = Instant::now() + Duration::from_secs(15);
    let series = format!("sframe_stack_samples_total{{comm=\"chain\",pid=\"{pid}\",stack=\"");
    let text = loop {
        let response = http_get(addr, "/metrics");
        let text = response.split("\r\n\r\n").nth(1).unwrap_or("").to_owned();
        let chain_samples = value_of(&text, &series, |l| l.contains(&format!(";{CHAIN}\"}}")));
        if chain_samples.is_some_and(|v| v >= 100.0) || Instant::now() > deadline {
            assert!(response.starts_with("HTTP/1.1 200 OK\r\n"), "{response}");
            assert!(
                response.contains("application/openmetrics-text"),
                "{response}"
            );
            break text;
        }
        thread::sleep(Duration::from_millis(500));
    };
    let chain_samples = value_of(&text, &series, |l| l.contains(&format!(";{CHAIN}\"}}")));
    assert!(
        chain_samples.is_some_and(|v| v >= 100.0),
        "no stack series ending in {CHAIN} with 100+ samples:\n{text}"
    );
    // Bounded: at most top-K stacks plus [other] for the process.
    let per_process = text.lines().filter(|l| l.starts_with(&series)).count();
    assert!(
        (1..=4).contains(&per_process),
        "{per_process} series:\n{text}"
    );
    assert!(text.contains(&format!("{series}[other]\"}}")), "{text}");
    let complete = value_of(
        &text,
        "sframe_walk_outcomes_total{outcome=\"complete\"}",
        |_| true,
    );
    assert!(complete.is_some_and(|v| v >= 100.0), "{text}");
    for name in WALK_OUTCOMES {
        assert!(
            text.contains(&format!(
                "sframe_walk_outcomes_total{{outcome=\"{name}\"}} "
            )),
            "{name} missing:\n{text}"
        );
    }
    let samples = value_of(&text, "sframe_events_total{event=\"samples\"}", |_| true);
    assert!(samples.is_some_and(|v| v >= 100.0), "{text}");
    assert!(
        value_of(&text, "sframe_objects_loaded ", |_| true).is_some_and(|v| v >= 2.0),
        "{text}"
    );
    assert!(
        value_of(&text, "sframe_table_rows ", |_| true).is_some_and(|v| v > 0.0),
        "{text}"
    );
    // libc's table comes from its .eh_frame (Debian has no .sframe).
    assert!(
        value_of(
            &text,
            "sframe_objects_by_source{source=\"eh_frame\"} ",
            |_| true
        )
        .is_some_and(|v| v >= 1.0),
        "{text}"
    );
    assert!(
        value_of(&text, "sframe_stack_frames_count ", |_| true).is_some_and(|v| v > 0.0),
        "{text}"
    );
    assert!(text.contains("sframe_bpf_runs_total "), "{text}");
    assert!(text.ends_with("# EOF\n"), "{text}");
    assert!(http_get(addr, "/").starts_with("HTTP/1.1 404 "));
    drop(profiler);
    drop(chain);
}

/// `--prometheus-group container` with room for one container: two chain processes in
/// two Docker-named cgroups; one's series carry its full container id, the other's
/// `[other]`, and the overflow is counted.
#[test]
fn prometheus_group_label_is_bounded() {
    if !bpf_or_skip("prometheus_group_label_is_bounded") {
        return;
    }
    let Some(root) = support::cgroup2_root() else {
        return;
    };
    let mut cgroups = support::TestCgroups::new(root);
    let ids = [
        "c0ffee0000000000000000000000000000000000000000000000000000000001",
        "c0ffee0000000000000000000000000000000000000000000000000000000002",
    ];
    let exe = chain_fixture();
    let chains: Vec<KillOnDrop> = ids
        .iter()
        .map(|id| {
            let dir = cgroups.make(&format!(
                "sframe-prom-{}/docker-{id}.scope",
                std::process::id()
            ));
            // `sh` moves itself into the cgroup and becomes the fixture (same pid).
            let script = format!(
                "echo $$ > {} && exec {}",
                dir.join("cgroup.procs").display(),
                exe.display()
            );
            KillOnDrop::spawn(Command::new("sh").args(["-c", &script]))
        })
        .collect();
    thread::sleep(Duration::from_millis(200));
    let pids: Vec<String> = chains.iter().map(|c| c.pid().to_string()).collect();
    let (profiler, addr) = start_exporter(
        &pids[0],
        &[
            "--pid",
            &pids[1],
            "--duration",
            "30",
            "--frequency",
            "199",
            "--prometheus-group",
            "container",
            "--prometheus-group-limit",
            "1",
        ],
    );
    // Wait until both processes have series (budgeted in samples, not time: the
    // profiler's duration is the bound).
    let series = |text: &str, pid: &str| -> Vec<String> {
        text.lines()
            .filter(|l| {
                l.starts_with(&format!(
                    "sframe_stack_samples_total{{comm=\"chain\",pid=\"{pid}\","
                ))
            })
            .map(str::to_owned)
            .collect()
    };
    let text = loop {
        let response = http_get(addr, "/metrics");
        let text = response.split("\r\n\r\n").nth(1).unwrap_or("").to_owned();
        if pids.iter().all(|p| {
            series(&text, p)
                .iter()
                .any(|l| l.contains(CHAIN) && !l.ends_with(" 0"))
        }) {
            break text;
        }
        thread::sleep(Duration::from_millis(500));
        if profiler_exited(&profiler) {
            panic!("the profiler ended before both processes had series:\n{text}");
        }
    };
    let labels: Vec<String> = pids
        .iter()
        .map(|p| {
            let lines = series(&text, p);
            let values: std::collections::HashSet<&str> = lines
                .iter()
                .filter_map(|l| l.split("container_id=\"").nth(1)?.split('"').next())
                .collect();
            assert_eq!(values.len(), 1, "one container_id per process: {lines:?}");
            assert_eq!(
                lines.iter().filter(|l| l.contains("container_id=")).count(),
                lines.len(),
                "{lines:?}"
            );
            values.into_iter().next().unwrap_or_default().to_owned()
        })
        .collect();
    let mut sorted = labels.clone();
    sorted.sort();
    let admitted = if labels[0] == "[other]" { 1 } else { 0 };
    assert_eq!(sorted[0], "[other]", "{labels:?}");
    assert_eq!(labels[admitted], ids[admitted], "{labels:?}");
    assert!(
        text.lines()
            .any(|l| l == "sframe_group_label_overflow_total 1"),
        "{text}"
    );
    drop(profiler);
    drop(chains);
}

fn profiler_exited(profiler: &KillOnDrop) -> bool {
    // SAFETY: waitid with WNOWAIT only looks at the child's state.
    let mut info: libc::siginfo_t = unsafe { std::mem::zeroed() };
    let r = unsafe {
        libc::waitid(
            libc::P_PID,
            profiler.pid(),
            &mut info,
            libc::WEXITED | libc::WNOHANG | libc::WNOWAIT,
        )
    };
    // SAFETY: si_pid is valid for a WEXITED report; 0 when nothing changed.
    r == 0 && unsafe { info.si_pid() } != 0
}

/// Prometheus's `prometheus` and `promtool`, or `None` (after printing why) when the
/// Debian package is missing outside CI.
fn prometheus_tools(test: &str) -> Option<(PathBuf, PathBuf)> {
    let works = |bin: &str| {
        Command::new(bin)
            .arg("--version")
            .output()
            .is_ok_and(|o| o.status.success())
    };
    if works("prometheus") && works("promtool") {
        return Some(("prometheus".into(), "promtool".into()));
    }
    let why = "prometheus/promtool not installed (apt-get install prometheus; cargo xtask setup installs it)";
    if sframe_user::privileges::in_ci() {
        panic!("{test}: {why}");
    }
    eprintln!("SKIPPED {test}: {why}");
    None
}

/// Percent-encodes a URL query value.
fn url_encode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// `GET path` over HTTP/1.0 (no chunked bodies to decode): (status, body). `None` when
/// nothing listens yet.
fn http10_get(addr: SocketAddr, path: &str, accept: &str) -> Option<(u16, String)> {
    let mut s = TcpStream::connect(addr).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    write!(
        s,
        "GET {path} HTTP/1.0\r\nHost: {addr}\r\nAccept: {accept}\r\n\r\n"
    )
    .ok()?;
    let mut out = String::new();
    s.read_to_string(&mut out).ok()?;
    let (head, body) = out.split_once("\r\n\r\n")?;
    let status = head.split(' ').nth(1)?.parse().ok()?;
    Some((status, body.to_owned()))
}

/// `promtool check metrics` on `exposition`: its combined output, empty when it has
/// nothing to say; panics when it fails.
fn promtool_check(promtool: &Path, exposition: &str) -> String {
    let mut child = Command::new(promtool)
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run promtool");
    child
        .stdin
        .take()
        .unwrap()
        .write_all(exposition.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        out.status.success(),
        "promtool check metrics: {}: {text}\n{exposition}",
        out.status
    );
    text
}

/// A free loopback port (the listener is closed again: a small race, retried by the
/// caller).
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// A Prometheus server on loopback, scraping `target` every second, killed on drop.
struct PrometheusServer {
    _process: KillOnDrop,
    addr: SocketAddr,
}

impl PrometheusServer {
    fn start(prometheus: &Path, target: SocketAddr) -> Self {
        let dir = support::fixture_dir("prometheus");
        let config = dir.join("prometheus.yml");
        std::fs::write(
            &config,
            format!(
                "global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\n  evaluation_interval: 1s\n\
                 scrape_configs:\n  - job_name: sframe\n    static_configs:\n      - targets: ['{target}']\n"
            ),
        )
        .unwrap();
        for attempt in 0..3 {
            let addr: SocketAddr = ([127, 0, 0, 1], free_port()).into();
            let log = std::fs::File::create(dir.join(format!("prometheus-{attempt}.log"))).unwrap();
            let mut process = KillOnDrop::spawn(
                Command::new(prometheus)
                    .arg(format!("--config.file={}", config.display()))
                    .arg(format!(
                        "--storage.tsdb.path={}",
                        dir.join(format!("data-{attempt}")).display()
                    ))
                    .arg(format!("--web.listen-address={addr}"))
                    .stdin(Stdio::null())
                    .stdout(Stdio::null())
                    .stderr(log),
            );
            let deadline = Instant::now() + Duration::from_secs(30);
            while Instant::now() < deadline {
                if let Some((200, _)) = http10_get(addr, "/-/ready", "*/*") {
                    return Self {
                        _process: process,
                        addr,
                    };
                }
                if process.0.try_wait().unwrap().is_some() {
                    // Port taken in between, most likely: try another.
                    break;
                }
                thread::sleep(Duration::from_millis(200));
            }
            eprintln!(
                "prometheus did not become ready (attempt {attempt}):\n{}",
                std::fs::read_to_string(dir.join(format!("prometheus-{attempt}.log")))
                    .unwrap_or_default()
            );
        }
        panic!("prometheus did not start; logs in {}", dir.display());
    }

    /// `GET /api/v1/...`, its `data` on success.
    fn api(&self, path: &str) -> serde_json::Value {
        let (status, body) = http10_get(self.addr, &format!("/api/v1/{path}"), "application/json")
            .expect("Prometheus answers");
        let json: serde_json::Value =
            serde_json::from_str(&body).unwrap_or_else(|e| panic!("{path}: {e}: {status} {body}"));
        assert_eq!(json["status"], "success", "{path}: {body}");
        json["data"].clone()
    }
}

/// A real Prometheus server scrapes the exporter (OpenMetrics, as Prometheus asks for)
/// while the profiler samples the chain fixture; its query API then has the fixture's
/// stacks with plausible counts, and `promtool` lints the exposition clean.
#[test]
fn prometheus_server_scrapes_fixture_stacks() {
    const TEST: &str = "prometheus_server_scrapes_fixture_stacks";
    if !bpf_or_skip(TEST) {
        return;
    }
    let Some((prometheus, promtool)) = prometheus_tools(TEST) else {
        return;
    };
    const FREQUENCY: f64 = 199.0;
    let chain = spawn_chain();
    let pid = chain.pid().to_string();
    let started = Instant::now();
    let (profiler, exporter) = start_exporter(&pid, &["--duration", "60", "--frequency", "199"]);
    let server = PrometheusServer::start(&prometheus, exporter);

    let query = format!(
        "query?query={}",
        url_encode(&format!("sframe_stack_samples_total{{pid=\"{pid}\"}}"))
    );
    let deadline = Instant::now() + Duration::from_secs(40);
    let (series, elapsed) = loop {
        let data = server.api(&query);
        let elapsed = started.elapsed().as_secs_f64();
        let series = data["result"].as_array().cloned().unwrap_or_default();
        let chain_value = series.iter().find_map(|s| {
            let stack = s["metric"]["stack"].as_str()?;
            let value: f64 = s["value"][1].as_str()?.parse().ok()?;
            stack.ends_with(&format!(";{CHAIN}")).then_some(value)
        });
        if chain_value.is_some_and(|v| v >= 50.0) {
            break (series, elapsed);
        }
        assert!(
            Instant::now() < deadline,
            "no series of pid {pid} ending in {CHAIN} with 50+ samples in Prometheus: {data}\ntargets: {}",
            server.api("targets")
        );
        thread::sleep(Duration::from_millis(500));
    };
    // At most one CPU's worth of samples: the fixture is one thread.
    let bound = elapsed * FREQUENCY * 1.2 + 10.0;
    let mut total = 0.0;
    for s in &series {
        let m = &s["metric"];
        assert_eq!(m["__name__"], "sframe_stack_samples_total", "{s}");
        assert_eq!(m["comm"], "chain", "{s}");
        assert_eq!(m["job"], "sframe", "{s}");
        assert_eq!(m["instance"], exporter.to_string(), "{s}");
        let value: f64 = s["value"][1].as_str().unwrap().parse().unwrap();
        assert!(value >= 0.0 && value <= bound, "{value} > {bound}: {s}");
        total += value;
    }
    assert!(
        total <= bound,
        "{total} samples in {elapsed:.1} s at {FREQUENCY} Hz"
    );
    let chain_stack = series
        .iter()
        .filter_map(|s| s["metric"]["stack"].as_str())
        .find(|s| s.ends_with(CHAIN))
        .unwrap();
    // Outermost first, down to the leaf.
    let frames: Vec<&str> = chain_stack.split(';').collect();
    let at = |name: &str| frames.iter().position(|f| *f == name);
    assert!(
        at("main") < at("f0")
            && at("f0") < at("f1")
            && at("f1") < at("f2")
            && at("f2") < at("leaf"),
        "{chain_stack}"
    );
    // Prometheus parsed every scrape: the target is up with no error.
    let targets = server.api("targets");
    let target = targets["activeTargets"]
        .as_array()
        .and_then(|t| t.iter().find(|t| t["labels"]["job"] == "sframe"))
        .unwrap_or_else(|| panic!("{targets}"));
    assert_eq!(target["health"], "up", "{target}");
    assert_eq!(target["lastError"], "", "{target}");
    // Health series came along too.
    let complete = server.api(&format!(
        "query?query={}",
        url_encode("sframe_walk_outcomes_total{outcome=\"complete\"}")
    ));
    let complete: f64 = complete["result"][0]["value"][1]
        .as_str()
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("{complete}"));
    assert!(complete >= 50.0, "{complete}");
    drop(server);

    // promtool lints the Prometheus text format (it reads no OpenMetrics): that is what
    // the exporter sends to a client that asks for text/plain.
    let (status, text) =
        http10_get(exporter, "/metrics", "text/plain").expect("the exporter answers");
    assert_eq!(status, 200, "{text}");
    assert!(text.contains(&format!("pid=\"{pid}\"")), "{text}");
    let lint = promtool_check(&promtool, &text);
    assert!(lint.trim().is_empty(), "promtool: {lint}");
    drop(profiler);
    drop(chain);
}

/// Needs no BPF: the exporter's text format passes `promtool check metrics`, and
/// promtool does find problems in what is not clean (so its silence means something).
#[test]
fn promtool_accepts_exporter_text_format() {
    use sframe_user::export::prometheus::{GRACE, Health, Metrics, WINDOW, server};
    let Some((_, promtool)) = prometheus_tools("promtool_accepts_exporter_text_format") else {
        return;
    };
    let mut metrics = Metrics::new(2, WINDOW, GRACE);
    metrics.record(42, "prog \"x\"", None, "main;work\\y", 2, 30);
    metrics.record(42, "prog \"x\"", None, "main;idle", 2, 20);
    metrics.record(42, "prog \"x\"", None, "main;rare", 2, 1);
    metrics.update(Instant::now(), &Health::default());
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let listener = runtime
        .block_on(server::bind("127.0.0.1:0".parse().unwrap()))
        .unwrap();
    let addr = listener.local_addr().unwrap();
    let exposition = server::Exposition::default();
    exposition.set(metrics.render());
    runtime.spawn(server::serve(listener, exposition));
    let (status, text) =
        http10_get(addr, "/metrics", "text/plain;version=0.0.4").expect("the server answers");
    assert_eq!(status, 200);
    assert!(text.contains("stack=\"main;work\\\\y\""), "{text}");
    let lint = promtool_check(&promtool, &text);
    assert!(lint.trim().is_empty(), "promtool: {lint}");
    // The OpenMetrics form is not promtool's format: it complains.
    let (_, om) = http10_get(addr, "/metrics", "application/openmetrics-text").unwrap();
    assert!(om.ends_with("# EOF\n"), "{om}");
    let out = Command::new(&promtool)
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .and_then(|mut c| {
            // promtool may reject the text and exit before reading all of it.
            match c.stdin.take().unwrap().write_all(om.as_bytes()) {
                Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => {}
                r => r?,
            }
            c.wait_with_output()
        })
        .unwrap();
    assert!(!out.status.success(), "promtool accepted OpenMetrics as is");
    runtime.shutdown_background();
}

const WALK_OUTCOMES: [&str; 4] = ["complete", "truncated", "no_rule", "read_fault"];

/// A frame box of an inferno flame graph.
#[derive(Debug)]
struct SvgFrame {
    name: String,
    /// Horizontal extent in samples (`fg:x`, `fg:w`).
    x: u64,
    w: u64,
    /// Top of the box; callers are drawn below their callees.
    y: f64,
}

/// Parses `svg` as XML (panicking unless it is well-formed) and returns its frame boxes:
/// each `<g>` with a `<title>NAME (N samples, P%)</title>` and a `<rect>`.
fn svg_frames(svg: &str) -> Vec<SvgFrame> {
    const FG: &str = "http://github.com/jonhoo/inferno";
    let doc = roxmltree::Document::parse_with_options(
        svg,
        roxmltree::ParsingOptions {
            // inferno writes the SVG 1.1 DOCTYPE (an external DTD, which is not read).
            allow_dtd: true,
            ..roxmltree::ParsingOptions::default()
        },
    )
    .unwrap_or_else(|e| panic!("the SVG is not well-formed XML: {e}"));
    let root = doc.root_element();
    assert_eq!(root.tag_name().name(), "svg");
    assert_eq!(
        root.tag_name().namespace(),
        Some("http://www.w3.org/2000/svg")
    );
    doc.descendants()
        .filter(|n| n.has_tag_name("g"))
        .filter_map(|g| {
            let title = g.children().find(|c| c.has_tag_name("title"))?.text()?;
            let rect = g.children().find(|c| c.has_tag_name("rect"))?;
            let (name, _) = title.rsplit_once(" (")?;
            let num = |attr: &str, value: Option<&str>| {
                value
                    .unwrap_or_else(|| panic!("{title}: no {attr}"))
                    .parse::<f64>()
                    .unwrap_or_else(|e| panic!("{title}: {attr}: {e}"))
            };
            Some(SvgFrame {
                name: name.to_owned(),
                x: num("fg:x", rect.attribute((FG, "x"))) as u64,
                w: num("fg:w", rect.attribute((FG, "w"))) as u64,
                y: num("y", rect.attribute("y")),
            })
        })
        .collect()
}

/// The flame graph in `svg` has a column whose frames, from the bottom, include `path`
/// in that order, consecutive from `path[1]` on (`path[0]` is the process name, under
/// the start-up frames).
fn svg_has_path(svg: &str, path: &[&str]) {
    let frames = svg_frames(svg);
    let leaf = path.last().unwrap();
    let mut columns = Vec::new();
    for top in frames.iter().filter(|f| f.name == *leaf && f.w > 0) {
        // Every box under `top` that spans it, bottom first: one per row, each containing
        // the next.
        let mut column: Vec<&SvgFrame> = frames
            .iter()
            .filter(|f| f.y > top.y && f.x <= top.x && top.x + top.w <= f.x + f.w)
            .collect();
        column.sort_by(|a, b| b.y.total_cmp(&a.y));
        column.push(top);
        for pair in column.windows(2) {
            assert!(
                pair[1].x >= pair[0].x && pair[1].x + pair[1].w <= pair[0].x + pair[0].w,
                "{pair:?}"
            );
            assert!(pair[1].y < pair[0].y, "two boxes in one row: {pair:?}");
        }
        let names: Vec<&str> = column.iter().map(|f| f.name.as_str()).collect();
        // Under the process name: "all".
        let comm = names.iter().position(|n| *n == path[0]);
        let tail = names.windows(path.len() - 1).position(|w| w == &path[1..]);
        if let (Some(comm), Some(tail)) = (comm, tail)
            && comm < tail
            && tail + path.len() - 1 == names.len()
        {
            return;
        }
        columns.push(names);
    }
    panic!("no column {path:?} in the flame graph; columns ending in {leaf}: {columns:?}");
}

#[test]
fn svg_path_check_rejects_wrong_orders() {
    let frame = |name: &str, x: u64, w: u64, row: u32| {
        format!(
            "<g><title>{name} ({w} samples, 1%)</title><rect x=\"0%\" y=\"{}\" width=\"1%\" height=\"15\" fg:x=\"{x}\" fg:w=\"{w}\"/></g>",
            200 - 16 * row
        )
    };
    let svg = |boxes: &[String]| {
        format!(
            "<?xml version=\"1.0\"?><svg xmlns=\"http://www.w3.org/2000/svg\" xmlns:fg=\"http://github.com/jonhoo/inferno\"><g id=\"frames\">{}</g></svg>",
            boxes.concat()
        )
    };
    let good = svg(&[
        frame("all", 0, 10, 0),
        frame("p", 0, 10, 1),
        frame("main", 0, 10, 2),
        frame("a", 0, 6, 3),
        frame("b", 6, 4, 3),
        frame("leaf", 1, 5, 4),
    ]);
    svg_has_path(&good, &["p", "main", "a", "leaf"]);
    for (boxes, path) in [
        // leaf is over b, not a.
        (
            vec![
                frame("p", 0, 10, 1),
                frame("main", 0, 10, 2),
                frame("a", 0, 6, 3),
                frame("b", 6, 4, 3),
                frame("leaf", 7, 2, 4),
            ],
            &["p", "main", "a", "leaf"][..],
        ),
        // Order reversed.
        (
            vec![
                frame("p", 0, 10, 1),
                frame("a", 0, 10, 2),
                frame("main", 0, 10, 3),
                frame("leaf", 0, 10, 4),
            ],
            &["p", "main", "a", "leaf"][..],
        ),
        // A frame in between.
        (
            vec![
                frame("p", 0, 10, 1),
                frame("main", 0, 10, 2),
                frame("x", 0, 10, 3),
                frame("a", 0, 10, 4),
                frame("leaf", 0, 10, 5),
            ],
            &["p", "main", "a", "leaf"][..],
        ),
    ] {
        let svg = svg(&boxes);
        let result = std::panic::catch_unwind(|| svg_has_path(&svg, path));
        assert!(result.is_err(), "accepted: {svg}");
    }
    let broken = good.replace("</svg>", "");
    assert!(std::panic::catch_unwind(|| svg_frames(&broken)).is_err());
}

fn decode_pprof(path: &Path) -> proto::Profile {
    let bytes = std::fs::read(path).expect("read the pprof file");
    let mut raw = Vec::new();
    flate2::read::GzDecoder::new(bytes.as_slice())
        .read_to_end(&mut raw)
        .expect("gzip");
    proto::Profile::decode(raw.as_slice()).expect("profile.proto")
}

#[test]
fn svg_and_pprof_of_fixture() {
    if !bpf_or_skip("svg_and_pprof_of_fixture") {
        return;
    }
    let chain = spawn_chain();
    let pid = chain.pid().to_string();
    let dir = support::fixture_dir("export-out");
    let svg = dir.join("flame.svg");
    let pb = dir.join("profile.pb.gz");
    let common = ["--pid", &pid, "--duration", "2", "--frequency", "499"];
    run_profiler(
        &[
            &common[..],
            &["--format", "svg", "--output", svg.to_str().unwrap()],
        ]
        .concat(),
    );
    run_profiler(
        &[
            &common[..],
            &["--format", "pprof", "--output", pb.to_str().unwrap()],
        ]
        .concat(),
    );
    drop(chain);

    let text = std::fs::read_to_string(&svg).expect("read svg");
    assert!(text.contains(&format!("chain (pid {pid}), ")), "title");
    svg_has_path(&text, &["chain", "main", "f0", "f1", "f2", "leaf"]);

    let p = decode_pprof(&pb);
    let s = |i: i64| p.string_table[i as usize].as_str();
    let types: Vec<(&str, &str)> = p
        .sample_type
        .iter()
        .map(|t| (s(t.r#type), s(t.unit)))
        .collect();
    assert_eq!(types, [("samples", "count"), ("cpu", "nanoseconds")]);
    assert_eq!(p.period, 1_000_000_000 / 499);
    let chain_map = p
        .mapping
        .iter()
        .find(|m| s(m.filename) == "chain")
        .expect("mapping of the fixture");
    assert!(!s(chain_map.build_id).is_empty(), "gcc gives a build-id");
    // The hottest sample's leaf is `leaf`, with a line number from DWARF.
    let hottest = p.sample.iter().max_by_key(|x| x.value[0]).expect("samples");
    let leaf = &p.location[hottest.location_id[0] as usize - 1];
    assert_eq!(leaf.mapping_id, chain_map.id);
    let line = leaf.line.last().unwrap();
    assert_eq!(s(p.function[line.function_id as usize - 1].name), "leaf");
    assert!(line.line > 0, "line number of leaf");
    pprof_top_lists_first(&pb, "leaf");
}

/// Builds Google's pprof from Debian's sources (once, into the target dir). `None`
/// (after printing why) when Go or the sources are missing outside CI.
fn pprof_tool() -> Option<PathBuf> {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("pprof-tool");
    let bin = dir.join("pprof");
    if bin.exists() {
        return Some(bin);
    }
    let sources = Path::new("/usr/share/gocode/src/github.com/google/pprof");
    let missing = if which_go().is_none() {
        Some("go is not installed (apt-get install golang-go)")
    } else if !sources.exists() {
        Some("pprof sources missing (apt-get install golang-github-google-pprof-dev)")
    } else {
        None
    };
    if let Some(why) = missing {
        if sframe_user::privileges::in_ci() {
            panic!("{why}: cargo xtask setup installs it");
        }
        eprintln!("SKIPPED pprof tool check: {why}");
        return None;
    }
    std::fs::create_dir_all(&dir).unwrap();
    // Build into a temporary name: concurrent tests never see a half-written binary.
    let tmp = dir.join(format!("pprof.{}", std::process::id()));
    let out = Command::new("go")
        .args(["build", "-o"])
        .arg(&tmp)
        .arg("github.com/google/pprof")
        .env("GO111MODULE", "off")
        .env("GOPATH", "/usr/share/gocode")
        .env("GOCACHE", dir.join("gocache"))
        .output()
        .expect("run go build");
    assert!(
        out.status.success(),
        "go build pprof: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    std::fs::rename(&tmp, &bin).unwrap();
    Some(bin)
}

fn which_go() -> Option<()> {
    Command::new("go")
        .arg("version")
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|_| ())
}

/// `pprof -top` reads `path`, and its first row is `function`.
fn pprof_top_lists_first(path: &Path, function: &str) {
    let Some(pprof) = pprof_tool() else {
        return;
    };
    let out = Command::new(&pprof)
        .args(["-top", "-sample_index=samples"])
        .arg(path)
        .env("PPROF_BINARY_PATH", "/nonexistent")
        .env("HOME", env!("CARGO_TARGET_TMPDIR"))
        .output()
        .expect("run pprof");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "pprof -top failed: {}{stdout}",
        String::from_utf8_lossy(&out.stderr)
    );
    // Rows follow the `flat  flat%   sum%        cum   cum%` header.
    let first = stdout
        .lines()
        .skip_while(|l| !l.trim_start().starts_with("flat"))
        .nth(1)
        .unwrap_or_else(|| panic!("no rows in:\n{stdout}"));
    assert_eq!(
        first.split_whitespace().last(),
        Some(function),
        "pprof -top:\n{stdout}"
    );
}

/// Needs no BPF: a profile written by the library is read by Google's pprof.
#[test]
fn pprof_tool_reads_written_profile() {
    use sframe_common::WalkOutcome;
    use sframe_user::{
        export::{ProcessProfile, Profile, Stack, pprof_bytes},
        symbolize::Frame,
    };
    let f = |name: &str, offset: u64| {
        let mut frame = Frame::unknown("prog", offset, "");
        frame.name = Some(name.to_owned());
        frame.reason = None;
        frame.build_id = Some("0123456789abcdef".to_owned());
        frame
    };
    let stack = |names: &[(&str, u64)], count| Stack {
        tid: 0,
        thread: String::new(),
        user: names.iter().map(|&(n, o)| f(n, o)).collect(),
        kernel: Vec::new(),
        count,
        outcome: WalkOutcome::Complete,
        sleep: None,
    };
    let profile = Profile {
        processes: vec![ProcessProfile {
            ns_pid: None,
            cgroup: None,
            container_id: None,
            pid: 1,
            comm: "prog".to_owned(),
            stacks: vec![
                stack(&[("main", 0x100), ("hot", 0x200)], 90),
                stack(&[("main", 0x100), ("cold", 0x300)], 10),
            ],
        }],
        duration: Duration::from_secs(1),
        frequency: 100,
        ..Profile::default()
    };
    let path = support::fixture_dir("pprof-tool").join("p.pb.gz");
    std::fs::write(&path, pprof_bytes(&profile)).unwrap();
    pprof_top_lists_first(&path, "hot");
}
