//! Hostile processes under the real profiler (issue 9): signal handlers on an alternate
//! stack, a corrupted return address, coroutine stacks, longjmp, and code mapped and
//! unmapped in a loop. The profiler must keep running, every sample must end with a
//! recorded outcome, and no frame may be attributed past a detected inconsistency.
//! Needs root or CAP_BPF+CAP_PERFMON.

mod support;

use std::{
    collections::HashMap,
    io::{BufRead as _, BufReader},
    process::{Command, Stdio},
    thread,
    time::{Duration, Instant},
};

use sframe_common::{WalkOutcome, stack::FRAME_EXACT};
use sframe_user::{
    procfs,
    profiler::{Profiler, symbolization_addresses},
    symbolize::Symbolizer,
};
use support::{KillOnDrop, bpf_or_skip, compile_c};

const FREQUENCY: u64 = 999;
/// CPU time of the target each profile covers (its CPU, not a wall-clock window: on a
/// busy machine the target gets what it gets — under `cargo xtask stress` a 1.5 s
/// window gave it 0.13 s and the sample floor failed).
const PROFILE_CPU: f64 = 0.5;
const FLAGS: &[&str] = &["-O2", "-fomit-frame-pointer"];

/// Common C prelude: `NOIPA` keeps gcc from inlining, cloning or splitting a function;
/// `stop` is never set, so spin loops are not provably infinite (no noreturn inference).
const PRELUDE: &str = "#define _GNU_SOURCE\n#include <stdio.h>\n#include <stdlib.h>\n\
    #include <signal.h>\n#include <unistd.h>\n#include <setjmp.h>\n#include <ucontext.h>\n\
    #include <string.h>\n#include <sys/mman.h>\n#include <sys/time.h>\n\
    #define NOIPA __attribute__((noipa))\n\
    volatile unsigned long sink;\nvolatile int stop;\n";

/// One distinct stack of the target: raw frames (innermost first), names (outermost
/// first), its sample count and how its walk ended.
struct Sample {
    raw: Vec<u64>,
    names: Vec<String>,
    /// The object of each of `names` (file name, or `[anon]`, `[vdso]`, ...).
    objects: Vec<String>,
    count: u64,
    outcome: WalkOutcome,
}

impl Sample {
    fn describe(&self) -> String {
        format!(
            "{:?} x{}: {}",
            self.outcome,
            self.count,
            self.names.join(";")
        )
    }
}

/// Profiles `pid` for `PROFILE_CPU` of its CPU time, re-reading its maps every 250 ms
/// when `refresh`
/// (as the CLI does every second), and returns its symbolized stacks. Asserts every
/// sample has a known outcome and the profiler counted at least as many outcomes.
fn profile(pid: u32, refresh: bool) -> Vec<Sample> {
    let mut profiler = Profiler::start(FREQUENCY).expect("load and attach the profile program");
    let report = profiler.add_target(pid).expect("load the target's tables");
    assert!(
        report.with_table >= 2,
        "executable and libc have tables: {report:?}"
    );
    let start = support::hostile::cpu_seconds(pid);
    let deadline = Instant::now() + Duration::from_secs(300);
    while support::hostile::cpu_seconds(pid) - start < PROFILE_CPU {
        thread::sleep(Duration::from_millis(250));
        if refresh {
            profiler.refresh(pid).expect("re-read the target's maps");
        }
        assert!(
            Instant::now() < deadline,
            "pid {pid} did not get {PROFILE_CPU} s of CPU in 300 s"
        );
    }
    let cpu = support::hostile::cpu_seconds(pid) - start;
    let maps = procfs::read_maps(pid).expect("maps");
    let snap = profiler.collect();
    let mut sym = Symbolizer::new();
    let mut out = Vec::new();
    for c in snap.counts.iter().filter(|c| c.key.pid == pid) {
        let raw = profiler.stack(c.key.user_stack).unwrap_or(&[]).to_vec();
        let frames = sym.symbolize_user(pid, &maps, &symbolization_addresses(&raw));
        let names = frames.iter().rev().map(|f| f.folded_name()).collect();
        let objects = frames.iter().rev().map(|f| f.object.clone()).collect();
        let outcome = WalkOutcome::try_from(c.key.outcome)
            .unwrap_or_else(|v| panic!("sample with an unknown outcome {v}"));
        out.push(Sample {
            raw,
            names,
            objects,
            count: c.count,
            outcome,
        });
    }
    let total: u64 = out.iter().map(|s| s.count).sum();
    let counted: u64 = snap.outcomes.iter().sum();
    eprintln!("pid {pid}: {total} samples, outcomes {:?}", snap.outcomes);
    // Half of what the kernel delivers for its CPU time: at FREQUENCY (999 Hz) the
    // 6.18.44 kernel of this machine kind's image fc-v1252 (CONFIG_HZ=250) delivered
    // 248-251 samples per 0.5 s of CPU (about half the requested rate; the image
    // before gave more), so the floor is a quarter of the requested rate.
    let floor = (cpu * FREQUENCY as f64 * 0.25) as u64;
    assert!(
        total >= floor,
        "too few samples: {total} in {cpu:.2} s of CPU"
    );
    assert!(
        counted >= total,
        "every sample counts an outcome: {counted} < {total}"
    );
    out
}

/// Samples per outcome, for messages.
fn outcome_totals(samples: &[Sample]) -> HashMap<WalkOutcome, u64> {
    let mut m = HashMap::new();
    for s in samples {
        *m.entry(s.outcome).or_default() += s.count;
    }
    m
}

/// Does `names` (outermost first) start at `_start` through libc's start code?
fn from_start(names: &[String]) -> bool {
    names.first().map(String::as_str) == Some("_start")
        && names.iter().any(|n| n.contains("libc_start"))
}

fn strings(names: &[&str]) -> Vec<String> {
    names.iter().map(|s| s.to_string()).collect()
}

/// Spawns `exe` with a piped stdout and returns it with its first output line.
fn spawn_reporting(exe: &std::path::Path) -> (KillOnDrop, String) {
    let mut child = KillOnDrop::spawn(Command::new(exe).stdout(Stdio::piped()));
    let stdout = child.0.stdout.take().expect("piped stdout");
    let mut line = String::new();
    BufReader::new(stdout)
        .read_line(&mut line)
        .expect("read the fixture's first line");
    (child, line.trim().to_string())
}

/// Runs a fixture whose handler for `signal` runs on a malloc'ed alternate stack and
/// spins for good; `f1` (called by main -> f0) runs `trigger`, after main ran `setup`.
/// Samples must walk hspin -> handler -> __restore_rt -> the interrupted frame(s), which
/// are f1 itself, or only libc frames called by f1, -> f0 -> main -> ... -> _start.
/// The fixture prints the kernel's sa_restorer: glibc's __restore_rt is a local symbol
/// that a stripped libc does not name.
fn signal_on_sigaltstack(name: &str, signal: &str, setup: &str, trigger: &str) {
    let source = format!(
        "{PRELUDE}\
         NOIPA void hspin(void) {{ while (!stop) sink++; }}\n\
         NOIPA void handler(int sig) {{ hspin(); sink += sig; }}\n\
         NOIPA void f1(void) {{ {trigger} sink += 1; }}\n\
         NOIPA void f0(void) {{ f1(); sink += 2; }}\n\
         int main(void) {{\n\
           stack_t ss = {{ .ss_sp = malloc(1 << 16), .ss_size = 1 << 16 }};\n\
           if (sigaltstack(&ss, 0)) return 1;\n\
           struct sigaction sa; memset(&sa, 0, sizeof sa);\n\
           sa.sa_handler = handler; sa.sa_flags = SA_ONSTACK;\n\
           if (sigaction({signal}, &sa, 0)) return 2;\n\
           struct sigaction old; if (sigaction({signal}, 0, &old)) return 3;\n\
           printf(\"%lx\\n\", (unsigned long)old.sa_restorer); fflush(stdout);\n\
           {setup}\n\
           f0(); return (int)sink;\n\
         }}\n"
    );
    let exe = compile_c(name, &source, FLAGS);
    let (child, line) = spawn_reporting(&exe);
    let restorer = u64::from_str_radix(&line, 16).expect("sa_restorer in hex");
    thread::sleep(Duration::from_millis(200));
    let samples = profile(child.pid(), false);

    let chain = strings(&["main", "f0", "f1"]);
    let (mut good, mut total) = (0, 0);
    let mut bad = Vec::new();
    for s in &samples {
        total += s.count;
        let n = s.names.len();
        // Outermost first: ..., main, f0, f1, [libc frames], __restore_rt, handler, hspin.
        // Raw frames innermost first: hspin, handler, __restore_rt, the interrupted PC.
        let ok = s.outcome == WalkOutcome::Complete
            && n >= 6
            && s.raw.len() == n
            && s.raw[2] == restorer
            // The interrupted frame's PC is exact (not looked up at RA − 1).
            && s.raw[3] & FRAME_EXACT != 0
            && s.names[n - 2..] == strings(&["handler", "hspin"])
            && s.names[..n - 3]
                .iter()
                .rposition(|f| f == "f1")
                .is_some_and(|i| {
                    s.names[..=i].ends_with(&chain)
                        && s.objects[i + 1..n - 3]
                            .iter()
                            .all(|o| o.contains("libc.so"))
                })
            && from_start(&s.names);
        if ok {
            good += s.count;
        } else {
            bad.push(s.describe());
        }
    }
    eprintln!(
        "{name}: outcomes {:?}; stacks: {:#?}",
        outcome_totals(&samples),
        samples.iter().map(Sample::describe).collect::<Vec<_>>()
    );
    assert!(
        good * 100 >= total * 99,
        "{good} of {total} samples walk handler -> __restore_rt ({restorer:#x}) -> f1 -> \
         ... -> _start; others: {bad:#?}"
    );
}

#[test]
fn walks_a_timer_signal_handler_on_sigaltstack_to_the_interrupted_function() {
    if !bpf_or_skip("walks_a_timer_signal_handler_on_sigaltstack_to_the_interrupted_function") {
        return;
    }
    // f1 spins until a one-shot timer fires: the interrupted PC is in f1 itself.
    signal_on_sigaltstack(
        "sigaltstack_timer",
        "SIGALRM",
        "struct itimerval it = { .it_value = { 0, 50000 } }; setitimer(ITIMER_REAL, &it, 0);",
        "while (!stop) sink++;",
    );
}

#[test]
fn walks_a_raised_signal_handler_on_sigaltstack_through_libc() {
    if !bpf_or_skip("walks_a_raised_signal_handler_on_sigaltstack_through_libc") {
        return;
    }
    // f1 raises the signal: the interrupted PC is in libc's raise (after tgkill).
    signal_on_sigaltstack("sigaltstack_raise", "SIGUSR1", "", "raise(SIGUSR1);");
}

#[test]
fn stops_at_a_corrupted_return_address() {
    if !bpf_or_skip("stops_at_a_corrupted_return_address") {
        return;
    }
    // f2 overwrites its own saved return address (the slot above its frame pointer;
    // `__builtin_frame_address` forces one in f2 only) with garbage, then spins.
    let source = format!(
        "{PRELUDE}\
         NOIPA void f2(void) {{\n\
           void **slot = (void **)__builtin_frame_address(0) + 1;\n\
           *(void *volatile *)slot = (void *)0x4141414141414141ul;\n\
           while (!stop) sink++;\n\
         }}\n\
         NOIPA void f1(void) {{ f2(); sink += 1; }}\n\
         NOIPA void f0(void) {{ f1(); sink += 2; }}\n\
         int main(void) {{ f0(); return (int)sink; }}\n"
    );
    let exe = compile_c("corrupt_ra", &source, FLAGS);
    let child = KillOnDrop::spawn(&mut Command::new(&exe));
    thread::sleep(Duration::from_millis(200));
    let samples = profile(child.pid(), false);

    let (mut in_f2, mut total) = (0, 0);
    for s in &samples {
        total += s.count;
        if s.names.last().map(String::as_str) != Some("f2") {
            continue;
        }
        in_f2 += s.count;
        // The walk must stop at the garbage address: it is the last frame, and nothing
        // after it (f1, f0, main, _start) is named.
        assert!(
            !s.outcome.is_complete() && s.outcome != WalkOutcome::Truncated,
            "a walk through a corrupt return address ended as {:?}: {}",
            s.outcome,
            s.describe()
        );
        assert!(
            s.raw.len() <= 2,
            "frames after the corrupt return address: {} (raw {:x?})",
            s.describe(),
            s.raw
        );
        if let Some(&ra) = s.raw.get(1) {
            assert_eq!(ra, 0x4141414141414141, "{}", s.describe());
        }
    }
    eprintln!("outcomes: {:?}", outcome_totals(&samples));
    assert!(
        in_f2 * 100 >= total * 99,
        "{in_f2} of {total} samples in f2"
    );
}

#[test]
fn walks_a_makecontext_coroutine_stack() {
    if !bpf_or_skip("walks_a_makecontext_coroutine_stack") {
        return;
    }
    let source = format!(
        "{PRELUDE}\
         static ucontext_t main_ctx, co_ctx;\n\
         NOIPA void gspin(void) {{ while (!stop) sink++; }}\n\
         NOIPA void g1(void) {{ gspin(); sink += 1; }}\n\
         NOIPA void g0(void) {{ g1(); sink += 2; }}\n\
         NOIPA void co_main(void) {{ g0(); sink += 3; }}\n\
         NOIPA void f0(void) {{\n\
           size_t size = 1 << 16; char *stack = malloc(size);\n\
           if (getcontext(&co_ctx)) exit(1);\n\
           co_ctx.uc_stack.ss_sp = stack; co_ctx.uc_stack.ss_size = size;\n\
           co_ctx.uc_link = &main_ctx;\n\
           makecontext(&co_ctx, co_main, 0);\n\
           swapcontext(&main_ctx, &co_ctx); sink += 4;\n\
         }}\n\
         int main(void) {{ f0(); return (int)sink; }}\n"
    );
    let exe = compile_c("coroutine", &source, FLAGS);
    let child = KillOnDrop::spawn(&mut Command::new(&exe));
    thread::sleep(Duration::from_millis(200));
    let samples = profile(child.pid(), false);

    let chain = strings(&["co_main", "g0", "g1", "gspin"]);
    let (mut good, mut total) = (0, 0);
    let mut bad = Vec::new();
    for s in &samples {
        total += s.count;
        // The coroutine's chain, and before it nothing from the main stack: at most
        // glibc's __start_context (the walk must not invent a caller).
        let before = s.names.len().saturating_sub(chain.len());
        let ok = s.names.ends_with(&chain)
            && s.outcome != WalkOutcome::Truncated
            && s.names[..before]
                .iter()
                .all(|n| !["main", "f0", "_start"].contains(&n.as_str()))
            && (s.outcome != WalkOutcome::Complete || before <= 1);
        if ok {
            good += s.count;
        } else {
            bad.push(s.describe());
        }
    }
    eprintln!(
        "outcomes: {:?}; stacks: {:#?}",
        outcome_totals(&samples),
        samples.iter().map(Sample::describe).collect::<Vec<_>>()
    );
    assert!(
        good * 100 >= total * 99,
        "{good} of {total} samples have the coroutine chain {chain:?}; others: {bad:#?}"
    );
}

#[test]
fn keeps_stacks_correct_across_repeated_longjmp() {
    if !bpf_or_skip("keeps_stacks_correct_across_repeated_longjmp") {
        return;
    }
    // f0 setjmps in a loop; f2 spins a while then longjmps back over f1.
    let source = format!(
        "{PRELUDE}\
         static jmp_buf jb;\n\
         NOIPA void f2(void) {{ for (volatile long i = 0; i < 200000; i++) sink++; longjmp(jb, 1); }}\n\
         NOIPA void f1(void) {{ f2(); sink += 1; }}\n\
         NOIPA void f0(void) {{ for (;;) {{ if (setjmp(jb) == 0) f1(); sink += 2; if (stop) break; }} }}\n\
         int main(void) {{ f0(); return (int)sink; }}\n"
    );
    let exe = compile_c("longjmp_loop", &source, FLAGS);
    let child = KillOnDrop::spawn(&mut Command::new(&exe));
    thread::sleep(Duration::from_millis(200));
    let samples = profile(child.pid(), false);

    let chain = strings(&["main", "f0", "f1", "f2"]);
    let (mut good, mut total) = (0, 0);
    let mut bad = Vec::new();
    for s in &samples {
        total += s.count;
        if s.outcome == WalkOutcome::Complete && s.names.ends_with(&chain) && from_start(&s.names) {
            good += s.count;
        } else {
            bad.push(s.describe());
        }
    }
    eprintln!("outcomes: {:?}; others: {bad:#?}", outcome_totals(&samples));
    assert!(
        good * 100 >= total * 95,
        "{good} of {total} samples have the chain {chain:?}; others: {bad:#?}"
    );
}

/// Where the fixture of `survives_code_mapped_and_unmapped_in_a_loop` maps its code.
const ANON_CODE: u64 = 0x2000_0000_0000;

#[test]
fn survives_code_mapped_and_unmapped_in_a_loop() {
    if !bpf_or_skip("survives_code_mapped_and_unmapped_in_a_loop") {
        return;
    }
    // f1 copies a frame-pointer function (push rbp; mov rbp, rsp; a 16M-iteration
    // loop; pop rbp; ret) into a fresh anonymous executable page, calls it, and unmaps
    // it, forever. The page has no table: the frame-pointer step must recover f1.
    let source = format!(
        "{PRELUDE}\
         static const unsigned char code[] = {{ 0x55, 0x48, 0x89, 0xe5, 0xb9, 0, 0, 0, 1,\n\
           0xff, 0xc9, 0x75, 0xfc, 0x5d, 0xc3 }};\n\
         NOIPA void f1(void) {{\n\
           void *p = mmap((void *){ANON_CODE:#x}ul, 4096, PROT_READ | PROT_WRITE | PROT_EXEC,\n\
                          MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED_NOREPLACE, -1, 0);\n\
           if (p == MAP_FAILED) exit(1);\n\
           memcpy(p, code, sizeof code);\n\
           ((void (*)(void))p)();\n\
           munmap(p, 4096); sink += 1;\n\
         }}\n\
         NOIPA void f0(void) {{ while (!stop) f1(); sink += 2; }}\n\
         int main(void) {{ f0(); return (int)sink; }}\n"
    );
    let exe = compile_c(
        "anon_code",
        &source,
        &[
            "-O2",
            "-fno-omit-frame-pointer",
            "-mno-omit-leaf-frame-pointer",
        ],
    );
    let child = KillOnDrop::spawn(&mut Command::new(&exe));
    thread::sleep(Duration::from_millis(200));
    let samples = profile(child.pid(), true);

    let in_anon = |pc: u64| (ANON_CODE..ANON_CODE + 4096).contains(&pc);
    let chain = strings(&["main", "f0", "f1"]);
    let (mut anon, mut good, mut total) = (0, 0, 0);
    let mut bad = Vec::new();
    for s in &samples {
        total += s.count;
        if !s.raw.first().is_some_and(|&pc| in_anon(pc)) {
            continue;
        }
        anon += s.count;
        let n = s.names.len();
        if s.outcome == WalkOutcome::Complete
            && n >= 2
            && s.names[..n - 1].ends_with(&chain)
            && from_start(&s.names)
        {
            good += s.count;
        } else {
            bad.push(s.describe());
        }
    }
    eprintln!(
        "outcomes: {:?}; {anon} of {total} samples in the anonymous code; others: {bad:#?}",
        outcome_totals(&samples)
    );
    assert!(
        anon * 2 >= total,
        "most time is spent in the anonymous code: {anon} of {total}"
    );
    assert!(
        good * 100 >= anon * 90,
        "{good} of {anon} samples in anonymous code have the chain {chain:?}; others: {bad:#?}"
    );
}
