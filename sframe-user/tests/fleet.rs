//! Fleet mode under the real kernel: whole-system profiling through process churn,
//! libraries loaded with dlopen after the start, processes in their own PID and mount
//! namespaces, and a table memory budget small enough to force evictions.
//!
//! Each test drives a `Profiler` in this process (events handled as they arrive, as the
//! command line does) while the workload runs in other threads and processes.

mod support;

use std::{
    collections::HashSet,
    io::{BufRead as _, BufReader, Write as _},
    path::{Path, PathBuf},
    process::{Command, Stdio},
    sync::mpsc,
    thread,
    time::{Duration, Instant},
};

use sframe_user::{
    procfs,
    profiler::{Profiler, ProfilerConfig, TargetInfo, TargetSpec},
};
use support::profiling::{
    assert_complete, complete_through, config, pump, pump_cpu, pump_until, samples_floor, serial,
    stacks_of,
};
use support::{KillOnDrop, bpf_or_skip, compile_c, fixture_dir};

const CHURN_SOURCE: &str = r#"
#include <time.h>
volatile unsigned long sink;
static double cpu_seconds(void) {
    struct timespec t;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
    return t.tv_sec + t.tv_nsec / 1e9;
}
__attribute__((noinline)) void churn_work(double secs) {
    double start = cpu_seconds();
    while (cpu_seconds() - start < secs)
        for (int i = 0; i < 2000; i++) sink += i;
}
int main(void) {
    churn_work(0.06);
    return 0;
}
"#;

/// Runs `n` processes made by `spawn`, two at a time (one per CPU of these machines),
/// each to a successful end, while `profiler` handles its events; then half a second
/// more of events. Returns their pids.
fn run_in_pairs(
    profiler: &mut Profiler,
    n: usize,
    spawn: impl Fn() -> std::process::Child + Send + 'static,
) -> HashSet<u32> {
    let (tx, rx) = mpsc::channel();
    let workload = thread::spawn(move || {
        let mut pids = Vec::new();
        for _ in 0..n / 2 {
            let (mut a, mut b) = (spawn(), spawn());
            pids.extend([a.id(), b.id()]);
            assert!(a.wait().unwrap().success() && b.wait().unwrap().success());
        }
        tx.send(pids).unwrap();
    });
    let pids = pump_until(profiler, &rx, Duration::from_secs(120));
    workload.join().unwrap();
    pump(profiler, Duration::from_millis(500));
    pids.into_iter().collect()
}

#[test]
fn whole_system_profiling_keeps_up_with_process_churn() {
    if !bpf_or_skip("whole_system_profiling_keeps_up_with_process_churn") {
        return;
    }
    let _serial = serial();
    const PROCESSES: usize = 200;
    let exe = compile_c("churn", CHURN_SOURCE, &["-O2", "-fomit-frame-pointer"]);
    let spec = TargetSpec {
        all: true,
        ..TargetSpec::default()
    };
    let mut profiler = Profiler::start_with(config(499, spec)).expect("start whole-system");
    // As the command line does: the event loop runs ahead of CPU-bound processes.
    sframe_user::privileges::raise_event_loop_priority();
    // The churn starts on a profiler that has met the machine: on a busy host the first
    // sight of other processes' objects (a compiler's: 100-600 ms each under `cargo
    // xtask stress`, tables built on the event loop) is a start-up transient, not the
    // steady state measured here; it made one churn process in two exit before its
    // first load. Settled when no table was loaded for 2 s (at most 60 s: objects
    // evicted and loaded again would never settle).
    let settling = Instant::now();
    let (mut loads, mut since) = (profiler.store().stats().loads, Instant::now());
    while since.elapsed() < Duration::from_secs(2) && settling.elapsed() < Duration::from_secs(60) {
        pump(&mut profiler, Duration::from_millis(100));
        if profiler.store().stats().loads != loads {
            (loads, since) = (profiler.store().stats().loads, Instant::now());
        }
    }
    let before = profiler.lifecycle();
    let started = Instant::now();
    let pids = run_in_pairs(&mut profiler, PROCESSES, move || {
        Command::new(&exe).spawn().expect("spawn")
    });
    let elapsed = started.elapsed();
    let snap = profiler.collect();
    let stacks = stacks_of(&profiler, &snap, &profiler.targets(), &pids);
    let (good, total, bad) = complete_through(&stacks, &["main", "churn_work"]);
    let all: u64 = snap
        .counts
        .iter()
        .filter(|c| pids.contains(&c.key.pid))
        .map(|c| c.count)
        .sum();
    let share = good as f64 / all.max(1) as f64;
    let mut outcomes = std::collections::BTreeMap::new();
    for c in snap.counts.iter().filter(|c| pids.contains(&c.key.pid)) {
        *outcomes.entry(c.key.outcome).or_insert(0u64) += c.count;
    }
    eprintln!(
        "outcomes of churn samples: {outcomes:?}; deferred {}, deferred lost {}",
        snap.counters[sframe_common::Counter::Deferred as usize],
        snap.counters[sframe_common::Counter::DeferredLost as usize]
    );
    eprintln!(
        "{PROCESSES} processes in {elapsed:?}: {good} of {all} samples complete through \
         churn_work ({:.1}%), {total} symbolized; lifecycle {:?}; others:\n{bad}",
        100.0 * share,
        profiler.lifecycle()
    );
    assert!(all >= 1000, "too few samples of the churn processes: {all}");
    // Issue 20's floor for processes living 100 ms or more: 90 % complete. These spin
    // 60 ms of CPU (about 130 ms of wall time under `cargo xtask stress`); measured:
    // 97.6 % on a quiet machine, 92.9 % under that load, where the loop at nice -10 still
    // loses the race with a process's exit for about one process in five (its samples
    // count `unknown_process`: it exited before its first load could read its maps).
    assert!(
        share >= 0.90,
        "only {:.1}% of churn samples are complete stacks through churn_work:\n{bad}",
        100.0 * share
    );
    // No kernel entry of an exited process remains.
    let left: Vec<u32> = profiler
        .kernel_processes()
        .into_iter()
        .chain(profiler.listed_targets())
        .filter(|p| pids.contains(p))
        .collect();
    assert!(
        left.is_empty(),
        "map entries of exited processes remain: {left:?}"
    );
    // (Exits seen during the churn, not while settling.)
    assert!(
        profiler.lifecycle().exits - before.exits >= PROCESSES as u64 / 2,
        "{:?}",
        profiler.lifecycle()
    );
}

/// Plugin `n` of [`short_plugin_process`]: `lN_work` spins for the CPU time it is given.
fn plugin_library(n: usize) -> String {
    format!(
        "#include <time.h>\n\
         volatile unsigned long sink;\n\
         static double cpu_seconds(void) {{\n    struct timespec t;\n    \
         clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);\n    return t.tv_sec + t.tv_nsec / 1e9;\n}}\n\
         __attribute__((noinline)) void l{n}_work(double secs) {{\n    \
         double start = cpu_seconds();\n    while (cpu_seconds() - start < secs)\n        \
         for (int i = 0; i < 2000; i++) sink += i;\n}}\n"
    )
}

/// Plugins of the short plugin process (each one more mapping made while it runs).
const PLUGINS: usize = 6;

const PLUGIN_MAIN: &str = r#"
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
__attribute__((noinline)) static void run(const char *dir, int n) {
    char path[4096], name[32];
    snprintf(path, sizeof path, "%s/libplugin%d.so", dir, n);
    snprintf(name, sizeof name, "l%d_work", n);
    void *h = dlopen(path, RTLD_NOW);
    if (!h) exit(2);
    void (*work)(double) = (void (*)(double))dlsym(h, name);
    if (!work) exit(3);
    work(0.005);
}
int main(int argc, char **argv) {
    for (int n = 1; n <= atoi(argv[2]); n++) run(argv[1], n);
    return 0;
}
"#;

/// A program that lives about 30 ms of CPU: it loads `PLUGINS` shared libraries one
/// after another with `dlopen` and spins 5 ms in each (`main → run → lN_work`), as a
/// plugin host or an interpreter importing extension modules does; built without frame
/// pointers.
fn short_plugin_process() -> (PathBuf, PathBuf) {
    let dir = fixture_dir("short-plugins");
    let flags = ["-O2", "-fomit-frame-pointer"];
    for n in 1..=PLUGINS {
        support::compile_c_shared(&dir, &format!("plugin{n}"), &plugin_library(n), &flags);
    }
    let exe = support::compile_c_linked(&dir, "short-plugins", PLUGIN_MAIN, &flags, &[]);
    (exe, dir)
}

/// Processes of 30 ms that map six libraries one after another while they run: each
/// library's mmap event reaches the profiler on its own, and the process's reloads for
/// them must not wait the throttle a long-lived process's do (`RELOAD_INTERVAL`, 40 ms),
/// or it exits before its later libraries are known and their samples stop there.
#[test]
fn short_processes_that_load_many_libraries_unwind_through_each() {
    if !bpf_or_skip("short_processes_that_load_many_libraries_unwind_through_each") {
        return;
    }
    let _serial = serial();
    const PROCESSES: usize = 60;
    let (exe, dir) = short_plugin_process();
    let run = move || {
        Command::new(&exe)
            .arg(&dir)
            .arg(PLUGINS.to_string())
            .spawn()
            .expect("spawn")
    };
    let spec = TargetSpec {
        all: true,
        ..TargetSpec::default()
    };
    let mut profiler = Profiler::start_with(config(499, spec)).expect("start whole-system");
    sframe_user::privileges::raise_event_loop_priority();
    // The libraries' tables are built once (the first process); the others find them
    // resident, as a build's compiler passes find theirs.
    assert!(run().wait().expect("wait").success());
    pump(&mut profiler, Duration::from_millis(500));
    let pids = run_in_pairs(&mut profiler, PROCESSES, run);
    let snap = profiler.collect();
    let stacks = stacks_of(&profiler, &snap, &profiler.targets(), &pids);
    // Complete through `main → run → lN_work` for one of the plugins.
    let plugin = |f: &str| {
        f.strip_prefix('l')
            .and_then(|r| r.strip_suffix("_work"))
            .and_then(|n| n.parse::<usize>().ok())
            .is_some_and(|n| (1..=PLUGINS).contains(&n))
    };
    let (mut good, mut complete_all, mut bad) = (0, 0, Vec::new());
    for (names, complete, count) in &stacks {
        if *complete {
            complete_all += count;
        }
        let user: Vec<&str> = names
            .iter()
            .map(String::as_str)
            .filter(|n| !n.ends_with("_[k]"))
            .collect();
        let through = user.first() == Some(&"_start")
            && user
                .windows(3)
                .any(|w| w[0] == "main" && w[1] == "run" && plugin(w[2]));
        if *complete && through {
            good += count;
        } else {
            bad.push((*count, names.join(";")));
        }
    }
    bad.sort_by_key(|b| std::cmp::Reverse(b.0));
    let bad: String = bad
        .iter()
        .take(8)
        .map(|(n, s)| format!("{n}x {s}\n"))
        .collect();
    let all: u64 = snap
        .counts
        .iter()
        .filter(|c| pids.contains(&c.key.pid))
        .map(|c| c.count)
        .sum();
    let share = good as f64 / all.max(1) as f64;
    let complete_share = complete_all as f64 / all.max(1) as f64;
    eprintln!(
        "{PROCESSES} processes: {good} of {all} samples complete through a plugin \
         ({:.1}%), {complete_all} complete ({:.1}%); lifecycle {:?}; others:\n{bad}",
        100.0 * share,
        100.0 * complete_share,
        profiler.lifecycle()
    );
    // 60 processes of 30 ms at 499 Hz: about 900 samples.
    assert!(
        all >= samples_floor(PROCESSES as f64 * 0.03, 499),
        "too few samples: {all}"
    );
    // Measured on a quiet machine: 94.9 % through a plugin (the rest in the loader and
    // in dlopen, complete), 99 % complete; 14.0 % through a plugin before young
    // processes' reloads (every later plugin's samples ended in it). The churn test's
    // floor for completeness (a process that exits before its first load loses its
    // samples on a loaded machine); 85 % through a plugin.
    assert!(
        complete_share >= 0.90,
        "only {:.1}% of the samples are complete:\n{bad}",
        100.0 * complete_share
    );
    assert!(
        share >= 0.85,
        "only {:.1}% of the samples are complete through a plugin:\n{bad}",
        100.0 * share
    );
}

const DL_LIB: &str = r#"
volatile unsigned long dl_sink;
__attribute__((noinline)) void dl_inner(void) {
    for (int i = 0; i < 20000; i++) dl_sink += i;
}
__attribute__((noinline)) void dl_spin(double secs, double (*now)(void)) {
    double start = now();
    while (now() - start < secs) { dl_inner(); dl_sink++; }
}
"#;

const DL_MAIN: &str = r#"
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
/* The process's CPU time: each phase spins a CPU budget, however busy the machine. */
static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
    return t.tv_sec + t.tv_nsec / 1e9;
}
typedef void (*spin_fn)(double, double (*)(void));
static void *open_and_run(const char *path, const char *what) {
    void *h = dlopen(path, RTLD_NOW);
    if (!h) { printf("error %s\n", dlerror()); fflush(stdout); return 0; }
    spin_fn spin = (spin_fn)dlsym(h, "dl_spin");
    Dl_info info;
    dladdr((void *)spin, &info);
    printf("%s %p\n", what, info.dli_fbase);
    fflush(stdout);
    spin(2.5, now);
    return info.dli_fbase;
}
int main(void) {
    char path[4096];
    if (!fgets(path, sizeof path, stdin)) return 1;
    path[strcspn(path, "\n")] = 0;
    void *h0 = dlopen(path, RTLD_NOW | RTLD_NOLOAD);
    (void)h0;
    void *base = open_and_run(path, "loaded");
    void *h = dlopen(path, RTLD_NOW | RTLD_NOLOAD);
    if (h) { dlclose(h); dlclose(h); }
    /* Keep the old place taken, so that the library comes back elsewhere. */
    mmap(base, 4096, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED_NOREPLACE, -1, 0);
    open_and_run(path, "reloaded");
    printf("done\n");
    fflush(stdout);
    return 0;
}
"#;

#[test]
fn follows_libraries_opened_with_dlopen_after_the_start() {
    if !bpf_or_skip("follows_libraries_opened_with_dlopen_after_the_start") {
        return;
    }
    let _serial = serial();
    let exe = compile_c("dlmain", DL_MAIN, &["-O2", "-fomit-frame-pointer", "-ldl"]);
    let mut child = KillOnDrop::spawn(
        Command::new(&exe)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped()),
    );
    let pid = child.pid();
    let mut profiler = Profiler::start(499).expect("start");
    profiler
        .add_target(pid)
        .expect("tables of the main program");
    // The library is built after profiling started.
    let dir = fixture_dir("dllib");
    let lib = support::compile_c_shared(&dir, "dlspin", DL_LIB, &["-O2", "-fomit-frame-pointer"]);
    let (tx, rx) = mpsc::channel();
    let stdout = child.0.stdout.take().unwrap();
    thread::spawn(move || {
        for line in BufReader::new(stdout).lines() {
            let Ok(line) = line else { break };
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    writeln!(child.0.stdin.as_mut().unwrap(), "{}", lib.display()).unwrap();
    let pids: HashSet<u32> = [pid].into();
    let mut bases = Vec::new();
    for phase in ["loaded", "reloaded"] {
        let line = pump_until(&mut profiler, &rx, Duration::from_secs(30));
        assert!(line.starts_with(phase), "expected {phase}, got {line}");
        bases.push(
            line.split_whitespace()
                .nth(1)
                .unwrap_or_default()
                .to_owned(),
        );
        // Stacks from 0.5 s of the phase's 2.5 s of CPU to 1.5 s (the window ends a
        // second of its CPU before the library is closed).
        pump_cpu(&mut profiler, pid, 0.5);
        let before = profiler.collect();
        let maps = procfs::read_maps(pid).expect("maps while the library is mapped");
        let cpu = pump_cpu(&mut profiler, pid, 1.0);
        let after = profiler.collect();
        let delta = sframe_user::export::snapshot_delta(&after, &before);
        let targets = [TargetInfo {
            pid,
            comm: "dlmain".into(),
            ns_pid: None,
            maps,
            perf_map: None,
            python: None,
            cgroup: None,
        }];
        let stacks = stacks_of(&profiler, &delta, &targets, &pids);
        let (good, total, bad) = complete_through(&stacks, &["main", "open_and_run", "dl_spin"]);
        eprintln!(
            "{phase} at {}: {good} of {total} complete through dl_spin\n{bad}",
            bases.last().unwrap()
        );
        assert_complete(
            &format!("{phase}: through the library"),
            (good, total, &bad),
            cpu,
            499,
            0.95,
        );
    }
    assert_ne!(
        bases[0], bases[1],
        "the library came back at the same address"
    );
    assert!(
        profiler.lifecycle().mmaps >= 2,
        "{:?}",
        profiler.lifecycle()
    );
}

const CONTAINER_SOURCE: &str = r#"
#include <time.h>
volatile unsigned long sink;
static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec / 1e9;
}
__attribute__((noinline)) void boxed_inner(void) { for (int i = 0; i < 1000; i++) sink += i; }
__attribute__((noinline)) void boxed_work(double secs) {
    double start = now();
    while (now() - start < secs) { boxed_inner(); sink++; }
}
int main(void) { boxed_work(6); return 0; }
"#;

#[test]
fn profiles_a_process_in_its_own_pid_and_mount_namespace() {
    if !bpf_or_skip("profiles_a_process_in_its_own_pid_and_mount_namespace") {
        return;
    }
    let _serial = serial();
    let exe = compile_c(
        "boxed",
        &spinner_source("boxed_work", 120.0),
        &["-O2", "-fomit-frame-pointer"],
    );
    // Inside the namespaces a private tmpfs hides the copy from this mount namespace.
    let private = fixture_dir("boxed-root");
    let script = format!(
        "mount -t tmpfs none {dir} && cp {exe} {dir}/boxed_fixture && exec {dir}/boxed_fixture",
        dir = private.display(),
        exe = exe.display()
    );
    let spec = TargetSpec {
        comms: vec!["boxed_fixture".into()],
        ..TargetSpec::default()
    };
    let mut profiler = Profiler::start_with(config(499, spec)).expect("start");
    let _unshare = KillOnDrop::spawn(
        Command::new("unshare")
            .args([
                "--pid",
                "--mount",
                "--fork",
                // Its pid 1 (the spinner) dies with it: killing only `unshare` left the
                // spinner burning a CPU under the tests that followed.
                "--kill-child",
                "--propagation",
                "private",
                "sh",
                "-c",
            ])
            .arg(&script),
    );
    let deadline = Instant::now() + Duration::from_secs(120);
    let target = loop {
        pump(&mut profiler, Duration::from_millis(100));
        if let Some(t) = profiler
            .targets()
            .into_iter()
            .find(|t| t.comm == "boxed_fixture")
        {
            break t;
        }
        assert!(
            Instant::now() < deadline,
            "the boxed process was never seen"
        );
    };
    assert_eq!(target.ns_pid, Some(1), "pid 1 of its namespace: {target:?}");
    let host_path = private.join("boxed_fixture");
    assert!(
        !Path::new(&host_path).exists(),
        "the copy must be invisible from here: {}",
        host_path.display()
    );
    let before = profiler.collect();
    let cpu = pump_cpu(&mut profiler, target.pid, 0.8);
    let after = profiler.collect();
    let snap = sframe_user::export::snapshot_delta(&after, &before);
    let targets = profiler.targets();
    let pids: HashSet<u32> = [target.pid].into();
    let stacks = stacks_of(&profiler, &snap, &targets, &pids);
    let (good, total, bad) = complete_through(&stacks, &["main", "boxed_work"]);
    eprintln!(
        "pid {} (1 inside): {good} of {total} complete\n{bad}",
        target.pid
    );
    assert_complete("through boxed_work", (good, total, &bad), cpu, 499, 0.95);
}

/// A C program with `n` functions (to give its table many rows) that spins in
/// `evict_work` for `secs`; `salt` makes each build a different object.
fn many_functions(salt: u32, n: usize, secs: f64) -> String {
    // Each function calls out with an array of its own size on the stack, so that it
    // has rows of its own (entry, frame of its size, after the epilogue): leaf
    // functions all have the one rule CFA = SP + 8, which the kernel layout merges
    // across the padding between them. `salt` only changes a string and a constant in
    // the code (same encoding), so that executables of different salts are distinct
    // objects (objects are told apart by their code and unwind sections, not by names or
    // build-ids) with the same rows.
    let mut s = format!(
        "#include <time.h>\n#define SALT {salt}\nvolatile unsigned long sink;\n\
         __attribute__((used)) static const char tag[] = \"evict fixture {salt}\";\n\
         static double now(void) {{ struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); \
         return t.tv_sec + t.tv_nsec / 1e9; }}\n\
         __attribute__((noinline)) void use(volatile unsigned long *p) {{ sink += p[0]; }}\n",
    );
    for i in 0..n {
        s += &format!(
            "__attribute__((noinline)) unsigned long f{i}(unsigned long x) {{ \
             volatile unsigned long a[{len}]; a[0] = x; a[x % {len}] = x ^ {i}; use(a); \
             return a[(x + 1) % {len}]; }}\n",
            len = 4 + i % 13
        );
    }
    s += "__attribute__((noinline)) void evict_work(double secs) { double t = now(); \
          unsigned long x = 0; while (now() - t < secs) { for (int i = 0; i < 1000; i++) x += i ^ SALT; sink += x;";
    for i in (0..n).step_by(97) {
        s += &format!(" x = f{i}(x);");
    }
    s += &format!(" }} }}\nint main(void) {{ evict_work({secs}); return 0; }}\n");
    s
}

#[test]
fn a_small_table_budget_evicts_unused_objects_and_stays_correct() {
    if !bpf_or_skip("a_small_table_budget_evicts_unused_objects_and_stays_correct") {
        return;
    }
    let _serial = serial();
    let a = compile_c(
        "evict_a",
        &many_functions(1, 3000, 30.0),
        &["-O2", "-fomit-frame-pointer"],
    );
    let b = compile_c(
        "evict_b",
        &many_functions(2, 3000, 30.0),
        &["-O2", "-fomit-frame-pointer"],
    );
    // Sizes of everything A's process maps (libc, ld.so, the vDSO, A itself).
    let mut first = KillOnDrop::spawn(&mut Command::new(&a));
    let (rows_all, rows_exe) = {
        let mut p = Profiler::start(99).expect("start");
        p.add_target(first.pid()).expect("tables");
        let rows = |f: &dyn Fn(&str) -> bool| -> u64 {
            p.store()
                .objects()
                .filter(|o| f(&o.path))
                .filter_map(|o| o.placement)
                .map(|pl| u64::from(pl.rows).next_multiple_of(8))
                .sum()
        };
        let exe = a.display().to_string();
        (rows(&|_| true), rows(&|p: &str| p == exe))
    };
    first.0.kill().unwrap();
    first.0.wait().unwrap();
    assert!(
        rows_exe > 4000,
        "the fixture should have many rows: {rows_exe}"
    );
    // Room for one process's objects and half of a second executable: B's table only
    // fits once A's is evicted.
    let wanted = rows_all + rows_exe / 2;
    let bytes = (1u64..)
        .map(|k| k * 4096)
        .find(|&b| u64::from(sframe_user::profiler::table_capacity(b).0) >= wanted)
        .unwrap();
    let mut profiler = Profiler::start_with(ProfilerConfig {
        max_table_memory: Some(bytes),
        ..ProfilerConfig::explicit(499)
    })
    .expect("start with a small budget");
    let run = |profiler: &mut Profiler, exe: &PathBuf| {
        let child = KillOnDrop::spawn(&mut Command::new(exe));
        let pid = child.pid();
        thread::sleep(Duration::from_millis(50));
        profiler.add_target(pid).expect("tables");
        pump_cpu(profiler, pid, 0.1);
        let before = profiler.collect();
        let cpu = pump_cpu(profiler, pid, 0.8);
        let after = profiler.collect();
        let delta = sframe_user::export::snapshot_delta(&after, &before);
        let stacks = stacks_of(profiler, &delta, &profiler.targets(), &[pid].into());
        drop(child);
        pump(profiler, Duration::from_millis(300));
        let (good, total, bad) = complete_through(&stacks, &["main", "evict_work"]);
        (good, total, bad, samples_floor(cpu, 499))
    };
    let (good_a, total_a, bad_a, floor_a) = run(&mut profiler, &a);
    assert_eq!(
        profiler.store().stats().evictions,
        0,
        "nothing to evict yet"
    );
    let (good_b, total_b, bad_b, floor_b) = run(&mut profiler, &b);
    let stats = profiler.store().stats();
    eprintln!(
        "budget {bytes} bytes ({wanted} rows): A {good_a}/{total_a}, B {good_b}/{total_b}; {stats:?}"
    );
    assert!(stats.evictions >= 1, "B needed A's room: {stats:?}");
    for (name, good, total, bad, floor) in [
        ("A", good_a, total_a, bad_a, floor_a),
        ("B", good_b, total_b, bad_b, floor_b),
    ] {
        assert!(
            total >= floor,
            "{name}: too few samples: {total} (at least {floor})"
        );
        assert!(
            good as f64 >= 0.95 * total as f64,
            "{name}: {good} of {total} complete:\n{bad}"
        );
    }
}

#[test]
fn without_targets_the_command_line_profiles_the_whole_system() {
    if !bpf_or_skip("without_targets_the_command_line_profiles_the_whole_system") {
        return;
    }
    let _serial = serial();
    let exe = compile_c(
        "wholesys",
        &spinner_source("boxed_work", 120.0),
        &["-O2", "-fomit-frame-pointer"],
    );
    let spinner = KillOnDrop::spawn(&mut Command::new(&exe));
    // Until the spinner has had 1 s of CPU (not a wall-clock window: on a busy machine
    // it may barely run), then stopped as a user stops it.
    let dir = fixture_dir("wholesys-out");
    let (out_path, err_path) = (dir.join("stdout"), dir.join("stderr"));
    let mut profiler = KillOnDrop::spawn(
        Command::new(env!("CARGO_BIN_EXE_sframe-user"))
            .args(["--top", "200"])
            .stdout(std::fs::File::create(&out_path).expect("stdout file"))
            .stderr(std::fs::File::create(&err_path).expect("stderr file")),
    );
    support::hostile::wait_attached(profiler.pid());
    support::hostile::wait_cpu(spinner.pid(), 1.0, || {
        assert!(
            profiler.0.try_wait().expect("poll sframe-user").is_none(),
            "sframe-user exited early: {}",
            std::fs::read_to_string(&err_path).unwrap_or_default()
        );
    });
    // SAFETY: a signal to our own child.
    unsafe { libc::kill(profiler.pid() as i32, libc::SIGTERM) };
    let status = profiler.0.wait().expect("wait for sframe-user");
    let stdout = std::fs::read_to_string(&out_path).unwrap_or_default();
    let stderr = std::fs::read_to_string(&err_path).unwrap_or_default();
    assert!(status.success(), "{status}: {stderr}");
    assert!(stderr.contains("profiling every process"), "{stderr}");
    // The spinner's hottest stack, innermost first, complete.
    let block = stdout
        .split("\n#")
        .find(|b| {
            b.contains("wholesys pid") && b.contains("[complete]") && b.contains("boxed_work")
        })
        .unwrap_or_else(|| panic!("no complete stack of the spinner:\n{stdout}"));
    let frames: Vec<&str> = block.lines().skip(1).map(str::trim).collect();
    assert_eq!(frames.last(), Some(&"_start"), "{block}");
    assert!(frames.contains(&"main"), "{block}");
}

#[test]
fn the_overhead_governor_lowers_the_frequency_over_budget() {
    if !bpf_or_skip("the_overhead_governor_lowers_the_frequency_over_budget") {
        return;
    }
    let _serial = serial();
    // Runs until killed: on a loaded machine the profiler's start-up can take longer
    // than the 6 s the shared spinner lives, and the run then ends before the governor's
    // first decision (5 s after the start).
    let exe = compile_c(
        "governed",
        &CONTAINER_SOURCE.replace("boxed_work(6)", "boxed_work(600)"),
        &["-O2", "-fomit-frame-pointer"],
    );
    let spinner = KillOnDrop::spawn(&mut Command::new(&exe));
    // A budget no profiler can meet at 999 Hz: 0.001% of each CPU.
    let out = Command::new(env!("CARGO_BIN_EXE_sframe-user"))
        .args(["--pid", &spinner.pid().to_string()])
        .args([
            "--frequency",
            "999",
            "--max-overhead",
            "0.001",
            "--duration",
            "8",
        ])
        .env("RUST_LOG", "sframe_user=info")
        .output()
        .expect("run sframe-user");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    let line = stderr
        .lines()
        .find(|l| l.contains("instead of 999 Hz"))
        .unwrap_or_else(|| panic!("the frequency was not lowered:\n{stderr}"));
    let hz: u64 = line
        .split("sampling at ")
        .nth(1)
        .and_then(|r| r.split(' ').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("unparsable: {line}"));
    assert!(hz < 999, "{line}");
}

#[test]
fn sigterm_writes_the_profile_and_exits_cleanly() {
    if !bpf_or_skip("sigterm_writes_the_profile_and_exits_cleanly") {
        return;
    }
    let _serial = serial();
    let exe = compile_c(
        "termed",
        &spinner_source("boxed_work", 120.0),
        &["-O2", "-fomit-frame-pointer"],
    );
    let spinner = KillOnDrop::spawn(&mut Command::new(&exe));
    let out = fixture_dir("termed-out").join("profile.folded");
    let mut profiler = KillOnDrop::spawn(
        Command::new(env!("CARGO_BIN_EXE_sframe-user"))
            .args([
                "--pid",
                &spinner.pid().to_string(),
                "--format",
                "folded",
                "--output",
            ])
            .arg(&out),
    );
    // Attached, then 0.3 s of the spinner's CPU (not a wall-clock window).
    support::hostile::wait_attached(profiler.pid());
    support::hostile::wait_cpu(spinner.pid(), 0.3, || {});
    // SAFETY: kill on a child we own.
    assert_eq!(
        unsafe { libc::kill(profiler.pid() as i32, libc::SIGTERM) },
        0
    );
    let status = profiler.0.wait().expect("wait");
    assert!(status.success(), "{status:?}");
    let folded = std::fs::read_to_string(&out).expect("the profile was written");
    assert!(
        folded.lines().any(|l| l.contains("main;boxed_work")),
        "{folded}"
    );
}

#[test]
fn a_restart_loads_tables_from_the_disk_cache() {
    if !bpf_or_skip("a_restart_loads_tables_from_the_disk_cache") {
        return;
    }
    let _serial = serial();
    let exe = compile_c(
        "cached",
        &spinner_source("boxed_work", 60.0),
        &["-O2", "-fomit-frame-pointer"],
    );
    let spinner = KillOnDrop::spawn(&mut Command::new(&exe));
    let pid = spinner.pid();
    thread::sleep(Duration::from_millis(50));
    let dir = fixture_dir("table-cache");
    let cached = |dir: &Path| ProfilerConfig {
        cache_dir: Some(dir.to_owned()),
        ..ProfilerConfig::explicit(499)
    };
    let stores = {
        let mut first = Profiler::start_with(cached(&dir)).expect("start");
        first.add_target(pid).expect("tables");
        let stats = first.store().cache().expect("cache").stats;
        assert_eq!(stats.hits, 0, "{stats:?}");
        assert!(
            stats.stores >= 3,
            "executable, libc, ld.so, vDSO: {stats:?}"
        );
        stats.stores
    };
    let mut second = Profiler::start_with(cached(&dir)).expect("restart");
    second.add_target(pid).expect("tables");
    let stats = second.store().cache().expect("cache").stats;
    assert_eq!((stats.hits, stats.stores), (stores, 0), "{stats:?}");
    let before = second.collect();
    let cpu = pump_cpu(&mut second, pid, 0.6);
    let after = second.collect();
    let snap = sframe_user::export::snapshot_delta(&after, &before);
    let stacks = stacks_of(&second, &snap, &second.targets(), &[pid].into());
    let (good, total, bad) = complete_through(&stacks, &["main", "boxed_work"]);
    assert_complete("from cached tables", (good, total, &bad), cpu, 499, 0.95);
}

/// A program spinning in a function named `name` for `secs`.
fn spinner_source(name: &str, secs: f64) -> String {
    CONTAINER_SOURCE
        .replace("boxed_work", name)
        .replace("boxed_work(6)", &format!("{name}({secs})"))
        .replace(&format!("{name}(6)"), &format!("{name}({secs})"))
}

/// Waits until `pid` has mapped the C library (the dynamic loader is done with it), not
/// for a wall-clock time: a busy machine may take long to get there.
fn wait_for_libc(pid: u32) {
    let start = Instant::now();
    while !procfs::read_executable_maps(pid)
        .is_ok_and(|m| m.iter().any(|m| m.path.contains("libc")))
    {
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "libc never mapped"
        );
        thread::sleep(Duration::from_millis(10));
    }
}

/// A load that finds no maps (the process exited: a zombie's read empty) leaves the
/// table installed before, for the samples still waiting to be walked with it. (CI,
/// 2026-12-04: a command's waiting samples were walked over the empty table such a
/// load installed, and kept only their PC.)
#[test]
fn a_load_of_an_exited_process_keeps_its_table() {
    if !bpf_or_skip("a_load_of_an_exited_process_keeps_its_table") {
        return;
    }
    let _serial = serial();
    let exe = compile_c(
        "zombie_keep",
        &spinner_source("zombie_keep_work", 30.0),
        &["-O2", "-fomit-frame-pointer"],
    );
    let child = KillOnDrop::spawn(&mut Command::new(&exe));
    let pid = child.pid();
    wait_for_libc(pid);
    let mut profiler = Profiler::start(99).expect("start");
    let loaded = profiler.add_target(pid).expect("load");
    let before = profiler
        .store()
        .process_entries(pid)
        .expect("its table")
        .len();
    assert!(before >= 3, "{loaded:?}");
    // SAFETY: a signal to our own child, not reaped: it stays a zombie.
    unsafe { libc::kill(pid as i32, libc::SIGKILL) };
    let start = Instant::now();
    while procfs::liveness(pid) != procfs::Liveness::Zombie {
        assert!(start.elapsed() < Duration::from_secs(60), "never a zombie");
        thread::sleep(Duration::from_millis(5));
    }
    let report = profiler.refresh(pid).expect("a zombie's maps read");
    assert!(report.maps.is_empty(), "a zombie has no mappings");
    assert_eq!(
        profiler.store().process_entries(pid).map(<[_]>::len),
        Some(before),
        "the table installed before stays"
    );
    // Reaped when `child` is dropped.
}

/// Loading a process parses each of its objects once, however many things are taken
/// from the file (identity, segments, `.sframe` or CFI, PLT): counted on the loading
/// thread (objects built on the worker are parsed there, and not counted here).
#[test]
fn a_process_load_parses_each_new_object_once() {
    if !bpf_or_skip("a_process_load_parses_each_new_object_once") {
        return;
    }
    let _serial = serial();
    let exe = compile_c(
        "parse_once",
        &spinner_source("parse_once_work", 30.0),
        &["-O2", "-fomit-frame-pointer"],
    );
    let child = KillOnDrop::spawn(&mut Command::new(&exe));
    wait_for_libc(child.pid());
    let mut profiler = Profiler::start(99).expect("start");
    let before = sframe_user::ehframe::parses_on_this_thread();
    let report = profiler.add_target(child.pid()).expect("load");
    let parses = sframe_user::ehframe::parses_on_this_thread() - before;
    eprintln!("{parses} ELF parses for {} objects", report.with_table);
    assert!(
        report.with_table >= 3,
        "exe, libc, ld.so: {} with a table",
        report.with_table
    );
    assert!(
        parses >= 1,
        "no parse counted: the counter is not on the load path"
    );
    assert!(
        parses <= report.with_table as u64,
        "{parses} ELF parses for {} objects",
        report.with_table
    );
}

#[test]
fn a_reused_pid_never_gets_the_old_process_tables() {
    if !bpf_or_skip("a_reused_pid_never_gets_the_old_process_tables") {
        return;
    }
    let _serial = serial();
    let a = compile_c(
        "reuse_a",
        &spinner_source("reuse_a_work", 30.0),
        &["-O2", "-fomit-frame-pointer"],
    );
    // Another layout: B's code is where A had other code.
    let b = compile_c(
        "reuse_b",
        &spinner_source("reuse_b_work", 30.0),
        &["-O0", "-fomit-frame-pointer"],
    );
    let spec = TargetSpec {
        all: true,
        ..TargetSpec::default()
    };
    let mut profiler = Profiler::start_with(config(499, spec)).expect("start");
    sframe_user::privileges::raise_event_loop_priority();
    let first = KillOnDrop::spawn(&mut Command::new(&a));
    let pid = first.pid();
    pump(&mut profiler, Duration::from_secs(1));
    drop(first);
    pump(&mut profiler, Duration::from_millis(300));
    // The next process gets the same pid: the kernel hands out ns_last_pid + 1.
    let second = (0..50)
        .find_map(|_| {
            std::fs::write("/proc/sys/kernel/ns_last_pid", (pid - 1).to_string()).ok()?;
            let child = KillOnDrop::spawn(&mut Command::new(&b));
            (child.pid() == pid).then_some(child)
        })
        .expect("could not get the same pid again");
    pump_cpu(&mut profiler, pid, 0.1);
    let before = profiler.collect();
    let cpu = pump_cpu(&mut profiler, pid, 0.8);
    let after = profiler.collect();
    let delta = sframe_user::export::snapshot_delta(&after, &before);
    let stacks = stacks_of(&profiler, &delta, &profiler.targets(), &[pid].into());
    let (good, total, bad) = complete_through(&stacks, &["main", "reuse_b_work"]);
    let stale: u64 = stacks
        .iter()
        .filter(|(names, _, _)| names.iter().any(|n| n.contains("reuse_a")))
        .map(|s| s.2)
        .sum();
    eprintln!("pid {pid} reused: {good} of {total} complete through reuse_b_work, {stale} stale");
    drop(second);
    assert_eq!(
        stale, 0,
        "samples of the new process named after the old one:\n{bad}"
    );
    assert_complete("the new process", (good, total, &bad), cpu, 499, 0.95);
}

#[test]
fn samples_taken_before_the_tables_are_unwound_later_in_user_space() {
    if !bpf_or_skip("samples_taken_before_the_tables_are_unwound_later_in_user_space") {
        return;
    }
    let _serial = serial();
    let exe = compile_c(
        "deferred",
        &spinner_source("deferred_work", 30.0),
        &["-O2", "-fomit-frame-pointer"],
    );
    let spinner = KillOnDrop::spawn(&mut Command::new(&exe));
    let pid = spinner.pid();
    thread::sleep(Duration::from_millis(100));
    // Whole system, loaded lazily: the spinner's first samples find no table.
    let spec = TargetSpec {
        all: true,
        ..TargetSpec::default()
    };
    let mut profiler = Profiler::start_with(config(499, spec)).expect("start");
    // Until the spinner's tables are loaded (on a busy machine, after those of the
    // processes that were sampled more), then a little more for the backlog to drain:
    // budgeted in the spinner's CPU time.
    let mut cpu = 0.0;
    while !profiler
        .targets()
        .iter()
        .any(|t| t.pid == pid && !t.maps.is_empty())
    {
        cpu += pump_cpu(&mut profiler, pid, 0.1);
        assert!(
            cpu < 20.0,
            "not loaded after {cpu:.1} s of the spinner's CPU"
        );
    }
    cpu += pump_cpu(&mut profiler, pid, 0.4);
    let snap = profiler.collect();
    let deferred = snap.counters[sframe_common::Counter::Deferred as usize];
    let lost = snap.counters[sframe_common::Counter::DeferredLost as usize];
    let stacks = stacks_of(&profiler, &snap, &profiler.targets(), &[pid].into());
    let (good, total, bad) = complete_through(&stacks, &["main", "deferred_work"]);
    let unknown: u64 = snap
        .counts
        .iter()
        .filter(|c| {
            c.key.pid == pid && c.key.outcome == sframe_common::WalkOutcome::UnknownProcess as u32
        })
        .map(|c| c.count)
        .sum();
    // The spinner's own deferred samples (not the machine's): walked in user space,
    // every one complete.
    let mine = profiler.deferred_walks(pid);
    eprintln!(
        "deferred {deferred} machine-wide (lost {lost}), the spinner's {} ({} complete); \
         {good} of {total} complete; {unknown} unknown_process",
        mine.samples, mine.complete
    );
    assert!(
        mine.samples >= 1,
        "the spinner's first sample had no table and must have been deferred"
    );
    assert!(
        mine.complete * 100 >= mine.samples * 95,
        "{} of the spinner's {} deferred samples complete:\n{bad}",
        mine.complete,
        mine.samples
    );
    // Every sample that reached user space was unwound; the only ones left without a
    // stack are those the kernel could not hand over (its ring full while the loop was
    // busy: counted as lost). On a quiet machine that is none.
    assert!(
        unknown <= lost,
        "{unknown} samples of the spinner not unwound, {lost} counted lost:\n{bad}"
    );
    assert!(
        good as f64 >= 0.98 * (total - unknown) as f64,
        "{good} of {total} ({unknown} lost in the kernel):\n{bad}"
    );
    assert!(
        total >= samples_floor(cpu, 499),
        "too few samples: {total} in {cpu:.2} s of CPU"
    );
}

#[test]
fn large_objects_are_built_off_the_event_loop_and_then_used() {
    if !bpf_or_skip("large_objects_are_built_off_the_event_loop_and_then_used") {
        return;
    }
    let _serial = serial();
    // 12 MiB of read-only data makes the file larger than SYNC_BUILD_BYTES.
    let source = spinner_source("large_work", 120.0).replace(
        "volatile unsigned long sink;",
        "volatile unsigned long sink;\nconst unsigned char ballast[12 << 20] = {1};",
    ) + "\nunsigned long touch(int i) { return ballast[i]; }\n";
    // Static: the executable is the only file its process maps, so the store's
    // figures below are about it alone.
    let exe = compile_c(
        "large",
        &source,
        &["-O2", "-fomit-frame-pointer", "-static"],
    );
    let size = std::fs::metadata(&exe).unwrap().len();
    assert!(
        size > sframe_user::objects::SYNC_BUILD_BYTES as u64,
        "fixture of {size} bytes"
    );
    // Its own cgroup (loaded from events as in whole-system mode), entered before the
    // exec: no other process of a busy machine is profiled.
    let (cgroup, mut profiler) = profiler_of_own_cgroup("sframe-large");
    let spinner = spawn_into_cgroup(&cgroup, &mut Command::new(&exe));
    let pid = spinner.pid();
    // The build runs on the worker while the spinner runs: wait for it (bounded by the
    // spinner's CPU, not by wall time).
    let mut cpu = 0.0;
    while profiler.store().stats().background_builds == 0 || profiler.store().builds_in_flight() > 0
    {
        cpu += pump_cpu(&mut profiler, pid, 0.1);
        assert!(
            cpu < 20.0,
            "the build did not finish while the spinner used {cpu:.1} s of CPU: {:?}",
            profiler.store().stats()
        );
    }
    // It was hashed on the worker too, not on the loop (its first sight), and built
    // there once.
    let stats = profiler.store().stats();
    assert!(
        stats.background_identifications == 1 && stats.background_builds == 1,
        "{stats:?}"
    );
    let before = profiler.collect();
    let cpu = pump_cpu(&mut profiler, pid, 0.5);
    let after = profiler.collect();
    let delta = sframe_user::export::snapshot_delta(&after, &before);
    let stacks = stacks_of(&profiler, &delta, &profiler.targets(), &[pid].into());
    let (good, total, bad) = complete_through(&stacks, &["main", "large_work"]);
    eprintln!("{size} bytes: {good} of {total} complete after the background build");
    assert_complete(
        "after the background build",
        (good, total, &bad),
        cpu,
        499,
        0.95,
    );
}

#[test]
fn a_reload_is_charged_only_what_reloading_costs() {
    if !bpf_or_skip("a_reload_is_charged_only_what_reloading_costs") {
        return;
    }
    let _serial = serial();
    let exe = compile_c(
        "reload_cost",
        &spinner_source("reload_work", 30.0),
        &["-O2", "-fomit-frame-pointer"],
    );
    let mut profiler = Profiler::start(99).expect("start");
    let spinner = KillOnDrop::spawn(&mut Command::new(&exe));
    thread::sleep(Duration::from_millis(50));
    // The first load builds the tables of the executable, libc, ld.so and the vDSO:
    // paid once. A reload finds them built: the throttle between reloads (a share of
    // their cost) must not count the builds, or a new process waits for its first
    // dlopen's reload long after its library runs.
    let first = profiler.add_target(spinner.pid()).expect("tables");
    let again = profiler.refresh(spinner.pid()).expect("tables");
    assert!(
        first.build_time > Duration::ZERO,
        "first load: {:?}",
        first.build_time
    );
    assert_eq!(again.build_time, Duration::ZERO, "nothing new to build");
    assert_eq!(again.with_table, first.with_table);
}

/// A large executable (over `SYNC_BUILD_BYTES`) that spins `short_work` for 0.3 s of CPU,
/// then waits for its stdin to close and exits.
const SHORT_LARGE_SOURCE: &str = r#"
#include <time.h>
#include <unistd.h>
volatile unsigned long sink;
const unsigned char ballast[12 << 20] = {1};
static double cpu_seconds(void) {
    struct timespec t;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
    return t.tv_sec + t.tv_nsec / 1e9;
}
__attribute__((noinline)) void short_inner(void) { for (int i = 0; i < 1000; i++) sink += i; }
__attribute__((noinline)) void short_work(double secs) {
    double start = cpu_seconds();
    while (cpu_seconds() - start < secs) { short_inner(); sink++; }
}
int main(int argc, char **argv) {
    char c;
    short_work(0.3);
    sink += ballast[argc];
    while (read(0, &c, 1) > 0) {}
    return 0;
}
"#;

#[test]
fn a_process_that_exits_while_its_table_is_built_keeps_its_stacks() {
    if !bpf_or_skip("a_process_that_exits_while_its_table_is_built_keeps_its_stacks") {
        return;
    }
    let _serial = serial();
    let exe = compile_c(
        "short_large",
        SHORT_LARGE_SOURCE,
        &["-O2", "-fomit-frame-pointer"],
    );
    // Targeted by a cgroup v2 of its own, which the kernel side filters on (as it does
    // for every process in whole-system mode, its samples are deferred before user space
    // has seen it), but the kernel's deferred-sample ring (about 250 records), which this
    // test lets fill while the loop does not run, is not shared with every new process
    // of a busy machine: in whole-system mode under `cargo xtask stress` the compile
    // loop's processes took 832 places and left this process 18 samples of 150.
    let (cgroup, mut profiler) = profiler_of_own_cgroup("sframe-exits");
    // The build "takes" until the process has exited: its result is left on the
    // worker's channel until then (otherwise how long it takes is a race).
    profiler.store_mut().hold_builds(true);
    // In the cgroup before its exec (so from its first instruction).
    let mut child = spawn_in_cgroup(&cgroup, &exe, Stdio::piped());
    let pid = child.pid();
    // Its samples find no table (the loop is not run meanwhile): all deferred.
    // (Bounded by its CPU: it spins 0.3 s in all, some before this call.)
    let cpu = support::hostile::wait_cpu(pid, 0.25, || {});
    // Its first load sends the executable to the worker; samples taken before wait for
    // that table rather than be walked without it (by frame pointers it does not keep).
    let started = Instant::now();
    while !profiler
        .targets()
        .iter()
        .any(|t| t.pid == pid && !t.maps.is_empty())
    {
        profiler.handle_events();
        thread::sleep(Duration::from_millis(10));
        assert!(started.elapsed() < Duration::from_secs(120), "never loaded");
    }
    // (On a busy host other processes' objects may be on the worker too; what matters
    // is that this one's is.)
    assert!(
        profiler.store().awaits_build(pid),
        "its executable is built on the worker ({} builds in flight)",
        profiler.store().builds_in_flight()
    );
    // It exits before the build is done: its tables go with it.
    drop(child.0.stdin.take());
    let _ = child.0.wait();
    while profiler.is_alive(pid) || profiler.targets().iter().all(|t| t.pid != pid) {
        profiler.handle_events();
        profiler.maintain();
        thread::sleep(Duration::from_millis(10));
        assert!(
            started.elapsed() < Duration::from_secs(120),
            "exit not seen"
        );
    }
    let waiting = profiler.deferred_waiting();
    assert!(waiting > 0, "its samples wait for the table");
    profiler.store_mut().hold_builds(false);
    profiler.flush_deferred(Duration::from_secs(120));
    let mut snap = profiler.collect();
    let deferred = snap.counters[sframe_common::Counter::Deferred as usize];
    let lost = snap.counters[sframe_common::Counter::DeferredLost as usize];
    let mut outcomes = std::collections::BTreeMap::new();
    for c in snap.counts.iter().filter(|c| c.key.pid == pid) {
        *outcomes.entry(c.key.outcome).or_insert(0u64) += c.count;
    }
    // The kernel's ring holds about 250 samples (16 KiB each); past that a sample is
    // counted `unknown_process` and `deferred_lost`. Those are the ring's bound, not this
    // test's subject: they are left out, and must all be accounted for as lost.
    let unknown = outcomes
        .get(&(sframe_common::WalkOutcome::UnknownProcess as u32))
        .copied()
        .unwrap_or(0);
    eprintln!(
        "{deferred} deferred, {lost} lost to a full ring, {waiting} waited past the exit; \
         outcomes {outcomes:?}; lifecycle {:?}",
        profiler.lifecycle()
    );
    assert!(
        unknown <= lost,
        "{unknown} samples without tables, only {lost} lost to a full ring"
    );
    snap.counts.retain(|c| {
        c.key.pid != pid || c.key.outcome != sframe_common::WalkOutcome::UnknownProcess as u32
    });
    let stacks = stacks_of(&profiler, &snap, &profiler.targets(), &[pid].into());
    let (good, total, bad) = complete_through(&stacks, &["main", "short_work"]);
    eprintln!("{good} of {total} walked samples complete");
    // The sample floor holds for all its samples; most of them reached user space (the
    // ring holds about 250, this process has about 125): what is left out is the ring's
    // overflow, not the subject.
    let floor = samples_floor(cpu, 499);
    assert!(
        total + unknown >= floor,
        "too few samples: {} in {cpu:.2} s of CPU (want {floor})",
        total + unknown
    );
    assert!(
        total * 2 >= total + unknown,
        "only {total} of {} samples reached user space",
        total + unknown
    );
    let walked_cpu = cpu * total as f64 / (total + unknown).max(1) as f64;
    assert_complete(
        "waited past the exit",
        (good, total, &bad),
        walked_cpu,
        499,
        0.95,
    );
}

/// The end of a profile waits for tables being built for samples that wait for them;
/// a process still alive then is reloaded with the finished table before its samples
/// are walked (walked with the table from before the build, they stopped at the
/// object being built).
#[test]
fn samples_waiting_at_the_end_are_walked_with_the_table_built_meanwhile() {
    if !bpf_or_skip("samples_waiting_at_the_end_are_walked_with_the_table_built_meanwhile") {
        return;
    }
    let _serial = serial();
    let exe = compile_c(
        "short_large",
        SHORT_LARGE_SOURCE,
        &["-O2", "-fomit-frame-pointer"],
    );
    // A cgroup target, deferred from its first instruction like a new process in
    // whole-system mode, but alone: with every build held, whole-system mode under
    // `cargo xtask stress` filled the backlog's 1,024 places with the compile loop's
    // samples (all waiting for their builds) and this process's were walked at once.
    let (cgroup, mut profiler) = profiler_of_own_cgroup("sframe-end-wait");
    profiler.store_mut().hold_builds(true);
    let child = spawn_in_cgroup(&cgroup, &exe, Stdio::piped());
    let pid = child.pid();
    // It spins 0.3 s of CPU, then waits on its stdin (alive, no more samples); the loop
    // does not run meanwhile: every sample is deferred.
    let cpu = support::hostile::wait_cpu(pid, 0.25, || {});
    wait_blocked(pid, || thread::sleep(Duration::from_millis(5)));
    let started = Instant::now();
    while !profiler
        .targets()
        .iter()
        .any(|t| t.pid == pid && !t.maps.is_empty())
    {
        profiler.handle_events();
        thread::sleep(Duration::from_millis(10));
        assert!(started.elapsed() < Duration::from_secs(120), "never loaded");
    }
    assert!(
        profiler.store().awaits_build(pid),
        "built on the worker ({} builds in flight)",
        profiler.store().builds_in_flight()
    );
    let waiting = profiler.deferred_waiting_of(pid);
    assert!(waiting > 0, "its samples wait for the table");
    // The profile ends: the build finishes while the end waits for it.
    let (good, total, bad) = release_builds_and_flush(&mut profiler, pid);
    assert!(profiler.is_alive(pid), "alive to the end");
    eprintln!("{waiting} waited for the build; {good} of {total} complete");
    // The samples that waited for the build are what this is about: without the reload
    // none of them is complete. (Others can end incomplete before the loop first runs:
    // 26 of 152 in one CI run, none of them waiting; cause not found.)
    assert!(
        total >= samples_floor(cpu, 499),
        "too few samples: {total} in {cpu:.2} s of CPU"
    );
    assert!(
        good as f64 >= 0.95 * waiting as f64,
        "{good} complete, {waiting} waited for the build:\n{bad}"
    );
    // Every stack the kernel stored is one a count names, drained with it: a deferred
    // sample's partial stack is not stored (each stayed in `STACKS` for good, and under
    // process churn they filled it: complete walks were then counted without frames).
    profiler.collect();
    let left = profiler.kernel_stacks_stored();
    assert_eq!(
        left, 0,
        "stacks left in the kernel's map after a drain, with the process blocked"
    );
    drop(child);
}

/// A local user's process whose samples wait for a long build (here held: a large
/// executable of its own, spinning) cannot take every place in the deferred backlog:
/// another new process whose samples wait for its own build keeps them, and they walk
/// complete once it is done.
#[test]
fn a_process_waiting_for_its_build_cannot_take_the_whole_deferred_backlog() {
    if !bpf_or_skip("a_process_waiting_for_its_build_cannot_take_the_whole_deferred_backlog") {
        return;
    }
    let _serial = serial();
    // Two large executables with different contents (two builds, both held).
    let hog_exe = compile_c(
        "backlog_hog",
        &SHORT_LARGE_SOURCE.replace("short_work(0.3)", "short_work(60.0)"),
        &["-O2", "-fomit-frame-pointer"],
    );
    let exe = compile_c(
        "backlog_victim",
        &SHORT_LARGE_SOURCE.replace("= {1}", "= {2}"),
        &["-O2", "-fomit-frame-pointer"],
    );
    let (cgroup, mut profiler) = profiler_of_own_cgroup("sframe-backlog");
    profiler.store_mut().hold_builds(true);
    // The attacker: unprivileged, moved into the profiled cgroup (a container's process).
    let hog = KillOnDrop::spawn(&mut support::hostile::as_nobody(&hog_exe));
    std::fs::write(cgroup.0.join("cgroup.procs"), hog.pid().to_string()).expect("move");
    // Its samples wait for its build: past 1,024 of them (2 s of CPU at 499 Hz) an
    // unshared backlog would be full.
    pump_cpu(&mut profiler, hog.pid(), 2.5);
    let hog_waiting = profiler.deferred_waiting_of(hog.pid());
    assert!(
        profiler.store().awaits_build(hog.pid()) && hog_waiting > 0,
        "its samples wait for its build ({hog_waiting})"
    );
    let victim = spawn_in_cgroup(&cgroup, &exe, Stdio::piped());
    let pid = victim.pid();
    let cpu = pump_cpu(&mut profiler, pid, 0.25);
    wait_blocked(pid, || {
        profiler.poll(Duration::from_millis(10));
    });
    profiler.poll(Duration::from_millis(10));
    let waiting = profiler.deferred_waiting_of(pid);
    let hog_waiting = profiler.deferred_waiting_of(hog.pid());
    eprintln!("waiting: victim {waiting}, attacker {hog_waiting}");
    assert!(
        profiler.deferred_waiting() < 1024,
        "the backlog is full: victim {waiting}, attacker {hog_waiting}"
    );
    drop(hog);
    let (good, total, bad) = release_builds_and_flush(&mut profiler, pid);
    eprintln!(
        "{waiting} waited; {good} of {total} complete ({} expected from {cpu:.2} s of CPU)",
        samples_floor(cpu, 499) * 2
    );
    // Every sample of it that reached the profiler waited for its table (none was walked
    // without it for want of room), and walked complete once the table was there. Not
    // judged by the sampling rate: in two CI runs on fresh hosts only 44 and 10 of the
    // victim's samples (of about 140 due for its CPU time) reached the profiler at all
    // while the attacker's filled their share; every one of them waited. Where the others
    // went is not found yet (locally 126-187 arrive, all waiting).
    assert!(
        waiting > 0 && total == waiting as u64,
        "{total} samples counted, {waiting} waited for the table ({cpu:.2} s of CPU)"
    );
    let incomplete = total - good;
    assert!(
        incomplete as f64 <= (0.05 * total as f64).max(1.0),
        "{good} of {total} complete ({waiting} waited):\n{bad}"
    );
    drop(victim);
}

#[test]
fn drop_privileges_keeps_only_what_profiling_needs() {
    if !bpf_or_skip("drop_privileges_keeps_only_what_profiling_needs") {
        return;
    }
    let _serial = serial();
    let exe = compile_c(
        "unprivileged",
        &spinner_source("boxed_work", 120.0),
        &["-O2", "-fomit-frame-pointer"],
    );
    let spinner = KillOnDrop::spawn(&mut Command::new(&exe));
    let out = fixture_dir("unprivileged-out").join("profile.folded");
    let mut profiler = KillOnDrop::spawn(
        Command::new(env!("CARGO_BIN_EXE_sframe-user"))
            .args(["--pid", &spinner.pid().to_string(), "--drop-privileges"])
            .args(["--frequency", "499", "--format", "folded", "--output"])
            .arg(&out),
    );
    // Privileges are dropped once the programs are loaded and attached (later on a
    // busy machine): wait for it.
    let read_status = || {
        std::fs::read_to_string(format!("/proc/{}/status", profiler.pid()))
            .expect("the profiler runs")
    };
    let deadline = Instant::now() + Duration::from_secs(120);
    let mut status = read_status();
    while !status.contains("NoNewPrivs:\t1") && Instant::now() < deadline {
        thread::sleep(Duration::from_millis(100));
        status = read_status();
    }
    let field = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .map(str::trim)
            .unwrap_or_default()
            .to_owned()
    };
    let keep: u64 = sframe_user::privileges::KEPT_CAPABILITIES
        .iter()
        .map(|&(c, _)| 1u64 << c)
        .sum();
    let hex = |s: String| u64::from_str_radix(&s, 16).unwrap_or(u64::MAX);
    assert_eq!(hex(field("CapEff:")), keep, "{status}");
    assert_eq!(hex(field("CapPrm:")), keep, "{status}");
    assert_eq!(hex(field("CapBnd:")), keep, "{status}");
    assert_eq!(field("NoNewPrivs:"), "1", "{status}");
    assert_eq!(field("Threads:"), "1", "{status}");
    // Then 0.6 s of the spinner's CPU (not a wall-clock window), and a stop as a user's.
    let cpu = support::hostile::wait_cpu(spinner.pid(), 0.6, || {});
    // SAFETY: a signal to our own child.
    unsafe { libc::kill(profiler.pid() as i32, libc::SIGTERM) };
    let done = profiler.0.wait().expect("wait");
    assert!(done.success(), "{done:?}");
    let folded = std::fs::read_to_string(&out).expect("the profile was written");
    let total: u64 = folded
        .lines()
        .filter_map(|l| l.rsplit(' ').next()?.parse::<u64>().ok())
        .sum();
    let complete: u64 = folded
        .lines()
        .filter(|l| l.contains(";_start;") && l.contains("main;boxed_work"))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<u64>().ok())
        .sum();
    assert!(
        total >= samples_floor(cpu, 499),
        "{cpu:.2} s of CPU:\n{folded}"
    );
    assert!(complete as f64 >= 0.95 * total as f64, "{folded}");
}

/// A cgroup directory created for a test, removed (after its processes) on drop.
struct TestCgroup(PathBuf);

impl TestCgroup {
    fn new(parent: &str, name: &str) -> Option<Self> {
        let dir = Path::new(parent).join(format!("{name}-{}", std::process::id()));
        std::fs::create_dir(&dir).ok()?;
        Some(Self(dir))
    }
    fn add(&self, pid: u32) {
        std::fs::write(self.0.join("cgroup.procs"), pid.to_string()).expect("move into the cgroup");
    }
}

impl Drop for TestCgroup {
    fn drop(&mut self) {
        for _ in 0..50 {
            if std::fs::remove_dir(&self.0).is_ok() {
                return;
            }
            thread::sleep(Duration::from_millis(20));
        }
    }
}

/// Profiles `--cgroup DIR` while one spinner runs inside the cgroup and one outside;
/// only the inside one is sampled, with complete stacks.
fn profile_one_cgroup(parent: &str, tag: &str) {
    let inside_exe = compile_c(
        &format!("{tag}_in"),
        &spinner_source("cg_inside", 30.0),
        &["-O2", "-fomit-frame-pointer"],
    );
    let outside_exe = compile_c(
        &format!("{tag}_out"),
        &spinner_source("cg_outside", 30.0),
        &["-O2", "-fomit-frame-pointer"],
    );
    let cgroup = TestCgroup::new(parent, "sframe-test")
        .unwrap_or_else(|| panic!("cannot create a cgroup under {parent}"));
    let inside = KillOnDrop::spawn(&mut Command::new(&inside_exe));
    cgroup.add(inside.pid());
    let outside = KillOnDrop::spawn(&mut Command::new(&outside_exe));
    let spec = TargetSpec {
        cgroups: vec![cgroup.0.clone()],
        ..TargetSpec::default()
    };
    let mut profiler = Profiler::start_with(config(499, spec)).expect("start with --cgroup");
    pump_cpu(&mut profiler, inside.pid(), 0.2);
    let before = profiler.collect();
    let cpu = pump_cpu(&mut profiler, inside.pid(), 0.6);
    let after = profiler.collect();
    let delta = sframe_user::export::snapshot_delta(&after, &before);
    let of = |pid: u32| -> u64 {
        delta
            .counts
            .iter()
            .filter(|c| c.key.pid == pid)
            .map(|c| c.count)
            .sum()
    };
    assert_eq!(
        of(outside.pid()),
        0,
        "the process outside the cgroup was sampled"
    );
    let stacks = stacks_of(
        &profiler,
        &delta,
        &profiler.targets(),
        &[inside.pid()].into(),
    );
    let (good, total, bad) = complete_through(&stacks, &["main", "cg_inside"]);
    eprintln!("{tag}: {good} of {total} complete inside, none outside");
    assert_complete(tag, (good, total, &bad), cpu, 499, 0.95);
    drop(inside);
    drop(outside);
}

#[test]
fn cgroup_targets_v2_and_v1() {
    if !bpf_or_skip("cgroup_targets_v2_and_v1") {
        return;
    }
    let _serial = serial();
    let v2 = ["/sys/fs/cgroup/unified", "/sys/fs/cgroup"]
        .into_iter()
        .find(|p| {
            Path::new(p).join("cgroup.procs").exists()
                && Path::new(p).join("cgroup.controllers").exists()
        });
    let v1 = [
        "/sys/fs/cgroup/cpu",
        "/sys/fs/cgroup/pids",
        "/sys/fs/cgroup/systemd",
    ]
    .into_iter()
    .find(|p| Path::new(p).join("tasks").exists());
    // CI machines (this project's kind) mount both: neither case may be skipped there.
    if sframe_user::privileges::in_ci() {
        assert!(v2.is_some() && v1.is_some(), "v2 {v2:?}, v1 {v1:?}");
    }
    match v2 {
        Some(root) => profile_one_cgroup(root, "cgv2"),
        None => eprintln!("SKIPPED the cgroup v2 case: no cgroup2 hierarchy here"),
    }
    match v1 {
        Some(root) => profile_one_cgroup(root, "cgv1"),
        None => eprintln!("SKIPPED the cgroup v1 case: no cgroup v1 hierarchy here"),
    }
    assert!(v2.is_some() || v1.is_some(), "no cgroup hierarchy at all");
}

const ZOMBIES_SOURCE: &str = r#"
#define _GNU_SOURCE
#include <signal.h>
#include <stdio.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
volatile unsigned long sink;
static double cpu_seconds(void) {
    struct timespec t;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
    return t.tv_sec + t.tv_nsec / 1e9;
}
__attribute__((noinline)) void zombie_work(double secs) {
    double start = cpu_seconds();
    while (cpu_seconds() - start < secs)
        for (int i = 0; i < 2000; i++) sink += i;
}
int main(void) {
    pid_t kids[2];
    for (int i = 0; i < 2; i++) {
        kids[i] = fork();
        if (kids[i] == 0) {
            zombie_work(0.1);
            _exit(0);
        }
    }
    /* Wait for their exits without reaping them: they stay zombies. */
    for (int i = 0; i < 2; i++) {
        siginfo_t si;
        waitid(P_PID, kids[i], &si, WEXITED | WNOWAIT);
        printf("%d\n", kids[i]);
    }
    fflush(stdout);
    pause();
    return 0;
}
"#;

/// A user can leave zombies behind: processes that exited (so their maps read empty)
/// but keep `/proc/PID` until their parent reaps them. Samples of such a process taken
/// before its first load must be walked with what there is, once, not held and retried
/// at every round of the loop (that spun the loop, one failed load per round, for as
/// long as the samples' patience lasted, renewed by every new zombie).
#[test]
fn samples_of_a_zombie_are_walked_once_not_retried_every_round() {
    if !bpf_or_skip("samples_of_a_zombie_are_walked_once_not_retried_every_round") {
        return;
    }
    let _serial = serial();
    let exe = compile_c("zombies", ZOMBIES_SOURCE, &["-O2", "-fomit-frame-pointer"]);
    let spec = TargetSpec {
        all: true,
        ..TargetSpec::default()
    };
    let mut profiler = Profiler::start_with(config(499, spec)).expect("start");
    let mut parent = KillOnDrop::spawn(
        support::hostile::as_nobody(&exe)
            .stdout(Stdio::piped())
            .stdin(Stdio::null()),
    );
    // The loop does not run until both children have exited: none of them was loaded,
    // their samples all wait in the kernel's deferred ring.
    let mut out = BufReader::new(parent.0.stdout.take().expect("stdout"));
    let mut zombies = HashSet::new();
    for _ in 0..2 {
        let mut line = String::new();
        out.read_line(&mut line).expect("a zombie's pid");
        zombies.insert(line.trim().parse::<u32>().expect("a pid"));
    }
    for &z in &zombies {
        assert!(
            procfs::liveness(z) == procfs::Liveness::Zombie,
            "{z} is a zombie"
        );
    }
    let failures_of = |p: &Profiler| -> u64 {
        zombies
            .iter()
            .map(|&z| u64::from(p.failed_loads_of(z)))
            .sum()
    };
    let failures_before = failures_of(&profiler);
    const ROUNDS: u64 = 100;
    for _ in 0..ROUNDS {
        profiler.handle_events();
        thread::sleep(Duration::from_millis(5));
    }
    // Its zombies' only: other processes of a busy host exit before their loads too.
    let failures = failures_of(&profiler) - failures_before;
    let waiting = profiler.deferred_waiting();
    let snap = profiler.collect();
    let deferred = snap.counters[sframe_common::Counter::Deferred as usize];
    // (Whole-system: other processes' samples may wait too.)
    let counted: u64 = snap
        .counts
        .iter()
        .filter(|c| zombies.contains(&c.key.pid))
        .map(|c| c.count)
        .sum();
    eprintln!(
        "{deferred} deferred, {counted} of the zombies' samples counted, {failures} failed loads in {ROUNDS} rounds, {waiting} still waiting"
    );
    // Walked within those rounds (held, they would wait out the 10 s patience).
    let floor = samples_floor(0.1 * zombies.len() as f64, 499);
    assert!(
        counted >= floor,
        "{counted} of the zombies' samples counted, want at least {floor}"
    );
    // Their fork, miss and exit events may each try a load once; not every round.
    assert!(
        failures <= 4 * zombies.len() as u64,
        "{failures} failed loads of zombies in {ROUNDS} rounds"
    );
}

/// A new cgroup v2 named after `tag`, and a profiler (499 Hz) whose only target it is.
fn profiler_of_own_cgroup(tag: &str) -> (TestCgroup, Profiler) {
    let root = support::cgroup2_root().expect("a cgroup v2 hierarchy");
    let cgroup = TestCgroup::new(root.to_str().expect("UTF-8 path"), tag).expect("create a cgroup");
    let spec = TargetSpec {
        cgroups: vec![cgroup.0.clone()],
        ..TargetSpec::default()
    };
    let profiler = Profiler::start_with(config(499, spec)).expect("start");
    (cgroup, profiler)
}

/// Spawns `exe` in `cgroup` from its first instruction (moved there before its exec).
fn spawn_in_cgroup(cgroup: &TestCgroup, exe: &Path, stdin: Stdio) -> KillOnDrop {
    KillOnDrop::spawn(
        Command::new("sh")
            .arg("-c")
            .arg(r#"echo $$ > "$1/cgroup.procs" && exec "$2""#)
            .arg("sh")
            .arg(&cgroup.0)
            .arg(exe)
            .stdin(stdin),
    )
}

/// Waits (calling `step` meanwhile) until `pid` sleeps: a [`SHORT_LARGE_SOURCE`]
/// process is done spinning and waits on its stdin.
fn wait_blocked(pid: u32, mut step: impl FnMut()) {
    let started = Instant::now();
    while procfs::state(pid) != Some(b'S') {
        step();
        assert!(
            started.elapsed() < Duration::from_secs(120),
            "never blocked"
        );
    }
}

/// Lets the held builds run, waits for the deferred samples to be walked (as the end
/// of a profile does), and returns `pid`'s stacks through `main`, `short_work`:
/// (complete, all, the incomplete ones).
fn release_builds_and_flush(profiler: &mut Profiler, pid: u32) -> (u64, u64, String) {
    profiler.store_mut().hold_builds(false);
    profiler.flush_deferred(Duration::from_secs(120));
    let snap = profiler.collect();
    let stacks = stacks_of(profiler, &snap, &profiler.targets(), &[pid].into());
    complete_through(&stacks, &["main", "short_work"])
}

/// Spawns `command` in `cgroup`, moved there between fork and exec: unlike
/// [`spawn_in_cgroup`] no shell (and its libraries) runs in the cgroup first.
fn spawn_into_cgroup(cgroup: &TestCgroup, command: &mut Command) -> KillOnDrop {
    use std::os::unix::process::CommandExt as _;
    let procs = std::ffi::CString::new(
        cgroup
            .0
            .join("cgroup.procs")
            .into_os_string()
            .into_encoded_bytes(),
    )
    .expect("path without NUL");
    // SAFETY: the hook only calls open, write and close (async-signal-safe) on memory
    // prepared before the fork.
    unsafe {
        command.pre_exec(move || {
            let fd = libc::open(procs.as_ptr(), libc::O_WRONLY);
            if fd < 0 {
                return Err(std::io::Error::last_os_error());
            }
            let ok = libc::write(fd, b"0".as_ptr().cast(), 1) == 1;
            let err = std::io::Error::last_os_error();
            libc::close(fd);
            if ok { Ok(()) } else { Err(err) }
        });
    }
    KillOnDrop::spawn(command)
}

/// ROWS and PAGES, mapped into the profiler, count 19 MB in its RSS: they are unmapped
/// once idle, and mapped again when deferred samples must be walked in user space — a
/// new process's samples taken before its first load, all deferred here (the loop does
/// not run while it spins), walk complete through the tables.
#[test]
fn the_table_maps_leave_the_profiler_when_idle_and_return_for_deferred_walks() {
    if !bpf_or_skip("the_table_maps_leave_the_profiler_when_idle_and_return_for_deferred_walks") {
        return;
    }
    let _serial = serial();
    let exe = compile_c(
        "idle_maps",
        &spinner_source("idle_spin", 120.0),
        &["-O2", "-fomit-frame-pointer"],
    );
    // A cgroup target: the kernel defers the samples of its processes until they are
    // loaded, and no other process of the machine uses the tables.
    let (cgroup, mut profiler) = profiler_of_own_cgroup("sframe-idle");
    let first = spawn_in_cgroup(&cgroup, &exe, Stdio::null());
    pump_cpu(&mut profiler, first.pid(), 0.2);
    // Idle: no load, no deferred sample (the first process is loaded). The arrays go
    // after TABLE_MAPPING_IDLE of the loop's time (a deadline far past it, not a
    // measurement).
    let idle_since = Instant::now();
    while profiler.store().tables().mapped_bytes() > 0 {
        profiler.poll(Duration::from_millis(100));
        assert!(
            idle_since.elapsed() < Duration::from_secs(120),
            "the table maps stayed mapped"
        );
    }
    let before = profiler.collect();
    // A second process of the same executable: nothing to load (its objects are in the
    // kernel already), so only the deferred walks can map the arrays again.
    let second = spawn_in_cgroup(&cgroup, &exe, Stdio::null());
    let cpu = support::hostile::wait_cpu(second.pid(), 0.2, || {});
    // Its load, and in the same step the walks of the samples it left: they map back
    // the chunks they read. (Not until none waits: one taken in `sh` before the exec
    // finds no mapping in the new image and waits DEFERRED_PATIENCE for a reload.)
    let started = Instant::now();
    while profiler.store().process_entries(second.pid()).is_none() {
        profiler.poll(Duration::from_millis(10));
        assert!(started.elapsed() < Duration::from_secs(120), "never loaded");
    }
    // Just used: not unmapped. (Asserted now: the walks are done with the first steps
    // after its load, and under `cargo xtask stress` the rest of this test can take
    // longer than TABLE_MAPPING_IDLE, after which unmapping them is right.)
    assert!(
        !profiler
            .store_mut()
            .unmap_tables_if_idle(sframe_user::profiler::TABLE_MAPPING_IDLE)
    );
    // Mapped again, only the chunks these walks read (not the 19 MB of both arrays).
    let mapped = profiler.store().tables().mapped_bytes();
    assert!(
        mapped > 0 && mapped <= 4 << 20,
        "{mapped} bytes of the table maps mapped"
    );
    let cpu = cpu + pump_cpu(&mut profiler, second.pid(), 0.1);
    let after = profiler.collect();
    let deferred = after.counters[sframe_common::Counter::Deferred as usize]
        - before.counters[sframe_common::Counter::Deferred as usize];
    let delta = sframe_user::export::snapshot_delta(&after, &before);
    let stacks = stacks_of(
        &profiler,
        &delta,
        &profiler.targets(),
        &[second.pid()].into(),
    );
    let (good, total, bad) = complete_through(&stacks, &["main", "idle_spin"]);
    eprintln!("{deferred} deferred; {good} of {total} complete");
    assert!(
        deferred * 2 >= total,
        "{deferred} of {total} samples deferred: the test's subject is their walk"
    );
    assert_complete("deferred after idle", (good, total, &bad), cpu, 499, 0.95);
}

/// Many distinct stacks in a short life: recursion to a depth that changes all the time.
const CROWD_FILLER: &str = r#"
volatile unsigned long sink;
__attribute__((noinline)) void fill_leaf(void) { for (int i = 0; i < 20000; i++) sink += i; }
__attribute__((noinline)) int fill_rec(int n) {
    if (n == 0) { fill_leaf(); return 0; }
    int r = fill_rec(n - 1);
    sink += r;
    return r + 1;
}
int main(void) { for (int k = 0; k < 4000; k++) fill_rec(k % 40); return 0; }
"#;

/// Exited processes kept for the report (`max_exited`) give way, oldest first, when the
/// counts kept fill their bounds: a running process's new stacks are counted, not
/// folded to its root. (Stressed CI, 2026-12-06: a build's exited compilers filled the
/// bounds in whole-system mode, and the churn test's processes, started later, were
/// counted without stacks.)
#[test]
fn exited_processes_give_way_to_running_ones_when_the_kept_counts_fill() {
    if !bpf_or_skip("exited_processes_give_way_to_running_ones_when_the_kept_counts_fill") {
        return;
    }
    let _serial = serial();
    let filler = compile_c(
        "crowd_filler",
        CROWD_FILLER,
        &["-O2", "-fomit-frame-pointer"],
    );
    let spinner = compile_c(
        "crowd_spinner",
        &spinner_source("crowd_work", 30.0),
        &["-O2", "-fomit-frame-pointer"],
    );
    // 256 keys (16 per process) and 4096 stack words (256 per process).
    let mut profiler = Profiler::start_with(ProfilerConfig {
        max_kept_counts: Some(256),
        ..ProfilerConfig::explicit(499)
    })
    .expect("start");
    // Each filler brings up to its 16 keys: 24 of them would hold 384 of 256.
    let mut fillers = 0;
    while profiler.lifecycle().exited_forgotten == 0 {
        assert!(
            fillers < 200,
            "{fillers} exited fillers never crowded the counts"
        );
        let mut child = Command::new(&filler).spawn().expect("spawn");
        let _ = profiler.add_target(child.id());
        while child.try_wait().expect("wait").is_none() {
            pump(&mut profiler, Duration::from_millis(20));
        }
        pump(&mut profiler, Duration::from_millis(50));
        let _ = profiler.collect();
        fillers += 1;
    }
    eprintln!(
        "{fillers} fillers; {} exited processes forgotten",
        profiler.lifecycle().exited_forgotten
    );
    let child = KillOnDrop::spawn(&mut Command::new(&spinner));
    let pid = child.pid();
    wait_for_libc(pid);
    profiler.add_target(pid).expect("load");
    pump_cpu(&mut profiler, pid, 1.0);
    let snap = profiler.collect();
    let pids = HashSet::from([pid]);
    let stacks = stacks_of(&profiler, &snap, &profiler.targets(), &pids);
    let (good, total, bad) = complete_through(&stacks, &["main", "crowd_work"]);
    assert!(
        total >= samples_floor(1.0, 499),
        "{total} samples of the running process"
    );
    assert!(
        good as f64 >= 0.9 * total as f64,
        "{good} of {total} samples complete through crowd_work:\n{bad}"
    );
}

/// A C program whose stacks are 32³ distinct chains `main → l1_I → l2_J → l3_K`, one
/// chosen at random for each short spin.
fn many_stacks_source() -> String {
    let mut c = String::from(
        "#include <stdlib.h>\nvolatile unsigned long sink;\ntypedef void (*fn)(unsigned);\n",
    );
    for k in 0..32 {
        c.push_str(&format!(
            "__attribute__((noinline)) void l3_{k}(unsigned r) {{ for (int i = 0; i < 2000; i++) sink += i ^ r; }}\n"
        ));
    }
    let table = |level: u32| {
        (0..32)
            .map(|k| format!("l{level}_{k}"))
            .collect::<Vec<_>>()
            .join(", ")
    };
    c.push_str(&format!("static fn t3[32] = {{ {} }};\n", table(3)));
    for j in 0..32 {
        c.push_str(&format!(
            "__attribute__((noinline)) void l2_{j}(unsigned r) {{ t3[r & 31](r); sink++; }}\n"
        ));
    }
    c.push_str(&format!("static fn t2[32] = {{ {} }};\n", table(2)));
    for i in 0..32 {
        c.push_str(&format!(
            "__attribute__((noinline)) void l1_{i}(unsigned r) {{ t2[(r >> 5) & 31](r); sink++; }}\n"
        ));
    }
    c.push_str(&format!("static fn t1[32] = {{ {} }};\n", table(1)));
    c.push_str(
        "int main(void) { srand(1); for (;;) { unsigned r = (unsigned)rand(); t1[(r >> 10) & 31](r); } }\n",
    );
    c
}

/// More distinct stacks between two snapshots than the kernel's stack map holds
/// (`MAX_STACKS`, 4,096: about a second of a busy machine's stacks): the loop moves the
/// kernel's counts and stacks into user space once a second (`Profiler::maintain`),
/// whoever runs it and however seldom it takes a snapshot. Before, only `collect`
/// emptied the kernel's maps: under `cargo xtask stress`, whole-system profiling
/// collected once at the end counted 78 % of a churn test's samples without their
/// frames (the map full of other processes' stacks).
#[test]
fn stacks_past_the_kernel_map_keep_their_frames_between_snapshots() {
    if !bpf_or_skip("stacks_past_the_kernel_map_keep_their_frames_between_snapshots") {
        return;
    }
    let _serial = serial();
    let exe = compile_c("many_stacks", &many_stacks_source(), &["-O2"]);
    let a = KillOnDrop::spawn(&mut Command::new(&exe));
    let b = KillOnDrop::spawn(&mut Command::new(&exe));
    let pids = vec![a.pid(), b.pid()];
    let spec = TargetSpec {
        pids: pids.clone(),
        ..TargetSpec::default()
    };
    let mut profiler = Profiler::start_with(config(999, spec)).expect("start");
    // 8 s of their CPU at 999 Hz: about 8,000 samples, of some 6,600 distinct stacks.
    support::profiling::pump_cpu_all(&mut profiler, &pids, 4.0);
    let snap = profiler.collect();
    let mine: Vec<_> = snap
        .counts
        .iter()
        .filter(|c| pids.contains(&c.key.pid))
        .collect();
    let all: u64 = mine.iter().map(|c| c.count).sum();
    let distinct: HashSet<u64> = mine.iter().map(|c| c.key.user_stack).collect();
    let frameless: u64 = mine
        .iter()
        .filter(|c| c.key.user_stack == 0 || profiler.stack(c.key.user_stack).is_none())
        .map(|c| c.count)
        .sum();
    let full = snap.counters[sframe_common::Counter::StackMapFull as usize];
    eprintln!(
        "{all} samples, {} distinct stacks, {frameless} without frames, stack map full {full} times",
        distinct.len()
    );
    assert!(
        distinct.len() > sframe_common::budget::MAX_STACKS as usize,
        "the test needs more distinct stacks than the kernel map holds: {}",
        distinct.len()
    );
    assert_eq!(full, 0, "the kernel's stack map filled up");
    assert_eq!(
        frameless, 0,
        "{frameless} of {all} samples without their frames"
    );
}
