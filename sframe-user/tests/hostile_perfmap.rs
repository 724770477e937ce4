//! Perf maps (`/tmp/perf-PID.map`) are files any user writes: hostile ones, made by
//! `nobody` for its own JIT processes and for another user's, never name anyone else's
//! frames, never block the profiler, and cost bounded memory and CPU. Against a baseline
//! run of the same profiler on the victims alone, in the same test:
//! - a map that is a symlink to a root-only file is not followed;
//! - a map that is a FIFO is not opened for reading (the profiler would block);
//! - a map of 96 MiB, its one true line at the end, is read within the bounds;
//! - a map `nobody` wrote for a root process that writes none is not used for it;
//! - a map last written before its process started (an earlier process's) is not used;
//!
//! The victim, which writes its own map, keeps its names on complete stacks.

mod support;

use std::{
    io::{BufRead as _, Write as _},
    os::unix::fs::{PermissionsExt as _, lchown},
    path::PathBuf,
    process::{Command, Stdio},
    time::{Duration, SystemTime},
};

use support::{
    KillOnDrop, bpf_or_skip, compile_c,
    hostile::{self, as_nobody},
};

/// A JIT process: the address and size of its code, as it printed them.
struct Jit {
    process: KillOnDrop,
    code: u64,
    size: u64,
}

fn spawn_jit(mut cmd: Command) -> Jit {
    let mut process = KillOnDrop::spawn(cmd.stdout(Stdio::piped()));
    let stdout = process.0.stdout.take().expect("piped stdout");
    let mut line = String::new();
    std::io::BufReader::new(stdout)
        .read_line(&mut line)
        .expect("the JIT's address");
    let mut parts = line.split_whitespace();
    let mut hex = || u64::from_str_radix(parts.next().expect("a number"), 16).expect("hex");
    let (code, size) = (hex(), hex());
    Jit {
        process,
        code,
        size,
    }
}

fn map_path(pid: u32) -> PathBuf {
    PathBuf::from(format!("/tmp/perf-{pid}.map"))
}

/// Writes `text` as process `pid`'s map, owned by `nobody`.
fn nobody_map(pid: u32, text: &str) -> PathBuf {
    let path = map_path(pid);
    std::fs::write(&path, text).expect("write a map");
    lchown(&path, Some(65534), Some(65534)).expect("chown to nobody");
    path
}

/// Removes the maps made when dropped.
struct Maps(Vec<PathBuf>);

impl Drop for Maps {
    fn drop(&mut self) {
        for p in &self.0 {
            let _ = std::fs::remove_file(p);
        }
    }
}

const RSS_MARGIN_KB: u64 = 32 * 1024;

#[test]
fn hostile_perf_maps_name_nobody_elses_frames_and_cost_bounded_work() {
    if !bpf_or_skip("hostile_perf_maps_name_nobody_elses_frames_and_cost_bounded_work") {
        return;
    }
    let exe = compile_c(
        "jit",
        include_str!("support/c/jit.c"),
        &["-O2", "-fno-omit-frame-pointer"],
    );
    let dir = exe.parent().expect("fixture dir").to_owned();
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
    let named = |name: &str| -> PathBuf {
        let p = dir.join(name);
        std::fs::copy(&exe, &p).expect("copy the JIT");
        p
    };
    let victim = spawn_jit({
        let mut c = Command::new(named("jitvictim"));
        c.arg("victim_code");
        c
    });
    // A root process that writes no map of its own.
    let bare = spawn_jit(Command::new(named("jitbare")));
    let mut maps = Maps(vec![map_path(victim.process.pid())]);
    let out = dir.clone();
    let pids = |jits: &[&Jit]| -> Vec<String> {
        jits.iter()
            .flat_map(|j| ["--pid".to_owned(), j.process.pid().to_string()])
            .collect()
    };
    let baseline = hostile::profile(&pids(&[&victim, &bare]), victim.process.pid(), 2.0, &out);

    // nobody's map for the root process.
    maps.0.push(nobody_map(
        bare.process.pid(),
        &format!("{:x} {:x} forged_name\n", bare.code, bare.size),
    ));
    // nobody's own processes, with hostile maps.
    let link = spawn_jit(as_nobody(&named("jitlink")));
    // A root-only file that, read through the link, would name nobody's code.
    let secret = support::fixture_dir("perfmap-root-only");
    std::fs::set_permissions(&secret, std::fs::Permissions::from_mode(0o700)).unwrap();
    let secret = secret.join("secret.map");
    std::fs::write(
        &secret,
        format!("{:x} {:x} root_secret\n", link.code, link.size),
    )
    .unwrap();
    let path = map_path(link.process.pid());
    std::os::unix::fs::symlink(&secret, &path).unwrap();
    lchown(&path, Some(65534), Some(65534)).unwrap();
    maps.0.push(path);

    let fifo = spawn_jit(as_nobody(&named("jitfifo")));
    let path = map_path(fifo.process.pid());
    let c = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()).unwrap();
    // SAFETY: mkfifo(3) of a NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o644) }, 0);
    lchown(&path, Some(65534), Some(65534)).unwrap();
    maps.0.push(path);

    let huge = spawn_jit(as_nobody(&named("jithuge")));
    let path = map_path(huge.process.pid());
    {
        let mut w = std::io::BufWriter::new(std::fs::File::create(&path).unwrap());
        let name = "h".repeat(1000);
        let mut written = 0u64;
        let mut addr = 0x1000_0000_0000u64;
        while written < 96 << 20 {
            let line = format!("{addr:x} 10 {name}\n");
            w.write_all(line.as_bytes()).unwrap();
            written += line.len() as u64;
            addr += 0x10;
        }
        writeln!(w, "{:x} {:x} huge_code", huge.code, huge.size).unwrap();
    }
    lchown(&path, Some(65534), Some(65534)).unwrap();
    maps.0.push(path);

    let stale = spawn_jit(as_nobody(&named("jitstale")));
    let path = nobody_map(
        stale.process.pid(),
        &format!("{:x} {:x} stale_name\n", stale.code, stale.size),
    );
    std::fs::File::options()
        .write(true)
        .open(&path)
        .unwrap()
        .set_modified(SystemTime::now() - Duration::from_secs(24 * 3600))
        .unwrap();
    maps.0.push(path);

    let attacked = hostile::profile(
        &pids(&[&victim, &bare, &link, &fifo, &huge, &stale]),
        victim.process.pid(),
        2.0,
        &out,
    );
    eprintln!(
        "peak RSS: {} kB alone, {} kB attacked; CPU: {:.2} s alone, {:.2} s attacked",
        baseline.peak_rss_kb, attacked.peak_rss_kb, baseline.cpu, attacked.cpu
    );
    for run in [&baseline, &attacked] {
        let (complete, all) =
            hostile::complete(&run.folded, "jitvictim", ";main;jit_caller;victim_code");
        assert!(
            all > 0 && complete * 100 >= all * 90,
            "{complete} of {all} victim samples named and complete:\n{}",
            run.folded
        );
        let (_, bare_all) = hostile::complete(&run.folded, "jitbare", "");
        assert!(bare_all > 0, "no samples of the bare JIT:\n{}", run.folded);
    }
    let of = |comm: &str| -> String {
        attacked
            .folded
            .lines()
            .filter(|l| l.split(';').next() == Some(comm))
            .collect::<Vec<_>>()
            .join("\n")
    };
    for comm in ["jitlink", "jitfifo", "jithuge", "jitstale"] {
        assert!(
            !of(comm).is_empty(),
            "no samples of {comm}:\n{}",
            attacked.folded
        );
    }
    assert!(
        !attacked.folded.contains("forged_name"),
        "nobody's map named root's frames:\n{}",
        of("jitbare")
    );
    assert!(
        !of("jitlink").contains("root_secret"),
        "a symlinked map was followed:\n{}",
        of("jitlink")
    );
    assert!(
        !of("jitstale").contains("stale_name"),
        "a map older than its process was used:\n{}",
        of("jitstale")
    );
    assert!(
        !of("jithuge").contains("hhhh"),
        "a line of the huge map names code it does not cover:\n{}",
        of("jithuge")
    );
    assert!(
        attacked.peak_rss_kb <= baseline.peak_rss_kb + RSS_MARGIN_KB,
        "peak RSS {} kB under attack, {} kB without",
        attacked.peak_rss_kb,
        baseline.peak_rss_kb
    );
    // The same victim budget; the attack adds its processes' samples and a few MiB of
    // map read, not 96 MiB.
    assert!(
        attacked.cpu <= 2.0 * baseline.cpu + 0.5,
        "profiler CPU {:.2} s under attack, {:.2} s without",
        attacked.cpu,
        baseline.cpu
    );
    drop(maps);
}
