//! The pull endpoint of profiles, `GET /debug/pprof/profile?seconds=N` on the
//! `--prometheus` address, as Go's `net/http/pprof` serves it: fetched by Google's
//! `pprof` itself over HTTP, the samples of the N seconds after the request (judged
//! against the workload's CPU time over the request), with complete stacks; at most two
//! at once (429 beyond), bad `seconds` refused, and `/metrics` still served meanwhile;
//! `pid` and `comm` parameters keep only the processes they name.

mod support;

use std::process::Command;

use support::{
    CHAIN, bpf_or_skip, fixture_dir,
    hostile::{cpu_seconds, wait_attached},
    pprof_tool, pprof_traces,
    prometheus::{http10_get, scrape, start_exporter},
    spawn_chain,
};

const BIN: &str = env!("CARGO_BIN_EXE_sframe-user");

/// The status of `GET path` over HTTP/1.0 (the body may be binary); `None` when the
/// connection ends without an answer.
fn get_status(addr: std::net::SocketAddr, path: &str) -> Option<u16> {
    use std::io::{Read as _, Write as _};
    let mut s = std::net::TcpStream::connect(addr).ok()?;
    write!(s, "GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n").ok()?;
    let mut out = Vec::new();
    s.read_to_end(&mut out).ok()?;
    let head = String::from_utf8_lossy(out.get(..out.len().min(64))?).into_owned();
    head.split(' ').nth(1)?.parse().ok()
}
const FREQUENCY: f64 = 99.0;

#[test]
fn a_profile_is_pulled_by_pprof_over_http_with_complete_stacks() {
    if !bpf_or_skip("a_profile_is_pulled_by_pprof_over_http_with_complete_stacks") {
        return;
    }
    let pprof = pprof_tool().expect("pprof (cargo xtask setup installs what builds it)");
    let chain = spawn_chain();
    let pid = chain.pid().to_string();
    let (exporter, addr) = start_exporter(BIN, &["--pid", &pid, "--frequency", "99"]);
    wait_attached(exporter.pid());
    let out = fixture_dir("pprof-pull");
    let saved = out.join("pulled.pb.gz");
    let before = cpu_seconds(chain.pid());
    let fetched = Command::new(&pprof)
        .args(["-proto", "-seconds", "3", "-output"])
        .arg(&saved)
        .arg(format!("http://{addr}/debug/pprof/profile"))
        .env("HOME", env!("CARGO_TARGET_TMPDIR"))
        .output()
        .expect("run pprof");
    let cpu = cpu_seconds(chain.pid()) - before;
    assert!(
        fetched.status.success(),
        "{}",
        String::from_utf8_lossy(&fetched.stderr)
    );
    let traces = pprof_traces(&pprof, &saved, &[]);
    let total: u64 = traces.iter().map(|t| t.0).sum();
    // The chain, innermost first, as pprof lists a trace.
    let chain_frames: Vec<&str> = CHAIN.rsplit(';').collect();
    let through: u64 = traces
        .iter()
        .filter(|(_, frames)| {
            frames.len() > chain_frames.len()
                && frames.iter().zip(&chain_frames).all(|(f, c)| f == c)
                && frames.last().is_some_and(|f| f == "_start")
        })
        .map(|t| t.0)
        .sum();
    eprintln!(
        "{total} samples pulled ({through} complete through {CHAIN}), the workload used {cpu:.2} s of CPU"
    );
    // The profile covers at least the 3 s asked for and lies within the request, whose
    // CPU time also counts pprof's start and the profile's making.
    let expected = cpu * FREQUENCY;
    assert!(
        total as f64 <= expected * 1.1 + 5.0,
        "{total} samples for {cpu:.2} s of CPU at {FREQUENCY} Hz"
    );
    assert!(
        total as f64 >= expected * 0.5,
        "{total} samples for {cpu:.2} s of CPU at {FREQUENCY} Hz"
    );
    assert!(
        through * 100 >= total * 95,
        "{through} of {total} samples complete through {CHAIN}: {traces:?}"
    );
}

#[test]
fn pulls_are_bounded_and_their_arguments_checked() {
    if !bpf_or_skip("pulls_are_bounded_and_their_arguments_checked") {
        return;
    }
    let chain = spawn_chain();
    let pid = chain.pid().to_string();
    let (exporter, addr) = start_exporter(BIN, &["--pid", &pid]);
    wait_attached(exporter.pid());
    for bad in ["0", "301", "x", "-1"] {
        let (status, body) =
            http10_get(addr, &format!("/debug/pprof/profile?seconds={bad}"), "*/*")
                .expect("an answer");
        assert_eq!(status, 400, "seconds={bad}: {body}");
    }
    // Three long pulls at once: two take both places, the third is refused at once;
    // scrapes go on meanwhile.
    let long: Vec<_> = (0..3)
        .map(|_| std::thread::spawn(move || get_status(addr, "/debug/pprof/profile?seconds=120")))
        .collect();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(100);
    while !long.iter().any(|t| t.is_finished()) {
        assert!(
            std::time::Instant::now() < deadline,
            "none of three pulls was refused"
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    assert!(scrape(addr).contains("sframe_stack_samples_total"));
    let (done, pending): (Vec<_>, Vec<_>) = long.into_iter().partition(|t| t.is_finished());
    assert_eq!(done.len(), 1, "more than one of three pulls ended early");
    for t in done {
        assert_eq!(t.join().expect("a pull"), Some(429));
    }
    drop(exporter);
    for t in pending {
        // Cut short by the profiler's end (no answer, or 503 if it answered first).
        let status = t.join().expect("a long pull");
        assert_ne!(status, Some(200), "a 120 s profile answered early");
    }
    drop(chain);
}

/// `pprof -tags` of `profile`: the values of tag `tag` it lists.
fn tag_values(pprof: &std::path::Path, profile: &std::path::Path, tag: &str) -> Vec<String> {
    let out = Command::new(pprof)
        .args(["-tags", &format!("-tagshow={tag}")])
        .arg(profile)
        .env("HOME", env!("CARGO_TARGET_TMPDIR"))
        .output()
        .expect("run pprof");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.split_once("%):").map(|(_, v)| v.trim().to_owned()))
        .collect()
}

/// Pulls of `pid` or `comm` keep only the processes named, of two profiled at once; a
/// filter that names none gives an empty profile.
#[test]
fn pulled_profiles_keep_the_processes_their_query_names() {
    if !bpf_or_skip("pulled_profiles_keep_the_processes_their_query_names") {
        return;
    }
    let pprof = pprof_tool().expect("pprof (cargo xtask setup installs what builds it)");
    let first = spawn_chain();
    // The same program under another name: another command name.
    let dir = fixture_dir("pprof-filter");
    let renamed = dir.join("chain_two");
    std::fs::copy(support::chain_fixture(), &renamed).expect("copy the fixture");
    let second = support::KillOnDrop::spawn(&mut Command::new(&renamed));
    let (a, b) = (first.pid().to_string(), second.pid().to_string());
    let (exporter, addr) = start_exporter(BIN, &["--pid", &a, "--pid", &b]);
    wait_attached(exporter.pid());
    let pull = |query: &str, name: &str| {
        let saved = dir.join(name);
        let fetched = Command::new(&pprof)
            .args(["-proto", "-output"])
            .arg(&saved)
            .arg(format!(
                "http://{addr}/debug/pprof/profile?seconds=2&{query}"
            ))
            .env("HOME", env!("CARGO_TARGET_TMPDIR"))
            .output()
            .expect("run pprof");
        assert!(
            fetched.status.success(),
            "{query}: {}",
            String::from_utf8_lossy(&fetched.stderr)
        );
        saved
    };
    let everything = pull("", "all.pb.gz");
    let mut pids = tag_values(&pprof, &everything, "pid");
    pids.sort();
    let mut both = vec![a.clone(), b.clone()];
    both.sort();
    assert_eq!(pids, both, "unfiltered");
    let by_pid = pull(&format!("pid={b}"), "pid.pb.gz");
    assert_eq!(
        tag_values(&pprof, &by_pid, "pid"),
        vec![b.clone()],
        "pid={b}"
    );
    let by_comm = pull("comm=chain_two", "comm.pb.gz");
    assert_eq!(tag_values(&pprof, &by_comm, "pid"), vec![b.clone()], "comm");
    assert_eq!(
        tag_values(&pprof, &by_comm, "comm"),
        vec!["chain_two".to_owned()]
    );
    let both_params = pull(&format!("pid={a}&comm=chain_two"), "none.pb.gz");
    assert!(
        tag_values(&pprof, &both_params, "pid").is_empty(),
        "pid={a}&comm=chain_two keeps a process"
    );
}
