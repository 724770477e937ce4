//! Prometheus servers of the tests (Debian's `prometheus` 2.42 on loopback: a scraping
//! server, an agent, a remote-write receiver) and the profiler's exporter.

use std::{
    io::{BufRead as _, BufReader, Read as _, Write as _},
    net::{SocketAddr, TcpStream},
    path::{Path, PathBuf},
    process::{Command, Stdio},
    sync::mpsc,
    thread,
    time::{Duration, Instant},
};

use super::KillOnDrop;

/// `prometheus` and `promtool`, or `None` (after printing why) when the Debian package
/// is missing outside CI; under CI a missing package fails the test.
pub fn tools(test: &str) -> Option<(PathBuf, PathBuf)> {
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

pub use sframe_user::export::prometheus::url_encode;

/// `GET path` over HTTP/1.0 (no chunked bodies to decode): (status, body). `None` when
/// nothing listens yet.
pub fn http10_get(addr: SocketAddr, path: &str, accept: &str) -> Option<(u16, String)> {
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

/// The exposition the exporter at `addr` serves (OpenMetrics).
pub fn scrape(addr: SocketAddr) -> String {
    let (status, body) =
        http10_get(addr, "/metrics", "application/openmetrics-text").expect("the exporter answers");
    assert_eq!(status, 200, "{body}");
    body
}

/// The value of the first exposition line that starts with `prefix` and passes `filter`.
pub fn value_of(text: &str, prefix: &str, filter: impl Fn(&str) -> bool) -> Option<f64> {
    text.lines()
        .filter(|l| l.starts_with(prefix) && filter(l))
        .find_map(|l| l.rsplit(' ').next()?.parse().ok())
}

/// The `sframe_stack_samples_total` lines of an exposition.
pub fn stack_series(text: &str) -> Vec<&str> {
    text.lines()
        .filter(|l| l.starts_with("sframe_stack_samples_total{"))
        .collect()
}

/// A label's value in an exposition line (values without `"` or `\` only).
pub fn label<'a>(line: &'a str, name: &str) -> Option<&'a str> {
    let key = format!("{name}=\"");
    let at = line
        .find(&format!("{{{key}"))
        .map(|i| i + 1)
        .or_else(|| line.find(&format!(",{key}")).map(|i| i + 1))?;
    line[at + key.len()..].split('"').next()
}

/// The longest label value of an exposition line, unescaped (what a backend checks).
pub fn longest_label(line: &str) -> usize {
    sframe_user::export::prometheus::text_format::longest_label_value(line)
}

/// `promtool check metrics` on `exposition`: its combined output, empty when it has
/// nothing to say; panics when it fails.
pub fn promtool_check(promtool: &Path, exposition: &str) -> String {
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
/// callers that bind it).
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// A Prometheus server on loopback, killed on drop.
pub struct Server {
    _process: KillOnDrop,
    pub addr: SocketAddr,
    pub dir: PathBuf,
}

impl Server {
    /// A server (agent mode with `agent`) with `config` (YAML) and `args`, ready.
    pub fn start(prometheus: &Path, name: &str, config: &str, agent: bool, args: &[&str]) -> Self {
        let dir = super::fixture_dir(name);
        let path = dir.join("prometheus.yml");
        std::fs::write(&path, config).unwrap();
        for attempt in 0..3 {
            let addr: SocketAddr = ([127, 0, 0, 1], free_port()).into();
            let log_path = dir.join(format!("prometheus-{attempt}.log"));
            let log = std::fs::File::create(&log_path).unwrap();
            let data = dir.join(format!("data-{attempt}"));
            let mut cmd = Command::new(prometheus);
            cmd.arg(format!("--config.file={}", path.display()))
                .arg(format!("--web.listen-address={addr}"));
            if agent {
                cmd.arg("--enable-feature=agent")
                    .arg(format!("--storage.agent.path={}", data.display()));
            } else {
                cmd.arg(format!("--storage.tsdb.path={}", data.display()));
            }
            let mut process = KillOnDrop::spawn(
                cmd.args(args)
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
                        dir,
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
                std::fs::read_to_string(&log_path).unwrap_or_default()
            );
        }
        panic!("prometheus did not start; logs in {}", dir.display());
    }

    /// A server scraping `target` every second.
    pub fn scraping(prometheus: &Path, target: SocketAddr) -> Self {
        Self::start(
            prometheus,
            "prometheus",
            &format!(
                "global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\n  evaluation_interval: 1s\n\
                 scrape_configs:\n  - job_name: sframe\n    static_configs:\n      - targets: ['{target}']\n"
            ),
            false,
            &[],
        )
    }

    /// `GET /api/v1/...`, its `data` on success.
    pub fn api(&self, path: &str) -> serde_json::Value {
        let (status, body) = http10_get(self.addr, &format!("/api/v1/{path}"), "application/json")
            .expect("Prometheus answers");
        let json: serde_json::Value =
            serde_json::from_str(&body).unwrap_or_else(|e| panic!("{path}: {e}: {status} {body}"));
        assert_eq!(json["status"], "success", "{path}: {body}");
        json["data"].clone()
    }

    /// The result vector of an instant query.
    pub fn query(&self, promql: &str) -> Vec<serde_json::Value> {
        self.api(&format!("query?query={}", url_encode(promql)))["result"]
            .as_array()
            .cloned()
            .unwrap_or_default()
    }

    /// The log of the last start attempt.
    pub fn log(&self) -> String {
        (0..3)
            .rev()
            .find_map(|a| {
                std::fs::read_to_string(self.dir.join(format!("prometheus-{a}.log"))).ok()
            })
            .unwrap_or_default()
    }
}

/// The number value of a query result's sample.
pub fn sample_value(result: &serde_json::Value) -> f64 {
    result["value"][1]
        .as_str()
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no value in {result}"))
}

/// The profiler with `--prometheus 127.0.0.1:0`, no overhead governor, and `args`, and
/// the address it announced. Its stderr is echoed.
pub fn start_exporter(bin: &str, args: &[&str]) -> (KillOnDrop, SocketAddr) {
    let mut profiler = KillOnDrop::spawn(
        Command::new(bin)
            .args(["--prometheus", "127.0.0.1:0", "--format", "folded"])
            // The tests judge sample counts against CPU time at the asked frequency:
            // the overhead governor must not lower it on a loaded machine.
            .args(["--max-overhead", "0"])
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

/// Whether the child has exited (without reaping it).
pub fn exited(child: &KillOnDrop) -> bool {
    // SAFETY: waitid with WNOWAIT only looks at the child's state.
    let mut info: libc::siginfo_t = unsafe { std::mem::zeroed() };
    let r = unsafe {
        libc::waitid(
            libc::P_PID,
            child.pid(),
            &mut info,
            libc::WEXITED | libc::WNOHANG | libc::WNOWAIT,
        )
    };
    // SAFETY: si_pid is valid for a WEXITED report; 0 when nothing changed.
    r == 0 && unsafe { info.si_pid() } != 0
}
