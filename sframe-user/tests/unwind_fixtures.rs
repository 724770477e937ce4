//! End-to-end fixture matrix of the kernel walker (issue 5): deep recursion (truncation),
//! alloca, a shared library called through its PLT, a libc callback (qsort), a second
//! thread, a syscall loop, and a plain deep chain. Each C fixture is built with
//! `-O2 -fomit-frame-pointer`, with `-Wa,--gsframe` (SFrame) and without (.eh_frame),
//! profiled for 2 s, and checked frame by frame; when `perf` is available the same run is
//! also recorded with `perf record --call-graph dwarf` and its dominant stack must be ours.
//! Needs root or CAP_BPF+CAP_PERFMON; under CI a missing `perf` is a failure.

mod support;

use std::{
    collections::HashMap,
    path::{Path, PathBuf},
    process::{Command, Stdio},
    sync::{OnceLock, mpsc},
    thread,
    time::Duration,
};

use sframe_common::{WalkOutcome, budget::MAX_FRAMES, stack::CountKey};
use sframe_user::{
    objects::ProcessReport,
    perfscript::{CmpFrame, PerfRecord, PerfStack, cmp_key},
    privileges::in_ci,
    procfs::{self, Mapping},
    profiler::{Profiler, symbolization_addresses},
    symbolize::Symbolizer,
};
use support::{
    KillOnDrop, bpf_or_skip, compile_c_linked, compile_c_shared, fixture_dir, has_section,
    section_file_range,
};

const FREQUENCY: u64 = 999;
/// perf only has to find the dominant stack; its DWARF unwinding is the slow part.
const PERF_FREQUENCY: u64 = 199;
const PROFILE_SECS: u64 = 2;
/// Room for 300 recursive frames and libc's start code.
const PERF_STACK_BYTES: u32 = 16384;
/// Share of samples (percent) that must have exactly the expected stack.
const REQUIRED_PERCENT: u64 = 99;
const MIN_SAMPLES: u64 = 200;
const LIBC: &str = "libc.so.6";

/// Which unwind tables the fixture carries.
#[derive(Clone, Copy, Debug)]
enum Tables {
    /// `.sframe` from `-Wa,--gsframe` (and `.eh_frame`, which the loader must not need).
    Sframe,
    /// `.eh_frame` only.
    EhFrame,
}

impl Tables {
    fn flags(self) -> &'static [&'static str] {
        match self {
            Tables::Sframe => &["-O2", "-fomit-frame-pointer", "-Wa,--gsframe"],
            Tables::EhFrame => &["-O2", "-fomit-frame-pointer"],
        }
    }

    fn suffix(self) -> &'static str {
        match self {
            Tables::Sframe => "sframe",
            Tables::EhFrame => "ehframe",
        }
    }

    /// Checks that `object` was built as intended (else the test would not test it).
    fn check(self, object: &Path) {
        let has = has_section(object, ".sframe");
        match self {
            Tables::Sframe => assert!(has, "{} lacks .sframe", object.display()),
            Tables::EhFrame => assert!(!has, "{} has .sframe", object.display()),
        }
    }
}

// ---------------------------------------------------------------------------------------
// C fixtures

const PRELUDE: &str = "#include <stdlib.h>\n\
    #define NOIPA __attribute__((noipa))\n\
    volatile unsigned long sink;\n";

/// Functions `{prefix}0` .. `{prefix}{n-1}`, each calling the next and the last calling
/// `last` (a C expression statement); each does work after its call so that no call is a
/// tail call. `noipa` keeps gcc from inlining, cloning or splitting them.
fn chain_functions(prefix: &str, n: usize, last: &str) -> String {
    let mut s = String::new();
    for i in (0..n).rev() {
        let call = if i + 1 == n {
            last.to_string()
        } else {
            format!("{prefix}{}();", i + 1)
        };
        s.push_str(&format!(
            "NOIPA void {prefix}{i}(void) {{ {call} sink += {i}; }}\n"
        ));
    }
    s
}

fn chain_names(prefix: &str, n: usize) -> impl Iterator<Item = Pat> + '_ {
    (0..n).map(move |i| Pat::Fn(format!("{prefix}{i}")))
}

/// Compiles a single-file fixture; returns the executable.
fn build(name: &str, tables: Tables, source: &str) -> PathBuf {
    let name = format!("{name}_{}", tables.suffix());
    let dir = fixture_dir(&name);
    let exe = compile_c_linked(&dir, &name, source, tables.flags(), &[]);
    tables.check(&exe);
    exe
}

// ---------------------------------------------------------------------------------------
// Profiling and symbolization

#[derive(Clone, Debug, PartialEq, Eq)]
struct SymFrame {
    /// Function name, or `[object+0xOFFSET]`.
    name: String,
    /// Object basename.
    object: String,
    /// File offset of the symbolized address (the PC for the innermost frame, the return
    /// address − 1 for the others: what `perf script` prints).
    offset: u64,
    named: bool,
}

#[derive(Clone, Debug)]
struct Stack {
    /// Outermost first.
    frames: Vec<SymFrame>,
    count: u64,
    outcome: WalkOutcome,
    tid: u32,
    in_kernel: bool,
}

impl Stack {
    fn describe(&self) -> String {
        let names: Vec<&str> = self.frames.iter().map(|f| f.name.as_str()).collect();
        format!(
            "{:?} tid {} {}({} frames): {}",
            self.outcome,
            self.tid,
            if self.in_kernel { "in kernel " } else { "" },
            self.frames.len(),
            names.join(";")
        )
    }
}

struct Run {
    name: String,
    pid: u32,
    stacks: Vec<Stack>,
    /// By outcome, for this pid.
    outcomes: [u64; WalkOutcome::COUNT],
    /// `None` when perf is unavailable outside CI.
    perf: Option<Vec<PerfStack>>,
}

/// One profiler and one symbolizer for all tests, owned by a service thread (neither is
/// `Send`): starting a profiler (loading and verifying the program, creating the table
/// maps) takes seconds, and so does symbolizing libc from its debug file; per test, both
/// would blow the time budget. Tests are kept apart by pid.
enum Request {
    AddTarget {
        pid: u32,
        reply: mpsc::Sender<Result<ProcessReport, String>>,
    },
    /// Stops sampling `pid`; replies with its stacks symbolized with `maps`.
    Finish {
        pid: u32,
        maps: Vec<Mapping>,
        reply: mpsc::Sender<Result<Vec<Stack>, String>>,
    },
}

fn service() -> &'static mpsc::Sender<Request> {
    static SERVICE: OnceLock<mpsc::Sender<Request>> = OnceLock::new();
    SERVICE.get_or_init(|| {
        let (tx, rx) = mpsc::channel();
        thread::spawn(move || serve(rx));
        tx
    })
}

fn serve(rx: mpsc::Receiver<Request>) {
    let mut profiler = Profiler::start(FREQUENCY).map_err(|e| format!("start profiler: {e:?}"));
    let mut sym = Symbolizer::new();
    // Counts of earlier processes with the same pid (pid_max can be small), per pid.
    let mut baselines: HashMap<u32, HashMap<CountKey, u64>> = HashMap::new();
    for request in rx {
        match request {
            Request::AddTarget { pid, reply } => {
                let result = profiler.as_mut().map_err(|e| e.clone()).and_then(|p| {
                    let baseline = counts_of(p, pid).into_iter().map(|(k, n, _)| (k, n));
                    baselines.insert(pid, baseline.collect());
                    p.add_target(pid)
                        .map_err(|e| format!("add target {pid}: {e}"))
                });
                let _ = reply.send(result);
            }
            Request::Finish { pid, maps, reply } => {
                let result = profiler.as_mut().map_err(|e| e.clone()).map(|p| {
                    let counts = counts_of(p, pid);
                    p.remove_target(pid);
                    let baseline = baselines.remove(&pid).unwrap_or_default();
                    counts
                        .into_iter()
                        .filter_map(|(key, count, raw)| {
                            let count = count - baseline.get(&key).copied().unwrap_or(0);
                            (count > 0).then(|| symbolized(&mut sym, pid, &maps, key, count, &raw))
                        })
                        .collect()
                });
                let _ = reply.send(result);
            }
        }
    }
}

fn request<T>(make: impl FnOnce(mpsc::Sender<T>) -> Request) -> T {
    let (tx, rx) = mpsc::channel();
    service()
        .send(make(tx))
        .expect("profiler service is running");
    rx.recv().expect("profiler service replies")
}

/// `pid`'s stacks counted so far: (key, count, user frames innermost first).
fn counts_of(profiler: &mut Profiler, pid: u32) -> Vec<(CountKey, u64, Vec<u64>)> {
    let snap = profiler.collect();
    snap.counts
        .iter()
        .filter(|c| c.key.pid == pid)
        .map(|c| {
            let frames = profiler.stack(c.key.user_stack).unwrap_or(&[]).to_vec();
            (c.key, c.count, frames)
        })
        .collect()
}

fn symbolized(
    sym: &mut Symbolizer,
    pid: u32,
    maps: &[Mapping],
    key: CountKey,
    count: u64,
    raw: &[u64],
) -> Stack {
    let frames = sym
        .symbolize_user(pid, maps, &symbolization_addresses(raw))
        .iter()
        .rev()
        .map(|f| SymFrame {
            name: f.folded_name(),
            object: f.object.clone(),
            offset: f.file_offset,
            named: f.name.is_some(),
        })
        .collect();
    Stack {
        frames,
        count,
        outcome: WalkOutcome::try_from(key.outcome).expect("known outcome"),
        tid: key.tid,
        in_kernel: key.kernel_stack >= 0,
    }
}

/// Runs `exe`, profiles it (and records it with perf when available) for 2 s, and
/// symbolizes every stack. `min_tables`: executable mappings that must have a table.
fn profile(name: &str, exe: &Path, min_tables: usize) -> Run {
    let use_perf = perf_gate(name);
    let child = KillOnDrop::spawn(Command::new(exe).stdout(Stdio::null()));
    let pid = child.pid();
    thread::sleep(Duration::from_millis(200));
    // perf starts first: it runs while our tables load, and ends when we do.
    let perf = use_perf.then(|| {
        PerfRecord::start(
            pid,
            PERF_FREQUENCY,
            PERF_STACK_BYTES,
            PROFILE_SECS as f64,
            exe.parent().expect("fixture dir"),
        )
        .expect("start perf record")
    });
    let report = request(|reply| Request::AddTarget { pid, reply })
        .unwrap_or_else(|e| panic!("{name}: {e}"));
    assert!(
        report.with_table >= min_tables,
        "{name}: expected ≥ {min_tables} objects with tables: {report:?}"
    );
    // PROFILE_SECS of the child's CPU (perf records that long in wall-clock time: on a
    // busy machine its run is the shorter; only its dominant stacks are compared).
    support::hostile::wait_cpu(pid, PROFILE_SECS as f64, || {});
    // Maps and symbols are read while the child is alive.
    let maps = procfs::read_maps(pid).expect("maps");
    let stacks: Vec<Stack> = request(|reply| Request::Finish { pid, maps, reply })
        .unwrap_or_else(|e| panic!("{name}: {e}"));
    let mut outcomes = [0u64; WalkOutcome::COUNT];
    for s in &stacks {
        outcomes[s.outcome as usize] += s.count;
    }
    let perf = perf.map(|p| p.finish().expect("perf record and perf script"));
    drop(child);
    Run {
        name: name.to_string(),
        pid,
        stacks,
        outcomes,
        perf,
    }
}

// ---------------------------------------------------------------------------------------
// Expected stacks

/// One element of an expected stack (outermost first).
#[derive(Clone, Debug)]
enum Pat {
    /// A frame outside libc (the fixture's executable or library) with exactly this name.
    Fn(String),
    /// A named libc frame whose name contains this.
    Libc(&'static str),
    /// One or more named libc frames.
    LibcFrames,
    /// A PLT stub of `object` (between `[start, end)` file offsets): the symbolizer
    /// names these after whatever symbol precedes them.
    Plt {
        object: String,
        start: u64,
        end: u64,
    },
}

/// A frame in `exe`'s `.plt`.
fn plt_of(exe: &Path) -> Pat {
    let (start, end) = section_file_range(exe, ".plt").expect("executable has a .plt");
    let object = exe
        .file_name()
        .expect("file name")
        .to_string_lossy()
        .into_owned();
    Pat::Plt { object, start, end }
}

fn is_libc(f: &SymFrame) -> bool {
    f.object == LIBC
}

fn matches(frames: &[SymFrame], pat: &[Pat]) -> bool {
    let (Some(p), Some(f)) = (pat.first(), frames.first()) else {
        return pat.is_empty() && frames.is_empty();
    };
    match p {
        Pat::Fn(name) => !is_libc(f) && f.name == *name && matches(&frames[1..], &pat[1..]),
        Pat::Libc(part) => {
            is_libc(f) && f.named && f.name.contains(part) && matches(&frames[1..], &pat[1..])
        }
        Pat::Plt { object, start, end } => {
            f.object == *object
                && (*start..*end).contains(&f.offset)
                && matches(&frames[1..], &pat[1..])
        }
        Pat::LibcFrames => {
            is_libc(f)
                && f.named
                && (matches(&frames[1..], &pat[1..]) || matches(&frames[1..], pat))
        }
    }
}

/// `_start` through libc's start code to `main`.
fn process_base() -> Vec<Pat> {
    vec![
        Pat::Fn("_start".into()),
        Pat::Libc("libc_start_main"),
        Pat::Libc("libc_start_call_main"),
        Pat::Fn("main".into()),
    ]
}

/// A stack is as expected when it has `outcome` and matches one of `patterns`.
struct Expect {
    outcome: WalkOutcome,
    patterns: Vec<Vec<Pat>>,
}

impl Expect {
    fn complete(pattern: Vec<Pat>) -> Self {
        Self {
            outcome: WalkOutcome::Complete,
            patterns: vec![pattern],
        }
    }

    fn or(mut self, pattern: Vec<Pat>) -> Self {
        self.patterns.push(pattern);
        self
    }

    fn accepts(&self, s: &Stack) -> bool {
        s.outcome == self.outcome && self.patterns.iter().any(|p| matches(&s.frames, p))
    }
}

/// Asserts that ≥ 99% of the samples are accepted; returns (good, total).
fn assert_expected(run: &Run, expect: &Expect) -> (u64, u64) {
    let total: u64 = run.stacks.iter().map(|s| s.count).sum();
    let mut good = 0;
    let mut bad: HashMap<String, u64> = HashMap::new();
    for s in &run.stacks {
        if expect.accepts(s) {
            good += s.count;
        } else {
            *bad.entry(s.describe()).or_default() += s.count;
        }
    }
    let percent = if total == 0 {
        0.0
    } else {
        good as f64 * 100.0 / total as f64
    };
    eprintln!(
        "{}: {good} of {total} samples ({percent:.2}%) have the expected stack; outcomes {:?}",
        run.name, run.outcomes
    );
    assert!(
        total >= MIN_SAMPLES,
        "{}: too few samples: {total}",
        run.name
    );
    assert!(
        good * 100 >= total * REQUIRED_PERCENT,
        "{}: only {good} of {total} samples have the expected stack {:?} ({:?}); others: {bad:#?}",
        run.name,
        expect.patterns,
        expect.outcome
    );
    (good, total)
}

// ---------------------------------------------------------------------------------------
// perf ground truth

/// Whether to compare with perf: `false` (with a notice) when perf is unusable outside
/// CI; a failure under CI.
fn perf_gate(test: &str) -> bool {
    let why = match Command::new("perf").arg("--version").output() {
        Ok(out) if out.status.success() => return true,
        Ok(out) => format!(
            "`perf --version` failed: {}",
            String::from_utf8_lossy(&out.stderr)
        ),
        Err(err) => format!("cannot run perf: {err}"),
    };
    assert!(!in_ci(), "{test}: perf is required in CI: {why}");
    eprintln!("SKIPPED {test} (perf comparison only): {why}");
    false
}

fn dominant<K: std::hash::Hash + Eq + Clone>(
    items: impl Iterator<Item = (K, u64)>,
) -> (K, u64, u64) {
    let mut counts: HashMap<K, u64> = HashMap::new();
    let mut total = 0;
    for (k, n) in items {
        *counts.entry(k).or_default() += n;
        total += n;
    }
    let (k, n) = counts
        .into_iter()
        .max_by_key(|(_, n)| *n)
        .expect("at least one stack");
    (k, n, total)
}

/// The dominant stack of our run must be perf's (names, objects and call sites), frame
/// by frame; for a truncated stack, perf's innermost frames. Perf frames it could not
/// symbolize (`[unknown]`) are compared by object and offset only.
fn compare_with_perf(run: &Run) {
    let Some(perf) = &run.perf else { return };
    let (ours, our_n, our_total) = dominant(run.stacks.iter().map(|s| {
        let key = cmp_key(
            s.frames
                .iter()
                .map(|f| (f.object.as_str(), f.name.as_str(), f.offset)),
        );
        ((key, s.outcome), s.count)
    }));
    let (theirs, their_n, their_total) = dominant(perf.iter().map(|s| {
        let key = cmp_key(
            s.frames
                .iter()
                .map(|f| (f.object.as_str(), f.sym.as_str(), f.offset)),
        );
        (key, 1)
    }));
    let (ours, outcome) = ours;
    eprintln!(
        "{}: dominant stack: ours {our_n}/{our_total} samples ({} frames, {outcome:?}), perf {their_n}/{their_total} ({} frames)",
        run.name,
        ours.len(),
        theirs.len()
    );
    assert!(
        their_n * 2 >= their_total,
        "{}: perf has no dominant stack ({their_n} of {their_total}): {theirs:#?}",
        run.name
    );
    let theirs_cmp: &[CmpFrame] = match outcome {
        WalkOutcome::Truncated => {
            assert!(
                theirs.len() > ours.len(),
                "{}: we truncated at {} frames but perf saw only {}",
                run.name,
                ours.len(),
                theirs.len()
            );
            &theirs[theirs.len() - ours.len()..]
        }
        _ => &theirs,
    };
    assert_eq!(
        ours.len(),
        theirs_cmp.len(),
        "{}: our dominant stack differs from perf's:\nours: {ours:#?}\nperf: {theirs_cmp:#?}",
        run.name
    );
    for (a, b) in ours.iter().zip(theirs_cmp) {
        let same_site = a.0 == b.0 && a.2 == b.2;
        // Two names for one call site: libc symbols have aliases, and perf (symbol table)
        // and blazesym (DWARF) pick different ones, e.g. `__libc_start_main@@GLIBC_2.34`
        // and `__libc_start_main_impl`. Allowed in libc only, where the call site proves
        // it is the same function.
        let alias = same_site && a.2.is_some() && a.0 == LIBC;
        let ok = same_site && (a.1 == b.1 || alias || (b.1 == "[unknown]" && a.2.is_some()));
        assert!(
            ok,
            "{}: our dominant stack differs from perf's at {a:?} / {b:?}:\nours: {ours:#?}\nperf: {theirs_cmp:#?}",
            run.name
        );
        if a.1 != b.1 {
            eprintln!(
                "{}: same call site, other name: ours {} perf {} ({}+{:#x})",
                run.name,
                a.1,
                b.1,
                a.0,
                a.2.unwrap_or_default()
            );
        }
    }
}

fn check(run: &Run, expect: &Expect) {
    assert_expected(run, expect);
    compare_with_perf(run);
}

// ---------------------------------------------------------------------------------------
// 1. Recursion deeper than MAX_FRAMES

const RECURSION_DEPTH: usize = 300;

fn recursion(tables: Tables) {
    let source = format!(
        "{PRELUDE}NOIPA void spin(void) {{ for (;;) sink++; }}\n\
         NOIPA void rec(int n) {{ if (n > 0) rec(n - 1); else spin(); sink += n; }}\n\
         int main(void) {{ rec({RECURSION_DEPTH}); return (int)sink; }}\n"
    );
    let exe = build("recursion", tables, &source);
    let run = profile(&format!("recursion_{}", tables.suffix()), &exe, 2);
    // The innermost MAX_FRAMES frames: spin and MAX_FRAMES - 1 of the 301 rec frames.
    let mut pattern: Vec<Pat> = vec![Pat::Fn("rec".into()); MAX_FRAMES - 1];
    pattern.push(Pat::Fn("spin".into()));
    let expect = Expect {
        outcome: WalkOutcome::Truncated,
        patterns: vec![pattern],
    };
    check(&run, &expect);
    for s in run.stacks.iter().filter(|s| expect.accepts(s)) {
        assert_eq!(s.frames.len(), MAX_FRAMES, "{}", s.describe());
    }
    assert!(
        run.outcomes[WalkOutcome::Truncated as usize] > 0,
        "truncation counted"
    );
}

#[test]
fn recursion_300_deep_is_truncated_sframe() {
    if bpf_or_skip("recursion_300_deep_is_truncated_sframe") {
        recursion(Tables::Sframe);
    }
}

#[test]
fn recursion_300_deep_is_truncated_ehframe() {
    if bpf_or_skip("recursion_300_deep_is_truncated_ehframe") {
        recursion(Tables::EhFrame);
    }
}

// ---------------------------------------------------------------------------------------
// 2. alloca

fn alloca(tables: Tables) {
    let source = format!(
        "{PRELUDE}#include <alloca.h>\n#include <string.h>\n\
         volatile char *escape;\n\
         NOIPA void leaf(void) {{ for (;;) sink++; }}\n\
         {below}\
         NOIPA void with_alloca(int n) {{\n\
           char *p = alloca(n); memset(p, 1, n); escape = p;\n\
           b0(); sink += p[n - 1];\n\
         }}\n\
         NOIPA void a2(int n) {{ with_alloca(n); sink += 2; }}\n\
         NOIPA void a1(int n) {{ a2(n); sink += 1; }}\n\
         NOIPA void a0(int n) {{ a1(n); sink += 0; }}\n\
         int main(int argc, char **argv) {{ (void)argv; a0(1000 + 37 * argc); return (int)sink; }}\n",
        below = chain_functions("b", 3, "leaf();"),
    );
    let exe = build("alloca", tables, &source);
    let run = profile(&format!("alloca_{}", tables.suffix()), &exe, 2);
    let mut pattern = process_base();
    pattern.extend(chain_names("a", 3));
    pattern.push(Pat::Fn("with_alloca".into()));
    pattern.extend(chain_names("b", 3));
    pattern.push(Pat::Fn("leaf".into()));
    check(&run, &Expect::complete(pattern));
}

#[test]
fn alloca_in_the_chain_sframe() {
    if bpf_or_skip("alloca_in_the_chain_sframe") {
        alloca(Tables::Sframe);
    }
}

#[test]
fn alloca_in_the_chain_ehframe() {
    if bpf_or_skip("alloca_in_the_chain_ehframe") {
        alloca(Tables::EhFrame);
    }
}

// ---------------------------------------------------------------------------------------
// 3a. A shared library called through its PLT, spinning inside it

fn shared_library(tables: Tables) {
    let name = format!("shlib_{}", tables.suffix());
    let dir = fixture_dir(&name);
    // Default visibility and -fPIC: the calls between the library's own functions go
    // through its PLT too (they could be interposed).
    let lib_source = "#define NOIPA __attribute__((noipa))\n\
        volatile unsigned long lib_sink;\n\
        NOIPA void lib_leaf(void) { for (;;) lib_sink++; }\n\
        NOIPA void lib_mid(void) { lib_leaf(); lib_sink += 1; }\n\
        NOIPA void lib_entry(void) { lib_mid(); lib_sink += 2; }\n";
    let lib = compile_c_shared(&dir, "fxlib", lib_source, tables.flags());
    tables.check(&lib);
    let source = format!(
        "{PRELUDE}void lib_entry(void);\n{}int main(void) {{ f0(); return (int)sink; }}\n",
        chain_functions("f", 4, "lib_entry();")
    );
    let exe = compile_c_linked(&dir, &name, &source, tables.flags(), &["fxlib"]);
    tables.check(&exe);
    let run = profile(&name, &exe, 3);
    let mut pattern = process_base();
    pattern.extend(chain_names("f", 4));
    pattern.extend(["lib_entry", "lib_mid", "lib_leaf"].map(|n| Pat::Fn(n.into())));
    check(&run, &Expect::complete(pattern));
    let in_lib = run
        .stacks
        .iter()
        .filter(|s| s.frames.last().is_some_and(|f| f.object == "libfxlib.so"))
        .count();
    assert!(in_lib > 0, "leaf frames are in the library");
}

#[test]
fn shared_library_through_plt_sframe() {
    if bpf_or_skip("shared_library_through_plt_sframe") {
        shared_library(Tables::Sframe);
    }
}

#[test]
fn shared_library_through_plt_ehframe() {
    if bpf_or_skip("shared_library_through_plt_ehframe") {
        shared_library(Tables::EhFrame);
    }
}

// ---------------------------------------------------------------------------------------
// 3b. A libc function (qsort, through the PLT) calling back into the program

fn libc_callback(tables: Tables) {
    let source = format!(
        "{PRELUDE}NOIPA void burn(void) {{ for (unsigned long i = 0; i < 20000000; i++) sink++; }}\n\
         NOIPA int cmp(const void *a, const void *b) {{\n\
           burn(); return *(const int *)a - *(const int *)b;\n\
         }}\n\
         NOIPA void sorter(void) {{\n\
           int v[2];\n\
           for (;;) {{ v[0] = 2; v[1] = 1; qsort(v, 2, sizeof v[0], cmp); sink += v[0]; }}\n\
         }}\n\
         {}int main(void) {{ f0(); return (int)sink; }}\n",
        chain_functions("f", 4, "sorter();")
    );
    let exe = build("qsort", tables, &source);
    let run = profile(&format!("qsort_callback_{}", tables.suffix()), &exe, 2);
    let mut pattern = process_base();
    pattern.extend(chain_names("f", 4));
    pattern.push(Pat::Fn("sorter".into()));
    pattern.push(Pat::Libc("qsort"));
    pattern.push(Pat::LibcFrames);
    pattern.extend(["cmp", "burn"].map(|n| Pat::Fn(n.into())));
    let mut direct = pattern.clone();
    // qsort may call the comparator directly.
    direct.remove(direct.len() - 3);
    check(
        &run,
        &Expect {
            outcome: WalkOutcome::Complete,
            patterns: vec![pattern, direct],
        },
    );
}

#[test]
fn libc_qsort_calling_back_sframe() {
    if bpf_or_skip("libc_qsort_calling_back_sframe") {
        libc_callback(Tables::Sframe);
    }
}

#[test]
fn libc_qsort_calling_back_ehframe() {
    if bpf_or_skip("libc_qsort_calling_back_ehframe") {
        libc_callback(Tables::EhFrame);
    }
}

// ---------------------------------------------------------------------------------------
// 4. The chain on a second thread

const THREAD_CHAIN: usize = 12;

fn second_thread(tables: Tables) {
    let source = format!(
        "{PRELUDE}#include <pthread.h>\n\
         NOIPA void leaf(void) {{ for (;;) sink++; }}\n\
         {}\
         NOIPA void *thread_main(void *arg) {{ f0(); return arg; }}\n\
         int main(void) {{\n\
           pthread_t t;\n\
           if (pthread_create(&t, 0, thread_main, 0)) return 1;\n\
           pthread_join(t, 0);\n\
           return (int)sink;\n\
         }}\n",
        chain_functions("f", THREAD_CHAIN, "leaf();")
    );
    let exe = build("thread", tables, &source);
    let run = profile(&format!("second_thread_{}", tables.suffix()), &exe, 2);
    let mut pattern = vec![
        Pat::Libc("clone"),
        Pat::Libc("start_thread"),
        Pat::Fn("thread_main".into()),
    ];
    pattern.extend(chain_names("f", THREAD_CHAIN));
    pattern.push(Pat::Fn("leaf".into()));
    check(&run, &Expect::complete(pattern));
    for s in &run.stacks {
        assert_ne!(
            s.tid,
            run.pid,
            "the main thread is blocked: {}",
            s.describe()
        );
    }
}

#[test]
fn chain_on_a_second_thread_sframe() {
    if bpf_or_skip("chain_on_a_second_thread_sframe") {
        second_thread(Tables::Sframe);
    }
}

#[test]
fn chain_on_a_second_thread_ehframe() {
    if bpf_or_skip("chain_on_a_second_thread_ehframe") {
        second_thread(Tables::EhFrame);
    }
}

// ---------------------------------------------------------------------------------------
// 5. A syscall loop: most samples hit the kernel

const SYSCALL_CHAIN: usize = 8;

fn syscall_loop(tables: Tables) {
    let source = format!(
        "{PRELUDE}#include <unistd.h>\n\
         NOIPA void leaf(void) {{ for (;;) {{ getppid(); sink++; }} }}\n\
         {}int main(void) {{ f0(); return (int)sink; }}\n",
        chain_functions("f", SYSCALL_CHAIN, "leaf();")
    );
    let exe = build("syscall", tables, &source);
    let run = profile(&format!("syscall_loop_{}", tables.suffix()), &exe, 2);
    let mut in_leaf = process_base();
    in_leaf.extend(chain_names("f", SYSCALL_CHAIN));
    in_leaf.push(Pat::Fn("leaf".into()));
    let mut in_wrapper = in_leaf.clone();
    in_wrapper.push(Pat::Libc("getppid"));
    // A few samples land in the PLT stub on the way to the wrapper.
    let mut in_plt = in_leaf.clone();
    in_plt.push(plt_of(&exe));
    let expect = Expect::complete(in_wrapper.clone())
        .or(in_leaf)
        .or(in_plt.clone());
    check(&run, &expect);
    let sum = |keep: &dyn Fn(&Stack) -> bool| -> u64 {
        run.stacks.iter().filter(|s| keep(s)).map(|s| s.count).sum()
    };
    let total = sum(&|_| true);
    let kernel = sum(&|s| s.in_kernel);
    let kernel_ok = sum(&|s| s.in_kernel && expect.accepts(s));
    let kernel_wrapper =
        sum(&|s| s.in_kernel && expect.outcome == s.outcome && matches(&s.frames, &in_wrapper));
    let plt = sum(&|s| s.outcome == WalkOutcome::Complete && matches(&s.frames, &in_plt));
    eprintln!(
        "{}: {kernel} of {total} samples in the kernel, {kernel_ok} of them with the expected \
         stack, {kernel_wrapper} from the libc wrapper; {plt} samples in the PLT stub",
        run.name
    );
    assert!(
        kernel * 100 >= total * 30,
        "most time is spent in the kernel"
    );
    assert!(
        kernel_ok * 100 >= kernel * REQUIRED_PERCENT,
        "{}: kernel samples unwind completely",
        run.name
    );
    // The others entered the kernel from the loop itself (interrupts, page faults).
    assert!(
        kernel_wrapper * 10 >= kernel * 9,
        "{}: kernel samples unwind from the syscall wrapper",
        run.name
    );
}

#[test]
fn syscall_loop_sframe() {
    if bpf_or_skip("syscall_loop_sframe") {
        syscall_loop(Tables::Sframe);
    }
}

#[test]
fn syscall_loop_ehframe() {
    if bpf_or_skip("syscall_loop_ehframe") {
        syscall_loop(Tables::EhFrame);
    }
}

// ---------------------------------------------------------------------------------------
// 6. The deep chain of tests/unwind.rs, against perf

const CHAIN: usize = 24;

fn chain(tables: Tables) {
    let source = format!(
        "{PRELUDE}NOIPA void leaf(void) {{ for (;;) sink++; }}\n\
         {}int main(void) {{ f0(); return (int)sink; }}\n",
        chain_functions("f", CHAIN, "leaf();")
    );
    let exe = build("chain", tables, &source);
    let run = profile(&format!("chain_{}", tables.suffix()), &exe, 2);
    let mut pattern = process_base();
    pattern.extend(chain_names("f", CHAIN));
    pattern.push(Pat::Fn("leaf".into()));
    check(&run, &Expect::complete(pattern));
}

#[test]
fn deep_chain_matches_perf_sframe() {
    if bpf_or_skip("deep_chain_matches_perf_sframe") {
        chain(Tables::Sframe);
    }
}

#[test]
fn deep_chain_matches_perf_ehframe() {
    if bpf_or_skip("deep_chain_matches_perf_ehframe") {
        chain(Tables::EhFrame);
    }
}
