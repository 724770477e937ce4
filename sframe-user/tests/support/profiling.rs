//! Driving a `Profiler` in a test: events pumped as the command line does, and the
//! symbolized stacks of some processes checked against an expected call chain.

use std::{
    collections::HashSet,
    sync::mpsc,
    time::{Duration, Instant, SystemTime},
};

use sframe_user::{
    export::Profile,
    profiler::{Profiler, ProfilerConfig, Snapshot, TargetInfo, TargetSpec},
    symbolize::Symbolizer,
};

/// The tests run one at a time: each profiles the whole system or depends on timing.
pub static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

pub fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

/// Handles the profiler's events for `d` (waiting on its ring buffer, as the CLI does).
pub fn pump(profiler: &mut Profiler, d: Duration) {
    let end = Instant::now() + d;
    loop {
        let left = end.saturating_duration_since(Instant::now());
        if left.is_zero() {
            break;
        }
        profiler.poll(left.min(Duration::from_millis(20)));
    }
    profiler.maintain();
}

/// Handles events until every process of `pids` has used `cpu` more seconds of CPU (a
/// window in the workload's CPU time, not wall-clock time); panics after 300 s.
pub fn pump_cpu_all(profiler: &mut Profiler, pids: &[u32], cpu: f64) {
    let start: Vec<f64> = pids
        .iter()
        .map(|&p| super::hostile::cpu_seconds(p))
        .collect();
    let end = Instant::now() + Duration::from_secs(300);
    while pids
        .iter()
        .zip(&start)
        .any(|(&p, &s)| super::hostile::cpu_seconds(p) - s < cpu)
    {
        pump(profiler, Duration::from_millis(100));
        assert!(
            Instant::now() < end,
            "{pids:?} did not get {cpu} s of CPU each in 300 s"
        );
    }
}

/// Handles events until process `pid` has used `cpu` more seconds of CPU: the test is
/// budgeted in the workload's CPU time, not in wall-clock time (on a busy machine the
/// workload gets what it gets). Panics when `pid` is gone or after 300 s of wall time
/// (a workload that cannot get `cpu` seconds in five minutes). Returns the CPU it used.
pub fn pump_cpu(profiler: &mut Profiler, pid: u32, cpu: f64) -> f64 {
    let start = super::hostile::cpu_seconds(pid);
    let end = Instant::now() + Duration::from_secs(300);
    loop {
        let used = super::hostile::cpu_seconds(pid) - start;
        if used >= cpu {
            return used;
        }
        assert!(
            std::path::Path::new(&format!("/proc/{pid}")).exists(),
            "process {pid} exited after {used:.2} of {cpu} CPU seconds"
        );
        assert!(
            Instant::now() < end,
            "process {pid} got {used:.2} of {cpu} CPU seconds in 300 s"
        );
        pump(profiler, Duration::from_millis(50));
    }
}

/// Samples expected of a process that used `cpu` seconds at `frequency` Hz, with half
/// as margin (sampling is per CPU clock tick; the first samples may precede the target).
pub fn samples_floor(cpu: f64, frequency: u64) -> u64 {
    (cpu * frequency as f64 * 0.5) as u64
}

/// Pumps events until `done` yields a value.
pub fn pump_until<T>(profiler: &mut Profiler, done: &mpsc::Receiver<T>, limit: Duration) -> T {
    let end = Instant::now() + limit;
    loop {
        if let Ok(v) = done.try_recv() {
            return v;
        }
        assert!(Instant::now() < end, "workload did not finish in {limit:?}");
        pump(profiler, Duration::from_millis(50));
    }
}

pub fn config(frequency: u64, targets: TargetSpec) -> ProfilerConfig {
    ProfilerConfig {
        targets,
        ..ProfilerConfig::explicit(frequency)
    }
}

/// The symbolized stacks of `pids` in `snap` (their mappings from `targets`):
/// (outermost-first names, outcome is complete, count).
pub fn stacks_of(
    profiler: &Profiler,
    snap: &Snapshot,
    targets: &[TargetInfo],
    pids: &HashSet<u32>,
) -> Vec<(Vec<String>, bool, u64)> {
    let targets: Vec<TargetInfo> = targets
        .iter()
        .filter(|t| pids.contains(&t.pid))
        .cloned()
        .collect();
    let mut symbolizer = Symbolizer::new();
    let profile = Profile::build(
        profiler,
        snap,
        &targets,
        &mut symbolizer,
        SystemTime::now(),
        Duration::from_secs(1),
        profiler.frequency(),
    );
    profile
        .processes
        .iter()
        .flat_map(|p| p.stacks.iter())
        .map(|s| (s.names(), s.outcome.is_complete(), s.count))
        .collect()
}

/// Samples whose stack is complete and runs `_start … main → chain` (chain outermost
/// first, ending at the leaf), and all samples, with a few bad ones for the message.
pub fn complete_through(stacks: &[(Vec<String>, bool, u64)], chain: &[&str]) -> (u64, u64, String) {
    let mut good = 0;
    let mut total = 0;
    let mut bad: Vec<(u64, bool, String)> = Vec::new();
    for (names, complete, count) in stacks {
        total += count;
        let user: Vec<&str> = names
            .iter()
            .map(String::as_str)
            .filter(|n| !n.ends_with("_[k]"))
            .collect();
        let through =
            user.first() == Some(&"_start") && user.windows(chain.len()).any(|w| w == chain);
        if *complete && through {
            good += count;
        } else {
            bad.push((*count, *complete, names.join(";")));
        }
    }
    // The hottest of the others, and how many samples they are in all.
    bad.sort_by_key(|b| std::cmp::Reverse(b.0));
    let (complete_other, incomplete): (u64, u64) =
        bad.iter().fold(
            (0, 0),
            |(c, i), b| {
                if b.1 { (c + b.0, i) } else { (c, i + b.0) }
            },
        );
    let mut message = format!(
        "{complete_other} samples complete but not through {chain:?}, {incomplete} incomplete; the hottest:"
    );
    for (count, complete, names) in bad.iter().take(8) {
        message.push_str(&format!("\n{count}x complete={complete}: {names}"));
    }
    (good, total, message)
}

/// Asserts a workload's samples, `(good, total, bad)` as `complete_through` gives them:
/// at least the floor its `cpu` seconds give at `frequency`, and at least `share` of
/// them complete; `what` names the case.
pub fn assert_complete(
    what: &str,
    (good, total, bad): (u64, u64, &str),
    cpu: f64,
    frequency: u64,
    share: f64,
) {
    let floor = samples_floor(cpu, frequency);
    assert!(
        total >= floor,
        "{what}: too few samples: {total} in {cpu:.2} s of CPU (want {floor})"
    );
    assert!(
        good as f64 >= share * total as f64,
        "{what}: {good} of {total} complete (want {:.0} %):\n{bad}",
        100.0 * share
    );
}

/// Asserts that `pid` has at least `min_total` samples in `snap` and that at least 95 %
/// of them are complete stacks through `chain` (outermost first); `what` names the case.
pub fn assert_complete_through(
    profiler: &Profiler,
    snap: &Snapshot,
    pid: u32,
    chain: &[&str],
    min_total: u64,
    what: &str,
) {
    let stacks = stacks_of(profiler, snap, &profiler.targets(), &[pid].into());
    let (good, total, bad) = complete_through(&stacks, chain);
    eprintln!("{what}: pid {pid}: {good} of {total} complete through {chain:?}");
    assert!(
        total >= min_total,
        "{what}: too few samples of pid {pid}: {total}"
    );
    assert!(
        good as f64 >= 0.95 * total as f64,
        "{what}: pid {pid}: {good} of {total} complete through {chain:?}:\n{bad}"
    );
}
