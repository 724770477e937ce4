//! Section 3b: the SFrame reader's throughput and `find_fre` lookups.

use std::fmt::Write as _;

use anyhow::{Context as _, Result, bail};
use sframe_user::{
    sframe::{Section, WriteOptions, WriteVersion, write_section},
    table::{TableBuilder, UnwindTable},
};

use crate::{
    Args,
    heap::{Allocs, count_allocs},
    objects::ObjectBench,
    util::{Rng, fmt_opt, fmt_stats, median, pct, ratio, time_ms},
};

/// Rows the SFrame reader benchmark section holds at least.
const READER_MIN_ROWS: usize = 100_000;
/// PCs looked up per `find_fre` timing run.
const LOOKUPS: usize = 200_000;
/// Goals of issues 3 and 4, printed beside the figures.
const GOAL_READER_MBPS: f64 = 500.0;
const GOAL_LOOKUP_NS: f64 = 100.0;

// ---------------------------------------------------------------------------------------
// 3b. SFrame reader

struct ReaderBench {
    origin: String,
    copies: usize,
    rows: usize,
    functions: u32,
    bytes: usize,
    reps: usize,
    /// Open + validate + iterate every function, row and rule; no allocation per row.
    iterate_ms: Vec<f64>,
    /// Open + validate only, and the same through the careful reference decoders.
    open_ms: Vec<f64>,
    open_reference_ms: Vec<f64>,
    /// Open + validate + `to_table`.
    to_table_ms: Vec<f64>,
    /// Heap allocations of one (untimed) run of each measurement, in the order
    /// iterate, open, reference, `to_table`.
    allocs: [Allocs; 4],
    lookups: Vec<LookupBench>,
}

/// `find_fre` on one section, and libsframe's search and scan on the same PCs.
struct LookupBench {
    what: String,
    bytes: usize,
    rows: usize,
    fast_ns: Vec<f64>,
    reference_ns: Vec<f64>,
    hits: usize,
    /// Both gave the same answer for every PC.
    agree: bool,
}

/// `table` repeated `copies` times, each copy moved past the previous one.
fn replicate(table: &UnwindTable, copies: usize) -> UnwindTable {
    let functions = table.functions();
    let lo = functions.first().map_or(0, |f| f.start);
    let hi = functions.iter().map(|f| f.end()).max().unwrap_or(lo);
    let span = (hi - lo + 0xffff) & !0xffff;
    let mut b = TableBuilder::new(table.arch, table.source);
    b.reserve(functions.len() * copies, table.row_count() * copies);
    for c in 0..copies as u64 {
        for f in functions {
            b.push(f.start + c * span, f.size, f.pc_type, table.rows(f));
        }
    }
    b.finish()
}

fn parse(bytes: &[u8]) -> Result<Section<'_>> {
    Section::parse(bytes, 0).map_err(|e| anyhow::anyhow!("parse: {e}"))
}

/// Open + validate + iterate every function, row and rule; a checksum of the rules.
fn open_validate_iterate(bytes: &[u8]) -> Result<i64> {
    let section = parse(bytes)?;
    let mut checksum = 0i64;
    // Internal iteration: the row iterator's `fold` runs one loop per FRE
    // start-address width.
    section.functions().for_each(|fde| {
        section.rows(&fde).for_each(|fre| {
            let rule = section.rule(&fde, &fre);
            checksum = checksum.wrapping_add(i64::from(rule.cfa.offset));
        })
    });
    Ok(checksum)
}

/// The allocations of one run of each measurement (see [`ReaderBench::allocs`]).
fn count_reader_allocs(bytes: &[u8]) -> Result<[Allocs; 4]> {
    let (checksum, iterate) = count_allocs(|| open_validate_iterate(bytes));
    std::hint::black_box(checksum?);
    let (section, open) = count_allocs(|| parse(bytes).map(drop));
    section?;
    let (section, reference) = count_allocs(|| Section::parse_reference(bytes, 0).map(drop));
    section.map_err(|e| anyhow::anyhow!("parse: {e}"))?;
    let (table, to_table) = count_allocs(|| {
        parse(bytes)?
            .to_table()
            .map(drop)
            .map_err(|e| anyhow::anyhow!("to_table: {e}"))
    });
    table?;
    Ok([iterate, open, reference, to_table])
}

fn write_v3(table: &UnwindTable) -> Result<(Vec<u8>, u32)> {
    write_section(
        table,
        &WriteOptions {
            version: WriteVersion::V3,
            section_vaddr: 0,
        },
    )
    .map(|(b, s)| (b, s.fdes))
    .map_err(|e| anyhow::anyhow!("writing the section: {e}"))
}

fn reader_bench(objects: &[ObjectBench], args: &Args) -> Result<ReaderBench> {
    let reps = if args.quick { 7 } else { 21 };
    // The larger of libc's and python3's tables.
    let source = objects
        .iter()
        .filter(|o| matches!(o.label, "libc.so.6" | "python3"))
        .filter_map(|o| o.result.as_ref().ok().map(|n| (o, n)))
        .max_by_key(|(_, n)| n.rows)
        .context("neither libc nor python3 has a table")?;
    let rows = source.1.rows.max(1);
    let copies = READER_MIN_ROWS.div_ceil(rows);
    let table = replicate(&source.1.table, copies);
    let (bytes, functions) = write_v3(&table)?;
    let allocs = count_reader_allocs(&bytes)?;
    let mut r = ReaderBench {
        origin: format!("{} (`{}`)", source.0.label, source.0.path.display()),
        copies,
        rows: table.row_count(),
        functions,
        bytes: bytes.len(),
        reps,
        iterate_ms: Vec::new(),
        open_ms: Vec::new(),
        open_reference_ms: Vec::new(),
        to_table_ms: Vec::new(),
        allocs,
        lookups: Vec::new(),
    };
    for _ in 0..reps {
        let (checksum, ms) = time_ms(|| open_validate_iterate(&bytes));
        std::hint::black_box(checksum?);
        r.iterate_ms.push(ms);
        let (section, ms) = time_ms(|| parse(&bytes));
        std::hint::black_box(section?);
        r.open_ms.push(ms);
        let (section, ms) = time_ms(|| Section::parse_reference(&bytes, 0));
        std::hint::black_box(section.map_err(|e| anyhow::anyhow!("parse: {e}"))?);
        r.open_reference_ms.push(ms);
        let (back, ms) = time_ms(|| {
            parse(&bytes)?
                .to_table()
                .map_err(|e| anyhow::anyhow!("to_table: {e}"))
        });
        let back = back?;
        r.to_table_ms.push(ms);
        if back.row_count() != r.rows {
            bail!("to_table gave {} rows of {}", back.row_count(), r.rows);
        }
    }
    r.lookups.push(lookup_bench(
        format!("the section above ({} FDEs)", r.functions),
        &table,
        &bytes,
        reps.min(9),
    )?);
    if let Some(libc) = objects
        .iter()
        .find(|o| o.label == "libc.so.6")
        .and_then(|o| o.result.as_ref().ok())
    {
        let (libc_bytes, fdes) = write_v3(&libc.table)?;
        r.lookups.push(lookup_bench(
            format!("libc's table as a v3 section ({fdes} FDEs)"),
            &libc.table,
            &libc_bytes,
            reps.min(9),
        )?);
    }
    Ok(r)
}

fn lookup_bench(
    what: String,
    table: &UnwindTable,
    bytes: &[u8],
    reps: usize,
) -> Result<LookupBench> {
    let section = parse(bytes)?;
    let fns = table.functions();
    if fns.is_empty() {
        bail!("no functions");
    }
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    let pcs: Vec<u64> = (0..LOOKUPS)
        .map(|_| {
            let f = &fns[(rng.next() % fns.len() as u64) as usize];
            f.start + rng.next() % u64::from(f.size.max(1))
        })
        .collect();
    let reference = |pc: u64| {
        section
            .find_fre_raw_linear(pc)
            .map(|(fde, fre)| (fde.index, section.rule(&fde, &fre)))
    };
    let agree = pcs
        .iter()
        .all(|&pc| section.find_fre(pc).map(|f| (f.function, f.rule)) == reference(pc));
    let mut out = LookupBench {
        what,
        bytes: bytes.len(),
        rows: table.row_count(),
        fast_ns: Vec::new(),
        reference_ns: Vec::new(),
        hits: 0,
        agree,
    };
    let per_pc = |ms: f64| ms * 1e6 / LOOKUPS as f64;
    for _ in 0..reps {
        let (hits, ms) = time_ms(|| {
            pcs.iter()
                .filter(|&&pc| std::hint::black_box(section.find_fre(pc)).is_some())
                .count()
        });
        out.hits = hits;
        out.fast_ns.push(per_pc(ms));
        let (_, ms) = time_ms(|| {
            pcs.iter()
                .filter(|&&pc| std::hint::black_box(reference(pc)).is_some())
                .count()
        });
        out.reference_ns.push(per_pc(ms));
    }
    Ok(out)
}

fn reader_section(doc: &mut String, r: &ReaderBench) {
    let mb = r.bytes as f64 / 1e6;
    let mbps = |v: &[f64]| ratio(mb, median(v) / 1e3);
    let ns_row = |v: &[f64]| ratio(median(v) * 1e6, r.rows as f64);
    let _ = writeln!(
        doc,
        "Method: the writer encodes the derived table of {} ({} cop{}, each moved past the\n\
         previous, to reach ≥ {READER_MIN_ROWS} rows) as one version 3 section of {} bytes,\n\
         {} FDEs and {} rows. Each figure is the median (min–max) of {} runs of wall-clock\n\
         time; MB/s are section bytes per second.\n\n\
         - *open + validate + iterate*: `Section::parse` (every check of the reader, one\n\
         \x20 pass), then `functions()`, `rows()` (both iterated with `for_each`) and `rule()`\n\
         \x20 on every FDE and FRE (nothing allocated per FDE or FRE).\n\
         - *reference validation*: `Section::parse_reference`, the careful decoders that\n\
         \x20 name the failed check, and that the fast pass falls back to on malformed input.\n\
         - *find_fre*: {LOOKUPS} pseudo-random PCs inside the functions; beside it, the same\n\
         \x20 PCs through libsframe's algorithm as written (`find_fde_libsframe`, then the\n\
         \x20 linear FRE scan of `find_fre_raw_linear`) on the same section.\n\
         - *allocations*, *bytes allocated*: heap allocations (a growing `realloc`\n\
         \x20 included) and the bytes they asked for during one more, untimed run, counted\n\
         \x20 by this binary's allocator for the running thread.\n\n\
         Goals (issue 3): open + validate + iterate ≥ {GOAL_READER_MBPS} MB/s and no\n\
         allocation per row (at most one per function; ideally a handful); `find_fre`\n\
         < {GOAL_LOOKUP_NS} ns per PC on libc-sized sections (O(log n), no allocation).\n",
        r.origin,
        r.copies,
        if r.copies == 1 { "y" } else { "ies" },
        r.bytes,
        r.functions,
        r.rows,
        r.reps,
    );
    doc.push_str(
        "| measurement | ms | MB/s | ns/row | allocations | bytes allocated | goal |\n\
         |---|---:|---:|---:|---:|---:|---|\n",
    );
    let met = |ok: bool| if ok { "met" } else { "not met" };
    let [
        iterate_allocs,
        open_allocs,
        reference_allocs,
        to_table_allocs,
    ] = r.allocs;
    let goal = format!(
        "≥ {GOAL_READER_MBPS} MB/s: {}; ≤ 1 allocation per function ({}): {}",
        met(mbps(&r.iterate_ms).is_some_and(|x| x >= GOAL_READER_MBPS)),
        r.functions,
        met(iterate_allocs.count <= u64::from(r.functions)),
    );
    for (name, v, allocs, goal) in [
        (
            "open + validate + iterate",
            &r.iterate_ms,
            iterate_allocs,
            goal,
        ),
        ("open + validate", &r.open_ms, open_allocs, String::new()),
        (
            "open + reference validation",
            &r.open_reference_ms,
            reference_allocs,
            "(baseline)".into(),
        ),
        (
            "open + validate + `to_table`",
            &r.to_table_ms,
            to_table_allocs,
            "(builds the table: O(rows) by design)".into(),
        ),
    ] {
        let _ = writeln!(
            doc,
            "| {name} | {} | {} | {} | {} | {} | {goal} |",
            fmt_stats(v, 2),
            fmt_opt(mbps(v), 0),
            fmt_opt(ns_row(v), 1),
            allocs.count,
            allocs.bytes,
        );
    }
    doc.push_str(
        "\n| `find_fre` on | bytes | rows | ns/PC | libsframe's algorithm, ns/PC | PCs found | same answers | goal |\n\
         |---|---:|---:|---:|---:|---:|---|---|\n",
    );
    for l in &r.lookups {
        let ns = median(&l.fast_ns);
        let _ = writeln!(
            doc,
            "| {} | {} | {} | {} | {} | {} | {} | < {GOAL_LOOKUP_NS} ns/PC: {} |",
            l.what,
            l.bytes,
            l.rows,
            fmt_stats(&l.fast_ns, 0),
            fmt_stats(&l.reference_ns, 0),
            pct(l.hits as f64, LOOKUPS as f64),
            if l.agree { "yes" } else { "NO" },
            if ns < GOAL_LOOKUP_NS {
                "met"
            } else {
                "not met"
            },
        );
    }
}

pub(crate) fn section(doc: &mut String, objects: &[ObjectBench], args: &Args) {
    doc.push_str("\n### SFrame reader throughput\n\n");
    match reader_bench(objects, args) {
        Ok(r) => reader_section(doc, &r),
        Err(err) => {
            let _ = writeln!(doc, "Not measured: {err:#}.");
        }
    }
}

#[cfg(test)]
mod tests {
    use sframe_common::{CfaRule, RegRule, RuleFlags, UnwindRule};
    use sframe_user::table::{Arch, PcType, Row, Source};

    use super::*;

    /// On a section of 5,000 functions and 100,000 rows, open + validate + iterate
    /// allocates a handful of times, not per row (nor per function); the counter does
    /// see the rows `to_table` allocates.
    #[test]
    fn open_validate_iterate_allocates_no_memory_per_row() {
        let mut b = TableBuilder::new(Arch::Amd64, Source::Synthesized);
        for f in 0..5_000u64 {
            let rows = (0..20u32).map(|i| Row {
                start_offset: i * 4,
                rule: Some(UnwindRule {
                    cfa: CfaRule::sp(8 + 8 * (i as i32 % 5)),
                    ra: RegRule::AtCfa(-8),
                    fp: RegRule::Unchanged,
                    flags: RuleFlags::default(),
                }),
            });
            b.push(0x10_000 + f * 0x100, 0x80, PcType::Inc, rows);
        }
        let table = b.finish();
        let (bytes, functions) = write_v3(&table).unwrap();
        assert_eq!(functions, 5_000);
        let [iterate, open, _, to_table] = count_reader_allocs(&bytes).unwrap();
        println!("iterate {iterate:?} open {open:?} to_table {to_table:?}");
        assert!(iterate.count <= 32, "{iterate:?}");
        assert_eq!(iterate, open, "iteration itself allocates");
        // Bounded by the counts checked at open: the address index (at most 2 buckets
        // of 4 bytes a function) and the lookup checkpoints (16 bytes each: one every
        // 16 rows of a function with more than 16, from its first), whose vector grows
        // by doubling (each growth counted in full: at most 4 times the final size).
        let checkpoints = 100_000 / 16 + 5_000;
        assert!(
            iterate.bytes <= 8 * 5_000 + 4 * 16 * checkpoints,
            "{iterate:?}"
        );
        assert!(to_table.bytes >= 100_000 * 6, "{to_table:?}");
    }
}
