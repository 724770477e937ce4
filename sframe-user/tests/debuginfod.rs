//! Frames of a stripped program named from a debuginfod server: elfutils' own
//! `debuginfod`, started on loopback, serves the separate debug file of a C++ program
//! built without frame pointers and stripped of every symbol. Without the server the
//! program's frames are `[prog+0x…]`; with it they are named, with file and line, the
//! debug file fetched while the program runs; with the server stopped, a second profile
//! names them from the disk cache.
//!
//! Build-ids are a hostile user's input: `nobody` maps a hundred objects of forged
//! build-ids; a server that counts what it is asked shows that they cause at most
//! `MAX_FETCHES_PER_USER` fetches, each once, while root's program is still named.

mod support;

use std::{
    net::{SocketAddr, TcpListener},
    path::{Path, PathBuf},
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use support::{
    KillOnDrop, bpf_or_skip, compile_c, fixture_dir,
    hostile::{as_nobody, nobody_dir},
    pprof_tool, pprof_traces,
};

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

/// What the counting server was asked for: each build-id, how many times.
type Asked = std::sync::Arc<std::sync::Mutex<std::collections::HashMap<String, u32>>>;

/// A debuginfod server of its own (HTTP/1.0 answers, one connection at a time): the
/// debug file `served` for `build_id`, 404 for any other; it counts every request.
fn counting_server(build_id: String, served: Vec<u8>) -> (SocketAddr, Asked) {
    use std::io::{BufRead as _, Write as _};
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = listener.local_addr().expect("address");
    let asked: Asked = Default::default();
    let counts = asked.clone();
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { continue };
            let mut reader = std::io::BufReader::new(stream.try_clone().expect("clone"));
            let mut request = String::new();
            if reader.read_line(&mut request).is_err() {
                continue;
            }
            // The headers, up to the blank line.
            let mut line = String::new();
            while reader.read_line(&mut line).is_ok_and(|n| n > 2) {
                line.clear();
            }
            let id = request
                .split_whitespace()
                .nth(1)
                .and_then(|p| p.strip_prefix("/buildid/"))
                .and_then(|p| p.strip_suffix("/debuginfo"))
                .unwrap_or("")
                .to_owned();
            *counts.lock().unwrap().entry(id.clone()).or_default() += 1;
            let _ = if id == build_id {
                write!(
                    stream,
                    "HTTP/1.0 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
                    served.len()
                )
                .and_then(|()| stream.write_all(&served))
            } else {
                write!(
                    stream,
                    "HTTP/1.0 404 Not Found\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
                )
            };
        }
    });
    (addr, asked)
}

/// Copies of `prog` whose build-id is replaced by `n` others, in a directory of
/// `nobody`'s, owned by it.
fn forged_copies(prog: &Path, build_id: &str, n: usize) -> (Vec<PathBuf>, Vec<String>) {
    let bytes = std::fs::read(prog).expect("read the program");
    let id: Vec<u8> = (0..build_id.len() / 2)
        .map(|i| u8::from_str_radix(&build_id[2 * i..2 * i + 2], 16).expect("hex"))
        .collect();
    let at = bytes
        .windows(id.len())
        .position(|w| w == id.as_slice())
        .expect("the build-id's bytes in the file");
    let dir = nobody_dir("forged");
    let mut paths = Vec::new();
    let mut ids = Vec::new();
    for i in 0..n {
        let mut forged = id.clone();
        forged[..4].copy_from_slice(&(0xf0f0_0000u32 + i as u32).to_be_bytes());
        let mut copy = bytes.clone();
        copy[at..at + forged.len()].copy_from_slice(&forged);
        let path = dir.join(format!("forged-{i}"));
        std::fs::write(&path, &copy).expect("write a forged object");
        std::os::unix::fs::chown(&path, Some(65534), Some(65534)).expect("chown");
        ids.push(forged.iter().map(|b| format!("{b:02x}")).collect());
        paths.push(path);
    }
    (paths, ids)
}

#[test]
fn forged_build_ids_of_a_user_cause_bounded_fetches_and_leave_others_named() {
    use std::io::BufRead as _;
    if !bpf_or_skip("forged_build_ids_of_a_user_cause_bounded_fetches_and_leave_others_named") {
        return;
    }
    let pprof = pprof_tool().expect("pprof (cargo xtask setup installs what builds it)");
    let dir = fixture_dir("debuginfod-hostile");
    let served = dir.join("served");
    std::fs::create_dir_all(&served).expect("mkdir");
    let (prog, build_id) = build_stripped(&dir, &served);
    let debug = std::fs::read(served.join("prog.debug")).expect("the debug file");
    let (addr, asked) = counting_server(build_id.clone(), debug);
    // The attacker: nobody maps 100 objects of forged build-ids.
    let (forged, forged_ids) = forged_copies(&prog, &build_id, 100);
    let mapper = compile_c("map_many", include_str!("support/c/map_many.c"), &["-O2"]);
    // It spins a while, then exits: the profile ends when it and root's program have.
    let mut attacker = KillOnDrop::spawn(
        as_nobody(&mapper)
            .arg("3")
            .args(&forged)
            .stdout(Stdio::piped()),
    );
    let mut line = String::new();
    std::io::BufReader::new(attacker.0.stdout.take().expect("stdout"))
        .read_line(&mut line)
        .expect("read");
    assert_eq!(
        line.trim(),
        "mapped",
        "the attacker did not map its objects"
    );
    let leaf_line = SOURCE
        .lines()
        .position(|l| l.contains("SPIN_LEAF_LINE"))
        .expect("the leaf's line")
        + 1;
    // Root's program, profiled with the attacker.
    let url = format!("http://{addr}");
    let cache = dir.join("cache");
    let traces = profile(
        &pprof,
        &dir.join("victim.pb.gz"),
        &prog,
        "3",
        &[
            "--pid",
            &attacker.pid().to_string(),
            "--debuginfod",
            &url,
            "--cache-dir",
            cache.to_str().expect("UTF-8 path"),
        ],
    );
    let asked = asked.lock().unwrap().clone();
    let forged_asked: Vec<(&String, &u32)> = asked
        .iter()
        .filter(|(id, _)| forged_ids.contains(id))
        .collect();
    eprintln!(
        "{} forged build-ids asked for, {} requests in all",
        forged_asked.len(),
        asked.values().sum::<u32>()
    );
    // The attacker's own executable counts against its bound too.
    assert!(
        (32..=64).contains(&forged_asked.len()),
        "{} of the 100 forged build-ids fetched (the bound is 64 per user): {asked:?}",
        forged_asked.len()
    );
    assert!(
        forged_asked.iter().all(|&(_, &n)| n == 1),
        "a forged build-id asked for twice: {forged_asked:?}"
    );
    assert_eq!(asked.get(&build_id), Some(&1), "root's program: {asked:?}");
    // Only the victim's samples: the attacker's are in its own process.
    let victim: Vec<(u64, Vec<String>)> = traces
        .into_iter()
        .filter(|(_, f)| {
            !f.iter()
                .any(|f| f.contains("map_many") || f.contains("forged"))
        })
        .filter(|(_, f)| {
            f.iter()
                .any(|f| f.starts_with("main ") || f.contains("[prog+"))
        })
        .collect();
    let (share, total) = named_share(&victim, leaf_line);
    eprintln!("root's program: {share:.3} of {total} samples named at the leaf's line");
    assert!(
        share >= 0.9 && total >= 100,
        "{share:.3} of {total} samples named: {victim:?}"
    );
}
