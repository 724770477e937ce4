//! Sections 2 and 3: each object's table (kernel bytes per row, user-space memory,
//! build and flatten time).

use std::{
    fmt::Write as _,
    fs,
    path::{Path, PathBuf},
    process::Command,
    time::Instant,
};

use anyhow::{Context as _, Result};
use object::{Object as _, ObjectSection as _};
use sframe_common::layout::RuleEntry;
use sframe_user::{
    flatten::{RuleDict, flatten},
    objtable::{ObjTableOptions, table_for_elf},
    sframe::{WriteOptions, WriteVersion, write_section},
    table::{Source, UnwindTable},
};

use crate::{
    Args,
    heap::peak_heap,
    progress,
    util::{fmt_opt, fmt_stats, one_line, ratio, stats, verdict},
};

const GOAL_MEMORY_RATIO: f64 = 2.0;
/// Issue 4: libc's `.eh_frame` derived in at most this many ms on one core.
const GOAL_LIBC_DERIVE_MS: f64 = 50.0;

// ---------------------------------------------------------------------------------------
// 2. and 3. Objects: kernel memory and build time

pub(crate) struct ObjectBench {
    pub label: &'static str,
    pub path: PathBuf,
    pub result: Result<ObjectNumbers>,
}

pub(crate) struct ObjectNumbers {
    pub file_bytes: u64,
    pub source: Source,
    pub table: UnwindTable,
    pub rows: usize,
    pub functions: usize,
    pub flat_rows: usize,
    /// Pages of the flattened object, and their size (log2 of bytes).
    pub pages: (u32, u32),
    pub kernel_bytes: u64,
    pub rules: usize,
    pub eh_frame_bytes: Option<u64>,
    pub sframe: Result<(usize, u32)>,
    pub derive_ms: Vec<f64>,
    /// The same rows read from their SFrame v3 encoding (`Section::parse` +
    /// `to_table`), the time a `.sframe` of the object would take.
    pub sframe_read_ms: Vec<f64>,
    pub flatten_ms: Vec<f64>,
    /// `UnwindTable::heap_bytes()` of the table.
    pub table_heap: usize,
    /// Most heap bytes allocated at once by one `table_for_elf` run.
    pub peak_heap: usize,
}

pub(crate) fn bench_objects(args: &Args) -> Vec<ObjectBench> {
    let mut out = Vec::new();
    for (label, found) in [
        ("libc.so.6", find_libc()),
        ("libstdc++.so.6", find_library("libstdc++.so.6")),
        ("python3", fs::canonicalize("/usr/bin/python3").ok()),
        ("largest ELF", largest_elf()),
    ] {
        let Some(path) = found else {
            out.push(ObjectBench {
                label,
                path: PathBuf::new(),
                result: Err(anyhow::anyhow!("not found on this machine")),
            });
            continue;
        };
        progress(&format!("  {label}: {}", path.display()));
        let result = bench_object(&path, args);
        out.push(ObjectBench {
            label,
            path,
            result,
        });
    }
    out
}

fn bench_object(path: &Path, args: &Args) -> Result<ObjectNumbers> {
    let data = fs::read(path).with_context(|| format!("reading {}", path.display()))?;
    let opts = ObjTableOptions::default();
    let mut derive_ms = Vec::new();
    let mut table = None;
    // One core: the build is single-threaded; pinned, it is not moved between CPUs.
    let _pin = crate::util::PinnedToOneCpu::new();
    for _ in 0..args.repetitions() {
        let t = Instant::now();
        let result = table_for_elf(&data, &opts);
        derive_ms.push(t.elapsed().as_secs_f64() * 1e3);
        table = Some(result.with_context(|| format!("table for {}", path.display()))?);
    }
    let table = table.context("no repetition ran")?;
    let table_heap = table.table.heap_bytes();
    let (again, peak_heap) = peak_heap(|| table_for_elf(&data, &opts));
    drop(again);
    let mut flatten_ms = Vec::new();
    let mut flat = None;
    let mut rules = 0;
    for _ in 0..args.repetitions() {
        let mut dict = RuleDict::default();
        let t = Instant::now();
        let result = flatten(&table.table, &mut dict);
        flatten_ms.push(t.elapsed().as_secs_f64() * 1e3);
        flat = Some(result.with_context(|| format!("flattening {}", path.display()))?);
        rules = dict.len();
    }
    let flat = flat.context("no repetition ran")?;
    let file = object::File::parse(&*data).context("parsing the ELF file")?;
    let eh_frame = file.section_by_name(".eh_frame");
    let eh_frame_bytes = eh_frame.as_ref().map(|s| s.size());
    let sframe_vaddr = eh_frame.as_ref().map_or(0, |s| s.address());
    let written = write_section(
        &table.table,
        &WriteOptions {
            version: WriteVersion::V3,
            section_vaddr: sframe_vaddr,
        },
    )
    .map_err(|e| anyhow::anyhow!("{e}"));
    let mut sframe_read_ms = Vec::new();
    if let Ok((bytes, _)) = &written {
        for _ in 0..args.repetitions() {
            let t = Instant::now();
            let back =
                sframe_user::sframe::Section::parse(bytes, sframe_vaddr).and_then(|s| s.to_table());
            sframe_read_ms.push(t.elapsed().as_secs_f64() * 1e3);
            std::hint::black_box(back.map(|t| t.row_count()).unwrap_or(0));
        }
    }
    let sframe = written.map(|(bytes, stats)| (bytes.len(), stats.fdes));
    Ok(ObjectNumbers {
        file_bytes: data.len() as u64,
        source: table.source,
        rows: table.table.row_count(),
        functions: table.table.functions().len(),
        flat_rows: flat.rows.len(),
        pages: (flat.page_count(), flat.page_shift),
        kernel_bytes: flat.kernel_bytes(),
        rules,
        eh_frame_bytes,
        sframe,
        derive_ms,
        sframe_read_ms,
        flatten_ms,
        table_heap,
        peak_heap,
        table: table.table,
    })
}

/// The libc this process runs with.
fn find_libc() -> Option<PathBuf> {
    let maps = fs::read_to_string("/proc/self/maps").ok()?;
    maps.lines()
        .filter_map(|l| l.split_whitespace().nth(5))
        .find(|p| p.ends_with("/libc.so.6"))
        .and_then(|p| fs::canonicalize(p).ok())
        .or_else(|| find_library("libc.so.6"))
}

/// A library as the dynamic loader's cache names it, else in the usual directories.
fn find_library(name: &str) -> Option<PathBuf> {
    let from_cache = Command::new("ldconfig")
        .arg("-p")
        .output()
        .ok()
        .and_then(|o| {
            String::from_utf8_lossy(&o.stdout).lines().find_map(|l| {
                let (lhs, path) = l.trim().split_once(" => ")?;
                (lhs.split_whitespace().next() == Some(name) && lhs.contains("x86-64"))
                    .then(|| PathBuf::from(path.trim()))
            })
        });
    from_cache
        .into_iter()
        .chain(
            [
                "/lib/x86_64-linux-gnu",
                "/usr/lib/x86_64-linux-gnu",
                "/usr/lib64",
                "/usr/lib",
            ]
            .iter()
            .map(|d| Path::new(d).join(name)),
        )
        .find_map(|p| fs::canonicalize(p).ok())
}

/// The largest ELF shared object or executable under /usr/lib and the rustup home.
fn largest_elf() -> Option<PathBuf> {
    let mut roots = vec![PathBuf::from("/usr/lib")];
    if let Some(home) = std::env::var_os("RUSTUP_HOME") {
        roots.push(PathBuf::from(home));
    } else if let Some(home) = std::env::var_os("HOME") {
        roots.push(PathBuf::from(home).join(".rustup"));
    }
    let mut files = Vec::new();
    for root in roots {
        walk(&root, 0, &mut files);
    }
    files.sort_by_key(|f| std::cmp::Reverse(f.0));
    files
        .into_iter()
        .map(|(_, p)| p)
        .find(|p| is_elf_program(p))
}

fn walk(dir: &Path, depth: u32, out: &mut Vec<(u64, PathBuf)>) {
    if depth > 16 {
        return;
    }
    let Ok(entries) = fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let Ok(meta) = entry.metadata() else { continue };
        if meta.is_dir() {
            walk(&entry.path(), depth + 1, out);
        } else if meta.is_file() && meta.len() > 1 << 20 {
            out.push((meta.len(), entry.path()));
        }
    }
}

/// ET_EXEC or ET_DYN ELF (not a relocatable object or archive member).
fn is_elf_program(path: &Path) -> bool {
    use std::io::Read as _;
    let mut head = [0u8; 18];
    let ok = fs::File::open(path)
        .and_then(|mut f| f.read_exact(&mut head))
        .is_ok();
    ok && head[..4] == *b"\x7fELF" && matches!(u16::from_le_bytes([head[16], head[17]]), 2 | 3)
}

pub(crate) fn memory_section(doc: &mut String, objects: &[ObjectBench]) {
    let rule_bytes = size_of::<RuleEntry>();
    let min_page = 1u64 << sframe_common::budget::MIN_PAGE_SHIFT;
    let max_page = (1u64 << sframe_common::budget::MAX_PAGE_SHIFT) >> 10;
    let min_rows = sframe_common::budget::MIN_ROWS_PER_PAGE;
    let _ = writeln!(
        doc,
        "\n## 2. Kernel memory per row\n\n\
         Method: `objtable::table_for_elf` builds each object's table (its `.sframe` when\n\
         valid, else rows derived from `.eh_frame`/`.debug_frame`, plus PLT rows);\n\
         `flatten::flatten` turns it into the kernel layout; *kernel bytes* is\n\
         `FlatObject::kernel_bytes()` (4-byte rows, 4-byte page entries, one object entry);\n\
         *pages*: the object's page entries and their size (the finest from {min_page} bytes\n\
         that leaves {min_rows} rows per page on average, else {max_page} KiB).\n\
         Rules are deduplicated into one table shared by all objects ({rule_bytes} bytes per\n\
         distinct rule), counted apart. Beside: the object's `.eh_frame` section, and a\n\
         version 3 `.sframe` the project's writer generates from the same table\n\
         (`sframe::write_section`). Bytes per row divide by the table's rows.\n\n\
         Goal (issues 5, 8): ≤ 4 bytes per row including the function entries, hard limit 8.\n"
    );
    doc.push_str(
        "| object | source | functions | rows | flattened rows | pages | kernel bytes | bytes/row | bytes/function | distinct rules | `.eh_frame` bytes (/row) | generated `.sframe` v3 bytes (/row) |\n\
         |---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n",
    );
    for o in objects {
        let name = object_name(o);
        match &o.result {
            Ok(n) => {
                let per_row = |b: f64| ratio(b, n.rows as f64);
                let eh = n.eh_frame_bytes.map_or_else(
                    || "none".into(),
                    |b| format!("{b} ({})", fmt_opt(per_row(b as f64), 1)),
                );
                let sf = match &n.sframe {
                    Ok((b, _)) => format!("{b} ({})", fmt_opt(per_row(*b as f64), 1)),
                    Err(e) => format!("not written: {}", one_line(&e.to_string())),
                };
                let _ = writeln!(
                    doc,
                    "| {name} | {} | {} | {} | {} | {} × {} B | {} | {} | {} | {} | {eh} | {sf} |",
                    source_name(n.source),
                    n.functions,
                    n.rows,
                    n.flat_rows,
                    n.pages.0,
                    1u64 << n.pages.1,
                    n.kernel_bytes,
                    fmt_opt(per_row(n.kernel_bytes as f64), 2),
                    fmt_opt(ratio(n.kernel_bytes as f64, n.functions as f64), 1),
                    n.rules,
                );
            }
            Err(err) => {
                let _ = writeln!(
                    doc,
                    "| {name} | not measured: {} |||||||||||",
                    one_line(&format!("{err:#}"))
                );
            }
        }
    }
}

pub(crate) fn table_memory_section(doc: &mut String, objects: &[ObjectBench]) {
    let _ = writeln!(
        doc,
        "\n### Table memory in user space\n\n\
         Method: the same tables in the profiler's memory before flattening. *Table bytes*\n\
         is `UnwindTable::heap_bytes()`: {} bytes per function, {} per row (start offset,\n\
         16-bit rule index) and {} per distinct rule, vector capacities included. *Peak heap*\n\
         is the most heap bytes allocated at once while one `table_for_elf` runs (ELF\n\
         parse, CFI evaluation, assembly; the returned table included, the file's bytes\n\
         not), counted by this binary's global allocator. Both are compared with the size\n\
         of the same rows encoded as SFrame version 3 (the generated section of the table\n\
         above: what issue 4 derives rows into, and what `gen` writes).\n\n\
         Goal (issue 4): memory ≤ {GOAL_MEMORY_RATIO}× the size of the rows produced.\n",
        size_of::<sframe_user::table::Function>(),
        size_of::<sframe_user::table::CompactRow>(),
        size_of::<sframe_common::UnwindRule>()
    );
    doc.push_str(
        "| object | source | rows | distinct rules | table bytes | bytes/row | × `.sframe` v3 (goal ≤ 2) | peak heap bytes | bytes/row | × `.sframe` v3 (goal ≤ 2) |\n\
         |---|---|---:|---:|---:|---:|---:|---:|---:|---:|\n",
    );
    for o in objects {
        let Ok(n) = &o.result else { continue };
        let sframe = n.sframe.as_ref().ok().map(|(b, _)| *b as f64);
        let per_row = |b: usize| fmt_opt(ratio(b as f64, n.rows as f64), 1);
        let times = |b: usize| {
            sframe
                .and_then(|sf| ratio(b as f64, sf))
                .map_or_else(|| "–".into(), |x| verdict(x, x <= GOAL_MEMORY_RATIO, 2))
        };
        let _ = writeln!(
            doc,
            "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |",
            o.label,
            source_name(n.source),
            n.rows,
            n.table.rules().len(),
            n.table_heap,
            per_row(n.table_heap),
            times(n.table_heap),
            n.peak_heap,
            per_row(n.peak_heap),
            times(n.peak_heap),
        );
    }
}

fn object_name(o: &ObjectBench) -> String {
    if o.path.as_os_str().is_empty() {
        o.label.to_string()
    } else {
        format!("{} (`{}`)", o.label, o.path.display())
    }
}

pub(crate) fn source_name(s: Source) -> String {
    match s {
        Source::SFrame { version } => format!(".sframe v{version}"),
        Source::EhFrame => ".eh_frame".into(),
        Source::DebugFrame => ".debug_frame".into(),
        Source::Synthesized => "synthesized".into(),
    }
}

pub(crate) fn build_section(doc: &mut String, objects: &[ObjectBench], args: &Args) {
    let _ = writeln!(
        doc,
        "\n## 3. Table build time\n\n\
         Method: the object's bytes are in memory; `table_for_elf` (ELF parse, `.sframe`\n\
         validation or CFI derivation, PLT rows) and `flatten` (fresh rule dictionary) each\n\
         run {} times on one CPU (the process pinned to it); median (min–max) in ms, and\n\
         rows per second from the median. Upload to the kernel maps is not included. None of\n\
         these objects has a `.sframe` of its own: *from `.sframe`* reads the same rows\n\
         from their SFrame v3 encoding (`Section::parse` + `to_table`), what the object\n\
         would cost with one.\n\n\
         Goal (issue 4): libc's `.eh_frame` in ≤ {GOAL_LIBC_DERIVE_MS} ms on one core.\n",
        args.repetitions()
    );
    doc.push_str(
        "| object | file MB | rows | table_for_elf ms | rows/s | from `.sframe` ms | table_for_elf ÷ `.sframe` | flatten ms | rows/s | goal |\n\
         |---|---:|---:|---:|---:|---:|---:|---:|---:|---|\n",
    );
    for o in objects {
        let Ok(n) = &o.result else { continue };
        let rate = |v: &[f64]| {
            let mut v = v.to_vec();
            stats(&mut v)
                .and_then(|(m, _, _)| ratio(n.rows as f64, m / 1e3))
                .map_or_else(|| "–".into(), |r| format!("{:.2} M", r / 1e6))
        };
        let median = |v: &[f64]| {
            let mut v = v.to_vec();
            stats(&mut v).map(|(m, _, _)| m)
        };
        let derive = median(&n.derive_ms);
        let goal = match (o.label, derive) {
            ("libc.so.6", Some(ms)) => format!(
                "≤ {GOAL_LIBC_DERIVE_MS} ms: {}",
                if ms <= GOAL_LIBC_DERIVE_MS {
                    "met"
                } else {
                    "not met"
                }
            ),
            _ => String::new(),
        };
        let _ = writeln!(
            doc,
            "| {} | {:.1} | {} | {} | {} | {} | {} | {} | {} | {goal} |",
            o.label,
            n.file_bytes as f64 / 1e6,
            n.rows,
            fmt_stats(&n.derive_ms, 1),
            rate(&n.derive_ms),
            fmt_stats(&n.sframe_read_ms, 2),
            fmt_opt(
                derive
                    .zip(median(&n.sframe_read_ms))
                    .and_then(|(d, r)| ratio(d, r)),
                1
            ),
            fmt_stats(&n.flatten_ms, 1),
            rate(&n.flatten_ms),
        );
    }
}
