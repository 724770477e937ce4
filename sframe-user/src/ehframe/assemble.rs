//! Combines the functions of all sources into one sorted, non-overlapping list:
//! `.eh_frame` first, `.debug_frame` only where `.eh_frame` leaves gaps, and synthesized
//! PLT rows where the CFI of a PLT section is missing or inexpressible.
//!
//! Functions are descriptors into the deriver's [`TableBuilder`]: cutting one pushes
//! the rows of the part kept, and rows left unused are dropped when the table is made.

use super::cfi::{ADDRESS_LIMIT, Candidate, Origin};
use super::error::{CfiSection, FdeError, SkipReason, Warning};
use super::plt::{self, PltSection};
use super::stats::DeriveStats;
use crate::table::{Arch, Function, PcType, TableBuilder};

/// `debug` came from `debug_section` (the object's `.debug_frame` or its separate
/// debug file's).
pub(crate) fn assemble(
    arch: Arch,
    builder: &mut TableBuilder,
    eh: Vec<Candidate>,
    (debug, debug_section): (Vec<Candidate>, CfiSection),
    plts: &[PltSection<'_>],
    stats: &mut DeriveStats,
) -> Vec<Function> {
    let mut base = dedupe(builder, eh, CfiSection::EhFrame, stats);
    let debug = dedupe(builder, debug, debug_section, stats);
    if !debug.is_empty() {
        base = fill_gaps(builder, base, (debug, debug_section), stats);
    }
    for p in plts {
        if p.address.saturating_add(p.size) > ADDRESS_LIMIT {
            stats.warnings.push(Warning::PltLayout {
                section: p.kind.name(),
                address: p.address,
            });
            continue;
        }
        if cfi_covers(builder, &base, p.address, p.address.saturating_add(p.size)) {
            continue;
        }
        match plt::synthesize(arch, p) {
            Some(fns) => {
                stats.plt_functions += fns.len() as u64;
                let fns = fns
                    .iter()
                    .map(|f| {
                        let span = builder.push_rows(f.rows.iter().copied());
                        Function::from_parts(f.start, f.size, f.pc_type, span)
                    })
                    .collect();
                base = replace_range(
                    builder,
                    base,
                    p.address,
                    p.address.saturating_add(p.size),
                    fns,
                );
            }
            None if arch == Arch::Amd64 && p.size > 0 => stats.warnings.push(Warning::PltLayout {
                section: p.kind.name(),
                address: p.address,
            }),
            None => {}
        }
    }
    // In place: a candidate is the size of a function.
    base.into_iter().map(|c| c.function()).collect()
}

fn drop_candidate(origin: Origin, stats: &mut DeriveStats) {
    stats.fdes_converted = stats.fdes_converted.saturating_sub(1);
    if origin.section != CfiSection::EhFrame {
        stats.fdes_from_debug_frame = stats.fdes_from_debug_frame.saturating_sub(1);
    }
    stats.skip(FdeError {
        section: origin.section,
        index: origin.index as usize,
        offset: u64::from(origin.offset),
        reason: SkipReason::Overlap,
        source: None,
    });
}

/// Sorts by start (longer first on ties) and clips each function's front to the end of
/// the previous one; functions left empty are dropped as overlaps.
fn dedupe(
    builder: &mut TableBuilder,
    mut cands: Vec<Candidate>,
    section: CfiSection,
    stats: &mut DeriveStats,
) -> Vec<Candidate> {
    // Equal ranges keep their enumeration order (the first listed wins), without the
    // buffer a stable sort allocates.
    cands.sort_unstable_by_key(|c| (c.start(), std::cmp::Reverse(c.end()), c.index()));
    // Compacted in place: `kept` never passes the candidate being looked at.
    let mut kept = 0usize;
    for i in 0..cands.len() {
        let Some(&c) = cands.get(i) else {
            break;
        };
        let prev = kept.checked_sub(1).and_then(|k| cands.get(k));
        let Some(prev_end) = prev.map(Candidate::end).filter(|&e| c.start() < e) else {
            if let Some(slot) = cands.get_mut(kept) {
                *slot = c;
            }
            kept += 1;
            continue;
        };
        match slice(builder, &c.function(), prev_end, c.end())
            .and_then(|function| c.with_function(&function))
        {
            Some(cut) => {
                if let Some(slot) = cands.get_mut(kept) {
                    *slot = cut;
                }
                kept += 1;
            }
            None => drop_candidate(c.origin(section), stats),
        }
    }
    cands.truncate(kept);
    cands
}

/// Adds the parts of `extra` that no function of `base` covers. Both sorted, each
/// non-overlapping.
fn fill_gaps(
    builder: &mut TableBuilder,
    base: Vec<Candidate>,
    (extra, section): (Vec<Candidate>, CfiSection),
    stats: &mut DeriveStats,
) -> Vec<Candidate> {
    let mut added = Vec::new();
    for c in extra {
        let (a, b) = (c.start(), c.end());
        let mut pieces = Vec::new();
        let mut cursor = a;
        let first = base.partition_point(|f| f.end() <= a);
        for f in base.get(first..).unwrap_or_default() {
            if f.start() >= b {
                break;
            }
            if f.start() > cursor {
                pieces.push((cursor, f.start()));
            }
            cursor = cursor.max(f.end());
        }
        if cursor < b {
            pieces.push((cursor, b));
        }
        let before = added.len();
        for (pa, pb) in pieces {
            if let Some(piece) =
                slice(builder, &c.function(), pa, pb).and_then(|f| c.with_function(&f))
            {
                added.push(piece);
            }
        }
        if added.len() == before {
            drop_candidate(c.origin(section), stats);
        }
    }
    let mut all = base;
    all.extend(added);
    all.sort_unstable_by_key(Candidate::start);
    all
}

/// True when `[a, b)` is entirely covered by functions whose rows there all have a rule.
fn cfi_covers(builder: &TableBuilder, base: &[Candidate], a: u64, b: u64) -> bool {
    let mut cursor = a;
    let first = base.partition_point(|f| f.end() <= a);
    for c in base.get(first..).unwrap_or_default() {
        let f = c.function();
        if f.start >= b || f.start > cursor {
            break;
        }
        let lo = u32::try_from(cursor - f.start).unwrap_or(u32::MAX);
        let hi = u32::try_from(b.min(f.end()) - f.start).unwrap_or(u32::MAX);
        let rows = builder.rows_of(&f);
        let all_some = rows.iter().enumerate().all(|(i, r)| {
            let end = rows.get(i + 1).map_or(f.size, |n| n.start_offset());
            // Rows outside [lo, hi) do not matter.
            end <= lo || r.start_offset() >= hi || TableBuilder::has_rule(r)
        });
        if !all_some || matches!(f.pc_type, PcType::Mask { .. }) {
            return false;
        }
        cursor = f.end();
        if cursor >= b {
            return true;
        }
    }
    cursor >= b
}

/// Most candidates one PLT section adds to the list: its synthesized functions (PLT0
/// and the block of entries) and the two parts of functions that stick out of it. The
/// deriver reserves this much room per PLT section up front, so that
/// [`replace_range`] never reallocates the candidate list.
pub(crate) const ROOM_PER_PLT: usize = 4;

/// Replaces whatever covers `[a, b)` in `base` (sorted, non-overlapping) by `fns`,
/// keeping the parts of functions that stick out of the range. In place: the list
/// grows by at most [`ROOM_PER_PLT`].
fn replace_range(
    builder: &mut TableBuilder,
    mut base: Vec<Candidate>,
    a: u64,
    b: u64,
    mut fns: Vec<Function>,
) -> Vec<Candidate> {
    // Non-overlapping and sorted by start, so sorted by end too.
    let lo = base.partition_point(|c| c.end() <= a);
    let hi = lo
        + base
            .get(lo..)
            .map_or(0, |rest| rest.partition_point(|c| c.start() < b));
    let mut front = None;
    let mut back = None;
    let last = hi.checked_sub(1).and_then(|h| base.get(h));
    if let (true, Some(&first), Some(&last)) = (lo < hi, base.get(lo), last) {
        front = slice(builder, &first.function(), first.start(), a)
            .and_then(|f| first.with_function(&f));
        back = slice(builder, &last.function(), b, last.end()).and_then(|f| last.with_function(&f));
    }
    fns.sort_unstable_by_key(|f| f.start);
    // Synthesized functions have no FDE: index and offset say so.
    let new = front
        .into_iter()
        .chain(
            fns.iter()
                .filter_map(|f| Candidate::new(f, u32::MAX, u32::MAX)),
        )
        .chain(back);
    base.splice(lo..hi, new);
    base
}

/// The part `[a, b)` of `f` (clamped to `f`), its rows rebased and pushed anew;
/// `None` when empty or when `f` is a PCMASK function that would have to be cut.
pub(crate) fn slice(builder: &mut TableBuilder, f: &Function, a: u64, b: u64) -> Option<Function> {
    let a = a.max(f.start);
    let b = b.min(f.end());
    if a >= b {
        return None;
    }
    if a == f.start && b == f.end() {
        return Some(*f);
    }
    if matches!(f.pc_type, PcType::Mask { .. }) {
        return None;
    }
    let lo = u32::try_from(a - f.start).ok()?;
    let hi = u32::try_from(b - f.start).ok()?;
    let rows = builder.rows_of(f);
    let first = rows
        .partition_point(|r| r.start_offset() <= lo)
        .checked_sub(1)?;
    let kept: Vec<_> = rows
        .get(first..)?
        .iter()
        .take_while(|r| r.start_offset() < hi)
        .map(|r| r.at(r.start_offset().saturating_sub(lo)))
        .collect();
    let span = builder.push_compact(kept);
    Some(Function::from_parts(a, hi - lo, PcType::Inc, span))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::table::{FunctionRows, Row, Source, UnwindTable};
    use sframe_common::{CfaRule, RegRule, RuleFlags, UnwindRule};

    fn rule(off: i32) -> Option<UnwindRule> {
        Some(UnwindRule {
            cfa: CfaRule::sp(off),
            ra: RegRule::AtCfa(-8),
            fp: RegRule::Unchanged,
            flags: RuleFlags(0),
        })
    }

    fn rows(rows: &[(u32, i32)]) -> Vec<Row> {
        rows.iter()
            .map(|&(o, r)| Row {
                start_offset: o,
                rule: rule(r),
            })
            .collect()
    }

    fn func(b: &mut TableBuilder, start: u64, size: u32, r: &[(u32, i32)]) -> Function {
        let span = b.push_rows(rows(r));
        Function::from_parts(start, size, PcType::Inc, span)
    }

    fn cand(b: &mut TableBuilder, start: u64, size: u32, r: &[(u32, i32)]) -> Candidate {
        let f = func(b, start, size, r);
        Candidate::new(&f, 0, 0).unwrap()
    }

    fn table(b: TableBuilder, fns: Vec<Function>) -> Vec<FunctionRows> {
        let t: UnwindTable = b.finish_with(Source::EhFrame, fns);
        t.to_function_rows()
    }

    #[test]
    fn candidates_pack_into_a_function_and_read_back() {
        assert_eq!(size_of::<Candidate>(), 24);
        let mut b = TableBuilder::new(Arch::Amd64, Source::EhFrame);
        let f = func(&mut b, (1 << 48) - 0x20, 0x20, &[(0, 8)]);
        let c = Candidate::new(&f, 0x3f_ffff, 0xdead_beef).unwrap();
        let back = c.function();
        assert!(back.same_range(&f));
        assert_eq!(back.row_span(), f.row_span());
        let o = c.origin(CfiSection::DebugFrame);
        assert_eq!((o.index, o.offset), (0x3f_ffff, 0xdead_beef));
        // Indices saturate; PCMASK rep sizes survive; out-of-range functions do not fit.
        assert_eq!(Candidate::new(&f, u32::MAX, 0).unwrap().index(), 0x3f_ffff);
        let plt = Function::from_parts(0x1000, 0x40, PcType::Mask { rep_size: 16 }, (7, 1));
        assert!(
            Candidate::new(&plt, 0, 0)
                .unwrap()
                .function()
                .same_range(&plt)
        );
        let high = Function::from_parts(1 << 48, 0x10, PcType::Inc, (0, 1));
        assert!(Candidate::new(&high, 0, 0).is_none());
        let many = Function::from_parts(0x1000, 0x10, PcType::Inc, (1 << 26, 1));
        assert!(Candidate::new(&many, 0, 0).is_none());
    }

    #[test]
    fn slice_rebases_rows() {
        let mut b = TableBuilder::new(Arch::Amd64, Source::EhFrame);
        let f = func(&mut b, 100, 20, &[(0, 8), (4, 16), (10, 8)]);
        let s = slice(&mut b, &f, 106, 115).unwrap();
        assert_eq!((s.start, s.size), (106, 9));
        assert!(slice(&mut b, &f, 130, 140).is_none());
        let out = table(b, vec![s]);
        assert_eq!(out[0].rows, rows(&[(0, 16), (4, 8)]));
    }

    #[test]
    fn debug_frame_fills_only_gaps() {
        let mut stats = DeriveStats {
            fdes_converted: 3,
            fdes_from_debug_frame: 2,
            ..Default::default()
        };
        let mut b = TableBuilder::new(Arch::Amd64, Source::EhFrame);
        let eh = vec![cand(&mut b, 100, 10, &[(0, 8)])];
        let df = vec![
            cand(&mut b, 90, 30, &[(0, 16)]),
            cand(&mut b, 102, 4, &[(0, 16)]),
        ];
        let out = assemble(
            Arch::Amd64,
            &mut b,
            eh,
            (df, CfiSection::DebugFrame),
            &[],
            &mut stats,
        );
        let spans: Vec<_> = out.iter().map(|f| (f.start, f.end())).collect();
        assert_eq!(spans, vec![(90, 100), (100, 110), (110, 120)]);
        assert_eq!(stats.fdes_skipped.get(&SkipReason::Overlap), Some(&1));
        assert_eq!(stats.fdes_converted, 2);
        let out = table(b, out);
        assert_eq!(out[0].rows, rows(&[(0, 16)]));
        assert_eq!(out[1].rows, rows(&[(0, 8)]));
        assert_eq!(out[2].rows, rows(&[(0, 16)]));
    }

    #[test]
    fn overlapping_eh_frame_fdes_are_clipped() {
        let mut stats = DeriveStats::default();
        let mut b = TableBuilder::new(Arch::Amd64, Source::EhFrame);
        let eh = vec![
            cand(&mut b, 100, 10, &[(0, 8)]),
            cand(&mut b, 105, 10, &[(0, 8), (2, 16)]),
            cand(&mut b, 100, 4, &[(0, 8)]),
        ];
        let out = assemble(
            Arch::Amd64,
            &mut b,
            eh,
            (vec![], CfiSection::DebugFrame),
            &[],
            &mut stats,
        );
        let spans: Vec<_> = out.iter().map(|f| (f.start, f.end())).collect();
        assert_eq!(spans, vec![(100, 110), (110, 115)]);
        let out = table(b, out);
        assert_eq!(out[1].rows, rows(&[(0, 16)]));
        // Rows of the dropped and clipped candidates are gone from the table.
        assert_eq!(out.iter().map(|f| f.rows.len()).sum::<usize>(), 2);
    }
}
