//! Section 5: accuracy. On each workload, this profiler, the kernel's frame-pointer walker
//! (`fp_baseline_record`) and `perf record --call-graph dwarf` (the ground truth) sample
//! the same process over the same window; their symbolized stacks are compared as
//! distributions.

use sframe_common::names::{maps, programs};
use std::{
    collections::{HashMap, HashSet},
    fmt::Write as _,
    thread,
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result};
use aya::{
    Ebpf,
    maps::{HashMap as BpfHashMap, MapData, RingBuf},
};
use sframe_common::{WalkOutcome, stack::BaselineSample};
use sframe_user::{
    bpf,
    perfscript::{PerfRecord, PerfStack, function_key, normalize},
    procfs::{self, Mapping},
    profiler::{Profiler, symbolization_addresses},
    symbolize::Symbolizer,
};

use crate::{
    Args, fixtures, progress,
    util::{Fixture, TempDir, one_line, pct},
};

/// Sampling frequency of all three.
const FREQUENCY: u64 = 999;
/// perf's copy of the user stack per sample: room for the interpreters' deep C stacks.
const PERF_STACK_BYTES: u32 = 32768;
const RECORD_PROGRAM: &str = programs::FP_BASELINE_RECORD;

/// A stack as compared: outermost first, (object, site): for the innermost frame its
/// normalized function name (the PC moves inside it), for callers the file offset of
/// the call (return address − 1).
type Key = Vec<(String, Site)>;

/// A caller → callee pair of adjacent frames.
type Step<'a> = (&'a (String, Site), &'a (String, Site));

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
enum Site {
    Function(String),
    Call(u64),
}

/// A symbolized stack, outermost first: (object, function name, file offset).
type Frames = Vec<(String, String, u64)>;

fn key_of(frames: &Frames) -> Key {
    let last = frames.len().saturating_sub(1);
    frames
        .iter()
        .enumerate()
        .map(|(i, (object, name, offset))| {
            let site = if i == last {
                Site::Function(function_key(name).to_string())
            } else {
                Site::Call(*offset)
            };
            (object.clone(), site)
        })
        .collect()
}

/// Samples per key.
#[derive(Default)]
struct Dist {
    counts: HashMap<Key, u64>,
    total: u64,
    /// Samples whose outermost frame is `_start`.
    complete: u64,
}

impl Dist {
    fn add(&mut self, frames: &Frames, n: u64) {
        if frames
            .first()
            .is_some_and(|(_, name, _)| normalize(name) == "start")
        {
            self.complete += n;
        }
        *self.counts.entry(key_of(frames)).or_default() += n;
        self.total += n;
    }

    /// Pairs of adjacent frames (caller, callee) in any stack.
    fn edges(&self) -> HashSet<Step<'_>> {
        self.counts
            .keys()
            .flat_map(|k| k.windows(2).map(|w| (&w[0], &w[1])))
            .collect()
    }

    /// Share of this distribution's samples that start where one of `other`'s stacks
    /// starts and whose every frame and caller → callee step `other` has in some stack
    /// (less sensitive to sampling noise than whole stacks).
    fn edges_seen_in(&self, other: &Dist) -> f64 {
        let edges = other.edges();
        let frames: HashSet<&(String, Site)> = other.counts.keys().flatten().collect();
        let outermost: HashSet<&(String, Site)> =
            other.counts.keys().filter_map(|k| k.first()).collect();
        let seen: u64 = self
            .counts
            .iter()
            .filter(|(k, _)| {
                k.first().is_some_and(|f| outermost.contains(f))
                    && k.windows(2).all(|w| edges.contains(&(&w[0], &w[1])))
                    && k.iter().all(|f| frames.contains(f))
            })
            .map(|(_, n)| n)
            .sum();
        seen as f64 / self.total.max(1) as f64
    }

    fn share(&self, k: &Key) -> f64 {
        self.counts.get(k).copied().unwrap_or(0) as f64 / self.total.max(1) as f64
    }

    /// Σ min(p_k, q_k): the share of samples the two distributions have in common.
    fn overlap(&self, other: &Dist) -> f64 {
        self.counts
            .keys()
            .map(|k| self.share(k).min(other.share(k)))
            .sum()
    }

    /// Share of this distribution's samples whose stack `other` also has.
    fn seen_in(&self, other: &Dist) -> f64 {
        let seen: u64 = self
            .counts
            .iter()
            .filter(|(k, _)| other.counts.contains_key(*k))
            .map(|(_, n)| n)
            .sum();
        seen as f64 / self.total.max(1) as f64
    }
}

/// The kernel's frame-pointer walker, sending every target sample's frames.
struct FpRecorder {
    ebpf: Ebpf,
    ring: RingBuf<MapData>,
    /// Frames (innermost first) per sample, by pid.
    stacks: HashMap<u32, Vec<Vec<u64>>>,
}

impl FpRecorder {
    fn start() -> Result<Self> {
        let mut ebpf = bpf::load().context("loading the BPF object")?;
        bpf::load_perf_event(&mut ebpf, RECORD_PROGRAM)
            .with_context(|| format!("loading {RECORD_PROGRAM}"))?;
        bpf::attach_cpu_clock_all_cpus(&mut ebpf, RECORD_PROGRAM, FREQUENCY)
            .with_context(|| format!("attaching {RECORD_PROGRAM}"))?;
        let ring = bpf::take_map(&mut ebpf, maps::FP_BASELINE_RING)?;
        Ok(Self {
            ebpf,
            ring,
            stacks: HashMap::new(),
        })
    }

    fn targets(&mut self) -> Result<BpfHashMap<&mut MapData, u32, u8>> {
        Ok(BpfHashMap::try_from(
            self.ebpf
                .map_mut(maps::TARGET_TGIDS)
                .context("map TARGET_TGIDS")?,
        )?)
    }

    fn add(&mut self, pid: u32) -> Result<()> {
        self.targets()?.insert(pid, 1, 0)?;
        Ok(())
    }

    fn remove(&mut self, pid: u32) -> Result<()> {
        self.targets()?.remove(&pid)?;
        Ok(())
    }

    fn drain(&mut self) {
        while let Some(item) = self.ring.next() {
            if item.len() < size_of::<BaselineSample>() {
                continue;
            }
            // SAFETY: the kernel wrote a BaselineSample (integers only, any bits valid).
            let s = unsafe { (item.as_ptr() as *const BaselineSample).read_unaligned() };
            let len = (s.len as usize).min(s.frames.len());
            self.stacks
                .entry(s.pid)
                .or_default()
                .push(s.frames[..len].to_vec());
        }
    }
}

/// One workload's three distributions.
struct Compared {
    workload: &'static str,
    perf: Dist,
    /// perf's even and odd samples, apart: how far two samplings of one truth differ.
    perf_halves: f64,
    ours: Dist,
    /// Our samples with outcome `Complete`.
    ours_complete_outcome: u64,
    fp: Dist,
}

fn symbolize(sym: &mut Symbolizer, pid: u32, maps: &[Mapping], raw: &[u64]) -> Frames {
    sym.symbolize_user(pid, maps, &symbolization_addresses(raw))
        .iter()
        .rev()
        .map(|f| {
            (
                f.object.clone(),
                f.name.clone().unwrap_or_else(|| "[unknown]".into()),
                f.file_offset,
            )
        })
        .collect()
}

fn perf_frames(s: &PerfStack) -> Frames {
    s.frames
        .iter()
        .map(|f| (f.object.clone(), f.sym.clone(), f.offset))
        .collect()
}

fn compare(
    w: &fixtures::Workload,
    profiler: &mut Profiler,
    fp: &mut FpRecorder,
    sym: &mut Symbolizer,
    dir: &TempDir,
    window: Duration,
) -> Result<Compared> {
    let fixture = Fixture {
        child: w
            .command()
            .spawn()
            .with_context(|| format!("starting {}", w.program.display()))?,
    };
    let pid = fixture.pid();
    // Past the dynamic loader and the interpreters' start.
    thread::sleep(Duration::from_millis(400));
    // perf first (it takes longest to start); all three stop about together.
    let perf = PerfRecord::start(
        pid,
        FREQUENCY,
        PERF_STACK_BYTES,
        window.as_secs_f64(),
        &dir.0,
    )?;
    let before: HashMap<_, _> = profiler
        .collect()
        .counts
        .iter()
        .filter(|c| c.key.pid == pid)
        .map(|c| (c.key, c.count))
        .collect();
    profiler
        .add_target(pid)
        .with_context(|| format!("adding target {pid}"))?;
    fp.add(pid)?;
    let started = Instant::now();
    while started.elapsed() < window {
        thread::sleep(Duration::from_millis(20));
        fp.drain();
    }
    fp.remove(pid)?;
    fp.drain();
    let snap = profiler.collect();
    profiler.remove_target(pid);
    let maps = procfs::read_maps(pid).context("reading the workload's maps")?;
    let mut ours = Dist::default();
    let mut ours_complete_outcome = 0;
    for c in snap.counts.iter().filter(|c| c.key.pid == pid) {
        let n = c.count - before.get(&c.key).copied().unwrap_or(0);
        if n == 0 {
            continue;
        }
        let raw = profiler.stack(c.key.user_stack).unwrap_or(&[]).to_vec();
        ours.add(&symbolize(sym, pid, &maps, &raw), n);
        if c.key.outcome == WalkOutcome::Complete as u32 {
            ours_complete_outcome += n;
        }
    }
    let mut fp_dist = Dist::default();
    for raw in fp.stacks.remove(&pid).unwrap_or_default() {
        fp_dist.add(&symbolize(sym, pid, &maps, &raw), 1);
    }
    let stacks = perf.finish().context("perf record")?;
    drop(fixture);
    let mut perf_dist = Dist::default();
    let mut halves = [Dist::default(), Dist::default()];
    for (i, s) in stacks.iter().enumerate() {
        let frames = perf_frames(s);
        perf_dist.add(&frames, 1);
        halves[i % 2].add(&frames, 1);
    }
    if std::env::var_os("SFRAME_BENCH_DEBUG").is_some() {
        for (name, d) in [("perf", &perf_dist), ("ours", &ours), ("fp", &fp_dist)] {
            let mut top: Vec<_> = d.counts.iter().collect();
            top.sort_by(|a, b| b.1.cmp(a.1));
            for (k, n) in top.into_iter().take(6) {
                eprintln!("{} {name} {n}: {k:?}", w.name);
            }
        }
        let mut unseen = Dist::default();
        for (k, &n) in &ours.counts {
            let mut one = Dist::default();
            one.counts.insert(k.clone(), n);
            one.total = n;
            if one.edges_seen_in(&perf_dist) == 0.0 {
                unseen.counts.insert(k.clone(), n);
            }
        }
        for (k, n) in unseen.counts.iter().take(8) {
            eprintln!("{} ours, a step perf never saw, {n}: {k:?}", w.name);
        }
    }
    Ok(Compared {
        workload: w.name,
        perf_halves: halves[0].overlap(&halves[1]),
        perf: perf_dist,
        ours,
        ours_complete_outcome,
        fp: fp_dist,
    })
}

pub fn section(doc: &mut String, args: &Args) {
    let window = args.sample_time();
    let _ = writeln!(
        doc,
        "\n## 5. Accuracy against `perf record --call-graph dwarf`\n\n\
         Method: each workload runs alone; after 400 ms, three samplers record it over the\n\
         same {} s window at {FREQUENCY} Hz: `perf record -e cpu-clock --call-graph\n\
         dwarf,{PERF_STACK_BYTES} -p PID` (the ground truth: perf copies the user stack and\n\
         unwinds it afterwards with DWARF CFI), this profiler (`Profiler::add_target`), and\n\
         the kernel's frame-pointer walker (`fp_baseline_record`: `bpf_get_stack` with\n\
         `BPF_F_USER_STACK`, as `fp_baseline` in section 1, sending the frames to user\n\
         space). Our stacks and the walker's are symbolized by this project's symbolizer\n\
         (blazesym, return addresses − 1), perf's by `perf script`.\n\n\
         The samplers do not take the same instants, so stacks are compared as\n\
         distributions. A stack's key is its frames from `_start` (or wherever the walk\n\
         ended) to the leaf: each caller frame as (object, file offset of the call site),\n\
         the leaf frame as (object, function name without `@version`, `__GI_`, leading\n\
         underscores, `libc_` alias prefix, C++ return type and parameters: what perf and\n\
         blazesym both print): call sites are exact, names only where the PC moves.\n\n\
         - *matches perf*: Σ over keys of min(share in perf's samples, share in this\n\
         \x20 sampler's): the share of samples the two distributions have in common\n\
         \x20 (1 − total variation distance). Two samplings of one truth do not reach 100 %:\n\
         \x20 perf's row shows the same figure between its even and odd samples, the\n\
         \x20 ceiling that sampling noise leaves.\n\
         - *stacks perf saw*: share of this sampler's samples whose key is among perf's.\n\
         - *steps perf saw*: share of samples whose outermost frame is one of perf's\n\
         \x20 outermost frames and whose every frame and every caller → callee step\n\
         \x20 (adjacent pair of frames) appear in some stack of perf's: a wrong step\n\
         \x20 makes a pair perf never saw, while rare stacks of a diverse workload (bash)\n\
         \x20 need not all have been sampled by perf.\n\
         - *complete to `_start`*: share of samples whose outermost frame is `_start`.\n\n\
         Workloads: the C workload of section 4 (`-O2 -fomit-frame-pointer`), a C++\n\
         program (g++ `-O2 -fomit-frame-pointer`: a virtual call, a template chain,\n\
         `std::map` inserts and erases, `std::sort` with a lambda), `/usr/bin/python3`\n\
         running a pure-Python loop three functions deep, `bash` running an arithmetic loop.\n\
         The system's python3, bash, libc and libstdc++ have no frame pointers.\n",
        window.as_secs(),
    );
    doc.push_str(
        "| workload | sampler | samples | distinct stacks | matches perf | stacks perf saw | steps perf saw | complete to `_start` |\n\
         |---|---|---:|---:|---:|---:|---:|---:|\n",
    );
    match run_all(window) {
        Ok(rows) => {
            for r in rows {
                match r {
                    Ok(c) => row(doc, &c),
                    Err((name, err)) => {
                        let _ = writeln!(
                            doc,
                            "| {name} | not measured: {} |||||||",
                            one_line(&format!("{err:#}"))
                        );
                    }
                }
            }
        }
        Err(err) => {
            let _ = writeln!(
                doc,
                "| all | not measured: {} |||||||",
                one_line(&format!("{err:#}"))
            );
        }
    }
}

type RowResult = std::result::Result<Compared, (String, anyhow::Error)>;

fn run_all(window: Duration) -> Result<Vec<RowResult>> {
    let dir = TempDir::new()?;
    let mut profiler = Profiler::start(FREQUENCY).context("starting the profiler")?;
    let mut fp = FpRecorder::start()?;
    let mut sym = Symbolizer::new();
    let mut out = Vec::new();
    for w in fixtures::all(&dir.0) {
        let w = match w {
            Ok(w) => w,
            Err(err) => {
                out.push(Err(("a workload".to_string(), err)));
                continue;
            }
        };
        progress(&format!("  {}", w.name));
        out.push(
            compare(&w, &mut profiler, &mut fp, &mut sym, &dir, window)
                .map_err(|e| (w.name.to_string(), e)),
        );
    }
    Ok(out)
}

fn row(doc: &mut String, c: &Compared) {
    let p = &c.perf;
    let _ = writeln!(
        doc,
        "| {} | `perf --call-graph dwarf` (reference) | {} | {} | {} (even vs odd samples) | – | – | {} |",
        c.workload,
        p.total,
        p.counts.len(),
        pct(c.perf_halves, 1.0),
        pct(p.complete as f64, p.total as f64),
    );
    for (name, d, extra) in [
        (
            "this profiler",
            &c.ours,
            format!(
                " (walks ending with outcome `complete`: {})",
                pct(c.ours_complete_outcome as f64, c.ours.total as f64)
            ),
        ),
        ("kernel FP walker (`fp_baseline`)", &c.fp, String::new()),
    ] {
        let _ = writeln!(
            doc,
            "| {} | {name} | {} | {} | {} | {} | {} | {}{extra} |",
            c.workload,
            d.total,
            d.counts.len(),
            pct(d.overlap(p), 1.0),
            pct(d.seen_in(p), 1.0),
            pct(d.edges_seen_in(p), 1.0),
            pct(d.complete as f64, d.total as f64),
        );
    }
}
