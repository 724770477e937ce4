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

#[test]
fn a_command_name_with_a_newline_cannot_forge_a_folded_line() {
    if !bpf_or_skip("a_command_name_with_a_newline_cannot_forge_a_folded_line") {
        return;
    }
    let exe = compile_c("forger", FORGER, &["-O2"]);
    let forger = KillOnDrop::spawn(&mut as_nobody(&exe));
    let dir = exe.parent().expect("fixture dir");
    let folded = dir.join("out.folded");
    // Budgeted in the forger's own CPU time, not a wall-clock window: on a busy machine
    // it may barely run.
    let profiler = Command::new(env!("CARGO_BIN_EXE_sframe-user"))
        .args(["--pid", &forger.pid().to_string()])
        .args(["--format", "folded", "--output"])
        .arg(&folded)
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("run sframe-user");
    let cpu = || -> f64 {
        let stat =
            std::fs::read_to_string(format!("/proc/{}/stat", forger.pid())).unwrap_or_default();
        let rest = stat.rsplit_once(") ").map(|x| x.1).unwrap_or("");
        let f: Vec<&str> = rest.split_whitespace().collect();
        // utime and stime: fields 14 and 15 of the line, 11 and 12 after the comm.
        let tick = |i: usize| f.get(i).and_then(|v| v.parse::<u64>().ok()).unwrap_or(0);
        (tick(11) + tick(12)) as f64 / 100.0
    };
    let start = cpu();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(300);
    while cpu() - start < 2.0 {
        assert!(
            std::time::Instant::now() < deadline,
            "the forger got no CPU in 300 s"
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
    let text = std::fs::read_to_string(&folded).expect("folded output");
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
