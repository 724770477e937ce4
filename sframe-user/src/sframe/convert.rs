//! Between tables and SFrame sections, where a version cannot hold everything: writing
//! what a version can store ([`write_storable`]) and comparing a section with a table
//! derived from the same object's CFI ([`compare_tables`]), as far as the section's
//! version can express the derived rules.

use std::collections::HashMap;

use sframe_common::{RuleFlags, UnwindRule};

use super::error::WriteError;
use super::write::{WriteOptions, WriteStats, WriteVersion, stores_rule, write_section};
use crate::table::{Arch, FunctionRows, PcType, UnwindTable, row_ranges};

/// A section written by [`write_storable`], and what was left out of it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StorableSection {
    /// The section's bytes.
    pub bytes: Vec<u8>,
    /// What the writer did.
    pub stats: WriteStats,
    /// Rows whose rule the version cannot store, written as "no rule" ranges (the FDE
    /// ends there).
    pub dropped_rows: u64,
    /// Bytes of code those rows covered (every repetition of a PCMASK row).
    pub dropped_bytes: u64,
    /// Functions left out entirely: PCMASK functions with a row the version cannot
    /// store (a block pattern cannot be cut), and functions the writer rejects
    /// (inconsistent flags, limits).
    pub dropped_functions: u64,
}

/// Most times [`write_storable`] leaves a rejected function out and writes again (each
/// try writes the whole section).
const MAX_WRITE_TRIES: usize = 256;

/// Writes `table` as an SFrame section of `version` for `section_vaddr`, turning the
/// rows whose rule the version cannot store ([`stores_rule`]) into "no rule" ranges and
/// leaving out the functions the writer rejects. The error is the writer's when it is
/// not about one function, or when more than 256 functions were rejected.
pub fn write_storable(
    table: &UnwindTable,
    version: WriteVersion,
    section_vaddr: u64,
) -> Result<StorableSection, WriteError> {
    let mut storable: HashMap<UnwindRule, bool> = HashMap::new();
    let mut fns = table.to_function_rows();
    let (mut dropped_rows, mut dropped_bytes, mut dropped_functions) = (0u64, 0u64, 0u64);
    fns.retain_mut(|f| {
        let mut lost = false;
        let spans = row_bytes(f);
        for (i, row) in f.rows.iter_mut().enumerate() {
            if let Some(rule) = row.rule {
                let ok = *storable
                    .entry(rule)
                    .or_insert_with(|| stores_rule(table.arch, version, &rule));
                if !ok {
                    row.rule = None;
                    dropped_rows += 1;
                    dropped_bytes += spans.get(i).copied().unwrap_or(0);
                    lost = true;
                }
            }
        }
        if lost && matches!(f.pc_type, PcType::Mask { .. }) {
            dropped_functions += 1;
            return false;
        }
        true
    });
    // The rules are filtered above; what remains (per-function consistency, limits) is
    // handled by leaving the function out and writing again.
    let opts = WriteOptions {
        version,
        section_vaddr,
    };
    let mut tries = 0;
    loop {
        let t = UnwindTable::from_functions(table.arch, table.source, fns.iter().cloned());
        let e = match write_section(&t, &opts) {
            Ok((bytes, stats)) => {
                return Ok(StorableSection {
                    bytes,
                    stats,
                    dropped_rows,
                    dropped_bytes,
                    dropped_functions,
                });
            }
            Err(e) => e,
        };
        tries += 1;
        match failing_function(&e) {
            Some(fi) if fi < fns.len() && tries < MAX_WRITE_TRIES => {
                fns.remove(fi);
                dropped_functions += 1;
            }
            _ => return Err(e),
        }
    }
}

fn failing_function(e: &WriteError) -> Option<usize> {
    match *e {
        WriteError::Unrepresentable { function, .. }
        | WriteError::BadRowOrder { function, .. }
        | WriteError::InconsistentFunction { function, .. }
        | WriteError::NoneRowInMaskFunction { function, .. }
        | WriteError::StartOutOfRange { function }
        | WriteError::TooManyRows { function, .. } => Some(function),
        WriteError::TooLarge { .. } => None,
    }
}

/// Code bytes covered by each row of `f` (all repetitions for PCMASK).
fn row_bytes(f: &FunctionRows) -> Vec<u64> {
    f.rows
        .iter()
        .enumerate()
        .map(|(i, r)| {
            let next = f.rows.get(i + 1).map(|n| n.start_offset);
            row_ranges(f.size, f.pc_type, r.start_offset, next)
                .map(|(lo, hi)| hi - lo)
                .sum()
        })
        .collect()
}

/// Whether an SFrame section of `version` (1 to 3) can express `rule`: what the writer
/// stores in v2 and v3 ([`stores_rule`]); v1 is v2 without zero-word (outermost) rows.
pub fn section_stores_rule(arch: Arch, version: u8, rule: &UnwindRule) -> bool {
    match version {
        1 => !rule.is_outermost() && stores_rule(arch, WriteVersion::V2, rule),
        2 => stores_rule(arch, WriteVersion::V2, rule),
        _ => stores_rule(arch, WriteVersion::V3, rule),
    }
}

/// Rules equal as far as `version` stores them.
fn same(version: u8, sf: &UnwindRule, derived: &UnwindRule) -> bool {
    if sf.is_outermost() || derived.is_outermost() {
        // Zero-word rows store no CFA offset or FP rule.
        return sf.is_outermost() && derived.is_outermost();
    }
    let mask = |r: &UnwindRule| {
        let mut r = *r;
        if version < 3 {
            r.flags = RuleFlags(r.flags.0 & !RuleFlags::SIGNAL);
        }
        r
    };
    mask(sf) == mask(derived)
}

/// A range of code where a section and a derived table disagree.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Disagreement {
    /// First address of the range.
    pub start: u64,
    /// Address after the range.
    pub end: u64,
    /// The section's rule there.
    pub sframe: UnwindRule,
    /// The derived table's rule there.
    pub derived: UnwindRule,
}

/// What [`compare_tables`] found, in bytes of code.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Comparison {
    /// Ranges where both have a rule the version expresses and the rules differ, in
    /// address order (neighbouring ranges with the same two rules merged).
    pub disagreements: Vec<Disagreement>,
    /// Bytes in [`Comparison::disagreements`].
    pub disagreeing_bytes: u64,
    /// Bytes where both have a rule the version expresses (agreeing or not).
    pub compared_bytes: u64,
    /// Bytes both cover where one has no rule or the derived rule is one the version
    /// cannot express.
    pub not_comparable_bytes: u64,
    /// Bytes the section covers and the derived table does not.
    pub sframe_only_bytes: u64,
}

/// Most PCMASK blocks expanded per function (a PLT has a few thousand at most).
const MAX_BLOCKS: usize = 1 << 20;

/// A PC range with one rule (or an explicit "no rule").
#[derive(Clone, Copy, Debug)]
struct Span {
    start: u64,
    end: u64,
    rule: Option<UnwindRule>,
}

/// The table as sorted spans.
fn spans(table: &UnwindTable) -> Vec<Span> {
    let mut out = Vec::new();
    for f in table.functions() {
        let rows = table.rows(f);
        for (i, r) in rows.clone().enumerate() {
            let next = rows.get(i + 1).map(|n| n.start_offset);
            for (lo, hi) in row_ranges(f.size, f.pc_type, r.start_offset, next).take(MAX_BLOCKS) {
                out.push(Span {
                    start: f.start.saturating_add(lo),
                    end: f.start.saturating_add(hi),
                    rule: r.rule,
                });
            }
        }
    }
    out.sort_by_key(|s| s.start);
    out
}

/// Compares the table of an SFrame section of `version` (`sframe`,
/// [`super::Section::to_table`]) with a table `derived` from the same object's CFI, at
/// every byte of code both cover, as far as the version can express the derived rules
/// (`tables check`: does the assembler's `.sframe` say what the `.eh_frame` says?).
pub fn compare_tables(sframe: &UnwindTable, version: u8, derived: &UnwindTable) -> Comparison {
    let (sf, dv) = (spans(sframe), spans(derived));
    let mut res = Comparison::default();
    let mut sf_covered = 0u64;
    let (mut a_iter, mut b_iter) = (sf.iter().peekable(), dv.iter().peekable());
    while let (Some(a), Some(b)) = (a_iter.peek(), b_iter.peek()) {
        let lo = a.start.max(b.start);
        let hi = a.end.min(b.end);
        if lo < hi {
            sf_covered += hi - lo;
            match (a.rule, b.rule) {
                (Some(x), Some(y)) if section_stores_rule(sframe.arch, version, &y) => {
                    res.compared_bytes += hi - lo;
                    if !same(version, &x, &y) {
                        res.disagreeing_bytes += hi - lo;
                        match res.disagreements.last_mut() {
                            Some(last)
                                if last.end == lo && last.sframe == x && last.derived == y =>
                            {
                                last.end = hi;
                            }
                            _ => res.disagreements.push(Disagreement {
                                start: lo,
                                end: hi,
                                sframe: x,
                                derived: y,
                            }),
                        }
                    }
                }
                _ => res.not_comparable_bytes += hi - lo,
            }
        }
        if a.end <= b.end {
            a_iter.next();
        } else {
            b_iter.next();
        }
    }
    let sf_total: u64 = sf.iter().map(|s| s.end - s.start).sum();
    res.sframe_only_bytes = sf_total.saturating_sub(sf_covered);
    res
}

#[cfg(test)]
mod tests {
    use sframe_common::{CfaRule, RegRule};

    use super::*;
    use crate::table::{Row, Source};

    fn rule(cfa: i32) -> UnwindRule {
        UnwindRule {
            cfa: CfaRule::sp(cfa),
            ra: RegRule::AtCfa(-8),
            fp: RegRule::Unchanged,
            flags: RuleFlags::default(),
        }
    }

    fn table(rows: &[(u32, UnwindRule)]) -> UnwindTable {
        UnwindTable::from_functions(
            Arch::Amd64,
            Source::Synthesized,
            [FunctionRows {
                start: 0x1000,
                size: 0x40,
                pc_type: PcType::Inc,
                rows: rows
                    .iter()
                    .map(|&(start_offset, r)| Row {
                        start_offset,
                        rule: Some(r),
                    })
                    .collect(),
            }],
        )
    }

    #[test]
    fn what_a_version_cannot_store_is_left_out_and_counted() {
        let mut val = rule(16);
        val.ra = RegRule::ValCfa(-8);
        let t = table(&[(0, rule(8)), (0x10, val), (0x20, rule(16))]);
        let s = write_storable(&t, WriteVersion::V3, 0x8000).unwrap();
        assert_eq!(
            (s.dropped_rows, s.dropped_bytes, s.dropped_functions),
            (1, 0x10, 0)
        );
        // The rest reads back, split around the range left out.
        let back = super::super::Section::parse(&s.bytes, 0x8000).unwrap();
        assert_eq!(back.find_fre(0x1008).map(|f| f.rule), Some(rule(8)));
        assert_eq!(back.find_fre(0x1018), None);
        assert_eq!(back.find_fre(0x1030).map(|f| f.rule), Some(rule(16)));
    }

    #[test]
    fn a_section_and_a_derived_table_are_compared_byte_by_byte() {
        let sframe = table(&[(0, rule(8)), (0x10, rule(16))]);
        assert_eq!(
            compare_tables(&sframe, 2, &sframe),
            Comparison {
                compared_bytes: 0x40,
                ..Comparison::default()
            }
        );
        // The derived table says something else from 0x18, and the version cannot say
        // what it says from 0x30.
        let mut deref = rule(16);
        deref.cfa.deref = true;
        let derived = table(&[
            (0, rule(8)),
            (0x10, rule(16)),
            (0x18, rule(24)),
            (0x30, deref),
        ]);
        let c = compare_tables(&sframe, 2, &derived);
        assert_eq!(
            c.disagreements,
            [Disagreement {
                start: 0x1018,
                end: 0x1030,
                sframe: rule(16),
                derived: rule(24)
            }]
        );
        assert_eq!(
            (
                c.disagreeing_bytes,
                c.compared_bytes,
                c.not_comparable_bytes
            ),
            (0x18, 0x30, 0x10)
        );
        // v3 expresses the dereferenced CFA: compared, and different.
        assert_eq!(compare_tables(&sframe, 3, &derived).disagreeing_bytes, 0x28);
    }
}
