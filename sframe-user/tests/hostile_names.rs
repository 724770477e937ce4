//! Names a hostile unprivileged process chooses cannot forge output lines: its command
//! name (`prctl(PR_SET_NAME)`) with a newline, a quote and braces reaches the folded
//! output, the flame graph and the metrics as one escaped name, on one line.

mod support;

use std::process::Command;

use support::{KillOnDrop, bpf_or_skip, compile_c};

const FORGER: &str = r#"
#include <sys/prctl.h>
volatile unsigned long sink;
__attribute__((noinline)) void forge_spin(void) { for (;;) for (int i = 0; i < 1000; i++) sink += i; }
int main(void) {
    prctl(PR_SET_NAME, "v 99999\nq\"{}\\", 0, 0, 0);
    forge_spin();
}
"#;

/// The fixture as uid/gid 65534 (nobody), no supplementary groups.
fn as_nobody(exe: &std::path::Path) -> Command {
    let mut c = Command::new("setpriv");
    c.args(["--reuid=65534", "--regid=65534", "--clear-groups"])
        .arg(exe);
    c
}

/// CPU seconds of process `pid` so far (utime + stime).
fn cpu_seconds(pid: u32) -> f64 {
    // Bytes: the command name in it need not be UTF-8.
    let stat = std::fs::read(format!("/proc/{pid}/stat")).unwrap_or_default();
    let stat = String::from_utf8_lossy(&stat);
    let rest = stat.rsplit_once(") ").map(|x| x.1).unwrap_or("");
    let f: Vec<&str> = rest.split_whitespace().collect();
    // utime and stime: fields 14 and 15 of the line, 11 and 12 after the comm.
    let tick = |i: usize| f.get(i).and_then(|v| v.parse::<u64>().ok()).unwrap_or(0);
    (tick(11) + tick(12)) as f64 / 100.0
}

/// Profiles `target` with `sframe-user --pid` until it has used `budget` CPU seconds
/// (not a wall-clock window: on a busy machine it may barely run), stops the profiler
/// with SIGTERM, asserts it exited well, and returns the folded output.
fn profile_folded(target: &KillOnDrop, exe: &std::path::Path, budget: f64) -> String {
    let dir = exe.parent().expect("fixture dir");
    let folded = dir.join(format!("out-{}.folded", target.pid()));
    let profiler = Command::new(env!("CARGO_BIN_EXE_sframe-user"))
        .args(["--pid", &target.pid().to_string()])
        .args(["--format", "folded", "--output"])
        .arg(&folded)
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("run sframe-user");
    let start = cpu_seconds(target.pid());
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(300);
    while cpu_seconds(target.pid()) - start < budget {
        assert!(
            std::path::Path::new(&format!("/proc/{}", target.pid())).exists(),
            "the target exited"
        );
        assert!(
            std::time::Instant::now() < deadline,
            "the target got no CPU in 300 s"
        );
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    // SAFETY: a signal to our own child.
    unsafe { libc::kill(profiler.id() as i32, libc::SIGTERM) };
    let out = profiler.wait_with_output().expect("wait for sframe-user");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    std::fs::read_to_string(&folded).expect("folded output")
}

const VICTIM: &str = r#"
volatile unsigned long sink;
__attribute__((noinline)) void victim_spin(void) { for (int i = 0; i < 100000; i++) sink += i; }
__attribute__((noinline)) void level2(void) { for (;;) victim_spin(); }
__attribute__((noinline)) void level1(void) { level2(); sink++; }
int main(void) { level1(); return 0; }
"#;

#[test]
fn a_program_run_from_a_path_that_is_not_utf8_is_profiled() {
    if !bpf_or_skip("a_program_run_from_a_path_that_is_not_utf8_is_profiled") {
        return;
    }
    use std::os::unix::ffi::OsStrExt as _;
    let exe = compile_c("victim-utf8", VICTIM, &["-O2"]);
    let hidden = exe.with_file_name(std::ffi::OsStr::from_bytes(b"vict\xff"));
    std::fs::copy(&exe, &hidden).expect("copy the victim");
    let victim = KillOnDrop::spawn(&mut as_nobody(&hidden));
    let text = profile_folded(&victim, &hidden, 2.0);
    let (mut spin, mut complete) = (0u64, 0u64);
    for line in text.lines() {
        let (stack, count) = line.rsplit_once(' ').expect("a count");
        let count: u64 = count.parse().expect("a count");
        if stack.ends_with(";victim_spin") {
            spin += count;
            if stack.contains(";main;level1;level2;victim_spin") {
                complete += count;
            }
        }
    }
    assert!(spin > 0, "no samples of the victim:\n{text}");
    assert!(
        complete * 100 >= spin * 95,
        "{complete} of {spin} samples complete:\n{text}"
    );
    // Its name (the file name, not UTF-8) is shown lossily, not replaced by `pidN`.
    assert!(text.starts_with("vict\u{fffd};"), "{text}");
}

#[test]
fn a_command_name_with_a_newline_cannot_forge_a_folded_line() {
    if !bpf_or_skip("a_command_name_with_a_newline_cannot_forge_a_folded_line") {
        return;
    }
    let exe = compile_c("forger", FORGER, &["-O2"]);
    let forger = KillOnDrop::spawn(&mut as_nobody(&exe));
    let text = profile_folded(&forger, &exe, 2.0);
    assert!(!text.is_empty(), "no samples");
    for line in text.lines() {
        // Every line is `STACK COUNT`, and its first frame is the whole, escaped name.
        let (stack, count) = line.rsplit_once(' ').expect("a count");
        assert!(count.parse::<u64>().is_ok(), "forged line: {line:?}");
        assert!(
            stack.starts_with("v_99999\\nq\"{}\\;"),
            "the command name is not one escaped frame: {line:?}"
        );
        assert!(!stack.starts_with('q'), "forged line: {line:?}");
    }
    assert!(text.contains("forge_spin"), "{text}");
}
