//! Names a hostile unprivileged process chooses cannot forge output lines: its command
//! name (`prctl(PR_SET_NAME)`) with a newline, a quote and braces reaches the folded
//! output, the flame graph and the metrics as one escaped name, on one line.

mod support;

use support::{
    KillOnDrop, bpf_or_skip, compile_c,
    hostile::{self, VICTIM, VICTIM_CHAIN, as_nobody},
};

const FORGER: &str = r#"
#include <sys/prctl.h>
volatile unsigned long sink;
__attribute__((noinline)) void forge_spin(void) { for (;;) for (int i = 0; i < 1000; i++) sink += i; }
int main(void) {
    prctl(PR_SET_NAME, "v 99999\nq\"{}\\", 0, 0, 0);
    forge_spin();
}
"#;

/// Profiles `target` alone until it used `budget` CPU seconds; the folded output.
fn profile_folded(target: &KillOnDrop, exe: &std::path::Path, budget: f64) -> String {
    let dir = exe.parent().expect("fixture dir");
    let args = ["--pid".to_owned(), target.pid().to_string()];
    hostile::profile(&args, target.pid(), budget, dir).folded
}

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
    let (complete, spin) = hostile::complete(&text, "vict\u{fffd}", VICTIM_CHAIN);
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

/// A thread that names itself (`pthread_setname_np`) with a newline, a `;` and a space.
const THREAD_FORGER: &str = r#"
#define _GNU_SOURCE
#include <pthread.h>
volatile unsigned long sink;
__attribute__((noinline)) void forged_thread_spin(void) {
    for (;;) for (int i = 0; i < 1000; i++) sink += i;
}
static void *run(void *arg) {
    (void)arg;
    pthread_setname_np(pthread_self(), "t 9\nq;x 1");
    forged_thread_spin();
    return 0;
}
int main(void) {
    pthread_t t;
    pthread_create(&t, 0, run, 0);
    pthread_join(t, 0);
    return 0;
}
"#;

#[test]
fn a_thread_name_with_a_newline_and_a_semicolon_cannot_forge_a_folded_line() {
    if !bpf_or_skip("a_thread_name_with_a_newline_and_a_semicolon_cannot_forge_a_folded_line") {
        return;
    }
    let exe = compile_c("thread-forger", THREAD_FORGER, &["-O2", "-pthread"]);
    let forger = KillOnDrop::spawn(&mut as_nobody(&exe));
    let dir = exe.parent().expect("fixture dir");
    let args = [
        "--pid".to_owned(),
        forger.pid().to_string(),
        "--group-by".to_owned(),
        "thread".to_owned(),
    ];
    let text = hostile::profile(&args, forger.pid(), 2.0, dir).folded;
    let mut spin = 0;
    for line in text.lines() {
        let (stack, count) = line.rsplit_once(' ').expect("a count");
        let count: u64 = count
            .parse()
            .unwrap_or_else(|_| panic!("forged line: {line:?}"));
        assert!(!stack.starts_with('q'), "forged line: {line:?}");
        if stack.contains("forged_thread_spin") {
            // The whole name is one frame: escaped newline, `;` and space as `_`, then `-PID/TID`.
            let group = stack.split(';').next().unwrap_or_default();
            assert!(
                group.starts_with("t_9\\nq_x_1-") && group.contains('/'),
                "the thread name is not one escaped frame: {line:?}"
            );
            spin += count;
        }
    }
    assert!(spin > 0, "no samples of the named thread:\n{text}");
}
