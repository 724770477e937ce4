//! The Prometheus exporter end to end: the `sframe-user` binary profiles compiled C
//! fixtures and serves its stack series; plain TCP clients and Debian's real
//! `prometheus` servers read them — a scraping server, an agent that remote-writes to a
//! central server, and the profiler's own remote write to that server — and
//! `sframe-user promql-flamegraph` rebuilds the flame graph from the central server.

mod support;

use std::{
    collections::HashMap,
    process::{Command, Stdio},
    thread,
    time::{Duration, Instant},
};

use support::{CHAIN, KillOnDrop, bpf_or_skip, compile_c, prometheus as prom, spawn_chain};

const BIN: &str = env!("CARGO_BIN_EXE_sframe-user");

const WALK_OUTCOMES: [&str; 4] = ["complete", "truncated", "no_rule", "read_fault"];

/// The sum of the `sframe_stack_samples_total` series of an exposition.
fn stack_sum(text: &str) -> f64 {
    prom::stack_series(text)
        .iter()
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// The samples of the target processes, by walk outcome, summed.
fn outcome_sum(text: &str) -> f64 {
    text.lines()
        .filter(|l| l.starts_with("sframe_walk_outcomes_total{"))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// One program's series: no `pid` label, a handful of series whatever the budget, the
/// fixture's stack exact, and every sample in exactly one series (their sum equals the
/// samples taken, once none waits for a name).
#[test]
fn exporter_serves_the_flame_graph_within_the_budget() {
    if !bpf_or_skip("exporter_serves_the_flame_graph_within_the_budget") {
        return;
    }
    let chain = spawn_chain();
    let pid = chain.pid().to_string();
    let (profiler, addr) = prom::start_exporter(
        BIN,
        &[
            "--pid",
            &pid,
            "--duration",
            "30",
            "--frequency",
            "499",
            "--prometheus-max-series",
            "10",
        ],
    );
    let chain_series = |text: &str| {
        prom::value_of(
            text,
            "sframe_stack_samples_total{comm=\"chain\",stack=\"",
            |l| l.contains(&format!(";{CHAIN}\"}}")),
        )
    };
    // Budgeted in samples: the profiler's duration bounds the wait.
    let text = loop {
        let text = prom::scrape(addr);
        let settled =
            prom::value_of(&text, "sframe_stacks_waiting_for_names ", |_| true) == Some(0.0);
        if settled && chain_series(&text).is_some_and(|v| v >= 200.0) {
            break text;
        }
        assert!(
            !prom::exited(&profiler),
            "the profiler ended first:\n{text}"
        );
        thread::sleep(Duration::from_millis(300));
    };
    let series = prom::stack_series(&text);
    assert!(series.len() <= 10, "{} series:\n{text}", series.len());
    assert!(
        series.iter().all(|l| prom::label(l, "pid").is_none()),
        "pid is opt-in:\n{text}"
    );
    // Every sample of the target is in one series: the samples of the first update
    // (before the first plan) in the host's remainder, the rest under `chain`. The
    // walk outcome and the stack count of a sample are two map updates: a collection
    // may see the first of a sample being taken on each CPU, not yet the second.
    let samples = outcome_sum(&text);
    assert!(samples >= 200.0, "{text}");
    let cpus = thread::available_parallelism().map_or(1, |n| n.get()) as f64;
    let in_series = stack_sum(&text);
    assert!(
        in_series <= samples && in_series >= samples - cpus,
        "{in_series} samples in the series, {samples} taken:\n{text}"
    );
    assert_eq!(
        prom::value_of(&text, "sframe_stack_series{profile=\"cpu\"} ", |_| true),
        Some(series.len() as f64),
        "{text}"
    );
    assert!(!text.contains("profile=\"off_cpu\""), "{text}");
    let complete = prom::value_of(
        &text,
        "sframe_walk_outcomes_total{outcome=\"complete\"}",
        |_| true,
    );
    assert!(complete.is_some_and(|v| v >= 200.0), "{text}");
    for name in WALK_OUTCOMES {
        assert!(
            text.contains(&format!(
                "sframe_walk_outcomes_total{{outcome=\"{name}\"}} "
            )),
            "{name} missing:\n{text}"
        );
    }
    assert!(
        prom::value_of(&text, "sframe_objects_loaded ", |_| true).is_some_and(|v| v >= 2.0),
        "{text}"
    );
    // libc's table comes from its .eh_frame (Debian has no .sframe).
    assert!(
        prom::value_of(
            &text,
            "sframe_objects_by_source{source=\"eh_frame\"} ",
            |_| true
        )
        .is_some_and(|v| v >= 1.0),
        "{text}"
    );
    assert!(text.contains("sframe_bpf_runs_total "), "{text}");
    assert!(text.ends_with("# EOF\n"), "{text}");
    assert_eq!(prom::http10_get(addr, "/", "*/*").map(|r| r.0), Some(404));
    drop(profiler);
    drop(chain);
}

/// The old per-process flags are refused with a note of what replaced them.
#[test]
fn removed_flags_say_what_replaced_them() {
    let out = Command::new(BIN)
        .args(["--prometheus-top-k", "5", "--duration", "1"])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("--prometheus-max-series"), "{err}");
}

/// `--prometheus-group container --prometheus-pid-label`: two fixture processes in two
/// Docker-named cgroups, each spinning in its own function; each process's series
/// carry its own container id and pid, and only its own function.
#[test]
fn group_and_pid_labels_name_each_process() {
    if !bpf_or_skip("group_and_pid_labels_name_each_process") {
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
    let exe = compile_c(
        "churn",
        include_str!("support/c/churn.c"),
        &["-O2", "-fomit-frame-pointer", "-g"],
    );
    let procs: Vec<KillOnDrop> = ids
        .iter()
        .enumerate()
        .map(|(i, id)| {
            let dir = cgroups.make(&format!(
                "sframe-prom-{}/docker-{id}.scope",
                std::process::id()
            ));
            // `sh` moves itself into the cgroup and becomes the fixture (same pid):
            // work_1 in the first container, work_2 in the second.
            let script = format!(
                "echo $$ > {} && exec {} 60000 {}",
                dir.join("cgroup.procs").display(),
                exe.display(),
                i + 1
            );
            KillOnDrop::spawn(Command::new("sh").args(["-c", &script]))
        })
        .collect();
    thread::sleep(Duration::from_millis(200));
    let pids: Vec<String> = procs.iter().map(|c| c.pid().to_string()).collect();
    let (profiler, addr) = prom::start_exporter(
        BIN,
        &[
            "--pid",
            &pids[0],
            "--pid",
            &pids[1],
            "--duration",
            "30",
            "--frequency",
            "199",
            "--prometheus-group",
            "container",
            "--prometheus-pid-label",
        ],
    );
    let leaf = |i: usize| format!(";run;work_{}\"", i + 1);
    let text = loop {
        let text = prom::scrape(addr);
        let both = (0..2).all(|i| {
            prom::stack_series(&text)
                .iter()
                .any(|l| prom::label(l, "pid") == Some(&pids[i]) && l.contains(&leaf(i)))
        });
        if both {
            break text;
        }
        assert!(
            !prom::exited(&profiler),
            "the profiler ended first:\n{text}"
        );
        thread::sleep(Duration::from_millis(500));
    };
    for (i, pid) in pids.iter().enumerate() {
        let lines: Vec<&str> = prom::stack_series(&text)
            .into_iter()
            .filter(|l| prom::label(l, "pid") == Some(pid))
            .collect();
        assert!(!lines.is_empty(), "{text}");
        for l in &lines {
            assert_eq!(prom::label(l, "container_id"), Some(ids[i]), "{l}");
            assert_eq!(prom::label(l, "comm"), Some("churn"), "{l}");
            assert!(!l.contains(&leaf(1 - i)), "{l}");
        }
    }
    drop(profiler);
    drop(procs);
}

/// Hundreds of short processes of one program, one after the other, beside a long one:
/// the series stay within the budget, no process gets series of its own, and the
/// program's four stacks are there, shared by all of its processes.
#[test]
fn process_churn_does_not_grow_the_series() {
    if !bpf_or_skip("process_churn_does_not_grow_the_series") {
        return;
    }
    const BUDGET: usize = 40;
    let exe = compile_c(
        "churn",
        include_str!("support/c/churn.c"),
        &["-O2", "-fomit-frame-pointer", "-g"],
    );
    let chain = spawn_chain();
    let (profiler, addr) = prom::start_exporter(
        BIN,
        &[
            "--comm",
            "churn",
            "--comm",
            "chain",
            "--duration",
            "60",
            "--frequency",
            "499",
            "--prometheus-max-series",
            &BUDGET.to_string(),
        ],
    );
    // 400 processes of 20 ms of CPU each, two at a time.
    let mut spawned = 0;
    let mut max_series = 0;
    let mut pids = std::collections::HashSet::new();
    for round in 0..200 {
        let children: Vec<_> = (0..2)
            .map(|k| {
                Command::new(&exe)
                    .args(["20", &((round * 2 + k) % 4).to_string()])
                    .spawn()
                    .unwrap()
            })
            .collect();
        for mut c in children {
            pids.insert(c.id());
            c.wait().unwrap();
            spawned += 1;
        }
        if round % 20 == 0 {
            max_series = max_series.max(prom::stack_series(&prom::scrape(addr)).len());
        }
    }
    // The last plan (at most a minute apart; 1, 2, 4 … s at the start) has seen them.
    thread::sleep(Duration::from_secs(2));
    let text = prom::scrape(addr);
    let series = prom::stack_series(&text);
    max_series = max_series.max(series.len());
    assert!(
        spawned == 400 && pids.len() >= 300,
        "{spawned} {}",
        pids.len()
    );
    assert!(max_series <= BUDGET, "{max_series} series:\n{text}");
    assert!(
        series.iter().all(|l| prom::label(l, "pid").is_none()),
        "{text}"
    );
    let churn: Vec<&&str> = series
        .iter()
        .filter(|l| prom::label(l, "comm") == Some("churn"))
        .collect();
    for n in 0..4 {
        assert!(
            churn
                .iter()
                .any(|l| l.contains(&format!(";main;run;work_{n}\""))),
            "work_{n} has no series:\n{text}"
        );
    }
    let created = prom::value_of(
        &text,
        "sframe_stack_series_created_total{profile=\"cpu\"} ",
        |_| true,
    )
    .unwrap();
    // Series come and go only when planned: a few budgets' worth at the start, not
    // one per process (400 processes).
    assert!(created <= (3 * BUDGET) as f64, "{created} created:\n{text}");
    assert!(stack_sum(&text) <= outcome_sum(&text), "{text}");
    drop(profiler);
    drop(chain);
}

/// A hostile user (`nobody`) forks processes without end, each with a new command name
/// (the exporter's markers, quotes, backslashes, newlines, `;`) and 60 frames deep,
/// beside a victim spinning in its own chain. The series stay within their budgets, the
/// exposition stays valid (promtool), no label passes its bound, the hostile names are
/// escaped and cannot pass for the host remainder, and the victim's stack keeps its
/// own series.
#[test]
fn hostile_names_and_churn_stay_within_the_budget() {
    const TEST: &str = "hostile_names_and_churn_stay_within_the_budget";
    if !bpf_or_skip(TEST) {
        return;
    }
    let Some((_, promtool)) = prom::tools(TEST) else {
        return;
    };
    const BUDGET: usize = 60;
    const LABEL_BYTES: usize = 256;
    let exe = compile_c(
        "name_churn",
        include_str!("support/c/name_churn.c"),
        &["-O1", "-fomit-frame-pointer", "-g"],
    );
    let dir = support::hostile::nobody_dir("name-churn");
    let attacker_exe = dir.join("name_churn");
    std::fs::copy(&exe, &attacker_exe).unwrap();
    let victim = spawn_chain();
    let (profiler, addr) = prom::start_exporter(
        BIN,
        &[
            "--all",
            "--duration",
            "60",
            "--frequency",
            "499",
            "--prometheus-max-series",
            &BUDGET.to_string(),
            "--prometheus-max-label-bytes",
            &LABEL_BYTES.to_string(),
        ],
    );
    support::hostile::wait_attached(profiler.pid());
    // The victim's leaf has its series before the attack (planned at 1, 2, 4 … s).
    let victim_series = |text: &str| {
        prom::value_of(
            text,
            "sframe_stack_samples_total{comm=\"chain\",stack=\"",
            |l| l.contains(&format!(";{CHAIN}\"}}")),
        )
    };
    let victim_before = loop {
        if let Some(v) = victim_series(&prom::scrape(addr)) {
            break v;
        }
        assert!(!prom::exited(&profiler), "the profiler ended first");
        thread::sleep(Duration::from_millis(200));
    };
    let victim_cpu = support::hostile::cpu_seconds(victim.pid());
    let attacker =
        KillOnDrop::spawn(support::hostile::as_nobody(&attacker_exe).stdout(Stdio::null()));
    // Budgeted in the attacker's CPU: 4 s of it (over a thousand processes).
    let before = support::hostile::cpu_seconds(attacker.pid());
    let mut max_series = 0;
    let mut used = 0.0;
    while used < 4.0 {
        thread::sleep(Duration::from_millis(500));
        let children: f64 = std::fs::read_to_string(format!("/proc/{}/stat", attacker.pid()))
            .ok()
            .and_then(|s| {
                let rest = s.rsplit_once(") ")?.1.to_owned();
                let f: Vec<&str> = rest.split_whitespace().collect();
                // cutime + cstime: the children's CPU.
                Some((f.get(13)?.parse::<f64>().ok()? + f.get(14)?.parse::<f64>().ok()?) / 100.0)
            })
            .unwrap_or(0.0);
        used = support::hostile::cpu_seconds(attacker.pid()) - before + children;
        let text = prom::scrape(addr);
        max_series = max_series.max(prom::stack_series(&text).len());
        assert!(!prom::exited(&profiler), "the profiler ended first");
    }
    let text = prom::scrape(addr);
    let victim_cpu = support::hostile::cpu_seconds(victim.pid()) - victim_cpu;
    drop(attacker);
    let series = prom::stack_series(&text);
    max_series = max_series.max(series.len());
    assert!(max_series <= BUDGET, "{max_series} series:\n{text}");
    let bytes: usize = series.iter().map(|l| l.len() + 1).sum();
    assert!(bytes <= 480_000, "{bytes}");
    for l in &series {
        assert!(prom::longest_label(l) <= LABEL_BYTES, "{l}");
    }
    let (status, plain) =
        prom::http10_get(addr, "/metrics", "text/plain").expect("the exporter answers");
    assert_eq!(status, 200);
    let lint = prom::promtool_check(&promtool, &plain);
    assert!(lint.trim().is_empty(), "promtool: {lint}");
    // A process named `[other]…` is a program of its own: only the real host remainder
    // has comm="[other]" with stack="[other]", once.
    let remainders = series
        .iter()
        .filter(|l| l.starts_with("sframe_stack_samples_total{comm=\"[other]\",stack=\"[other]\"}"))
        .count();
    assert_eq!(remainders, 1, "{text}");
    // The victim's leaf keeps its own series through the attack (its share of the host
    // is far above the attacker's names, each a few samples), counting what its CPU
    // time in the attack is worth at 499 Hz: 60 % at least (timer sampling of a
    // time-sliced thread on a loaded machine misses up to a fifth, and the page lags
    // by a second).
    let value =
        victim_series(&text).unwrap_or_else(|| panic!("the victim lost its series:\n{text}"));
    let grew = value - victim_before;
    assert!(
        grew >= victim_cpu * 499.0 * 0.6 && grew > 0.0,
        "{grew} samples for {victim_cpu} s of CPU:\n{text}"
    );
    drop(profiler);
    drop(victim);
}

/// A real Prometheus server scrapes the exporter (OpenMetrics, as Prometheus asks for)
/// while the profiler samples the chain fixture; its query API then has the fixture's
/// stack with plausible counts, and `promtool` lints the exposition clean.
#[test]
fn prometheus_server_scrapes_fixture_stacks() {
    const TEST: &str = "prometheus_server_scrapes_fixture_stacks";
    if !bpf_or_skip(TEST) {
        return;
    }
    let Some((prometheus, promtool)) = prom::tools(TEST) else {
        return;
    };
    const FREQUENCY: f64 = 199.0;
    let chain = spawn_chain();
    let pid = chain.pid().to_string();
    let started = Instant::now();
    let (profiler, exporter) = prom::start_exporter(
        BIN,
        &["--pid", &pid, "--duration", "60", "--frequency", "199"],
    );
    let server = prom::Server::scraping(&prometheus, exporter);
    let deadline = Instant::now() + Duration::from_secs(40);
    let (series, elapsed) = loop {
        let series = server.query("sframe_stack_samples_total{comm=\"chain\"}");
        let elapsed = started.elapsed().as_secs_f64();
        let chain_value = series.iter().find_map(|s| {
            let stack = s["metric"]["stack"].as_str()?;
            stack
                .ends_with(&format!(";{CHAIN}"))
                .then(|| prom::sample_value(s))
        });
        if chain_value.is_some_and(|v| v >= 50.0) {
            break (series, elapsed);
        }
        assert!(
            Instant::now() < deadline,
            "no chain series ending in {CHAIN} with 50+ samples in Prometheus: {series:?}\ntargets: {}",
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
        assert_eq!(m["job"], "sframe", "{s}");
        assert_eq!(m["instance"], exporter.to_string(), "{s}");
        assert!(m["pid"].is_null(), "{s}");
        let value = prom::sample_value(s);
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
    // Complete: from `_start` through libc's start-up code (no frame pointers there
    // either) to the fixture's chain, outermost first.
    let frames: Vec<&str> = chain_stack.split(';').collect();
    assert_eq!(frames.first(), Some(&"_start"), "{chain_stack}");
    let libc = frames.iter().position(|f| f.starts_with("__libc_start"));
    let main = frames.iter().position(|f| *f == "main");
    assert!(libc.is_some() && libc < main, "{chain_stack}");
    // Prometheus parsed every scrape: the target is up with no error.
    let targets = server.api("targets");
    let target = targets["activeTargets"]
        .as_array()
        .and_then(|t| t.iter().find(|t| t["labels"]["job"] == "sframe"))
        .unwrap_or_else(|| panic!("{targets}"));
    assert_eq!(target["health"], "up", "{target}");
    assert_eq!(target["lastError"], "", "{target}");
    let complete = server.query("sframe_walk_outcomes_total{outcome=\"complete\"}");
    assert!(prom::sample_value(&complete[0]) >= 50.0, "{complete:?}");
    drop(server);

    // promtool lints the Prometheus text format (it reads no OpenMetrics): that is what
    // the exporter sends to a client that asks for text/plain.
    let (status, text) =
        prom::http10_get(exporter, "/metrics", "text/plain").expect("the exporter answers");
    assert_eq!(status, 200, "{text}");
    assert!(text.contains("comm=\"chain\""), "{text}");
    let lint = prom::promtool_check(&promtool, &text);
    assert!(lint.trim().is_empty(), "promtool: {lint}");
    drop(profiler);
    drop(chain);
}

/// The two fleet paths into one central Prometheus (`--web.enable-remote-write-receiver`):
/// a Prometheus agent (`--enable-feature=agent`) scrapes the profiler and remote-writes,
/// and the profiler remote-writes itself (`--prometheus-remote-write`). The central
/// server has the fixture's stack from both, with the labels of each path, and
/// `sframe-user promql-flamegraph` rebuilds the fixture's flame graph from it.
#[test]
fn agent_and_profiler_remote_write_to_a_central_prometheus() {
    const TEST: &str = "agent_and_profiler_remote_write_to_a_central_prometheus";
    if !bpf_or_skip(TEST) {
        return;
    }
    let Some((prometheus, _)) = prom::tools(TEST) else {
        return;
    };
    let central = prom::Server::start(
        &prometheus,
        "central",
        "global:\n  scrape_interval: 15s\n",
        false,
        &["--web.enable-remote-write-receiver"],
    );
    let write_url = format!("http://{}/api/v1/write", central.addr);
    let chain = spawn_chain();
    let pid = chain.pid().to_string();
    let (profiler, exporter) = prom::start_exporter(
        BIN,
        &[
            "--pid",
            &pid,
            "--duration",
            "90",
            "--frequency",
            "199",
            "--prometheus-remote-write",
            &write_url,
            "--prometheus-remote-write-interval",
            "1",
            "--prometheus-external-label",
            "path=direct",
            "--prometheus-remote-write-header",
            "X-Scope-OrgID: test",
        ],
    );
    // The agent's configuration is the one shipped, its intervals shortened and its
    // addresses replaced.
    let mut agent_config = include_str!("../../contrib/prometheus-agent.yml").to_owned();
    for (from, to) in [
        ("scrape_interval: 15s", "scrape_interval: 1s".to_owned()),
        ("scrape_timeout: 10s", "scrape_timeout: 1s".to_owned()),
        ("cluster: build-farm", "path: agent".to_owned()),
        ("127.0.0.1:9464", exporter.to_string()),
        (
            "http://prometheus.central:9090/api/v1/write",
            write_url.clone(),
        ),
    ] {
        assert!(
            agent_config.contains(from),
            "contrib/prometheus-agent.yml lacks {from}"
        );
        agent_config = agent_config.replace(from, &to);
    }
    let _agent = prom::Server::start(&prometheus, "agent", &agent_config, true, &[]);
    let chain_value = |path: &str| -> Option<(f64, serde_json::Value)> {
        central
            .query(&format!(
                "sframe_stack_samples_total{{comm=\"chain\",path=\"{path}\"}}"
            ))
            .into_iter()
            .find(|s| {
                s["metric"]["stack"]
                    .as_str()
                    .is_some_and(|st| st.ends_with(CHAIN))
            })
            .map(|s| (prom::sample_value(&s), s["metric"].clone()))
    };
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut first_seen = None;
    let (direct, agent) = loop {
        if first_seen.is_none() && chain_value("direct").is_some() {
            first_seen = Some(Instant::now());
        }
        if let (Some(d), Some(a)) = (chain_value("direct"), chain_value("agent"))
            && d.0 >= 100.0
            && a.0 >= 100.0
        {
            break (d, a);
        }
        assert!(
            Instant::now() < deadline,
            "the central server lacks the chain series of a path: direct {:?}, agent {:?}\ncentral log:\n{}",
            chain_value("direct"),
            chain_value("agent"),
            central.log()
        );
        thread::sleep(Duration::from_millis(500));
    };
    // Each path's own labels: the agent's scrape target, the profiler's defaults.
    assert_eq!(agent.1["instance"], exporter.to_string(), "{}", agent.1);
    assert_eq!(agent.1["job"], "sframe", "{}", agent.1);
    assert_eq!(direct.1["job"], "sframe", "{}", direct.1);
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap();
    assert_eq!(direct.1["instance"], host.trim(), "{}", direct.1);
    // The same counter through both paths: within the samples of a few seconds.
    assert!(
        (direct.0 - agent.0).abs() <= 199.0 * 10.0,
        "direct {} agent {}",
        direct.0,
        agent.0
    );
    // The sender's own health came along, with nothing dropped or refused.
    let sent = central.query("sframe_remote_write_requests_total{path=\"direct\"}");
    let by_result: HashMap<String, f64> = sent
        .iter()
        .map(|s| {
            (
                s["metric"]["result"].as_str().unwrap_or("").to_owned(),
                prom::sample_value(s),
            )
        })
        .collect();
    assert!(
        by_result.get("sent").is_some_and(|v| *v >= 3.0),
        "{by_result:?}"
    );
    assert_eq!(by_result.get("rejected"), Some(&0.0), "{by_result:?}");
    assert_eq!(by_result.get("dropped"), Some(&0.0), "{by_result:?}");

    // The flame graph of 10 s rebuilt from the central server, once the series cover
    // them: the fixture's stack with the samples its CPU time in them is worth.
    let covered = first_seen.unwrap() + Duration::from_secs(3);
    thread::sleep(covered.saturating_duration_since(Instant::now()));
    let cpu_before = support::hostile::cpu_seconds(chain.pid());
    thread::sleep(Duration::from_secs(10));
    let cpu = support::hostile::cpu_seconds(chain.pid()) - cpu_before;
    let end = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs_f64();
    // The window's last remote write lands within its interval (1 s).
    thread::sleep(Duration::from_secs(2));
    let folded = Command::new(BIN)
        .args([
            "promql-flamegraph",
            "--prometheus-url",
            &format!("http://{}", central.addr),
            "--window",
            "10s",
            "--selector",
            "path=\"direct\",comm=\"chain\"",
            "--format",
            "folded",
            "--time",
            &format!("{end:.3}"),
        ])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&folded.stdout);
    assert!(
        folded.status.success(),
        "{text}{}",
        String::from_utf8_lossy(&folded.stderr)
    );
    let chain_line = text
        .lines()
        .find(|l| l.starts_with("chain;") && l.contains(&format!(";{CHAIN} ")))
        .unwrap_or_else(|| panic!("no chain stack:\n{text}"));
    let count: f64 = chain_line.rsplit(' ').next().unwrap().parse().unwrap();
    // What Prometheus itself gives for the stack's increase() over the 10 s (rounded),
    // and of the order of the spinner's CPU in them at 199 Hz (increase() extrapolates
    // from the samples in the window, about one a second here, and timer sampling of a
    // time-sliced thread on a loaded machine misses up to a fifth: this bound catches
    // unit and scale errors).
    let r = central.api(&format!(
        "query?query={}&time={end:.3}",
        prom::url_encode(&format!(
            "sum(increase(sframe_stack_samples_total{{path=\"direct\",comm=\"chain\",stack=~\".*;{CHAIN}\"}}[10s]))"
        ))
    ));
    let stored: f64 = r["result"][0]["value"][1]
        .as_str()
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("{r}"));
    assert!(
        (count - stored).abs() <= 1.0,
        "{count} samples in the flame graph, Prometheus' increase() {stored}: {text}"
    );
    let expected = cpu * 199.0;
    assert!(
        (expected * 0.5..=expected * 1.3 + 4.0).contains(&count),
        "{count} samples, {expected:.0} expected ({cpu:.2} s of CPU): {text}"
    );
    let dir = support::fixture_dir("promql-svg");
    let svg = dir.join("flame.svg");
    let out = Command::new(BIN)
        .args([
            "promql-flamegraph",
            "--prometheus-url",
            &format!("http://{}", central.addr),
            "--window",
            "10s",
            "--selector",
            "path=\"direct\"",
            "--output",
        ])
        .arg(&svg)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let svg = std::fs::read_to_string(&svg).unwrap();
    for f in ["main", "f0", "f1", "f2", "leaf", "chain"] {
        assert!(svg.contains(&format!("<title>{f} (")), "{f} missing");
    }
    drop(profiler);
    drop(chain);
}

/// Needs no BPF: the exporter's text format passes `promtool check metrics`, and
/// promtool does find problems in what is not clean (so its silence means something).
#[test]
fn promtool_accepts_exporter_text_format() {
    use sframe_user::export::prometheus::{Health, Metrics, SeriesConfig, server};
    let Some((_, promtool)) = prom::tools("promtool_accepts_exporter_text_format") else {
        return;
    };
    let mut metrics = Metrics::new(SeriesConfig {
        pid_label: true,
        ..SeriesConfig::default()
    });
    let now = Instant::now();
    for second in 0..2 {
        metrics.record(42, "prog \"x\"", None, "main;work\\y", 2, 30);
        metrics.record(42, "prog \"x\"", None, "main;idle", 2, 20);
        metrics.record(42, "prog \"x\"", None, "main;rare", 2, 1);
        metrics.update(now + Duration::from_secs(second), &Health::default());
    }
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let listener = runtime
        .block_on(server::bind("127.0.0.1:0".parse().unwrap()))
        .unwrap();
    let addr = listener.local_addr().unwrap();
    let exposition = server::Exposition::default();
    exposition.set(metrics.render());
    runtime.spawn(server::serve(listener, exposition));
    let (status, text) =
        prom::http10_get(addr, "/metrics", "text/plain;version=0.0.4").expect("the server answers");
    assert_eq!(status, 200);
    assert!(text.contains("stack=\"main;work\\\\y\""), "{text}");
    let lint = prom::promtool_check(&promtool, &text);
    assert!(lint.trim().is_empty(), "promtool: {lint}");
    // The OpenMetrics form is not promtool's format: it complains.
    let (_, om) = prom::http10_get(addr, "/metrics", "application/openmetrics-text").unwrap();
    assert!(om.ends_with("# EOF\n"), "{om}");
    let out = Command::new(&promtool)
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .and_then(|mut c| {
            use std::io::Write as _;
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

/// The Prometheus configurations shipped in `contrib/` are ones `promtool` accepts.
#[test]
fn promtool_accepts_the_shipped_configurations() {
    const TEST: &str = "promtool_accepts_the_shipped_configurations";
    let Some((_, promtool)) = prom::tools(TEST) else {
        return;
    };
    let contrib = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../contrib");
    for file in ["prometheus.yml", "prometheus-agent.yml"] {
        let out = Command::new(&promtool)
            .args(["check", "config"])
            .arg(contrib.join(file))
            .output()
            .expect("run promtool");
        assert!(
            out.status.success(),
            "promtool check config {file}: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
}
