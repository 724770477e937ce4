//! Section 2, kernel side: the objects' tables copied into the BPF maps, and the maps'
//! memory as the kernel reports it (`memlock` in `/proc/self/fdinfo/FD`, the figure
//! `bpftool map show` prints).

use sframe_common::names::maps;
use std::{collections::BTreeMap, fmt::Write as _, fs};

use anyhow::{Context as _, Result};
use aya::maps::MapInfo;
use sframe_common::layout::{ObjectEntry, RuleEntry};
use sframe_user::{
    bpf::{self, LoadConfig},
    flatten::flatten,
    kmaps::KernelTables,
    profiler::table_capacity,
};

use crate::{
    objects::{ObjectBench, ObjectNumbers},
    util::{fmt_opt, one_line, ratio},
};

/// The maps that hold unwind tables.
const TABLE_MAPS: [&str; 4] = [maps::ROWS, maps::PAGES, maps::OBJECTS, maps::RULES];
/// `--max-table-memory`'s default (the `sframe-user` command's).
pub const DEFAULT_TABLE_MEMORY: u64 = 20 * 1024 * 1024;
const GOAL_BYTES_PER_ROW: f64 = 4.0;

/// One BPF map this process holds, as the kernel reports it.
#[derive(Clone, Debug)]
pub struct MapMem {
    pub name: String,
    pub max_entries: u32,
    pub value_size: u32,
    pub memlock: u64,
}

/// Every BPF map this process has a descriptor of, by map id.
pub fn maps_of_this_process() -> BTreeMap<u32, MapMem> {
    let mut out = BTreeMap::new();
    let Ok(dir) = fs::read_dir("/proc/self/fdinfo") else {
        return out;
    };
    for entry in dir.flatten() {
        let Ok(text) = fs::read_to_string(entry.path()) else {
            continue;
        };
        let field = |name: &str| {
            text.lines()
                .find_map(|l| l.strip_prefix(name)?.trim().parse::<u64>().ok())
        };
        let (Some(id), Some(memlock)) = (field("map_id:"), field("memlock:")) else {
            continue;
        };
        let id = id as u32;
        let Ok(info) = MapInfo::from_id(id) else {
            continue;
        };
        out.insert(
            id,
            MapMem {
                name: info.name_as_str().unwrap_or("?").to_string(),
                max_entries: info.max_entries(),
                value_size: info.value_size(),
                memlock,
            },
        );
    }
    out
}

/// The maps in `after` and not in `before`.
fn new_maps(before: &BTreeMap<u32, MapMem>, after: &BTreeMap<u32, MapMem>) -> Vec<MapMem> {
    after
        .iter()
        .filter(|(id, _)| !before.contains_key(id))
        .map(|(_, m)| m.clone())
        .collect()
}

fn memlock_of(maps: &[MapMem], names: &[&str]) -> u64 {
    maps.iter()
        .filter(|m| names.contains(&m.name.as_str()))
        .map(|m| m.memlock)
        .sum()
}

/// One object in a map set sized to fit exactly its rows and pages.
struct Fitted {
    rows: u64,
    pages: u64,
    /// memlock of ROWS + PAGES.
    rows_pages: u64,
    /// memlock of OBJECTS + RULES (fixed sizes, shared by every object).
    fixed: u64,
    /// rows × 4 + pages × 4 + one object entry + its distinct rules × 12: what the object
    /// uses of a shared map set.
    used: u64,
}

fn fitted(n: &ObjectNumbers) -> Result<Fitted> {
    let before = maps_of_this_process();
    let mut dict = sframe_user::flatten::RuleDict::default();
    let flat = flatten(&n.table, &mut dict).context("flattening")?;
    let rows = flat.rows.len() as u32;
    let pages = flat.pages.len() as u32;
    let mut ebpf = bpf::load_with(&LoadConfig {
        max_rows: Some(rows),
        max_pages: Some(pages),
        ..LoadConfig::default()
    })
    .context("loading the BPF object")?;
    let mut kt = KernelTables::new(&mut ebpf).context("opening the table maps")?;
    let flat = flatten(&n.table, kt.rule_dict()).context("flattening")?;
    kt.load_object(&flat).context("uploading")?;
    let maps = new_maps(&before, &maps_of_this_process());
    Ok(Fitted {
        rows: u64::from(rows),
        pages: u64::from(pages),
        rows_pages: memlock_of(&maps, &[maps::ROWS, maps::PAGES]),
        fixed: memlock_of(&maps, &[maps::OBJECTS, maps::RULES]),
        used: flat.kernel_bytes() + dict.len() as u64 * size_of::<RuleEntry>() as u64,
    })
}

pub fn section(doc: &mut String, objects: &[ObjectBench]) {
    let (rows_cap, pages_cap) = table_capacity(DEFAULT_TABLE_MEMORY);
    let _ = writeln!(
        doc,
        "\n### Kernel memory as the kernel reports it\n\n\
         Method: the BPF object is loaded (maps created, no program attached) and each\n\
         object's flattened table is copied into the maps with `KernelTables::load_object`,\n\
         the path the profiler uses. *memlock* is the `memlock:` line of\n\
         `/proc/self/fdinfo/FD` of each map (what `bpftool map show` prints as\n\
         `memlock`). Array maps are preallocated: their memlock is fixed by their size, not\n\
         by what is loaded. Hence two figures per object:\n\n\
         - *fitted*: a map set whose `ROWS` and `PAGES` are sized to exactly this object's\n\
         \x20 flattened rows and page entries (`LoadConfig::max_rows`/`max_pages`), one object\n\
         \x20 per map set; their memlock per row of the object's table is the kernel's own\n\
         \x20 figure of bytes per row. It includes what two maps cost whatever their size\n\
         \x20 (each memory-mapped array's data rounded up to whole pages, plus a page of\n\
         \x20 header: 8 to 16 KiB for `ROWS` and `PAGES`), which a shared map set pays\n\
         \x20 once for all objects: small objects stay above the goal by this measure.\n\
         \x20 `OBJECTS` and `RULES` have fixed sizes whatever is loaded (shared by all\n\
         \x20 objects) and are shown apart.\n\
         - *share used*: rows × 4 + page entries × 4 + one {}-byte object entry + the\n\
         \x20 object's distinct rules × {}: what the object takes of a shared map set (the\n\
         \x20 default `--max-table-memory 20M`: {} rows, {} page entries).\n\n\
         Goal (issue 8): ≤ {GOAL_BYTES_PER_ROW} bytes per row.\n",
        size_of::<ObjectEntry>(),
        size_of::<RuleEntry>(),
        rows_cap,
        pages_cap,
    );
    doc.push_str(
        "| object | rows | flattened rows | page entries | `ROWS`+`PAGES` memlock, fitted | bytes/row | bytes/function | `OBJECTS`+`RULES` memlock (fixed) | share used | bytes/row | `.eh_frame` bytes/row |\n\
         |---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n",
    );
    for o in objects {
        let Ok(n) = &o.result else { continue };
        match fitted(n) {
            Ok(f) => {
                let per_row = |b: u64| ratio(b as f64, n.rows as f64);
                let goal = |b: u64| {
                    per_row(b).map_or_else(
                        || "–".into(),
                        |x| {
                            format!(
                                "{x:.2} ({})",
                                if x <= GOAL_BYTES_PER_ROW {
                                    "met"
                                } else {
                                    "not met"
                                }
                            )
                        },
                    )
                };
                let _ = writeln!(
                    doc,
                    "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |",
                    o.label,
                    n.rows,
                    f.rows,
                    f.pages,
                    f.rows_pages,
                    goal(f.rows_pages),
                    fmt_opt(ratio(f.rows_pages as f64, n.functions as f64), 1),
                    f.fixed,
                    f.used,
                    goal(f.used),
                    fmt_opt(
                        n.eh_frame_bytes
                            .and_then(|b| ratio(b as f64, n.rows as f64)),
                        1
                    ),
                );
            }
            Err(err) => {
                let _ = writeln!(
                    doc,
                    "| {} | not measured: {} ||||||||||",
                    o.label,
                    one_line(&format!("{err:#}"))
                );
            }
        }
    }
    match all_in_one(objects) {
        Ok(text) => doc.push_str(&text),
        Err(err) => {
            let _ = writeln!(
                doc,
                "\nThe default map set: not measured: {}.",
                one_line(&format!("{err:#}"))
            );
        }
    }
}

/// Every object in one default-size map set: the memlock of every map of the BPF
/// object, and the table maps' share in use.
fn all_in_one(objects: &[ObjectBench]) -> Result<String> {
    let (rows_cap, pages_cap) = table_capacity(DEFAULT_TABLE_MEMORY);
    let before = maps_of_this_process();
    let mut ebpf = bpf::load_with(&LoadConfig {
        max_rows: Some(rows_cap),
        max_pages: Some(pages_cap),
        ..LoadConfig::default()
    })
    .context("loading the BPF object")?;
    let mut kt = KernelTables::new(&mut ebpf).context("opening the table maps")?;
    let mut names = Vec::new();
    let mut rows = 0;
    for o in objects {
        let Ok(n) = &o.result else { continue };
        let flat = flatten(&n.table, kt.rule_dict()).context("flattening")?;
        match kt.load_object(&flat) {
            Ok(_) => {
                names.push(o.label.to_string());
                rows += n.rows;
            }
            Err(err) => names.push(format!(
                "{} (did not fit: {})",
                o.label,
                one_line(&err.to_string())
            )),
        }
    }
    let mut maps = new_maps(&before, &maps_of_this_process());
    maps.sort_by(|a, b| b.memlock.cmp(&a.memlock).then(a.name.cmp(&b.name)));
    let total: u64 = maps.iter().map(|m| m.memlock).sum();
    let tables = memlock_of(&maps, &TABLE_MAPS);
    let used = kt.bytes_in_use();
    let mut s = String::new();
    let _ = writeln!(
        s,
        "\nAll of them in one map set of the default size ({}): table maps (`ROWS`, `PAGES`,\n\
         `OBJECTS`, `RULES`) {tables} bytes of memlock, of which {used} bytes in use\n\
         (`KernelTables::bytes_in_use`: rows, page entries, object entries and rules) for\n\
         {rows} rows ({} bytes/row in use, {} bytes/row of memlock). Every map the BPF\n\
         object creates, {total} bytes of memlock in all (the profiler holds all of them;\n\
         the largest are preallocated for processes, stacks and counts, not tables):\n",
        names.join(", "),
        fmt_opt(ratio(used as f64, rows as f64), 2),
        fmt_opt(ratio(tables as f64, rows as f64), 2),
    );
    s.push_str("| map | entries | value bytes | memlock |\n|---|---:|---:|---:|\n");
    for m in &maps {
        let _ = writeln!(
            s,
            "| `{}` | {} | {} | {} |",
            m.name, m.max_entries, m.value_size, m.memlock
        );
    }
    Ok(s)
}
