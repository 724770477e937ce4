//! CPython frames read from the interpreter, without flags, by the real profiler binary:
//! each supported CPython (pyenv's 3.7 to 3.13, built as `libpython3.X.so`, and Debian's
//! `python3`, whose interpreter is in the executable) runs a program spinning in
//! a known chain of its own functions; threads are told apart; and a hostile process
//! posing as CPython with a forged interpreter state (run as `nobody`) neither stops the
//! profiler nor changes a real Python process's frames. Budgeted in the programs' CPU time.

mod support;

use std::{
    path::{Path, PathBuf},
    process::Command,
};

use sframe_user::profiler::Profiler;
use support::{
    KillOnDrop, bpf_or_skip, fixture_dir,
    hostile::{as_nobody, nobody_dir, profile},
};

/// The chain of `support/runtimes/spin.py`, outermost first.
const SPIN_CHAIN: &str = ";<module>;main;Outer.method;middle;leaf_work";
/// The same before 3.11, whose code objects have no qualified name (`co_name` stands in).
const SPIN_CHAIN_310: &str = ";<module>;main;method;middle;leaf_work";

/// Whether interpreter `what` (`pyenv 3.X.Y`) is older than 3.11: frame objects, each
/// Python call through C.
fn before_311(what: &str) -> bool {
    what.strip_prefix("pyenv 3.")
        .and_then(|v| v.split('.').next()?.parse::<u32>().ok())
        .is_some_and(|minor| minor < 11)
}

/// [`SPIN_CHAIN`] as interpreter `what` names it.
fn spin_chain(what: &str) -> &'static str {
    if before_311(what) {
        SPIN_CHAIN_310
    } else {
        SPIN_CHAIN
    }
}

/// The interpreters of [`interpreters`] whose version starts with one of `minors`
/// ("3.12." …): tests of what differs between versions run on those it differs in.
fn interpreters_of(minors: &[&str]) -> Vec<(String, PathBuf)> {
    interpreters()
        .into_iter()
        .filter(|(what, _)| {
            minors
                .iter()
                .any(|m| what.starts_with(&format!("pyenv {m}")))
        })
        .collect()
}

fn runtime_script(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/support/runtimes")
        .join(name)
}

/// The CPython interpreters to test: (what it is, its `python3`): pyenv's 3.11, 3.12,
/// 3.13, 3.10, 3.9, 3.8 and 3.7 (in that order: tests that take one take 3.11 or 3.12),
/// and Debian's (3.11). Each one missing is skipped outside CI and fails the test under
/// `CI=true`.
fn interpreters() -> Vec<(String, PathBuf)> {
    let ci = std::env::var_os("CI").is_some_and(|v| v == "true");
    // pyenv's root: as `pyenv` says, else where pyenv puts it by default.
    let root = Command::new("pyenv")
        .arg("root")
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| PathBuf::from(String::from_utf8_lossy(&o.stdout).trim()))
        .or_else(|| std::env::var_os("PYENV_ROOT").map(PathBuf::from))
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".pyenv")))
        .filter(|r| r.join("versions").is_dir());
    let mut found = Vec::new();
    for minor in ["3.11.", "3.12.", "3.13.", "3.10.", "3.9.", "3.8.", "3.7."] {
        let version = root.as_ref().and_then(|r| {
            let mut v: Vec<PathBuf> = std::fs::read_dir(r.join("versions"))
                .ok()?
                .filter_map(Result::ok)
                .map(|e| e.path())
                .filter(|p| {
                    p.file_name()
                        .is_some_and(|n| n.to_string_lossy().starts_with(minor))
                })
                .collect();
            v.sort();
            v.pop()
        });
        match version {
            Some(dir) => found.push((
                format!(
                    "pyenv {}",
                    dir.file_name().unwrap_or_default().to_string_lossy()
                ),
                dir.join("bin/python3"),
            )),
            None if ci => panic!("no pyenv CPython {minor}x on this CI machine"),
            None => eprintln!("skipped: no pyenv CPython {minor}x"),
        }
    }
    let debian = PathBuf::from("/usr/bin/python3");
    if debian.exists() {
        found.push(("Debian python3".into(), debian));
    } else if ci {
        panic!("no /usr/bin/python3 on this CI machine");
    }
    found
}

/// Runs `sframe-user --format folded -- CMD…` and returns the folded output.
fn profile_command(out: &Path, frequency: u64, cmd: &[&Path], args: &[&str]) -> String {
    let folded = out.join("out.folded");
    let run = Command::new(env!("CARGO_BIN_EXE_sframe-user"))
        .args(["--no-debuginfod", "--format", "folded", "--frequency"])
        .arg(frequency.to_string())
        .arg("--output")
        .arg(&folded)
        .arg("--")
        .args(cmd)
        .args(args)
        .output()
        .expect("run sframe-user");
    assert!(
        run.status.success(),
        "{}",
        String::from_utf8_lossy(&run.stderr)
    );
    std::fs::read_to_string(&folded).expect("folded output")
}

/// (samples, samples whose stack matches `keep`) over every line of `folded`.
fn share(folded: &str, keep: impl Fn(&str) -> bool) -> (u64, u64) {
    let (mut all, mut kept) = (0, 0);
    for line in folded.lines() {
        let (stack, count) = line.rsplit_once(' ').expect("a count");
        let count: u64 = count.parse().expect("a count");
        all += count;
        if keep(stack) {
            kept += count;
        }
    }
    (all, kept)
}

fn hottest(folded: &str) -> String {
    let mut lines: Vec<&str> = folded.lines().collect();
    lines.sort_by_key(|l| {
        std::cmp::Reverse(l.rsplit_once(' ').and_then(|(_, c)| c.parse::<u64>().ok()))
    });
    lines
        .iter()
        .take(6)
        .map(|l| l.chars().take(500).collect::<String>())
        .collect::<Vec<_>>()
        .join("\n")
}

/// A folded stack with the `(file:line)` of its Python frames left out.
fn functions(stack: &str) -> String {
    stack
        .split(';')
        .map(|f| match f.split_once(" (") {
            Some((name, at)) if at.contains(".py") => name,
            _ => f,
        })
        .collect::<Vec<_>>()
        .join(";")
}

/// The stack's Python frames alone (names without file and line), `;`-separated with a
/// leading `;`: what a chain of Python functions looks like across the native frames
/// of the call machinery between them (coroutines, generators).
fn python_frames(stack: &str) -> String {
    stack
        .split(';')
        .filter_map(|f| match f.split_once(" (") {
            Some((name, at)) if at.contains(".py:") => Some(format!(";{name}")),
            _ => None,
        })
        .collect()
}

/// The stack shows the Python chain (the program's own functions, outermost first).
fn through(stack: &str, chain: &str) -> bool {
    functions(stack).contains(chain)
}

/// [`through`] as interpreter `what` runs the chain: 3.10 calls each Python function
/// through C (`_PyEval_Vector;_PyEval_EvalFrame` between two Python frames), so there
/// the Python frames alone must show it.
fn shows(what: &str, stack: &str, chain: &str) -> bool {
    if before_311(what) {
        python_frames(stack).contains(chain)
    } else {
        through(stack, chain)
    }
}

/// The stack goes from the program's entry (`_start`, or a thread's start) through the
/// Python chain: the native frames up to the evaluation loop, then the program's own
/// functions, each in place.
fn complete_through(stack: &str, chain: &str) -> bool {
    complete(stack) && through(stack, chain)
}

/// The stack goes from the program's entry (`_start`, or a thread's start).
fn complete(stack: &str) -> bool {
    matches!(
        stack.split(';').nth(1),
        Some("_start" | "clone" | "clone3" | "start_thread")
    )
}

/// The floors: at least 80 % of the samples show the chain, at least 95 % of
/// those are complete.
fn assert_chain(what: &str, folded: &str, chain: &str) {
    let hot = hottest(folded);
    let (all, with_chain) = share(folded, |s| shows(what, s, chain));
    let (_, complete) = share(folded, |s| complete(s) && shows(what, s, chain));
    eprintln!(
        "{what}: {with_chain} of {all} samples show {chain}, {complete} of them complete\n{hot}"
    );
    assert!(
        with_chain * 100 >= all * 80,
        "{what}: {with_chain} of {all} samples show {chain}\n{hot}"
    );
    assert!(
        complete * 100 >= with_chain * 95,
        "{what}: {complete} of {with_chain} samples with the chain are complete\n{hot}"
    );
}

#[test]
fn every_cpython_names_the_programs_own_functions_on_complete_stacks() {
    if !bpf_or_skip("every_cpython_names_the_programs_own_functions_on_complete_stacks") {
        return;
    }
    let _serial = support::profiling::serial();
    let frequency = 199;
    let cpu = 2.0;
    for (what, python) in interpreters() {
        let dir = fixture_dir("python-spin");
        let folded = profile_command(
            &dir,
            frequency,
            &[&python, &runtime_script("spin.py")],
            &[&cpu.to_string()],
        );
        let (all, _) = share(&folded, |_| true);
        let hot = hottest(&folded);
        // What its CPU time is worth, less a margin for the samples of the start (the
        // interpreter's own initialisation) and those lost in a loaded machine's
        // timer: a floor that a sampling failure cannot pass.
        let due = (cpu * frequency as f64) as u64;
        assert!(
            all >= due / 2,
            "{what}: {all} samples for {cpu} s of CPU at {frequency} Hz"
        );
        let chain = spin_chain(&what);
        assert_chain(&what, &folded, chain);
        // Each Python frame carries its file and line: the innermost one a line of
        // `leaf_work`'s body (lines 9 to 12 of spin.py).
        let (_, with_line) = share(&folded, |s| {
            ["9", "10", "11", "12"]
                .iter()
                .any(|l| s.contains(&format!("leaf_work (spin.py:{l})")))
        });
        assert!(
            with_line * 100 >= all * 80,
            "{what}: {with_line} of {all} samples give leaf_work's file and line\n{hot}"
        );
        // No frame of the runtime's evaluation loop is left where a Python frame goes.
        let (_, eval_left) = share(&folded, |s| {
            shows(&what, s, chain) && s.contains("_PyEval_EvalFrameDefault")
        });
        assert_eq!(eval_left, 0, "{what}: evaluation-loop frames left\n{hot}");
    }
}

/// A code object's address is freed and taken by another code object (exec'd code, a
/// module's at start-up): each names its own samples. (The 3.11 interpreter's start-up
/// ran a `.pth` file's line through `exec`, and a function later made at that address
/// was named `<module> (<string>:1)` in every sample.)
#[test]
fn a_reused_code_object_address_names_each_code_object_s_own_samples() {
    if !bpf_or_skip("a_reused_code_object_address_names_each_code_object_s_own_samples") {
        return;
    }
    let _serial = support::profiling::serial();
    let frequency = 199;
    // CPU seconds (process time) up to which `transient` spins, then in `lasting`.
    let (first, then) = (0.8, 1.2);
    // Code objects are told apart by their header in every layout: one of each.
    for (what, python) in interpreters_of(&["3.8.", "3.10.", "3.11.", "3.13."]) {
        let dir = fixture_dir("python-reuse");
        let folded = profile_command(
            &dir,
            frequency,
            &[&python, &runtime_script("reuse.py")],
            &[&first.to_string(), &then.to_string()],
        );
        let hot = hottest(&folded);
        // (exec'd code's file is `<string>`.)
        let named = |name: &str| {
            share(&folded, |s| {
                through(s, ";<module>") && s.contains(&format!(";{name} (<string>:"))
            })
        };
        let ((all, transient), (_, lasting)) = (named("transient"), named("lasting"));
        eprintln!("{what}: {transient} transient, {lasting} lasting of {all}\n{hot}");
        // By CPU time, about 0.7 of `first` (the interpreter's start takes some) and
        // `then`: each gets at least half of what its share is worth; together they
        // are nearly every sample.
        let due = |cpu: f64| (cpu * frequency as f64 / 2.0) as u64;
        assert!(
            transient >= due(first * 0.7),
            "{what}: {transient} samples name `transient` of {all}\n{hot}"
        );
        assert!(
            lasting >= due(then),
            "{what}: {lasting} samples name `lasting` of {all}\n{hot}"
        );
        // (The samples between the two spins are the search for the address, whose
        // length depends on the allocator: not counted.)
        let _ = all;
    }
}

/// A native thread of a Python process (started by C code, never running Python) has
/// no thread state: the walk looks for it in the interpreter's thread list again only
/// when the list changed (`PY_NO_THREAD_STATE`), not at each of its samples.
#[test]
fn a_thread_that_never_runs_python_is_not_searched_at_each_sample() {
    if !bpf_or_skip("a_thread_that_never_runs_python_is_not_searched_at_each_sample") {
        return;
    }
    let _serial = support::profiling::serial();
    let Some((what, python)) = interpreters().into_iter().nth(1) else {
        return;
    };
    let dir = fixture_dir("python-native-thread");
    let lib = support::compile_c_shared(
        &dir,
        "nativespin",
        "#include <pthread.h>\n\
         volatile unsigned long sink;\n\
         static void *spin(void *a) { for (;;) sink++; return a; }\n\
         int start_native_thread(void) { pthread_t t; return pthread_create(&t, 0, spin, 0); }\n",
        &["-O2", "-pthread"],
    );
    let mut child = KillOnDrop::spawn(
        Command::new(&python)
            .arg(runtime_script("native_thread.py"))
            .arg(&lib)
            .arg("60")
            .stdout(std::process::Stdio::piped()),
    );
    let pid = child.pid();
    let mut ready = String::new();
    std::io::BufRead::read_line(
        &mut std::io::BufReader::new(child.0.stdout.take().expect("stdout")),
        &mut ready,
    )
    .expect("read");
    assert_eq!(ready.trim(), "ready", "{what}: the fixture did not start");
    let frequency = 199;
    let mut profiler = Profiler::start(frequency).expect("start");
    profiler.add_target(pid).expect("tables");
    // Both threads spin: about half of the process's CPU is the native thread's.
    let cpu = support::profiling::pump_cpu(&mut profiler, pid, 4.0);
    let snap = profiler.collect();
    let no_thread = snap.counters[sframe_common::Counter::PythonNoThread as usize];
    let searches = snap.counters[sframe_common::Counter::PythonThreadSearches as usize];
    let frames = snap.counters[sframe_common::Counter::PythonFrames as usize];
    eprintln!(
        "{what}: {cpu:.2} s of CPU, {no_thread} samples without a thread state, \
         {searches} thread searches, {frames} Python frames"
    );
    // The precondition: the native thread was sampled (its half of the CPU), and the
    // Python thread's frames were read.
    assert!(
        no_thread >= support::profiling::samples_floor(cpu / 2.0, frequency),
        "{what}: {no_thread} samples without a thread state for {cpu:.2} s of CPU"
    );
    assert!(frames > 0, "{what}: no Python frames");
    // A few searches (the list is the same all along): far fewer than the native
    // thread's samples (about 400).
    assert!(
        searches * 4 <= no_thread,
        "{what}: {searches} thread searches for {no_thread} samples without a thread state"
    );
}

/// A Python chain longer than the walk reads (`MAX_PY_FRAMES`) ends its frames with the
/// unread marker and counts as `python_unread`, not complete; a shorter one beside it,
/// in the same profile, is read whole and complete.
#[test]
fn a_chain_deeper_than_the_walk_reads_counts_its_stacks_as_python_unread() {
    if !bpf_or_skip("a_chain_deeper_than_the_walk_reads_counts_its_stacks_as_python_unread") {
        return;
    }
    use sframe_common::{
        WalkOutcome,
        python::{MAX_PY_FRAMES, is_frame, is_unread},
    };
    let _serial = support::profiling::serial();
    let Some((what, python)) = interpreters().into_iter().next() else {
        return;
    };
    let spawn = |depth: u32| {
        KillOnDrop::spawn(
            Command::new(&python)
                .arg(runtime_script("deep.py"))
                .arg("1000")
                .arg(depth.to_string()),
        )
    };
    // 200 calls: past the 128 frames read; 40: well within.
    let deep = spawn(200);
    let shallow = spawn(40);
    let frequency = 199;
    let mut profiler = Profiler::start(frequency).expect("start");
    profiler.add_target(deep.pid()).expect("tables");
    profiler.add_target(shallow.pid()).expect("tables");
    support::profiling::pump_cpu_all(&mut profiler, &[deep.pid(), shallow.pid()], 1.5);
    let snap = profiler.collect();
    // Per process: samples, samples whose walk reached the bound (MAX_PY_FRAMES frames
    // read), those ending with the marker after exactly MAX_PY_FRAMES frames, samples
    // counted python_unread. Samples of the interpreter's start-up have a shorter chain:
    // they do not reach the bound.
    let mut seen = std::collections::HashMap::<u32, [u64; 4]>::new();
    for c in &snap.counts {
        let words = profiler.stack(c.key.user_stack).unwrap_or(&[]);
        let py: Vec<u64> = words.iter().copied().filter(|&w| is_frame(w)).collect();
        let s = seen.entry(c.key.pid).or_default();
        s[0] += c.count;
        if py.len() >= MAX_PY_FRAMES as usize {
            s[1] += c.count;
        }
        if py.len() == MAX_PY_FRAMES as usize + 1 && py.last().is_some_and(|&w| is_unread(w)) {
            s[2] += c.count;
        }
        if c.key.outcome == WalkOutcome::PythonUnread as u32 {
            s[3] += c.count;
        }
        // The marker ends a chain and is found nowhere else.
        assert!(
            py.iter().rev().skip(1).all(|&w| !is_unread(w)),
            "{what}: a marker inside the Python frames"
        );
    }
    let d = seen.get(&deep.pid()).copied().unwrap_or_default();
    let s = seen.get(&shallow.pid()).copied().unwrap_or_default();
    eprintln!(
        "{what}: deep: {} samples, {} reaching the bound, {} cut with the marker, {} \
         python_unread; shallow: {} samples, {} reaching the bound, {} cut, {} python_unread",
        d[0], d[1], d[2], d[3], s[0], s[1], s[2], s[3]
    );
    assert!(
        d[0] >= support::profiling::samples_floor(1.5, frequency),
        "{what}: {} samples of the deep chain",
        d[0]
    );
    // Most deep samples reach the bound (not those of the start-up, nor those taken
    // before the interpreter was known); every one that does is cut, and counted so.
    assert!(d[1] * 100 >= d[0] * 80, "{what}: {d:?}");
    assert_eq!(
        d[2], d[1],
        "{what}: deep samples at the bound not cut: {d:?}"
    );
    assert_eq!(d[3], d[2], "{what}: cut samples not python_unread: {d:?}");
    // The shallow chain is read whole (past its 40 calls) and never cut.
    assert_eq!(
        s[1] + s[2] + s[3],
        0,
        "{what}: the shallow chain was cut: {s:?}"
    );
    let shallow_read: u64 = snap
        .counts
        .iter()
        .filter(|c| c.key.pid == shallow.pid())
        .filter(|c| {
            profiler
                .stack(c.key.user_stack)
                .is_some_and(|w| w.iter().filter(|&&w| is_frame(w)).count() > 40)
        })
        .map(|c| c.count)
        .sum();
    assert!(
        shallow_read * 100 >= s[0] * 80,
        "{what}: {shallow_read} of {} shallow samples read past 40 Python frames",
        s[0]
    );
    assert!(
        snap.outcomes[WalkOutcome::PythonUnread as usize] >= d[3],
        "{what}: the outcome counts miss the python_unread samples"
    );
}

#[test]
fn each_thread_shows_its_own_python_frames() {
    if !bpf_or_skip("each_thread_shows_its_own_python_frames") {
        return;
    }
    let _serial = support::profiling::serial();
    // 3.12 finds a thread's state by its native id, 3.10 and 3.7 by its `pthread_t`
    // (the id in the C library's descriptor).
    for (what, python) in interpreters_of(&["3.12.", "3.10.", "3.7."]) {
        let dir = fixture_dir("python-threads");
        let folded = profile_command(&dir, 199, &[&python, &runtime_script("threads.py")], &["3"]);
        let hot = hottest(&folded);
        let thread_root = |s: &str| s.contains(";start_thread;") || s.contains(";clone3;");
        let main_root = |s: &str| s.split(';').nth(1) == Some("_start");
        let (all, worker) = share(&folded, |s| {
            thread_root(s) && shows(&what, s, ";worker;spin_a")
        });
        let (_, main) = share(&folded, |s| {
            main_root(s) && shows(&what, s, ";<module>;main;spin_b")
        });
        // A sample with the other thread's frames: the walk took the wrong thread state.
        let (_, crossed) = share(&folded, |s| {
            (s.contains("spin_a") && main_root(s)) || (s.contains("spin_b") && thread_root(s))
        });
        eprintln!("{what}: {all} samples, worker {worker}, main {main}, crossed {crossed}\n{hot}");
        assert_eq!(
            crossed, 0,
            "{what}: samples with another thread's frames\n{hot}"
        );
        // The GIL passes between the two every 5 ms: each holds it about half the time.
        assert!(
            worker * 100 >= all * 25 && main * 100 >= all * 25,
            "{what}: worker {worker}, main {main} of {all}\n{hot}"
        );
        assert!(
            (worker + main) * 100 >= all * 80,
            "{what}: {} of {all} samples name their thread's chain\n{hot}",
            worker + main
        );
    }
}

#[test]
fn coroutines_and_generators_show_their_frames_in_order() {
    if !bpf_or_skip("coroutines_and_generators_show_their_frames_in_order") {
        return;
    }
    let _serial = support::profiling::serial();
    // Frame objects (3.9, 3.10), `is_entry` (3.11), the C stack's own frames (3.13).
    for (what, python) in interpreters_of(&["3.9.", "3.10.", "3.11.", "3.13."]) {
        let dir = fixture_dir("python-coroutines");
        // 3 s of CPU: the interpreter's start (asyncio's import, about 0.2 s on 3.9, in
        // none of the chains) stays a small share; at 1.5 s a clean machine's 3.9 had
        // 78 % of its samples in a chain.
        let folded = profile_command(
            &dir,
            199,
            &[&python, &runtime_script("coroutines.py")],
            &["3"],
        );
        let hot = hottest(&folded);
        // The awaited coroutine and the generator each run in an invocation of the
        // evaluation loop of their own, under the C machinery that resumes them
        // (`gen_send_ex2`): Python frames in order, native frames between.
        let chain =
            |s: &str, want: &str| complete_through(s, "") && python_frames(s).contains(want);
        let (all, coroutine) = share(&folded, |s| chain(s, ";outer_coro;inner_coro;spin_c"));
        let (_, generator) = share(&folded, |s| chain(s, ";outer_coro;gen_values;spin_c"));
        eprintln!(
            "{what}: {all} samples, coroutine chain {coroutine}, generator chain {generator}"
        );
        // The two chains take about 2/3 and 1/3 of the program's CPU (20,000 and 50 x 200
        // iterations per round); asyncio's own frames and the start take the rest.
        assert!(
            coroutine * 100 >= all * 30 && generator * 100 >= all * 10,
            "{what}: coroutine {coroutine}, generator {generator} of {all}\n{hot}"
        );
        assert!(
            (coroutine + generator) * 100 >= all * 80,
            "{what}: {} of {all} samples show a chain\n{hot}",
            coroutine + generator
        );
    }
}

#[test]
fn a_python_process_in_its_own_pid_namespace_shows_its_frames() {
    if !bpf_or_skip("a_python_process_in_its_own_pid_namespace_shows_its_frames") {
        return;
    }
    let _serial = support::profiling::serial();
    let Some((what, python)) = interpreters().into_iter().nth(1) else {
        return;
    };
    // CPython records each thread's id as its namespace shows it (pid 1 here), not the
    // id the kernel's samples carry.
    let dir = fixture_dir("python-pidns");
    let script = runtime_script("spin.py");
    let folded = profile_command(
        &dir,
        199,
        &[
            Path::new("unshare"),
            Path::new("--pid"),
            Path::new("--fork"),
            Path::new("--kill-child"),
            &python,
            &script,
        ],
        &["2"],
    );
    let python_lines: String = folded
        .lines()
        .filter(|l| !l.starts_with("unshare;"))
        .map(|l| format!("{l}\n"))
        .collect();
    assert_chain(
        &format!("{what} in a PID namespace"),
        &python_lines,
        SPIN_CHAIN,
    );
}

#[test]
fn off_cpu_time_is_charged_to_the_python_functions_that_slept() {
    if !bpf_or_skip("off_cpu_time_is_charged_to_the_python_functions_that_slept") {
        return;
    }
    let _serial = support::profiling::serial();
    // The off-CPU walker reads the frames as `profile` does: a frame object version
    // and an interpreter frame one.
    for (what, python) in interpreters_of(&["3.9.", "3.12."]) {
        let dir = fixture_dir("python-offcpu");
        let folded = dir.join("off-cpu.folded");
        let out = Command::new(env!("CARGO_BIN_EXE_sframe-user"))
            .args([
                "--no-debuginfod",
                "--off-cpu",
                "--no-on-cpu",
                "--max-overhead",
                "0",
            ])
            .args(["--format", "folded", "--output"])
            .arg(&folded)
            .arg("--")
            .arg(&python)
            .arg(runtime_script("sleeper.py"))
            .arg("2")
            .output()
            .expect("run sframe-user");
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let slept: f64 = String::from_utf8_lossy(&out.stdout)
            .lines()
            .find_map(|l| l.strip_prefix("slept ")?.trim().parse().ok())
            .expect("the program's own measure");
        let folded = std::fs::read_to_string(&folded).expect("the off-CPU profile");
        let hot = hottest(&folded);
        // Microseconds, in the stacks through the Python chain to the sleep.
        let (_, in_chain) = share(&folded, |s| {
            python_frames(s).contains(";<module>;main;waiter;wait_short")
        });
        let in_chain = in_chain as f64 / 1e6;
        eprintln!("{what}: {in_chain:.3} s off CPU through the chain, {slept:.3} s slept\n{hot}");
        assert!(
            in_chain >= 0.8 * slept && in_chain <= 1.05 * slept,
            "{what}: {in_chain:.3} s through the chain for {slept:.3} s slept\n{hot}"
        );
    }
}

#[test]
fn prometheus_stack_series_name_the_python_functions() {
    if !bpf_or_skip("prometheus_stack_series_name_the_python_functions") {
        return;
    }
    let _serial = support::profiling::serial();
    let Some((what, python)) = interpreters().into_iter().next() else {
        return;
    };
    let victim = KillOnDrop::spawn(
        Command::new(&python)
            .arg(runtime_script("spin.py"))
            .arg("1000"),
    );
    let pid = victim.pid().to_string();
    let (profiler, addr) = support::prometheus::start_exporter(
        env!("CARGO_BIN_EXE_sframe-user"),
        &["--no-debuginfod", "--frequency", "199", "--pid", &pid],
    );
    // Series per program are planned at 1, 2, 4 … s, then every minute; samples taken
    // before a node entered the set are in a remainder. So the share is judged on the
    // series' increase between two scrapes once the chain has its series: 2 s of the
    // program's CPU.
    let value = |l: &str| -> f64 {
        l.rsplit_once(' ')
            .and_then(|(_, v)| v.parse().ok())
            .unwrap_or(0.0)
    };
    let series = |text: &str| -> std::collections::HashMap<String, f64> {
        support::prometheus::stack_series(text)
            .into_iter()
            .filter_map(|l| {
                let (k, _) = l.rsplit_once(' ')?;
                Some((k.to_owned(), value(l)))
            })
            .collect()
    };
    let in_chain = |key: &str| {
        support::prometheus::label(key, "stack")
            .is_some_and(|s| through(&format!(";{s}"), SPIN_CHAIN))
    };
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(120);
    let before = loop {
        support::hostile::wait_cpu(victim.pid(), 0.5, || {
            assert!(
                !support::prometheus::exited(&profiler),
                "the profiler ended"
            );
        });
        let s = series(&support::prometheus::scrape(addr));
        if s.keys().any(|k| in_chain(k)) {
            break s;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "{what}: no series of the chain in 120 s: {s:?}"
        );
    };
    support::hostile::wait_cpu(victim.pid(), 2.0, || {
        assert!(
            !support::prometheus::exited(&profiler),
            "the profiler ended"
        );
    });
    let text = support::prometheus::scrape(addr);
    let after = series(&text);
    let grew = |keep: &dyn Fn(&str) -> bool| -> f64 {
        after
            .iter()
            .filter(|(k, _)| keep(k))
            .map(|(k, v)| v - before.get(k).copied().unwrap_or(0.0))
            .sum()
    };
    let all = grew(&|_| true);
    let chain = grew(&|k| in_chain(k));
    eprintln!("{what}: {chain} of {all} new samples in series through the chain");
    assert!(
        all >= 2.0 * 199.0 * 0.5,
        "{what}: {all} new samples for 2 s of CPU\n{text}"
    );
    assert!(
        chain >= 0.8 * all,
        "{what}: {chain} of {all} new samples in series through the chain:\n{text}"
    );
}

#[test]
fn a_forged_interpreter_state_is_walked_within_bounds_and_changes_no_other_process() {
    if !bpf_or_skip(
        "a_forged_interpreter_state_is_walked_within_bounds_and_changes_no_other_process",
    ) {
        return;
    }
    let _serial = support::profiling::serial();
    let Some((what, python)) = interpreters().into_iter().next() else {
        return;
    };
    // The attacker: a program named like CPython's executable, in its own directory.
    let dir = nobody_dir("fake-python");
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/support/c/fake_python.c");
    let exe = dir.join("python3.13");
    support::gcc(
        &dir,
        &[
            "-O2",
            "-rdynamic",
            "-pthread",
            "-o",
            &exe.to_string_lossy(),
            &src.to_string_lossy(),
        ],
    );
    let fake = KillOnDrop::spawn(&mut as_nobody(&exe));
    // The victim: a real CPython program, spinning for longer than the budget.
    let victim = KillOnDrop::spawn(
        Command::new(&python)
            .arg(runtime_script("spin.py"))
            .arg("1000"),
    );
    let out = fixture_dir("fake-python-out");
    let args: Vec<String> = vec![
        "--no-debuginfod".into(),
        "--frequency".into(),
        "199".into(),
        "--pid".into(),
        fake.pid().to_string(),
        "--pid".into(),
        victim.pid().to_string(),
    ];
    let run = profile(&args, victim.pid(), 2.0, &out);
    let folded = &run.folded;
    let hot = hottest(folded);
    let victim_comm = std::fs::read_to_string(format!("/proc/{}/comm", victim.pid()))
        .expect("victim comm")
        .trim()
        .to_owned();
    let victim_lines: String = folded
        .lines()
        .filter(|l| l.starts_with(&format!("{victim_comm};")))
        .map(|l| format!("{l}\n"))
        .collect();
    let (_, fake_walked) = share(folded, |s| {
        s.starts_with("python3.13;") && s.contains("[[python]+")
    });
    let longest = folded
        .lines()
        .map(|l| l.split(';').count())
        .max()
        .unwrap_or(0);
    eprintln!(
        "{what}: forged: {fake_walked} samples with interpreter frames; longest stack \
         {longest} frames\n{hot}"
    );
    assert!(
        fake_walked > 0,
        "the forged state was never walked: the test did not attack\n{hot}"
    );
    // Its frame chain is a cycle: every walk of it stops at the bound, with the marker.
    let (_, fake_cut) = share(folded, |s| {
        s.starts_with("python3.13;")
            && s.contains("[[python]+")
            && s.contains(sframe_user::python::UNREAD_FRAME)
    });
    assert_eq!(
        fake_cut, fake_walked,
        "forged walks not ended by the marker\n{hot}"
    );
    assert!(
        longest <= 1 + sframe_common::budget::MAX_FRAMES + 8,
        "a stack of {longest} frames"
    );
    assert_chain(
        &format!("{what} beside the forger"),
        &victim_lines,
        SPIN_CHAIN,
    );
}
