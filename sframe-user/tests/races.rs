//! Races and resource bounds under the real kernel: libraries replaced on disk while
//! mapped (renamed over, rewritten in place), kernel maps too small for the workload,
//! and a storm of short-lived processes against the profiler's memory.

mod support;

use std::{
    collections::HashSet,
    fs,
    path::{Path, PathBuf},
    process::{Command, Stdio},
    thread,
    time::{Duration, Instant},
};

use sframe_common::Counter;
use sframe_user::{
    bpf::MapSizes,
    profiler::{Profiler, ProfilerConfig},
};
use support::profiling::{assert_complete_through, pump, pump_cpu, pump_cpu_all, serial};
use support::{KillOnDrop, bpf_or_skip, compile_c_linked, compile_c_shared, fixture_dir};

/// The program: `main → swap_entry → <the library's spinner>` for `argv[1]` seconds.
const SWAP_MAIN: &str = r#"
#include <stdlib.h>
void swap_entry(double secs);
int main(int argc, char **argv) {
    swap_entry(argc > 1 ? atof(argv[1]) : 30);
    return 0;
}
"#;

/// Version A of the library: the spinner keeps a 2 KiB buffer on its stack.
const SWAP_A: &str = r#"
#include <time.h>
volatile unsigned long sink;
static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec / 1e9;
}
__attribute__((noinline)) void swap_a_spin(double secs) {
    volatile char buf[2048];
    double start = now();
    while (now() - start < secs)
        for (int i = 0; i < 2000; i++) { buf[i & 2047] = i; sink += buf[(i * 7) & 2047]; }
}
__attribute__((noinline)) void swap_entry(double secs) { swap_a_spin(secs); sink++; }
"#;

/// Version B: other code first, a spinner with a small frame at another address.
const SWAP_B: &str = r#"
#include <time.h>
volatile unsigned long sink;
static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec / 1e9;
}
#define PAD(n) __attribute__((noinline)) unsigned long pad##n(unsigned long x) { \
    for (int i = 0; i < 64; i++) x = x * 31 + i + n; return x; }
PAD(0) PAD(1) PAD(2) PAD(3) PAD(4) PAD(5) PAD(6) PAD(7)
__attribute__((noinline)) void swap_b_spin(double secs) {
    double start = now();
    while (now() - start < secs)
        for (int i = 0; i < 2000; i++) sink += pad0(i) ^ pad5(i);
}
__attribute__((noinline)) void swap_entry(double secs) { pad3(1); swap_b_spin(secs); sink++; }
"#;

const FLAGS: &[&str] = &["-O2", "-fomit-frame-pointer"];

/// Replaces `path` by `from` the way package managers do: a new file renamed over it.
fn rename_over(from: &Path, path: &Path) {
    let tmp = path.with_extension("new");
    fs::copy(from, &tmp).expect("copy library");
    fs::rename(&tmp, path).expect("rename over the library");
}

/// Rewrites `path` in place (same inode) with the bytes of `from`, as `cp` does.
fn rewrite_in_place(from: &Path, path: &Path) {
    let bytes = fs::read(from).expect("read library");
    fs::write(path, bytes).expect("rewrite library in place");
}

fn inode(path: &Path) -> u64 {
    use std::os::unix::fs::MetadataExt as _;
    fs::metadata(path).expect("stat").ino()
}

/// Profiles until each (pid, spinner) has used 1 s of CPU (not a wall-clock window: on
/// a busy machine they get what they get) and asserts that its samples are complete
/// through `main → swap_entry → spinner`.
fn check_spinners(profiler: &mut Profiler, expect: &[(u32, &str)], what: &str) {
    let before = profiler.collect();
    let pids: Vec<u32> = expect.iter().map(|&(pid, _)| pid).collect();
    pump_cpu_all(profiler, &pids, 1.0);
    let after = profiler.collect();
    let delta = sframe_user::export::snapshot_delta(&after, &before);
    for &(pid, spinner) in expect {
        assert_complete_through(
            profiler,
            &delta,
            pid,
            &["main", "swap_entry", spinner],
            200,
            what,
        );
    }
}

#[test]
fn a_library_replaced_on_disk_while_mapped_is_unwound_with_the_mapped_file() {
    if !bpf_or_skip("a_library_replaced_on_disk_while_mapped_is_unwound_with_the_mapped_file") {
        return;
    }
    let _serial = serial();
    let a = compile_c_shared(&fixture_dir("swap-a"), "swap", SWAP_A, FLAGS);
    let b = compile_c_shared(&fixture_dir("swap-b"), "swap", SWAP_B, FLAGS);
    let dir = fixture_dir("swap");
    let lib = dir.join("libswap.so");
    fs::copy(&a, &lib).expect("install version A");
    let exe = compile_c_linked(&dir, "swapper", SWAP_MAIN, FLAGS, &["swap"]);
    let spawn = || KillOnDrop::spawn(Command::new(&exe).arg("30"));

    // A profiler that knew version A before it was renamed over.
    let mut early = Profiler::start_with(ProfilerConfig::explicit(499)).expect("start");
    let old = spawn();
    thread::sleep(Duration::from_millis(50));
    early
        .add_target(old.pid())
        .expect("tables of the first process");
    pump(&mut early, Duration::from_millis(300));
    let inode_a = inode(&lib);
    rename_over(&b, &lib);
    assert_ne!(inode(&lib), inode_a, "the rename made a new file");
    let new = spawn();
    thread::sleep(Duration::from_millis(50));
    early
        .add_target(new.pid())
        .expect("tables of the second process");
    check_spinners(
        &mut early,
        &[(old.pid(), "swap_a_spin"), (new.pid(), "swap_b_spin")],
        "renamed over, profiler started before",
    );
    drop(early);

    // A profiler started after the rename: the path names version B, but the first
    // process still maps A (read through /proc/PID/map_files).
    let mut late = Profiler::start_with(ProfilerConfig::explicit(499)).expect("start");
    late.add_target(old.pid())
        .expect("tables of the first process");
    late.add_target(new.pid())
        .expect("tables of the second process");
    check_spinners(
        &mut late,
        &[(old.pid(), "swap_a_spin"), (new.pid(), "swap_b_spin")],
        "renamed over, profiler started after",
    );

    // Rewritten in place (same inode, now version A again) while the profiler still
    // knows the inode as version B: the next process must get A's tables.
    drop(old);
    drop(new);
    pump(&mut late, Duration::from_millis(200));
    let inode_b = inode(&lib);
    // A different size and modification time from the bytes read before.
    thread::sleep(Duration::from_millis(20));
    rewrite_in_place(&a, &lib);
    assert_eq!(inode(&lib), inode_b, "rewritten in place");
    let changed_before = late.store().stats().files_changed;
    let third = spawn();
    thread::sleep(Duration::from_millis(50));
    late.add_target(third.pid())
        .expect("tables of the third process");
    assert!(
        late.store().stats().files_changed > changed_before,
        "the rewritten file was not noticed"
    );
    check_spinners(
        &mut late,
        &[(third.pid(), "swap_a_spin")],
        "rewritten in place",
    );
}

/// A spinner whose stacks change all the time: `spin → level(depth)` for depths
/// 1..=48, so that it produces many distinct stacks.
const MANY_STACKS: &str = r#"
#include <time.h>
volatile unsigned long sink;
static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec / 1e9;
}
__attribute__((noinline)) void level(int depth) {
    if (depth > 0) { level(depth - 1); sink++; return; }
    for (int i = 0; i < 3000; i++) sink += i;
}
__attribute__((noinline)) void spin(double secs) {
    double start = now();
    unsigned n = 0;
    while (now() - start < secs) level(1 + (n++ % 48));
}
int main(void) { spin(30); return 0; }
"#;

#[test]
fn full_kernel_maps_are_counted_and_profiling_goes_on() {
    if !bpf_or_skip("full_kernel_maps_are_counted_and_profiling_goes_on") {
        return;
    }
    let _serial = serial();
    let exe = support::compile_c("many_stacks", MANY_STACKS, FLAGS);
    let mut profiler = Profiler::start_with(ProfilerConfig {
        map_sizes: MapSizes {
            processes: Some(2),
            // Both overflow between two drains (every 100 ms here: `pump` →
            // `Profiler::maintain`), in which the two processes in the kernel map make
            // some 40 distinct stacks and at least two keys (a stack that found no room
            // is counted under stack 0, which makes few distinct keys: one key of room).
            stacks: Some(4),
            counts: Some(1),
            kernel_stacks: None,
        },
        ..ProfilerConfig::explicit(499)
    })
    .expect("start with tiny maps");
    let children: Vec<KillOnDrop> = (0..4)
        .map(|_| KillOnDrop::spawn(&mut Command::new(&exe)))
        .collect();
    thread::sleep(Duration::from_millis(50));
    for c in &children {
        // A process that finds no room is still a target: it is reported, not refused.
        profiler
            .add_target(c.pid())
            .expect("a full process map is not an error");
    }
    let in_kernel: HashSet<u32> = profiler.kernel_processes().into_iter().collect();
    let pids: Vec<u32> = children.iter().map(KillOnDrop::pid).collect();
    let without: Vec<u32> = pids
        .iter()
        .copied()
        .filter(|p| !in_kernel.contains(p))
        .collect();
    eprintln!("in the kernel map: {in_kernel:?}; without room: {without:?}");
    assert_eq!(without.len(), 2, "two of four fit in a map of two");
    assert!(profiler.store().stats().process_table_full >= 2);

    // Several windows (0.5 s of each child's CPU, about 250 samples at 499 Hz): each
    // collection empties STACKS and COUNTS, which overflow again.
    let mut last = profiler.collect();
    for window in 0..3 {
        pump_cpu_all(&mut profiler, &pids, 0.5);
        let snap = profiler.collect();
        let delta = sframe_user::export::snapshot_delta(&snap, &last);
        let counter =
            |c: Counter| snap.counters[c as usize].saturating_sub(last.counters[c as usize]);
        let per_pid = |pid: u32| -> u64 {
            delta
                .counts
                .iter()
                .filter(|c| c.key.pid == pid)
                .map(|c| c.count)
                .sum()
        };
        eprintln!(
            "window {window}: stack_map_full {}, count_map_full {}, deferred {}, samples per pid {:?}",
            counter(Counter::StackMapFull),
            counter(Counter::CountMapFull),
            counter(Counter::Deferred),
            pids.iter().map(|&p| per_pid(p)).collect::<Vec<_>>()
        );
        assert!(counter(Counter::StackMapFull) > 0, "window {window}");
        assert!(counter(Counter::CountMapFull) > 0, "window {window}");
        // The processes without room are sampled and unwound in user space.
        assert!(counter(Counter::Deferred) > 0, "window {window}");
        for &pid in &without {
            assert_complete_through(
                &profiler,
                &delta,
                pid,
                &["main", "spin", "level"],
                100,
                &format!("window {window}"),
            );
        }
        // The checks above symbolize on the loop's thread (the command names stacks on
        // a thread of its own): meanwhile the deferred ring (256 samples) filled, and
        // what did not fit was counted with its PC alone. The next window starts once
        // the loop runs again.
        pump(&mut profiler, Duration::from_millis(100));
        last = profiler.collect();
    }

    // When processes leave the map, the waiting ones take their places.
    let (gone, waiting): (Vec<KillOnDrop>, Vec<KillOnDrop>) = children
        .into_iter()
        .partition(|c| in_kernel.contains(&c.pid()));
    drop(gone);
    // A bound against a hang, not a measure: the room is given at the next exits'
    // handling.
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        pump(&mut profiler, Duration::from_millis(100));
        let now_in: HashSet<u32> = profiler.kernel_processes().into_iter().collect();
        if without.iter().all(|p| now_in.contains(p)) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the waiting processes never got the freed room: {now_in:?}"
        );
    }

    // Stacks whose count found no room stayed in the kernel's map, named by no count
    // for the drain to take out, and the map stayed full for good: once no target runs,
    // one drain leaves it empty.
    drop(waiting);
    pump(&mut profiler, Duration::from_millis(100));
    profiler.collect();
    assert_eq!(
        profiler.kernel_stacks_stored(),
        0,
        "stacks left in the kernel's map after the targets exited and a drain"
    );
}

/// A shell loop starting short processes (`/bin/true`) for `secs` seconds; it prints
/// how many it started.
fn storm(secs: u64) -> std::process::Child {
    let script = format!(
        "end=$(( $(date +%s) + {secs} )); n=0; \
         while [ $(date +%s) -lt $end ]; do /bin/true; n=$((n+1)); done; echo $n"
    );
    Command::new("sh")
        .args(["-c", &script])
        .stdout(Stdio::piped())
        .spawn()
        .expect("start a storm loop")
}

fn storm_count(loops: Vec<std::process::Child>) -> u64 {
    loops
        .into_iter()
        .map(|l| {
            let out = l.wait_with_output().expect("storm loop");
            String::from_utf8_lossy(&out.stdout)
                .trim()
                .parse::<u64>()
                .unwrap_or(0)
        })
        .sum()
}

/// Resident memory of `pid` in KiB (`VmRSS`).
fn rss_kib(pid: u32) -> Option<u64> {
    let status = fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
}

fn running_processes() -> usize {
    fs::read_dir("/proc")
        .map(|d| {
            d.filter_map(Result::ok)
                .filter(|e| e.file_name().to_string_lossy().parse::<u32>().is_ok())
                .count()
        })
        .unwrap_or(0)
}

/// A shell loop starting `n` short processes (`/bin/true`), writing how many it has
/// started to `progress` every 50.
fn counted_storm(n: u64, progress: &Path) -> std::process::Child {
    let script = format!(
        "i=0; while [ $i -lt {n} ]; do /bin/true; i=$((i+1)); \
         [ $((i % 50)) -eq 0 ] && echo $i > \"$1.tmp\" && mv \"$1.tmp\" \"$1\"; done; \
         echo $i > \"$1.tmp\"; mv \"$1.tmp\" \"$1\""
    );
    Command::new("sh")
        .args(["-c", &script, "sh"])
        .arg(progress)
        .stdout(Stdio::null())
        .spawn()
        .expect("start a storm loop")
}

#[test]
fn a_storm_of_short_processes_leaves_the_profiler_memory_bounded() {
    if !bpf_or_skip("a_storm_of_short_processes_leaves_the_profiler_memory_bounded") {
        return;
    }
    let _serial = serial();
    let dir: PathBuf = fixture_dir("storm");
    let out = dir.join("storm.folded");

    // The command line, following every process named `true` as it execs, through four
    // storm loops of 1,000 processes each: its resident memory must not trend up with
    // the processes started (exited ones beyond --keep-exited are forgotten; the kernel
    // maps have fixed sizes). Judged by processes started, not by seconds: on a busy
    // machine the storm is slower, and proves the same. Not `--all`: a large unrelated
    // object (this test binary) sampled late raises the RSS by its table, not because
    // of the storm.
    const PER_LOOP: u64 = 1000;
    let profiler = Command::new(env!("CARGO_BIN_EXE_sframe-user"))
        .args([
            "--comm",
            "true",
            "--no-cache",
            "--frequency",
            "199",
            "--keep-exited",
            "200",
        ])
        .args([
            "--max-processes",
            "64",
            "--max-overhead",
            "0",
            "--format",
            "folded",
        ])
        .arg("--output")
        .arg(&out)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start sframe-user");
    let pid = profiler.id();
    support::hostile::wait_attached(pid);
    let progress: Vec<PathBuf> = (0..4).map(|i| dir.join(format!("progress-{i}"))).collect();
    let mut loops: Vec<_> = progress
        .iter()
        .map(|p| counted_storm(PER_LOOP, p))
        .collect();
    let started_so_far = || -> u64 {
        progress
            .iter()
            .filter_map(|p| fs::read_to_string(p).ok()?.trim().parse::<u64>().ok())
            .sum()
    };
    // (processes started so far, VmRSS)
    let mut rss = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(600);
    while loops
        .iter_mut()
        .any(|l| l.try_wait().ok().flatten().is_none())
    {
        if let Some(kib) = rss_kib(pid) {
            rss.push((started_so_far(), kib));
        }
        assert!(
            Instant::now() < deadline,
            "the storm did not end in 600 s ({} started)",
            started_so_far()
        );
        thread::sleep(Duration::from_millis(100));
    }
    let started = started_so_far();
    // SIGTERM: the profile is written and the profiler exits.
    // SAFETY: kill(2) on our own child.
    unsafe { libc::kill(pid as i32, libc::SIGTERM) };
    let result = profiler.wait_with_output().expect("sframe-user");
    assert!(
        result.status.success(),
        "sframe-user failed under the storm:\n{}",
        String::from_utf8_lossy(&result.stderr)
    );
    let total = 4 * PER_LOOP;
    let max_in = |a: u64, b: u64| {
        rss.iter()
            .filter(|(n, _)| (a..b).contains(n))
            .map(|&(_, k)| k)
            .max()
            .unwrap_or(0)
    };
    // Past the first 10 % (the first processes' objects loaded), and the last 30 %.
    let early = max_in(total / 10, total * 4 / 10);
    let late = max_in(total * 7 / 10, total + 1);
    eprintln!(
        "storm: {started} processes; sframe-user RSS {} MiB (10-40 % started), {} MiB (last 30 %)",
        early / 1024,
        late / 1024
    );
    assert_eq!(started, total, "the storm loops ended early");
    assert!(early > 0 && late > 0, "RSS not sampled: {rss:?}");
    assert!(
        late <= early + 16 * 1024,
        "memory grew with the processes: {rss:?}"
    );
    let folded = fs::read_to_string(&out).expect("the profile was written");
    assert!(!folded.is_empty(), "the profile is empty");

    // The library: what it keeps of exited processes stays within max_exited.
    let mut profiler = Profiler::start_with(ProfilerConfig {
        max_exited: 100,
        targets: sframe_user::profiler::TargetSpec {
            all: true,
            ..Default::default()
        },
        ..ProfilerConfig::explicit(199)
    })
    .expect("start");
    // Storms of 2 s until it has seen several times max_exited exits (not a wall-clock
    // window: on a busy machine a storm starts fewer processes).
    let exits_seen = |p: &Profiler| {
        p.fleet_counters()
            .iter()
            .find(|c| c.0 == "exit")
            .map_or(0, |c| c.1)
    };
    let deadline = Instant::now() + Duration::from_secs(300);
    let mut started = 0;
    while exits_seen(&profiler) < 400 {
        let loops: Vec<_> = (0..4).map(|_| storm(2)).collect();
        let until = Instant::now() + Duration::from_secs(2);
        while Instant::now() < until {
            pump(&mut profiler, Duration::from_millis(100));
        }
        started += storm_count(loops);
        assert!(
            Instant::now() < deadline,
            "{} exits seen in 300 s",
            exits_seen(&profiler)
        );
    }
    pump(&mut profiler, Duration::from_millis(300));
    let known = profiler.targets().len();
    let running = running_processes();
    let exits = profiler
        .fleet_counters()
        .iter()
        .find(|c| c.0 == "exit")
        .map_or(0, |c| c.1);
    eprintln!(
        "library: {started} started, {exits} exits seen, {known} processes known, {running} running"
    );
    assert!(
        exits >= 300,
        "too few exits seen to exceed max_exited: {exits}"
    );
    assert!(
        known <= 110 + running,
        "{known} processes kept with max_exited 100 and {running} running"
    );
}

/// Two phases of system calls: `phase_a` (reads and getppid) for 2.5 s, then
/// `phase_b` (file system calls) until killed.
const SYSCALL_PHASES: &str = r#"
#include <fcntl.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec / 1e9;
}
static char buf[65536];
__attribute__((noinline)) void phase_a(double secs) {
    int z = open("/dev/zero", O_RDONLY);
    double start = now();
    for (unsigned n = 0; now() - start < secs; n++) {
        read(z, buf, 1 + (n % 16) * 4096);
        getppid();
    }
    close(z);
}
__attribute__((noinline)) void phase_b(void) {
    struct stat st;
    for (;;) {
        int fd = open("/etc/hostname", O_RDONLY);
        fstat(fd, &st);
        close(fd);
        stat("/usr/lib", &st);
        access("/usr/bin/env", X_OK);
    }
}
int main(void) { phase_a(2.5); phase_b(); return 0; }
"#;

#[test]
fn a_full_kernel_stack_map_is_emptied_and_kernel_stacks_keep_coming() {
    if !bpf_or_skip("a_full_kernel_stack_map_is_emptied_and_kernel_stacks_keep_coming") {
        return;
    }
    let _serial = serial();
    let exe = support::compile_c("syscall_phases", SYSCALL_PHASES, FLAGS);
    let mut profiler = Profiler::start_with(ProfilerConfig {
        map_sizes: MapSizes {
            kernel_stacks: Some(64),
            ..MapSizes::default()
        },
        ..ProfilerConfig::explicit(999)
    })
    .expect("start with a small kernel stack map");
    let child = KillOnDrop::spawn(&mut Command::new(&exe));
    thread::sleep(Duration::from_millis(20));
    profiler.add_target(child.pid()).expect("tables");
    let mut last = profiler.collect();
    let mut shares = Vec::new();
    // Windows of 0.7 s of the child's CPU (not wall-clock time: on a busy machine it
    // gets what it gets).
    for window in 0..6 {
        pump_cpu(&mut profiler, child.pid(), 0.7);
        let snap = profiler.collect();
        let delta = sframe_user::export::snapshot_delta(&snap, &last);
        let in_kernel = snap.counters[Counter::SamplesInKernel as usize]
            - last.counters[Counter::SamplesInKernel as usize];
        let failed = snap.counters[Counter::KernelStackFailed as usize]
            - last.counters[Counter::KernelStackFailed as usize];
        let with_stack: u64 = delta
            .counts
            .iter()
            .filter(|c| c.key.kernel_stack >= 0)
            .filter(|c| {
                profiler
                    .kernel_stack(c.key.kernel_stack)
                    .is_some_and(|k| !k.is_empty())
            })
            .map(|c| c.count)
            .sum();
        let share = with_stack as f64 / in_kernel.max(1) as f64;
        eprintln!(
            "window {window}: {in_kernel} samples in the kernel, {with_stack} with their kernel stack, {failed} failed"
        );
        shares.push((in_kernel, share));
        last = snap;
    }
    // A map of 64 entries that were never emptied would have given at most 64
    // distinct kernel stacks in all.
    let distinct: HashSet<i32> = last
        .counts
        .iter()
        .map(|c| c.key.kernel_stack)
        .filter(|&k| profiler.kernel_stack(k).is_some_and(|f| !f.is_empty()))
        .collect();
    eprintln!("{} distinct kernel stacks", distinct.len());
    assert!(
        distinct.len() > 2 * 64,
        "{} distinct kernel stacks from a 64-entry map: it was not emptied",
        distinct.len()
    );
    for &(in_kernel, share) in &shares[1..] {
        assert!(in_kernel >= 100, "too few kernel samples: {shares:?}");
        assert!(share >= 0.1, "kernel stacks stopped coming: {shares:?}");
    }
}
