//! JIT code named from perf maps, with the real profiler binary and real runtimes: a
//! Node.js program (`--perf-basic-prof --interpreted-frames-native-stack`) and a Java
//! program (`-XX:+PreserveFramePointer`, its map written at exit or asked for with
//! `jcmd PID Compiler.perfmap` while it runs), each spinning in a known chain of its own
//! functions. Budgeted in the programs' CPU time.

mod support;

use std::{path::Path, process::Command};

use support::{bpf_or_skip, fixture_dir};

/// Runs `sframe-user --format folded -- CMD…` and returns the folded output.
fn profile_command(out: &Path, cmd: &[&str]) -> String {
    let folded = out.join("out.folded");
    let run = Command::new(env!("CARGO_BIN_EXE_sframe-user"))
        .args(["--format", "folded", "--output"])
        .arg(&folded)
        .arg("--")
        .args(cmd)
        .output()
        .expect("run sframe-user");
    assert!(
        run.status.success(),
        "{}",
        String::from_utf8_lossy(&run.stderr)
    );
    std::fs::read_to_string(&folded).expect("folded output")
}

/// Samples of the process named `comm`: all of them, those whose stack has a frame
/// naming each of `chain` in order (consecutive frames, outermost first), and those of
/// the latter whose walk reached the start of the program or thread.
fn chain_counts(folded: &str, comm: &str, chain: &[&str]) -> (u64, u64, u64) {
    let (mut all, mut with_chain, mut complete) = (0, 0, 0);
    for line in folded.lines() {
        let (stack, count) = line.rsplit_once(' ').expect("a count");
        let count: u64 = count.parse().expect("a count");
        let frames: Vec<&str> = stack.split(';').collect();
        if frames.first() != Some(&comm) {
            continue;
        }
        all += count;
        let found = frames.windows(chain.len()).any(|w| {
            w.iter()
                .zip(chain)
                .all(|(frame, name)| frame_is(frame, name))
        });
        if found {
            with_chain += count;
            if matches!(
                frames.get(1),
                Some(&("_start" | "clone" | "clone3" | "start_thread"))
            ) {
                complete += count;
            }
        }
    }
    (all, with_chain, complete)
}

/// Whether folded frame `frame` is function `name` as a JIT names it: `JS:*name file…`
/// or `JS:~name file…` (V8), `double Hot.name(int)` (HotSpot).
fn frame_is(frame: &str, name: &str) -> bool {
    frame
        .split([' ', '(', '*', '~', ':', '.'])
        .any(|part| part == name)
}

/// Asserts the goals: ≥ 80 % of the samples show the chain, ≥ 95 % of those complete.
fn assert_chain(folded: &str, comm: &str, chain: &[&str]) {
    let (all, with_chain, complete) = chain_counts(folded, comm, chain);
    let mut hottest: Vec<&str> = folded.lines().collect();
    hottest.sort_by_key(|l| {
        std::cmp::Reverse(l.rsplit_once(' ').and_then(|(_, c)| c.parse::<u64>().ok()))
    });
    let shown = hottest
        .iter()
        .take(8)
        .map(|l| l.chars().take(600).collect::<String>())
        .collect::<Vec<_>>()
        .join("\n");
    eprintln!("{comm}: {all} samples, {with_chain} through {chain:?}, {complete} of them complete");
    assert!(all >= 50, "{all} samples of {comm}\n{shown}");
    assert!(
        with_chain as f64 >= 0.8 * all as f64,
        "{with_chain} of {all} samples of {comm} show {chain:?}\n{shown}"
    );
    assert!(
        complete as f64 >= 0.95 * with_chain as f64,
        "{complete} of {with_chain} samples through {chain:?} complete\n{shown}"
    );
}

fn runtime(name: &str) -> bool {
    let found = Command::new(name)
        .arg(if name == "node" {
            "--version"
        } else {
            "-version"
        })
        .output()
        .is_ok_and(|o| o.status.success());
    if !found {
        assert!(
            std::env::var_os("CI").is_none(),
            "{name} is not installed (cargo xtask setup installs it)"
        );
        eprintln!("skipped: {name} is not installed");
    }
    found
}

fn fixture(name: &str) -> String {
    format!(
        "{}/tests/support/runtimes/{name}",
        env!("CARGO_MANIFEST_DIR")
    )
}

#[test]
fn node_functions_are_named_from_its_perf_map_on_complete_stacks() {
    if !bpf_or_skip("node_functions_are_named_from_its_perf_map_on_complete_stacks")
        || !runtime("node")
    {
        return;
    }
    let out = fixture_dir("jit-node");
    let script = fixture("spin.js");
    // Inlining off: the chain is the program's own calls, not what TurboFan merged.
    let folded = profile_command(
        &out,
        &[
            "node",
            "--perf-basic-prof",
            "--interpreted-frames-native-stack",
            "--no-turbo-inlining",
            &script,
            "3",
        ],
    );
    assert_chain(&folded, "node", &["jsOuter", "jsMiddle", "jsLeaf"]);
}

fn javac(out: &Path) {
    let built = Command::new("javac")
        .arg("-d")
        .arg(out)
        .arg(fixture("Hot.java"))
        .output()
        .expect("run javac");
    assert!(
        built.status.success(),
        "{}",
        String::from_utf8_lossy(&built.stderr)
    );
}

const JAVA_FLAGS: [&str; 3] = [
    "-XX:+PreserveFramePointer",
    "-XX:CompileCommand=quiet",
    "-XX:CompileCommand=dontinline,Hot::*",
];

/// HotSpot writes its map as it exits: the profiler reads it after the process is gone,
/// from the process's root directory it held.
#[test]
fn java_methods_are_named_from_the_map_written_at_exit() {
    if !bpf_or_skip("java_methods_are_named_from_the_map_written_at_exit") || !runtime("java") {
        return;
    }
    let out = fixture_dir("jit-java-exit");
    javac(&out);
    let classes = out.to_str().expect("UTF-8 path");
    let mut cmd = vec!["java"];
    cmd.extend(JAVA_FLAGS);
    cmd.extend([
        "-XX:+UnlockDiagnosticVMOptions",
        "-XX:+DumpPerfMapAtExit",
        "-cp",
        classes,
        "Hot",
        "4",
    ]);
    let folded = profile_command(&out, &cmd);
    assert_chain(&folded, "java", &["javaOuter", "javaMiddle", "javaLeaf"]);
}

/// A running JVM asked for its map (`jcmd PID Compiler.perfmap`): what it writes then
/// names the frames sampled before and after.
#[test]
fn java_methods_are_named_from_a_map_asked_for_at_run_time() {
    if !bpf_or_skip("java_methods_are_named_from_a_map_asked_for_at_run_time") || !runtime("java") {
        return;
    }
    let out = fixture_dir("jit-java-jcmd");
    javac(&out);
    let pid_file = out.join("pid");
    let classes = out.to_str().expect("UTF-8 path").to_owned();
    let pid_path = pid_file.to_str().expect("UTF-8 path").to_owned();
    let asker = std::thread::spawn(move || {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(300);
        let pid = loop {
            if let Ok(pid) = std::fs::read_to_string(&pid_file)
                && let Ok(pid) = pid.trim().parse::<u32>()
            {
                break pid;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "java never wrote its pid"
            );
            std::thread::sleep(std::time::Duration::from_millis(20));
        };
        let asked = Command::new("jcmd")
            .arg(pid.to_string())
            .arg("Compiler.perfmap")
            .output()
            .expect("run jcmd");
        std::fs::remove_file(&pid_file).expect("let java go on");
        assert!(
            asked.status.success(),
            "{}",
            String::from_utf8_lossy(&asked.stderr)
        );
    });
    let mut cmd = vec!["java"];
    cmd.extend(JAVA_FLAGS);
    cmd.extend(["-cp", &classes, "Hot", "4", &pid_path]);
    let folded = profile_command(&out, &cmd);
    asker.join().expect("jcmd asked");
    assert_chain(&folded, "java", &["javaOuter", "javaMiddle", "javaLeaf"]);
}

/// A JIT in its own PID and mount namespaces (a container's view): its map is its own
/// `/tmp/perf-1.map` on its own `/tmp` (a directory of the test's bound there), which
/// the host's `/tmp` does not have.
#[test]
fn a_jit_in_its_own_namespaces_is_named_from_its_own_tmp() {
    if !bpf_or_skip("a_jit_in_its_own_namespaces_is_named_from_its_own_tmp") {
        return;
    }
    let exe = support::compile_c(
        "jitns",
        include_str!("support/c/jit.c"),
        &["-O2", "-fno-omit-frame-pointer"],
    );
    // The namespace's /tmp is a directory of the test's, bound over /tmp there, holding
    // the program (the clone itself may be under the host's /tmp, hidden in there).
    let ns_tmp = fixture_dir("jitns-tmp");
    std::fs::copy(&exe, ns_tmp.join("jitns")).expect("copy the JIT");
    let script = format!(
        "mount --bind {} /tmp && exec /tmp/jitns container_code >/dev/null 2>&1",
        ns_tmp.display()
    );
    let ns = support::KillOnDrop::spawn(
        Command::new("unshare")
            .args(["--pid", "--fork", "--mount", "--mount-proc", "sh", "-c"])
            .arg(&script),
    );
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(300);
    let pid = loop {
        let found = support::hostile::all_pids_named("jitns");
        if let Some(&pid) = found.first()
            && support::hostile::cpu_seconds(pid) > 0.05
        {
            break pid;
        }
        assert!(
            std::time::Instant::now() < deadline && !support::prometheus::exited(&ns),
            "the JIT never ran in its namespaces"
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    };
    // The namespace's init: only SIGKILL from outside ends it.
    struct KillNsInit(u32);
    impl Drop for KillNsInit {
        fn drop(&mut self) {
            // SAFETY: a signal to the test's own process.
            unsafe { libc::kill(self.0 as i32, libc::SIGKILL) };
        }
    }
    let _init = KillNsInit(pid);
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    assert!(
        status
            .lines()
            .any(|l| l.starts_with("NSpid:") && l.ends_with("\t1")),
        "{status}"
    );
    assert!(!Path::new(&format!("/tmp/perf-{pid}.map")).exists());
    assert!(!Path::new("/tmp/perf-1.map").exists());
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(300);
    while !ns_tmp.join("perf-1.map").exists() {
        assert!(
            std::time::Instant::now() < deadline,
            "no map in the namespace's /tmp"
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let out = exe.parent().expect("fixture dir");
    let run = support::hostile::profile(&["--pid".to_owned(), pid.to_string()], pid, 1.0, out);
    let (named, all) =
        support::hostile::complete(&run.folded, "jitns", ";main;jit_caller;container_code");
    assert!(
        all > 0 && named * 100 >= all * 90,
        "{named} of {all} samples named from the namespace's map:\n{}",
        run.folded
    );
}
