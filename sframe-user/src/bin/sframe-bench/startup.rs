//! Section 3, kernel side: the upload of each object's table into the maps, and the time
//! from a new process's exec to the first complete stack the profiler counts for it.

use std::{
    fmt::Write as _,
    process::Child,
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result, bail};
use sframe_common::WalkOutcome;
use sframe_user::{
    bpf::{self, LoadConfig},
    flatten::flatten,
    kmaps::KernelTables,
    profiler::{Profiler, ProfilerConfig, TargetSpec, table_capacity},
};

use crate::{
    Args, fixtures,
    kmem::DEFAULT_TABLE_MEMORY,
    objects::ObjectBench,
    progress,
    util::{TempDir, fmt_stats, median, one_line, ratio},
};

/// Sampling frequency of the first-stack runs: the `sframe-user` command's default.
const FIRST_STACK_HZ: u64 = 99;
/// How long a run waits for the first complete stack.
const FIRST_STACK_PATIENCE: Duration = Duration::from_secs(10);
/// How often the event loop of the first-stack runs looks for new counts.
const POLL: Duration = Duration::from_millis(2);

struct Upload {
    flatten_ms: Vec<f64>,
    upload_ms: Vec<f64>,
    bytes: u64,
}

fn upload(o: &ObjectBench, reps: usize) -> Result<Upload> {
    let n = o.result.as_ref().map_err(|e| anyhow::anyhow!("{e:#}"))?;
    let (rows, pages) = table_capacity(DEFAULT_TABLE_MEMORY);
    let mut u = Upload {
        flatten_ms: Vec::new(),
        upload_ms: Vec::new(),
        bytes: 0,
    };
    for _ in 0..reps {
        // A fresh map set each time: the first copy into never-touched map pages, as
        // when the profiler sees an object for the first time.
        let mut ebpf = bpf::load_with(&LoadConfig {
            max_rows: Some(rows),
            max_pages: Some(pages),
            ..LoadConfig::default()
        })
        .context("loading the BPF object")?;
        let mut kt = KernelTables::new(&mut ebpf).context("opening the table maps")?;
        let t = Instant::now();
        let flat = flatten(&n.table, kt.rule_dict()).context("flattening")?;
        u.flatten_ms.push(t.elapsed().as_secs_f64() * 1e3);
        let t = Instant::now();
        kt.load_object(&flat).context("uploading")?;
        u.upload_ms.push(t.elapsed().as_secs_f64() * 1e3);
        u.bytes = flat.kernel_bytes();
    }
    Ok(u)
}

pub fn upload_section(doc: &mut String, objects: &[ObjectBench], args: &Args) {
    let reps = args.repetitions();
    let _ = writeln!(
        doc,
        "\n### Upload to the kernel maps\n\n\
         Method: per object, {reps} times, a fresh map set of the default size\n\
         (`--max-table-memory 20M`) is created and the table (built once by `table_for_elf`,\n\
         timed above) is flattened into the map set's rule dictionary and copied in with\n\
         `KernelTables::load_object` (new rules to `RULES` by syscall, rows and page entries\n\
         through the `mmap` of `ROWS` and `PAGES`, the object entry by syscall): the first\n\
         copy into map pages never touched, as when the profiler sees an object for the\n\
         first time. Median (min–max) ms. *Total* adds the medians of `table_for_elf`,\n\
         flatten and upload: from the object's bytes in memory to a table the walker can\n\
         use (reading the file and the disk cache are not included).\n"
    );
    doc.push_str(
        "| object | rows | kernel bytes | table_for_elf ms | flatten ms | upload ms | upload MB/s | total ms |\n\
         |---|---:|---:|---:|---:|---:|---:|---:|\n",
    );
    for o in objects {
        let Ok(n) = &o.result else { continue };
        match upload(o, reps) {
            Ok(u) => {
                let up = median(&u.upload_ms);
                let total = median(&n.derive_ms) + median(&u.flatten_ms) + up;
                let _ = writeln!(
                    doc,
                    "| {} | {} | {} | {} | {} | {} | {} | {total:.1} |",
                    o.label,
                    n.rows,
                    u.bytes,
                    fmt_stats(&n.derive_ms, 1),
                    fmt_stats(&u.flatten_ms, 1),
                    fmt_stats(&u.upload_ms, 2),
                    ratio(u.bytes as f64 / 1e6, up / 1e3)
                        .map_or_else(|| "–".into(), |r| format!("{r:.0}")),
                );
            }
            Err(err) => {
                let _ = writeln!(
                    doc,
                    "| {} | not measured: {} |||||||",
                    o.label,
                    one_line(&format!("{err:#}"))
                );
            }
        }
    }
}

// ---------------------------------------------------------------------------------------
// Time to the first complete stack

#[derive(Clone, Copy, PartialEq, Eq)]
enum Mode {
    Comm,
    All,
}

/// One new process: ms from exec to its tables loaded and to its first complete stack.
#[derive(Clone, Copy)]
struct First {
    loaded_ms: Option<f64>,
    complete_ms: f64,
}

/// Kills and reaps the process when dropped.
struct Running(Child);

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Starts `w` and runs the profiler's event loop until `w`'s first complete stack.
fn first_stack(profiler: &mut Profiler, w: &fixtures::Workload) -> Result<First> {
    // Counts of earlier processes are kept by `collect`: only this pid's matter.
    let t0 = Instant::now();
    // `spawn` returns once the exec is done (std reports exec failures through a pipe).
    let child = Running(
        w.command()
            .spawn()
            .with_context(|| format!("starting {}", w.program.display()))?,
    );
    let pid = child.0.id();
    let mut loaded_ms = None;
    loop {
        let added = profiler.poll(POLL);
        if loaded_ms.is_none()
            && (added.contains(&pid) || profiler.store().process_entries(pid).is_some())
        {
            loaded_ms = Some(t0.elapsed().as_secs_f64() * 1e3);
        }
        let snap = profiler.collect();
        let complete = snap.counts.iter().any(|c| {
            c.key.pid == pid && c.key.outcome == WalkOutcome::Complete as u32 && c.count > 0
        });
        if complete {
            return Ok(First {
                loaded_ms,
                complete_ms: t0.elapsed().as_secs_f64() * 1e3,
            });
        }
        if t0.elapsed() > FIRST_STACK_PATIENCE {
            bail!(
                "no complete stack of pid {pid} within {} s",
                FIRST_STACK_PATIENCE.as_secs()
            );
        }
    }
}

/// One profiler: a first process (every object new to the profiler: cold) then a second
/// of the same program (its objects already loaded: warm).
fn run(mode: Mode, w: &fixtures::Workload, comm: &str) -> Result<(First, First)> {
    let mut config = ProfilerConfig::explicit(FIRST_STACK_HZ);
    config.targets = match mode {
        Mode::Comm => TargetSpec {
            comms: vec![comm.to_string()],
            ..TargetSpec::default()
        },
        Mode::All => TargetSpec {
            all: true,
            ..TargetSpec::default()
        },
    };
    config.max_table_memory = Some(DEFAULT_TABLE_MEMORY);
    let mut profiler = Profiler::start_with(config).context("starting the profiler")?;
    // Processes already running (whole system): let their first loads pass.
    let settle = Instant::now();
    while settle.elapsed() < Duration::from_millis(300) || profiler.has_pending() {
        profiler.poll(POLL);
        if settle.elapsed() > Duration::from_secs(10) {
            break;
        }
    }
    profiler.collect();
    let cold = first_stack(&mut profiler, w)?;
    let warm = first_stack(&mut profiler, w)?;
    Ok((cold, warm))
}

pub fn first_stack_section(doc: &mut String, args: &Args) {
    let reps = if args.quick { 1 } else { 5 };
    let _ = writeln!(
        doc,
        "\n### Time to the first complete stack of a new process\n\n\
         Method: a profiler is started (`Profiler::start_with`, {FIRST_STACK_HZ} Hz, the\n\
         command's default, no disk cache) in `--comm NAME` mode or in whole-system mode\n\
         (`--all`), and its event loop runs in this process as the command's does (woken by\n\
         the lifecycle and deferred-sample ring buffers, here at least every\n\
         {} ms, then `collect`). A new process of the workload is started; the clock starts\n\
         before `fork` (`Command::spawn`, which returns after the `exec`) and stops when a\n\
         `collect` first holds a complete walk of that pid. *Tables loaded* is when its\n\
         mapping table was installed (exec event handled). *Cold*: the first such process of\n\
         the profiler, every object of it derived on first sight; *warm*: a second process\n\
         of the same program right after, its objects already in the maps. The sampling\n\
         period ({:.1} ms per CPU at {FIRST_STACK_HZ} Hz) is part of the figure. Median\n\
         (min–max) of {reps} profiler start(s) per row, in ms.\n",
        POLL.as_millis(),
        1e3 / FIRST_STACK_HZ as f64,
    );
    doc.push_str(
        "| workload | mode | cold: tables loaded | cold: first complete stack | warm: tables loaded | warm: first complete stack |\n\
         |---|---|---:|---:|---:|---:|\n",
    );
    let dir = match TempDir::new() {
        Ok(d) => d,
        Err(err) => {
            let _ = writeln!(doc, "Not measured: {err:#}.");
            return;
        }
    };
    let c = fixtures::c_workload(&dir.0, "first_c").map(|program| fixtures::Workload {
        name: "C, no frame pointers",
        program,
        args: Vec::new(),
    });
    let python = Ok(fixtures::Workload {
        name: "python3, pure-Python loop",
        program: "/usr/bin/python3".into(),
        args: vec!["-c".into(), fixtures::PYTHON_SCRIPT.into()],
    });
    for (w, comm) in [(c, "first_c"), (python, "python3")] {
        let w = match w {
            Ok(w) => w,
            Err(err) => {
                let _ = writeln!(
                    doc,
                    "| {comm} | not measured: {} |||||",
                    one_line(&format!("{err:#}"))
                );
                continue;
            }
        };
        // --quick: one mode per workload (each profiler start verifies the programs).
        let modes: &[Mode] = match (args.quick, comm) {
            (false, _) => &[Mode::Comm, Mode::All],
            (true, "python3") => &[Mode::All],
            (true, _) => &[Mode::Comm],
        };
        for &mode in modes {
            let mode_name = match mode {
                Mode::Comm => format!("`--comm {comm}`"),
                Mode::All => "`--all`".to_string(),
            };
            let mut runs = Vec::new();
            let mut error = None;
            for _ in 0..reps {
                match run(mode, &w, comm) {
                    Ok(r) => {
                        progress(&format!(
                            "  {} {mode_name}: cold {:.1} ms, warm {:.1} ms",
                            w.name, r.0.complete_ms, r.1.complete_ms
                        ));
                        runs.push(r);
                    }
                    Err(err) => {
                        progress(&format!("  {} {mode_name}: {err:#}", w.name));
                        error.get_or_insert(err);
                    }
                }
            }
            if runs.is_empty() {
                let why = error.map_or_else(|| "no run".into(), |e| format!("{e:#}"));
                let _ = writeln!(
                    doc,
                    "| {} | {mode_name} | not measured: {} ||||",
                    w.name,
                    one_line(&why)
                );
                continue;
            }
            let col = |f: &dyn Fn(&(First, First)) -> Option<f64>| {
                let v: Vec<f64> = runs.iter().filter_map(f).collect();
                if v.is_empty() {
                    "–".to_string()
                } else {
                    fmt_stats(&v, 1)
                }
            };
            let _ = writeln!(
                doc,
                "| {} | {mode_name} | {} | {} | {} | {} |",
                w.name,
                col(&|r| r.0.loaded_ms),
                col(&|r| Some(r.0.complete_ms)),
                col(&|r| r.1.loaded_ms),
                col(&|r| Some(r.1.complete_ms)),
            );
        }
    }
}
