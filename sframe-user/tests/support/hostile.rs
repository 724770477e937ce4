//! Support for the tests of hostile local users: fixtures run as `nobody`, and the real
//! profiler binary run against them, budgeted in a target's CPU time.

use std::{
    path::Path,
    process::{Command, Stdio},
    time::{Duration, Instant},
};

/// `exe` run as uid/gid 65534 (nobody), no supplementary groups.
pub fn as_nobody(exe: &Path) -> Command {
    let mut c = Command::new("setpriv");
    c.args(["--reuid=65534", "--regid=65534", "--clear-groups"])
        .arg(exe);
    c
}

/// A directory `nobody` owns (and only it may write), for an attacker's files.
pub fn nobody_dir(name: &str) -> std::path::PathBuf {
    let dir = super::fixture_dir(name);
    std::os::unix::fs::chown(&dir, Some(65534), Some(65534)).expect("chown to nobody");
    dir
}

/// CPU seconds of process `pid` so far (utime + stime).
pub fn cpu_seconds(pid: u32) -> f64 {
    // Bytes: the command name in it need not be UTF-8.
    let stat = std::fs::read(format!("/proc/{pid}/stat")).unwrap_or_default();
    let stat = String::from_utf8_lossy(&stat);
    let rest = stat.rsplit_once(") ").map(|x| x.1).unwrap_or("");
    let f: Vec<&str> = rest.split_whitespace().collect();
    // utime and stime: fields 14 and 15 of the line, 11 and 12 after the comm.
    let tick = |i: usize| f.get(i).and_then(|v| v.parse::<u64>().ok()).unwrap_or(0);
    (tick(11) + tick(12)) as f64 / 100.0
}

/// Waits until the profiler process `pid` holds BPF links (its programs are attached:
/// samples are being taken), for at most 300 s; panics if it exits first.
pub fn wait_attached(pid: u32) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(300);
    loop {
        let attached = std::fs::read_dir(format!("/proc/{pid}/fd"))
            .expect("the profiler runs")
            .filter_map(Result::ok)
            .filter_map(|e| std::fs::read_link(e.path()).ok())
            .any(|l| l.to_string_lossy().contains("bpf_link"));
        if attached {
            return;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the profiler did not attach in 300 s"
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
}

/// Waits until process `pid` has used `secs` more seconds of CPU (a test budgeted in its
/// workload's CPU time, not a wall-clock window), at most 300 s of wall time; `alive`
/// is checked between polls (e.g. the profiler has not exited). Returns the CPU used.
pub fn wait_cpu(pid: u32, secs: f64, mut alive: impl FnMut()) -> f64 {
    let start = cpu_seconds(pid);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(300);
    loop {
        let used = cpu_seconds(pid) - start;
        if used >= secs {
            return used;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "process {pid} got {used:.2} of {secs} CPU seconds in 300 s"
        );
        alive();
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
}

/// The processes whose command name is `comm` now.
pub fn all_pids_named(comm: &str) -> Vec<u32> {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            std::fs::read_to_string(format!("/proc/{pid}/comm")).is_ok_and(|c| c.trim_end() == comm)
        })
        .collect()
}

/// A field of `/proc/PID/status` in kB (`VmHWM`, `VmRSS`).
pub fn status_kb(pid: u32, field: &str) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status
        .lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))?
        .trim()
        .trim_end_matches(" kB")
        .parse()
        .ok()
}

/// How long the profiler may take to stop after SIGTERM (it writes its report; a
/// generous bound: what it guards against is a profiler that never stops).
pub const STOP_LIMIT: Duration = Duration::from_secs(120);

/// What one profiler run gave.
pub struct Run {
    pub folded: String,
    /// The profiler's peak RSS (VmHWM) in kB, just before it was stopped.
    pub peak_rss_kb: u64,
    /// The profiler's CPU seconds, stopping included.
    pub cpu: f64,
    /// Seconds from the profiler's start to its exit.
    pub wall: f64,
}

/// Runs `sframe-user` with `args` (targets and options) and folded output until process
/// `budget_pid` has used `budget` CPU seconds (not a wall-clock window: on a busy
/// machine it may barely run), stops it with SIGTERM and asserts it exited well.
pub fn profile(args: &[String], budget_pid: u32, budget: f64, out_dir: &Path) -> Run {
    let folded = out_dir.join(format!("out-{budget_pid}-{}.folded", args.len()));
    let mut profiler = Command::new(env!("CARGO_BIN_EXE_sframe-user"))
        .args(args)
        .args(["--format", "folded", "--output"])
        .arg(&folded)
        .stderr(Stdio::piped())
        .spawn()
        .expect("run sframe-user");
    let started = Instant::now();
    let start = cpu_seconds(budget_pid);
    let deadline = Instant::now() + Duration::from_secs(300);
    while cpu_seconds(budget_pid) - start < budget {
        assert!(
            Path::new(&format!("/proc/{budget_pid}")).exists(),
            "the target exited"
        );
        assert!(
            profiler.try_wait().expect("poll sframe-user").is_none(),
            "sframe-user exited early"
        );
        assert!(Instant::now() < deadline, "the target got no CPU in 300 s");
        std::thread::sleep(Duration::from_millis(100));
    }
    let pid = profiler.id();
    let peak_rss_kb = status_kb(pid, "VmHWM").expect("profiler's VmHWM");
    // SAFETY: a signal to our own child.
    unsafe { libc::kill(pid as i32, libc::SIGTERM) };
    // Its stderr is drained meanwhile, so that it cannot block on a full pipe.
    let mut stderr = profiler.stderr.take().expect("piped stderr");
    let drain = std::thread::spawn(move || {
        let mut text = String::new();
        let _ = std::io::Read::read_to_string(&mut stderr, &mut text);
        text
    });
    // Waits for the exit without reaping, to read its final CPU times (stopping
    // included) from the zombie.
    // A profiler that does not stop within STOP_LIMIT is killed and the test fails
    // (a hang, such as a blocking open, would otherwise hang the test).
    let stop_deadline = Instant::now() + STOP_LIMIT;
    loop {
        // SAFETY: waitid(2) on our own child with a zeroed siginfo_t to fill.
        let (waited, exited) = unsafe {
            let mut info: libc::siginfo_t = std::mem::zeroed();
            let r = libc::waitid(
                libc::P_PID,
                pid,
                &mut info,
                libc::WEXITED | libc::WNOWAIT | libc::WNOHANG,
            );
            (r, info.si_pid() != 0)
        };
        assert_eq!(waited, 0, "waitid: {}", std::io::Error::last_os_error());
        if exited {
            break;
        }
        if Instant::now() > stop_deadline {
            let _ = profiler.kill();
            let _ = profiler.wait();
            panic!("sframe-user did not stop within {STOP_LIMIT:?} of SIGTERM");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let cpu = cpu_seconds(pid);
    let status = profiler.wait().expect("wait for sframe-user");
    let out = std::process::Output {
        status,
        stdout: Vec::new(),
        stderr: drain.join().unwrap_or_default().into_bytes(),
    };
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    Run {
        folded: std::fs::read_to_string(&folded).expect("folded output"),
        peak_rss_kb,
        cpu,
        wall: started.elapsed().as_secs_f64(),
    }
}

/// All samples of the process named `comm` in folded stacks (its first frame), and those
/// of them that go through `chain` (e.g. `;main;level1;level2;victim_spin`, kernel frames
/// after it allowed). A sample counted without frames, or whose walk stopped short, is
/// in the first count only: incomplete.
pub fn complete(folded: &str, comm: &str, chain: &str) -> (u64, u64) {
    let (mut all, mut complete) = (0u64, 0u64);
    for line in folded.lines() {
        let (stack, count) = line.rsplit_once(' ').expect("a count");
        let count: u64 = count.parse().expect("a count");
        if stack.split(';').next() == Some(comm) {
            all += count;
            if stack.contains(chain) {
                complete += count;
            }
        }
    }
    (complete, all)
}

/// A no-frame-pointer program spinning in `main → level1 → level2 → victim_spin`.
pub const VICTIM: &str = r#"
volatile unsigned long sink;
__attribute__((noinline)) void victim_spin(void) { for (int i = 0; i < 100000; i++) sink += i; }
__attribute__((noinline)) void level2(void) { for (;;) victim_spin(); }
__attribute__((noinline)) void level1(void) { level2(); sink++; }
int main(void) { level1(); return 0; }
"#;

/// The victim's complete chain in folded stacks.
pub const VICTIM_CHAIN: &str = ";main;level1;level2;victim_spin";
