//! Frames of a stripped program named from a debuginfod server: elfutils' own
//! `debuginfod`, started on loopback, serves the separate debug file of a C++ program
//! built without frame pointers and stripped of every symbol. Without the server the
//! program's frames are `[prog+0x…]`; with it they are named, with file and line, the
//! debug file fetched while the program runs; with the server stopped, a second profile
//! names them from the disk cache.

mod support;

use std::{
    net::{SocketAddr, TcpListener},
    path::{Path, PathBuf},
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use support::{KillOnDrop, bpf_or_skip, fixture_dir, pprof_tool, pprof_traces};

const BIN: &str = env!("CARGO_BIN_EXE_sframe-user");
const SOURCE: &str = include_str!("support/c/debuginfod.cpp");

/// The stripped program and its build-id; its debug file goes to `served`.
fn build_stripped(dir: &Path, served: &Path) -> (PathBuf, String) {
    let src = dir.join("debuginfod.cpp");
    std::fs::write(&src, SOURCE).expect("write the source");
    let full = dir.join("prog.full");
    run(Command::new("g++")
        .args(["-O2", "-g", "-fomit-frame-pointer", "-Wl,--build-id", "-o"])
        .arg(&full)
        .arg(&src));
    run(Command::new("objcopy")
        .arg("--only-keep-debug")
        .arg(&full)
        .arg(served.join("prog.debug")));
    let prog = dir.join("prog");
    run(Command::new("objcopy")
        .arg("--strip-all")
        .arg(&full)
        .arg(&prog));
    std::fs::remove_file(&full).expect("remove the unstripped program");
    assert!(!support::has_section(&prog, ".symtab"));
    assert!(!support::has_section(&prog, ".debug_info"));
    let notes = Command::new("readelf")
        .arg("-n")
        .arg(&prog)
        .output()
        .expect("readelf");
    let text = String::from_utf8_lossy(&notes.stdout);
    let id = text
        .lines()
        .find_map(|l| l.trim().strip_prefix("Build ID: "))
        .expect("a build-id")
        .trim()
        .to_owned();
    (prog, id)
}

fn run(cmd: &mut Command) {
    let out = cmd.output().expect("run");
    assert!(
        out.status.success(),
        "{cmd:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The status of `GET path` over HTTP/1.0.
fn get_status(addr: SocketAddr, path: &str) -> Option<u16> {
    use std::io::{Read as _, Write as _};
    let mut s = std::net::TcpStream::connect(addr).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(10))).ok()?;
    write!(s, "GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n").ok()?;
    let mut head = [0u8; 32];
    let n = s.read(&mut head).ok()?;
    let head = String::from_utf8_lossy(head.get(..n)?).into_owned();
    head.split(' ').nth(1)?.parse().ok()
}

/// elfutils' debuginfod serving the ELF and DWARF files under `served`, on loopback;
/// returns once it serves the debug file of `build_id`.
fn start_server(served: &Path, db: &Path, build_id: &str) -> (KillOnDrop, SocketAddr) {
    let Ok(path) = which("debuginfod") else {
        panic!("debuginfod is not installed: cargo xtask setup installs it");
    };
    // A free port: taken from the kernel, released, given to the server.
    let port = TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port();
    let server = KillOnDrop::spawn(
        Command::new(path)
            .args(["-F", "-t", "0", "-g", "0", "-p", &port.to_string(), "-d"])
            .arg(db)
            .arg(served)
            .stdout(Stdio::null())
            .stderr(Stdio::null()),
    );
    let addr: SocketAddr = format!("127.0.0.1:{port}").parse().expect("address");
    let path = format!("/buildid/{build_id}/debuginfo");
    let start = Instant::now();
    while get_status(addr, &path) != Some(200) {
        assert!(
            start.elapsed() < Duration::from_secs(120),
            "debuginfod did not serve {path} in 120 s"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    (server, addr)
}

fn which(name: &str) -> Result<PathBuf, ()> {
    std::env::var_os("PATH")
        .into_iter()
        .flat_map(|p| std::env::split_paths(&p).collect::<Vec<_>>())
        .map(|d| d.join(name))
        .find(|p| p.is_file())
        .ok_or(())
}

/// Profiles `prog` (about `seconds` of CPU) in command mode into a pprof file, with
/// `args`; returns the traces `pprof -traces -lines` lists.
fn profile(
    pprof: &Path,
    out: &Path,
    prog: &Path,
    seconds: &str,
    args: &[&str],
) -> Vec<(u64, Vec<String>)> {
    let status = Command::new(BIN)
        .args(["--frequency", "199", "--format", "pprof", "--output"])
        .arg(out)
        .args(args)
        .arg("--")
        .arg(prog)
        .arg(seconds)
        .env_remove("DEBUGINFOD_URLS")
        .status()
        .expect("run the profiler");
    assert!(status.success(), "the profiler failed: {status}");
    pprof_traces(pprof, out, &["-lines"])
}

/// The share of samples whose stack is `spin_leaf` at its loop's line, called from
/// `spin_middle` and `main`, all in the fixture's source file; and the samples in all.
fn named_share(traces: &[(u64, Vec<String>)], leaf_line: usize) -> (f64, u64) {
    let total: u64 = traces.iter().map(|t| t.0).sum();
    let leaf = format!("debuginfod.cpp:{leaf_line}");
    let named: u64 = traces
        .iter()
        .filter(|(_, frames)| {
            let at = |i: usize, name: &str| {
                frames
                    .get(i)
                    .is_some_and(|f| f.contains(name) && f.contains("debuginfod.cpp:"))
            };
            frames
                .first()
                .is_some_and(|f| f.contains("fixture::Worker::spin_leaf") && f.contains(&leaf))
                && at(1, "fixture::Worker::spin_middle")
                && frames
                    .iter()
                    .any(|f| f.starts_with("main ") && f.contains("debuginfod.cpp:"))
        })
        .map(|t| t.0)
        .sum();
    (named as f64 / total.max(1) as f64, total)
}

#[test]
fn a_stripped_program_is_named_from_a_debuginfod_server_then_from_the_disk_cache() {
    if !bpf_or_skip("a_stripped_program_is_named_from_a_debuginfod_server_then_from_the_disk_cache")
    {
        return;
    }
    let pprof = pprof_tool().expect("pprof (cargo xtask setup installs what builds it)");
    let dir = fixture_dir("debuginfod");
    let served = dir.join("served");
    std::fs::create_dir_all(&served).expect("mkdir");
    let (prog, build_id) = build_stripped(&dir, &served);
    let leaf_line = SOURCE
        .lines()
        .position(|l| l.contains("SPIN_LEAF_LINE"))
        .expect("the leaf's line")
        + 1;

    // Without a server: the program's own frames have no names.
    let base = profile(
        &pprof,
        &dir.join("base.pb.gz"),
        &prog,
        "0.5",
        &["--no-debuginfod", "--no-cache"],
    );
    let unnamed: u64 = base.iter().map(|t| t.0).sum();
    assert!(unnamed > 0, "no samples");
    assert!(
        !base.iter().any(|(_, f)| f
            .iter()
            .any(|f| f.contains("spin_leaf") || f.contains("debuginfod.cpp"))),
        "named without a server: {base:?}"
    );

    let (server, addr) = start_server(&served, &dir.join("debuginfod.sqlite"), &build_id);
    let url = format!("http://{addr}");
    let cache = dir.join("cache");
    let cache_arg = cache.to_str().expect("UTF-8 path");
    let fetched = profile(
        &pprof,
        &dir.join("fetched.pb.gz"),
        &prog,
        "2",
        &["--debuginfod", &url, "--cache-dir", cache_arg],
    );
    let (share, total) = named_share(&fetched, leaf_line);
    eprintln!("through the server: {share:.3} of {total} samples named at the leaf's line");
    assert!(
        share >= 0.9 && total >= 100,
        "{share:.3} of {total} samples named: {fetched:?}"
    );
    let cached = cache.join("debuginfod").join(format!("{build_id}.debug"));
    assert!(cached.is_file(), "{} missing", cached.display());

    // The server stopped: the disk cache names them.
    drop(server);
    assert_eq!(get_status(addr, "/"), None, "the server still answers");
    let again = profile(
        &pprof,
        &dir.join("cached.pb.gz"),
        &prog,
        "1",
        &["--debuginfod", &url, "--cache-dir", cache_arg],
    );
    let (share, total) = named_share(&again, leaf_line);
    eprintln!("from the disk cache: {share:.3} of {total} samples named at the leaf's line");
    assert!(
        share >= 0.9 && total >= 50,
        "{share:.3} of {total} samples named: {again:?}"
    );
}
