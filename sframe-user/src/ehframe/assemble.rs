//! Combines the functions of all sources into one sorted, non-overlapping list:
//! `.eh_frame` first, `.debug_frame` only where `.eh_frame` leaves gaps, and synthesized
//! PLT rows where the CFI of a PLT section is missing or inexpressible.

use super::cfi::{Candidate, Origin};
use super::error::{CfiSection, FdeError, SkipReason, Warning};
use super::plt::{self, PltSection};
use super::stats::DeriveStats;
use crate::table::{Arch, FunctionRows, PcType, Row};

pub(crate) fn assemble(
    arch: Arch,
    eh: Vec<Candidate>,
    debug: Vec<Candidate>,
    plts: &[PltSection<'_>],
    stats: &mut DeriveStats,
) -> Vec<FunctionRows> {
    let mut base = dedupe(eh, stats);
    let debug = dedupe(debug, stats);
    if !debug.is_empty() {
        base = fill_gaps(base, debug, stats);
    }
    for p in plts {
        if cfi_covers(&base, p.address, p.address.saturating_add(p.size)) {
            continue;
        }
        match plt::synthesize(arch, p) {
            Some(fns) => {
                stats.plt_functions += fns.len() as u64;
                base = replace_range(base, p.address, p.address.saturating_add(p.size), fns);
            }
            None if arch == Arch::Amd64 && p.size > 0 => stats.warnings.push(Warning::PltLayout {
                section: p.kind.name(),
                address: p.address,
            }),
            None => {}
        }
    }
    base.into_iter().map(|c| c.function).collect()
}

fn drop_candidate(origin: Origin, stats: &mut DeriveStats) {
    stats.fdes_converted = stats.fdes_converted.saturating_sub(1);
    if origin.section != CfiSection::EhFrame {
        stats.fdes_from_debug_frame = stats.fdes_from_debug_frame.saturating_sub(1);
    }
    stats.skip(FdeError {
        section: origin.section,
        index: origin.index,
        offset: origin.offset,
        reason: SkipReason::Overlap,
        source: None,
    });
}

/// Sorts by start (longer first on ties) and clips each function's front to the end of
/// the previous one; functions left empty are dropped as overlaps.
fn dedupe(mut cands: Vec<Candidate>, stats: &mut DeriveStats) -> Vec<Candidate> {
    cands.sort_by(|a, b| {
        (a.function.start, std::cmp::Reverse(a.function.size))
            .cmp(&(b.function.start, std::cmp::Reverse(b.function.size)))
    });
    let mut out: Vec<Candidate> = Vec::with_capacity(cands.len());
    for c in cands {
        let prev_end = out.last().map_or(0, |p| p.function.end());
        if c.function.start >= prev_end || out.is_empty() {
            out.push(c);
            continue;
        }
        match slice(&c.function, prev_end, c.function.end()) {
            Some(function) => out.push(Candidate {
                function,
                origin: c.origin,
            }),
            None => drop_candidate(c.origin, stats),
        }
    }
    out
}

/// Adds the parts of `extra` that no function of `base` covers. Both sorted, each
/// non-overlapping.
fn fill_gaps(
    base: Vec<Candidate>,
    extra: Vec<Candidate>,
    stats: &mut DeriveStats,
) -> Vec<Candidate> {
    let mut added = Vec::new();
    for c in extra {
        let (a, b) = (c.function.start, c.function.end());
        let mut pieces = Vec::new();
        let mut cursor = a;
        let first = base.partition_point(|f| f.function.end() <= a);
        for f in &base[first..] {
            if f.function.start >= b {
                break;
            }
            if f.function.start > cursor {
                pieces.push((cursor, f.function.start));
            }
            cursor = cursor.max(f.function.end());
        }
        if cursor < b {
            pieces.push((cursor, b));
        }
        let before = added.len();
        for (pa, pb) in pieces {
            if let Some(function) = slice(&c.function, pa, pb) {
                added.push(Candidate {
                    function,
                    origin: c.origin,
                });
            }
        }
        if added.len() == before {
            drop_candidate(c.origin, stats);
        }
    }
    let mut all = base;
    all.extend(added);
    all.sort_by_key(|c| c.function.start);
    all
}

/// True when `[a, b)` is entirely covered by functions whose rows there all have a rule.
fn cfi_covers(base: &[Candidate], a: u64, b: u64) -> bool {
    let mut cursor = a;
    let first = base.partition_point(|f| f.function.end() <= a);
    for c in &base[first..] {
        let f = &c.function;
        if f.start >= b || f.start > cursor {
            break;
        }
        let lo = u32::try_from(cursor - f.start).unwrap_or(u32::MAX);
        let hi = u32::try_from(b.min(f.end()) - f.start).unwrap_or(u32::MAX);
        let all_some = f.rows.iter().enumerate().all(|(i, r)| {
            let end = f.rows.get(i + 1).map_or(f.size, |n| n.start_offset);
            // Rows outside [lo, hi) do not matter.
            end <= lo || r.start_offset >= hi || r.rule.is_some()
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

/// Replaces whatever covers `[a, b)` in `base` by `fns`, keeping the parts of functions
/// that stick out of the range.
fn replace_range(base: Vec<Candidate>, a: u64, b: u64, fns: Vec<FunctionRows>) -> Vec<Candidate> {
    let plt_origin = Origin {
        section: CfiSection::EhFrame,
        index: usize::MAX,
        offset: 0,
    };
    let mut out = Vec::with_capacity(base.len() + fns.len());
    for c in base {
        let f = &c.function;
        if f.end() <= a || f.start >= b {
            out.push(c);
            continue;
        }
        for (pa, pb) in [(f.start, a), (b, f.end())] {
            if let Some(function) = slice(f, pa, pb) {
                out.push(Candidate {
                    function,
                    origin: c.origin,
                });
            }
        }
    }
    out.extend(fns.into_iter().map(|function| Candidate {
        function,
        origin: plt_origin,
    }));
    out.sort_by_key(|c| c.function.start);
    out
}

/// The part `[a, b)` of `f` (clamped to `f`), rows rebased; `None` when empty or when
/// `f` is a PCMASK function that would have to be cut.
pub(crate) fn slice(f: &FunctionRows, a: u64, b: u64) -> Option<FunctionRows> {
    let a = a.max(f.start);
    let b = b.min(f.end());
    if a >= b {
        return None;
    }
    if a == f.start && b == f.end() {
        return Some(f.clone());
    }
    if matches!(f.pc_type, PcType::Mask { .. }) {
        return None;
    }
    let lo = u32::try_from(a - f.start).ok()?;
    let hi = u32::try_from(b - f.start).ok()?;
    let first = f
        .rows
        .partition_point(|r| r.start_offset <= lo)
        .checked_sub(1)?;
    let mut rows: Vec<Row> = Vec::new();
    for r in &f.rows[first..] {
        if r.start_offset >= hi {
            break;
        }
        rows.push(Row {
            start_offset: r.start_offset.saturating_sub(lo),
            rule: r.rule,
        });
    }
    Some(FunctionRows {
        start: a,
        size: hi - lo,
        pc_type: PcType::Inc,
        rows,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use sframe_common::{CfaRule, RegRule, RuleFlags, UnwindRule};

    fn rule(off: i32) -> Option<UnwindRule> {
        Some(UnwindRule {
            cfa: CfaRule::sp(off),
            ra: RegRule::AtCfa(-8),
            fp: RegRule::Unchanged,
            flags: RuleFlags(0),
        })
    }

    fn func(start: u64, size: u32, rows: &[(u32, i32)]) -> FunctionRows {
        FunctionRows {
            start,
            size,
            pc_type: PcType::Inc,
            rows: rows
                .iter()
                .map(|&(o, r)| Row {
                    start_offset: o,
                    rule: rule(r),
                })
                .collect(),
        }
    }

    fn cand(f: FunctionRows, section: CfiSection) -> Candidate {
        Candidate {
            function: f,
            origin: Origin {
                section,
                index: 0,
                offset: 0,
            },
        }
    }

    #[test]
    fn slice_rebases_rows() {
        let f = func(100, 20, &[(0, 8), (4, 16), (10, 8)]);
        let s = slice(&f, 106, 115).unwrap();
        assert_eq!(s.start, 106);
        assert_eq!(s.size, 9);
        assert_eq!(
            s.rows,
            vec![
                Row {
                    start_offset: 0,
                    rule: rule(16)
                },
                Row {
                    start_offset: 4,
                    rule: rule(8)
                }
            ]
        );
        assert!(slice(&f, 130, 140).is_none());
    }

    #[test]
    fn debug_frame_fills_only_gaps() {
        let mut stats = DeriveStats {
            fdes_converted: 3,
            fdes_from_debug_frame: 2,
            ..Default::default()
        };
        let eh = vec![cand(func(100, 10, &[(0, 8)]), CfiSection::EhFrame)];
        let df = vec![
            cand(func(90, 30, &[(0, 16)]), CfiSection::DebugFrame),
            cand(func(102, 4, &[(0, 16)]), CfiSection::DebugFrame),
        ];
        let out = assemble(Arch::Amd64, eh, df, &[], &mut stats);
        let spans: Vec<_> = out.iter().map(|f| (f.start, f.end())).collect();
        assert_eq!(spans, vec![(90, 100), (100, 110), (110, 120)]);
        assert_eq!(stats.fdes_skipped.get(&SkipReason::Overlap), Some(&1));
        assert_eq!(stats.fdes_converted, 2);
    }

    #[test]
    fn overlapping_eh_frame_fdes_are_clipped() {
        let mut stats = DeriveStats::default();
        let eh = vec![
            cand(func(100, 10, &[(0, 8)]), CfiSection::EhFrame),
            cand(func(105, 10, &[(0, 8), (2, 16)]), CfiSection::EhFrame),
            cand(func(100, 4, &[(0, 8)]), CfiSection::EhFrame),
        ];
        let out = assemble(Arch::Amd64, eh, vec![], &[], &mut stats);
        let spans: Vec<_> = out.iter().map(|f| (f.start, f.end())).collect();
        assert_eq!(spans, vec![(100, 110), (110, 115)]);
        assert_eq!(
            out[1].rows,
            vec![Row {
                start_offset: 0,
                rule: rule(16)
            }]
        );
    }
}
