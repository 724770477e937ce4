//! The remote-write sender against a real Prometheus (Debian's `prometheus`, with its
//! remote-write receiver on): what `RemoteWriter` pushes is queryable with the values,
//! names and labels a scrape of the same exposition would give, and a request
//! Prometheus refuses for good is dropped, not retried.

mod support;

use std::{
    io::{Read as _, Write as _},
    net::{SocketAddr, TcpStream},
    path::{Path, PathBuf},
    process::{Command, Stdio},
    thread,
    time::{Duration, Instant, SystemTime, UNIX_EPOCH},
};

use sframe_user::export::prometheus::remote_write::{Config, RemoteWriter, Stats};
use support::KillOnDrop;

/// Debian's `prometheus`, or `None` (after printing why) when it is missing outside CI.
fn prometheus_or_skip(test: &str) -> Option<PathBuf> {
    let works = Command::new("prometheus")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    if works {
        return Some("prometheus".into());
    }
    let why =
        "prometheus not installed (apt-get install prometheus; cargo xtask setup installs it)";
    if sframe_user::privileges::in_ci() {
        panic!("{test}: {why}");
    }
    eprintln!("SKIPPED {test}: {why} (set CI=true to make this a failure)");
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
fn http10_get(addr: SocketAddr, path: &str) -> Option<(u16, String)> {
    let mut s = TcpStream::connect(addr).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(10))).ok()?;
    write!(s, "GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n").ok()?;
    let mut out = String::new();
    s.read_to_string(&mut out).ok()?;
    let (head, body) = out.split_once("\r\n\r\n")?;
    let status = head.split(' ').nth(1)?.parse().ok()?;
    Some((status, body.to_owned()))
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

/// A Prometheus server on loopback with its remote-write receiver on and nothing to
/// scrape, in its own data directory, killed on drop. (Not the Debian package's
/// service, which may be running on :9090.)
struct PrometheusServer {
    _process: KillOnDrop,
    addr: SocketAddr,
}

impl PrometheusServer {
    fn start(prometheus: &Path) -> Self {
        let dir = support::fixture_dir("prometheus-remote-write");
        let config = dir.join("prometheus.yml");
        std::fs::write(&config, "scrape_configs: []\n").unwrap();
        for attempt in 0..3 {
            let addr: SocketAddr = ([127, 0, 0, 1], free_port()).into();
            let log_path = dir.join(format!("prometheus-{attempt}.log"));
            let log = std::fs::File::create(&log_path).unwrap();
            let mut process = KillOnDrop::spawn(
                Command::new(prometheus)
                    .arg("--web.enable-remote-write-receiver")
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
                if let Some((200, _)) = http10_get(addr, "/-/ready") {
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
                std::fs::read_to_string(&log_path).unwrap_or_default()
            );
        }
        panic!("prometheus did not start; logs in {}", dir.display());
    }

    fn write_url(&self) -> String {
        format!("http://{}/api/v1/write", self.addr)
    }

    /// The result vector of the instant query `promql`.
    fn query(&self, promql: &str) -> Vec<serde_json::Value> {
        let path = format!("/api/v1/query?query={}", url_encode(promql));
        let (status, body) = http10_get(self.addr, &path).expect("Prometheus answers");
        let json: serde_json::Value = serde_json::from_str(&body)
            .unwrap_or_else(|e| panic!("{promql}: {e}: {status} {body}"));
        assert_eq!(json["status"], "success", "{promql}: {body}");
        json["data"]["result"]
            .as_array()
            .cloned()
            .unwrap_or_default()
    }

    /// [`Self::query`] until it has `n` series, for up to 30 s.
    fn query_until(&self, promql: &str, n: usize) -> Vec<serde_json::Value> {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let result = self.query(promql);
            if result.len() == n {
                return result;
            }
            assert!(
                Instant::now() < deadline,
                "{promql}: {} series, not {n}: {result:?}",
                result.len()
            );
            thread::sleep(Duration::from_millis(200));
        }
    }
}

fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis()
        .try_into()
        .unwrap()
}

fn wait_stats(writer: &RemoteWriter, what: &str, done: impl Fn(&Stats) -> bool) -> Stats {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let stats = writer.stats();
        if done(&stats) {
            return stats;
        }
        assert!(Instant::now() < deadline, "{what}: {stats:?}");
        thread::sleep(Duration::from_millis(50));
    }
}

/// The series' value, as a number.
fn value(series: &serde_json::Value) -> f64 {
    series["value"][1]
        .as_str()
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no value in {series}"))
}

/// An exposition like the profiler's: counters (one with escaped label values, one with
/// its own `job`), a `_created` sample, a histogram and a gauge.
fn exposition(samples_main_work: u64) -> String {
    format!(
        r#"# HELP sframe_stack_samples Samples per stack.
# TYPE sframe_stack_samples counter
sframe_stack_samples_total{{comm="prog",stack="main;work"}} {samples_main_work}
sframe_stack_samples_total{{comm="prog",stack="main;idle"}} 7
sframe_stack_samples_total{{comm="q\"uote",stack="a\\b;\"c\""}} 3
# HELP sframe_walk_outcomes Samples of target processes per stack walk outcome.
# TYPE sframe_walk_outcomes counter
sframe_walk_outcomes_total{{outcome="complete",job="own"}} 6
sframe_walk_outcomes_created{{outcome="complete",job="own"}} 1700000000.0
# HELP sframe_stack_frames User frames per sampled stack.
# TYPE sframe_stack_frames histogram
sframe_stack_frames_sum 12.0
sframe_stack_frames_count 6
sframe_stack_frames_bucket{{le="1.0"}} 0
sframe_stack_frames_bucket{{le="2.0"}} 6
sframe_stack_frames_bucket{{le="+Inf"}} 6
# HELP sframe_processes Processes being profiled.
# TYPE sframe_processes gauge
sframe_processes 2
# EOF
"#
    )
}

/// Series in [`exposition`] (the `_created` sample is not one).
const SERIES: u64 = 10;

#[test]
fn pushed_expositions_are_queryable_in_prometheus() {
    const TEST: &str = "pushed_expositions_are_queryable_in_prometheus";
    let Some(prometheus) = prometheus_or_skip(TEST) else {
        return;
    };
    let server = PrometheusServer::start(&prometheus);
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let _entered = runtime.enter();
    let writer = RemoteWriter::spawn(Config {
        headers: vec![("X-Scope-OrgID".into(), "tenant-1".into())],
        external_labels: vec![
            ("instance".into(), "test-host:9464".into()),
            ("job".into(), "sframe".into()),
        ],
        ..Config::new(server.write_url())
    })
    .unwrap();

    // Two pushes a second apart (both in the past: an instant query is at "now").
    let now = now_ms();
    writer.push(exposition(40), now - 1000);
    writer.push(exposition(42), now);
    let stats = wait_stats(&writer, "2 requests sent", |s| s.requests_sent == 2);
    assert_eq!(stats.samples_sent, 2 * SERIES, "{stats:?}");
    assert_eq!(
        (stats.requests_failed, stats.requests_rejected),
        (0, 0),
        "{stats:?}"
    );
    assert!(stats.last_success_unix_ms.abs_diff(now_ms() as u64) < 60_000);

    let stacks = server.query_until("sframe_stack_samples_total", 3);
    let find = |stack: &str| {
        stacks
            .iter()
            .find(|s| s["metric"]["stack"] == stack)
            .unwrap_or_else(|| panic!("no stack {stack:?} in {stacks:?}"))
    };
    let work = find("main;work");
    assert_eq!(value(work), 42.0, "{work}");
    assert_eq!(
        work["metric"],
        serde_json::json!({
            "__name__": "sframe_stack_samples_total",
            "comm": "prog",
            "stack": "main;work",
            "instance": "test-host:9464",
            "job": "sframe",
        })
    );
    assert_eq!(value(find("main;idle")), 7.0);
    // Escapes undone: Prometheus has the values themselves.
    let escaped = find("a\\b;\"c\"");
    assert_eq!(escaped["metric"]["comm"], "q\"uote", "{escaped}");
    assert_eq!(value(escaped), 3.0);
    // Both pushes are samples of the series.
    let over_time = server.query_until(
        "count_over_time(sframe_stack_samples_total{stack=\"main;work\"}[5m])",
        1,
    );
    assert_eq!(value(&over_time[0]), 2.0, "{over_time:?}");

    // A label of the exposition wins over an external label; no _created series.
    let outcomes = server.query_until("sframe_walk_outcomes_total", 1);
    assert_eq!(outcomes[0]["metric"]["job"], "own", "{outcomes:?}");
    assert_eq!(outcomes[0]["metric"]["instance"], "test-host:9464");
    assert_eq!(value(&outcomes[0]), 6.0);
    assert!(server.query("sframe_walk_outcomes_created").is_empty());

    // The histogram, as a scrape would store it.
    let buckets = server.query_until("sframe_stack_frames_bucket", 3);
    let inf = buckets
        .iter()
        .find(|s| s["metric"]["le"] == "+Inf")
        .expect("an +Inf bucket");
    assert_eq!(value(inf), 6.0);
    let quantile = server.query_until(
        "histogram_quantile(0.5, sframe_stack_frames_bucket{job=\"sframe\"})",
        1,
    );
    assert!((1.0..=2.0).contains(&value(&quantile[0])), "{quantile:?}");
    assert_eq!(
        value(&server.query_until("sframe_stack_frames_sum", 1)[0]),
        12.0
    );
    assert_eq!(value(&server.query_until("sframe_processes", 1)[0]), 2.0);
    let all = server.query_until("count({job=~\"sframe|own\"})", 1);
    assert_eq!(value(&all[0]), SERIES as f64, "{all:?}");

    // Samples far older than the head: Prometheus refuses them for good (400), so the
    // request is dropped, not retried, and the next one still goes through.
    writer.push(exposition(1), 1_000);
    writer.push(exposition(43), now_ms());
    let stats = wait_stats(&writer, "old request rejected, next sent", |s| {
        s.requests_rejected == 1 && s.requests_sent == 3
    });
    assert_eq!(stats.requests_retried, 0, "{stats:?}");
    let work = server.query_until("sframe_stack_samples_total{stack=\"main;work\"}", 1);
    assert_eq!(value(&work[0]), 43.0, "{work:?}");
}
