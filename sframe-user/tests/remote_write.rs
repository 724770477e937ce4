//! The remote-write sender against a real Prometheus (Debian's `prometheus`, with its
//! remote-write receiver on): what `RemoteWriter` pushes is queryable with the values,
//! names and labels a scrape of the same exposition would give, and a request
//! Prometheus refuses for good is dropped, not retried.

mod support;

use std::{
    thread,
    time::{Duration, Instant, SystemTime, UNIX_EPOCH},
};

use sframe_user::export::prometheus::remote_write::{Config, RemoteWriter, Stats};
use support::prometheus as prom;

/// A Prometheus server with its remote-write receiver on, and no scrapes.
fn receiver(prometheus: &std::path::Path) -> prom::Server {
    prom::Server::start(
        prometheus,
        "prometheus-remote-write",
        "scrape_configs: []\n",
        false,
        &["--web.enable-remote-write-receiver"],
    )
}

/// [`prom::Server::query`] until it has `n` series, for up to 30 s.
fn query_until(server: &prom::Server, promql: &str, n: usize) -> Vec<serde_json::Value> {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let result = server.query(promql);
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
    let Some((prometheus, _)) = prom::tools(TEST) else {
        return;
    };
    let server = receiver(&prometheus);
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let _entered = runtime.enter();
    let writer = RemoteWriter::spawn(Config {
        headers: vec![("X-Scope-OrgID".into(), "tenant-1".into())],
        external_labels: vec![
            ("instance".into(), "test-host:9464".into()),
            ("job".into(), "sframe".into()),
        ],
        ..Config::new(format!("http://{}/api/v1/write", server.addr))
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

    let stacks = query_until(&server, "sframe_stack_samples_total", 3);
    let find = |stack: &str| {
        stacks
            .iter()
            .find(|s| s["metric"]["stack"] == stack)
            .unwrap_or_else(|| panic!("no stack {stack:?} in {stacks:?}"))
    };
    let work = find("main;work");
    assert_eq!(prom::sample_value(work), 42.0, "{work}");
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
    assert_eq!(prom::sample_value(find("main;idle")), 7.0);
    // Escapes undone: Prometheus has the values themselves.
    let escaped = find("a\\b;\"c\"");
    assert_eq!(escaped["metric"]["comm"], "q\"uote", "{escaped}");
    assert_eq!(prom::sample_value(escaped), 3.0);
    // Both pushes are samples of the series.
    let over_time = query_until(
        &server,
        "count_over_time(sframe_stack_samples_total{stack=\"main;work\"}[5m])",
        1,
    );
    assert_eq!(prom::sample_value(&over_time[0]), 2.0, "{over_time:?}");

    // A label of the exposition wins over an external label; no _created series.
    let outcomes = query_until(&server, "sframe_walk_outcomes_total", 1);
    assert_eq!(outcomes[0]["metric"]["job"], "own", "{outcomes:?}");
    assert_eq!(outcomes[0]["metric"]["instance"], "test-host:9464");
    assert_eq!(prom::sample_value(&outcomes[0]), 6.0);
    assert!(server.query("sframe_walk_outcomes_created").is_empty());

    // The histogram, as a scrape would store it.
    let buckets = query_until(&server, "sframe_stack_frames_bucket", 3);
    let inf = buckets
        .iter()
        .find(|s| s["metric"]["le"] == "+Inf")
        .expect("an +Inf bucket");
    assert_eq!(prom::sample_value(inf), 6.0);
    let quantile = query_until(
        &server,
        "histogram_quantile(0.5, sframe_stack_frames_bucket{job=\"sframe\"})",
        1,
    );
    assert!(
        (1.0..=2.0).contains(&prom::sample_value(&quantile[0])),
        "{quantile:?}"
    );
    assert_eq!(
        prom::sample_value(&query_until(&server, "sframe_stack_frames_sum", 1)[0]),
        12.0
    );
    assert_eq!(
        prom::sample_value(&query_until(&server, "sframe_processes", 1)[0]),
        2.0
    );
    let all = query_until(&server, "count({job=~\"sframe|own\"})", 1);
    assert_eq!(prom::sample_value(&all[0]), SERIES as f64, "{all:?}");

    // Samples far older than the head: Prometheus refuses them for good (400), so the
    // request is dropped, not retried, and the next one still goes through.
    writer.push(exposition(1), 1_000);
    writer.push(exposition(43), now_ms());
    let stats = wait_stats(&writer, "old request rejected, next sent", |s| {
        s.requests_rejected == 1 && s.requests_sent == 3
    });
    assert_eq!(stats.requests_retried, 0, "{stats:?}");
    let work = query_until(
        &server,
        "sframe_stack_samples_total{stack=\"main;work\"}",
        1,
    );
    assert_eq!(prom::sample_value(&work[0]), 43.0, "{work:?}");
}
