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

#[test]
fn prometheus_exporter_serves_fixture_stacks() {
    if !bpf_or_skip("prometheus_exporter_serves_fixture_stacks") {
        return;
    }
    let chain = spawn_chain();
    let pid = chain.pid().to_string();
    let mut profiler = KillOnDrop::spawn(
        Command::new(BIN)
            .args(["--pid", &pid, "--duration", "20", "--frequency", "499"])
            .args(["--prometheus", "127.0.0.1:0", "--prometheus-top-k", "3"])
            .args(["--format", "folded"])
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
    let addr: SocketAddr = loop {
        let line = rx
            .recv_timeout(Duration::from_secs(60))
            .expect("the profiler announces its metrics address");
        if let Some(rest) = line.strip_prefix("sframe-user: serving metrics on http://") {
            break rest.trim_end_matches("/metrics").parse().expect("address");
        }
    };
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

const WALK_OUTCOMES: [&str; 4] = ["complete", "truncated", "no_rule", "read_fault"];

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
    assert!(text.starts_with("<?xml") && text.trim_end().ends_with("</svg>"));
    assert!(text.contains(&format!("chain (pid {pid}), ")), "title");
    // The chain's frames, outermost first, in the order inferno draws them.
    let mut at = 0;
    for name in ["chain", "main", "f0", "f1", "f2", "leaf"] {
        let found = text[at..]
            .find(&format!("<title>{name} ("))
            .unwrap_or_else(|| panic!("{name} not found after offset {at}"));
        at += found;
    }

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
        user: names.iter().map(|&(n, o)| f(n, o)).collect(),
        kernel: Vec::new(),
        count,
        outcome: WalkOutcome::Complete,
    };
    let profile = Profile {
        processes: vec![ProcessProfile {
            ns_pid: None,
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
