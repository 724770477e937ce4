//! End-to-end: the kernel walker unwinds real processes built without frame pointers,
//! through libc (from its .eh_frame) to _start. Needs root or CAP_BPF+CAP_PERFMON.

mod support;

use std::{collections::HashMap, process::Command, thread, time::Duration};

use sframe_common::WalkOutcome;
use sframe_user::{
    procfs,
    profiler::{Profiler, ProfilerConfig, SampleProgram, symbolization_addresses},
    symbolize::Symbolizer,
};
use support::{KillOnDrop, bpf_or_skip, compile_c};

/// A chain main -> f0 -> ... -> f{N-1} -> leaf spinning; every function non-inlined and
/// doing work after its call so that it is not a tail call.
fn chain_source(n: usize) -> String {
    let mut s = String::from(
        "#include <stdio.h>\n#include <stdlib.h>\nvolatile unsigned long sink;\n\
         __attribute__((noinline)) void leaf(void) { for (;;) sink++; }\n",
    );
    for i in (0..n).rev() {
        let next = if i + 1 == n {
            "leaf".to_string()
        } else {
            format!("f{}", i + 1)
        };
        s.push_str(&format!(
            "__attribute__((noinline)) void f{i}(void) {{ {next}(); sink += {i}; }}\n"
        ));
    }
    s.push_str("int main(void) { f0(); return (int)sink; }\n");
    s
}

/// Profiles `pid` for `cpu` seconds of its CPU time (not wall-clock time: on a busy
/// machine it gets what it gets) at 499 Hz; returns symbolized stacks (outermost first)
/// with their counts, and the outcome totals.
type Stacks = Vec<(Vec<String>, u64, WalkOutcome)>;

fn profile(pid: u32, cpu: f64) -> (Stacks, [u64; WalkOutcome::COUNT]) {
    profile_with(pid, cpu, SampleProgram::Profile)
}

/// `profile` with the perf-event program given.
fn profile_with(pid: u32, cpu: f64, program: SampleProgram) -> (Stacks, [u64; WalkOutcome::COUNT]) {
    let mut profiler = Profiler::start_with(ProfilerConfig {
        program,
        ..ProfilerConfig::explicit(499)
    })
    .expect("load and attach the profile program");
    // The program asked for is the one that runs (a walker swapped for another would
    // pass every assertion below).
    // (Named from the contract, not from `SampleProgram::name`, which could be wrong.)
    use sframe_common::names::programs;
    let sampling = [
        programs::PROFILE,
        programs::PROFILE_BOUNDED,
        programs::PROFILE_NO_THREAD_NAMES,
    ];
    let expected = match program {
        SampleProgram::Profile if sframe_user::bpf::has_bpf_loop() => programs::PROFILE,
        SampleProgram::Profile | SampleProgram::Bounded => programs::PROFILE_BOUNDED,
        SampleProgram::WithoutThreadNames => programs::PROFILE_NO_THREAD_NAMES,
    };
    let loaded: Vec<String> = profiler
        .verifier_stats()
        .into_iter()
        .map(|(name, _)| name)
        .filter(|name| sampling.contains(&name.as_str()))
        .collect();
    assert_eq!(loaded, [expected], "the loaded perf-event programs");
    let report = profiler.add_target(pid).expect("load the target's tables");
    assert!(
        report.with_table >= 2,
        "executable and libc have tables: {report:?}"
    );
    support::hostile::wait_cpu(pid, cpu, || {});
    let maps = procfs::read_maps(pid).expect("maps");
    let snap = profiler.collect();
    let mut sym = Symbolizer::new();
    let mut out = Vec::new();
    for c in &snap.counts {
        let frames = symbolization_addresses(profiler.stack(c.key.user_stack).unwrap_or(&[]));
        let names: Vec<String> = sym
            .symbolize_user(pid, &maps, &frames)
            .iter()
            .rev()
            .map(|f| {
                if f.name.is_none() {
                    eprintln!("unsymbolized: {f:?}");
                }
                f.folded_name()
            })
            .collect();
        let outcome = WalkOutcome::try_from(c.key.outcome).expect("known outcome");
        out.push((names, c.count, outcome));
    }
    (out, snap.outcomes)
}

/// Asserts ≥ 99% of samples have exactly `expected` (outermost first) after the libc
/// start frames, completed to `_start`.
fn assert_chain(stacks: &[(Vec<String>, u64, WalkOutcome)], expected: &[String]) {
    let total: u64 = stacks.iter().map(|s| s.1).sum();
    assert!(total >= 200, "too few samples: {total}");
    let mut good = 0;
    let mut bad: HashMap<String, u64> = HashMap::new();
    for (names, count, outcome) in stacks {
        let ok = *outcome == WalkOutcome::Complete
            && names.first().map(String::as_str) == Some("_start")
            && names.ends_with(expected)
            && names.iter().any(|n| n.contains("libc_start"));
        if ok {
            good += count;
        } else {
            *bad.entry(format!("{outcome:?}: {}", names.join(";")))
                .or_default() += count;
        }
    }
    assert!(
        good * 100 >= total * 99,
        "only {good} of {total} samples have the expected stack {expected:?}; others: {bad:#?}"
    );
}

fn run_chain(flags: &[&str], name: &str) {
    run_chain_of(24, flags, name, SampleProgram::Profile);
}

/// A chain of `n` functions (`n` + 6 frames with the leaf and libc's start), profiled
/// with `program`.
fn run_chain_of(n: usize, flags: &[&str], name: &str, program: SampleProgram) {
    let exe = compile_c(name, &chain_source(n), flags);
    let child = KillOnDrop::spawn(&mut Command::new(&exe));
    thread::sleep(Duration::from_millis(200));
    let (stacks, outcomes) = profile_with(child.pid(), 1.0, program);
    eprintln!("outcomes: {outcomes:?}");
    let mut expected = vec!["main".to_string()];
    expected.extend((0..n).map(|i| format!("f{i}")));
    expected.push("leaf".into());
    assert_chain(&stacks, &expected);
}

#[test]
fn unwinds_a_deep_chain_without_frame_pointers_from_sframe() {
    if !bpf_or_skip("unwinds_a_deep_chain_without_frame_pointers_from_sframe") {
        return;
    }
    run_chain(
        &["-O2", "-fomit-frame-pointer", "-Wa,--gsframe"],
        "chain_sframe",
    );
}

#[test]
fn unwinds_a_deep_chain_without_frame_pointers_from_eh_frame() {
    if !bpf_or_skip("unwinds_a_deep_chain_without_frame_pointers_from_eh_frame") {
        return;
    }
    run_chain(&["-O2", "-fomit-frame-pointer"], "chain_ehframe");
}

/// The walker for kernels without `bpf_loop` (`profile_bounded`: a bounded loop of
/// global-function calls) walks what `profile` walks, to the frame bound: 254 of the
/// 256 frames a stack holds, from the SFrame and `.eh_frame` tables alike. (On this
/// kernel both load; the VM guests run it where it is the only one.)
#[test]
fn the_walker_without_bpf_loop_walks_chains_to_the_frame_bound() {
    if !bpf_or_skip("the_walker_without_bpf_loop_walks_chains_to_the_frame_bound") {
        return;
    }
    let n = sframe_common::budget::MAX_FRAMES - 8;
    run_chain_of(
        n,
        &["-O2", "-fomit-frame-pointer", "-Wa,--gsframe"],
        "chain_bounded_sframe",
        SampleProgram::Bounded,
    );
    run_chain_of(
        n,
        &["-O2", "-fomit-frame-pointer"],
        "chain_bounded_ehframe",
        SampleProgram::Bounded,
    );
}

/// Past the bound, the walker without `bpf_loop` stops as `profile` does: every sample
/// of a chain deeper than the stack holds is `truncated`, with the stack full.
#[test]
fn the_walker_without_bpf_loop_truncates_deeper_chains_as_profile_does() {
    if !bpf_or_skip("the_walker_without_bpf_loop_truncates_deeper_chains_as_profile_does") {
        return;
    }
    let max = sframe_common::budget::MAX_FRAMES;
    let exe = compile_c(
        "chain_bounded_deep",
        &chain_source(max + 20),
        &["-O2", "-fomit-frame-pointer"],
    );
    let child = KillOnDrop::spawn(&mut Command::new(&exe));
    thread::sleep(Duration::from_millis(200));
    for program in [SampleProgram::Profile, SampleProgram::Bounded] {
        let (stacks, outcomes) = profile_with(child.pid(), 0.5, program);
        let total: u64 = stacks.iter().map(|s| s.1).sum();
        let full: u64 = stacks
            .iter()
            .filter(|(names, _, outcome)| {
                *outcome == WalkOutcome::Truncated
                    && names.len() == max
                    && names.last().map(String::as_str) == Some("leaf")
            })
            .map(|s| s.1)
            .sum();
        eprintln!(
            "{}: {full} of {total} full and truncated; {outcomes:?}",
            program.name()
        );
        assert!(total >= 100, "{}: too few samples: {total}", program.name());
        assert!(
            full * 100 >= total * 99,
            "{}: only {full} of {total} samples truncated at {max} frames",
            program.name()
        );
    }
}

#[test]
fn follows_child_processes_created_after_start() {
    if !bpf_or_skip("follows_child_processes_created_after_start") {
        return;
    }
    // The parent waits (reading its stdin) until the profiler is attached, then forks a
    // child that runs the chain; only the parent's pid is given to the profiler.
    let source = chain_source(4).replace(
        "int main(void) { f0(); return (int)sink; }",
        "#include <unistd.h>\n#include <sys/wait.h>\n\
         int main(void) { char c; if (read(0, &c, 1) != 1) return 1; pid_t p = fork(); \
         if (p == 0) { f0(); } waitpid(p, 0, 0); return 0; }",
    );
    let exe = compile_c("forker", &source, &["-O2", "-fomit-frame-pointer"]);
    let mut parent = KillOnDrop::spawn(Command::new(&exe).stdin(std::process::Stdio::piped()));
    let mut profiler = Profiler::start(499).expect("load and attach");
    profiler.add_target(parent.pid()).expect("parent tables");
    {
        use std::io::Write as _;
        let mut stdin = parent.0.stdin.take().expect("piped stdin");
        stdin.write_all(b"x").expect("release the parent");
    }
    let mut child = None;
    let started = std::time::Instant::now();
    while started.elapsed() < Duration::from_secs(120) {
        thread::sleep(Duration::from_millis(100));
        if let Some(&pid) = profiler.adopt_children().first() {
            child = Some(pid);
            break;
        }
    }
    let child = child.expect("the forked child was adopted as a target");
    let _kill_child = ChildKiller(child);
    // Half a second of the child's CPU (about 250 samples at 499 Hz).
    support::hostile::wait_cpu(child, 0.5, || {});
    let maps = procfs::read_maps(child).expect("child maps");
    let snap = profiler.collect();
    let mut sym = Symbolizer::new();
    let mut complete = 0;
    let mut total = 0;
    for c in snap.counts.iter().filter(|c| c.key.pid == child) {
        total += c.count;
        let frames = symbolization_addresses(profiler.stack(c.key.user_stack).unwrap_or(&[]));
        let names: Vec<String> = sym
            .symbolize_user(child, &maps, &frames)
            .iter()
            .rev()
            .map(|f| f.folded_name())
            .collect();
        if c.key.outcome == WalkOutcome::Complete as u32
            && names.ends_with(&["main", "f0", "f1", "f2", "f3", "leaf"].map(String::from))
        {
            complete += c.count;
        }
    }
    assert!(total >= 100, "only {total} samples of the child");
    assert!(
        complete * 100 >= total * 99,
        "{complete} of {total} complete"
    );
}

/// Kills a pid on drop (the forked grandchild is not our child).
struct ChildKiller(u32);

impl Drop for ChildKiller {
    fn drop(&mut self) {
        // SAFETY: kill(2) on a pid we observed; at worst ESRCH.
        unsafe { libc::kill(self.0 as i32, libc::SIGKILL) };
    }
}

#[test]
fn reloads_tables_when_a_target_execs() {
    if !bpf_or_skip("reloads_tables_when_a_target_execs") {
        return;
    }
    let after = compile_c(
        "after_exec",
        &chain_source(3),
        &["-O2", "-fomit-frame-pointer"],
    );
    let before = compile_c(
        "before_exec",
        &format!(
            "#include <unistd.h>\nint main(void) {{ char c; if (read(0, &c, 1) != 1) return 1; \
             execl(\"{}\", \"after_exec\", (char *)0); return 2; }}\n",
            after.display()
        ),
        &["-O2"],
    );
    let mut target = KillOnDrop::spawn(Command::new(&before).stdin(std::process::Stdio::piped()));
    let pid = target.pid();
    let mut profiler = Profiler::start(499).expect("load and attach");
    profiler.add_target(pid).expect("tables");
    {
        use std::io::Write as _;
        let mut stdin = target.0.stdin.take().expect("piped stdin");
        stdin.write_all(b"x").expect("release the target");
    }
    // 1.5 s of its CPU after the exec (about 750 samples at 499 Hz; not a wall-clock
    // window: under `cargo xtask stress` 2 s gave it 297 samples).
    support::hostile::wait_cpu(pid, 1.5, || {
        profiler.adopt_children();
    });
    let maps = procfs::read_maps(pid).expect("maps after exec");
    let snap = profiler.collect();
    let mut sym = Symbolizer::new();
    let (mut total, mut complete) = (0, 0);
    for c in snap.counts.iter().filter(|c| c.key.pid == pid) {
        total += c.count;
        let frames = symbolization_addresses(profiler.stack(c.key.user_stack).unwrap_or(&[]));
        let names: Vec<String> = sym
            .symbolize_user(pid, &maps, &frames)
            .iter()
            .rev()
            .map(|f| f.folded_name())
            .collect();
        if c.key.outcome == WalkOutcome::Complete as u32
            && names.ends_with(&["main", "f0", "f1", "f2", "leaf"].map(String::from))
        {
            complete += c.count;
        }
    }
    assert!(total >= 300, "only {total} samples");
    // Samples between the exec and the reload (at most ~100 ms) count as UnknownProcess.
    assert!(
        complete * 100 >= total * 90,
        "{complete} of {total} complete after exec"
    );
}

#[test]
fn unwinds_a_rust_program() {
    if !bpf_or_skip("unwinds_a_rust_program") {
        return;
    }
    // rustc's binaries put the text in the same file page as the read-only data: the load
    // bias must come from the executable segment.
    let dir = support::fixture_dir("rustchain");
    let src = dir.join("rustchain.rs");
    std::fs::write(
        &src,
        "#[inline(never)] fn leaf(n: u64) -> u64 { let mut s = n; while std::hint::black_box(s != 0 || n == 0) { s = std::hint::black_box(s.wrapping_mul(3) | 1); } s }\n\
         #[inline(never)] fn middle(n: u64) -> u64 { leaf(n) + 1 }\n\
         #[inline(never)] fn outer(n: u64) -> u64 { middle(n) + 2 }\n\
         fn main() { std::process::exit(outer(std::env::args().count() as u64) as i32); }\n",
    )
    .unwrap();
    let exe = dir.join("rustchain");
    let status = Command::new("rustc")
        .args(["-O", "-C", "force-frame-pointers=no", "-o"])
        .arg(&exe)
        .arg(&src)
        .status()
        .expect("run rustc");
    assert!(status.success(), "rustc failed");
    let child = KillOnDrop::spawn(&mut Command::new(&exe));
    thread::sleep(Duration::from_millis(200));
    let (stacks, outcomes) = profile(child.pid(), 1.0);
    eprintln!("outcomes: {outcomes:?}");
    let total: u64 = stacks.iter().map(|s| s.1).sum();
    let good: u64 = stacks
        .iter()
        .filter(|(names, _, outcome)| {
            *outcome == WalkOutcome::Complete
                && names.first().map(String::as_str) == Some("_start")
                && names.ends_with(
                    &["rustchain::outer", "rustchain::middle", "rustchain::leaf"].map(String::from),
                )
        })
        .map(|s| s.1)
        .sum();
    assert!(total >= 200, "too few samples: {total}");
    assert!(
        good * 100 >= total * 99,
        "{good} of {total} complete through rustchain::outer;middle;leaf: {:#?}",
        stacks.iter().take(5).collect::<Vec<_>>()
    );
}

#[test]
fn unwinds_through_the_vdso() {
    if !bpf_or_skip("unwinds_through_the_vdso") {
        return;
    }
    // The leaf calls clock_gettime in a loop: many samples are inside the vDSO, whose
    // rows come from its .eh_frame read out of the process's memory.
    let source = chain_source(3).replace(
        "__attribute__((noinline)) void leaf(void) { for (;;) sink++; }",
        "#include <time.h>\n__attribute__((noinline)) void leaf(void) { struct timespec ts; \
         for (;;) { clock_gettime(CLOCK_MONOTONIC, &ts); sink += ts.tv_nsec; } }",
    );
    let exe = compile_c("vdso_loop", &source, &["-O2", "-fomit-frame-pointer"]);
    let child = KillOnDrop::spawn(&mut Command::new(&exe));
    thread::sleep(Duration::from_millis(200));
    let maps = procfs::read_maps(child.pid()).expect("maps");
    let vdso = maps
        .iter()
        .find(|m| m.path == "[vdso]")
        .expect("the process has a vDSO")
        .clone();
    let mut profiler = Profiler::start(499).expect("load and attach");
    profiler.add_target(child.pid()).expect("tables");
    // A second of its CPU (about 500 samples at 499 Hz).
    support::hostile::wait_cpu(child.pid(), 1.0, || {});
    let snap = profiler.collect();
    let (mut total, mut in_vdso, mut in_vdso_complete) = (0, 0, 0);
    for c in &snap.counts {
        total += c.count;
        let frames = profiler.stack(c.key.user_stack).unwrap_or(&[]);
        if frames
            .first()
            .is_some_and(|&pc| vdso.start <= pc && pc < vdso.end)
        {
            in_vdso += c.count;
            // vdso frame(s), then leaf, f2, f1, f0, main, libc start frames, _start.
            if c.key.outcome == WalkOutcome::Complete as u32 && frames.len() >= 9 {
                in_vdso_complete += c.count;
            }
        }
    }
    assert!(total >= 200, "only {total} samples");
    assert!(
        in_vdso * 10 >= total,
        "only {in_vdso} of {total} samples in the vDSO"
    );
    assert!(
        in_vdso_complete * 100 >= in_vdso * 99,
        "{in_vdso_complete} of {in_vdso} vDSO samples unwound completely: {:?}",
        snap.outcomes
    );
}
