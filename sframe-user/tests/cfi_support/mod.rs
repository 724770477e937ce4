//! Support for the CFI tests: derived tables written as SFrame and read back.
#![allow(dead_code, reason = "each test binary uses a different subset")]

use sframe_common::{CfaRule, RegRule, UnwindRule};
use sframe_user::sframe::{Section, WriteOptions, WriteVersion, write_section};
use sframe_user::table::{PcType, UnwindTable};

/// A rule as SFrame stores it: an outermost (RA undefined) row is a zero-data-word
/// FRE, which keeps only the CFA base register and the flags (the walk ends there, so
/// the CFA offset and FP rule are never used).
fn stored(r: UnwindRule) -> UnwindRule {
    if r.is_outermost() {
        UnwindRule {
            cfa: CfaRule {
                base: r.cfa.base,
                offset: 0,
                deref: false,
            },
            ra: RegRule::Undefined,
            fp: RegRule::Unchanged,
            flags: r.flags,
        }
    } else {
        r
    }
}

/// What [`sframe_round_trip`] compared.
#[derive(Debug, Default)]
pub struct RoundTrip {
    /// PCs whose rule was compared (row starts, row ends, and the middle of rows).
    pub pcs: u64,
    /// Of those, PCs where the derived table has no rule (and the section none either).
    pub no_rule: u64,
}

/// Writes `table` as an SFrame section of `version` at `vaddr` (v2 with PCREL), reads
/// it back with the reader, and checks that every function's rows are found by the
/// reader's lookup exactly as the derived table has them: at each row's first and
/// last byte and in between, the same rule, and "not found" where the table has a
/// row without a rule (outermost rows compared as stored, see [`stored`]). v3
/// expresses every rule the deriver makes; v2 only SFrame's default rows, so v2 is
/// checked on tables without FLEX rows.
pub fn sframe_round_trip(table: &UnwindTable, version: WriteVersion, vaddr: u64) -> RoundTrip {
    let (bytes, _) = write_section(
        table,
        &WriteOptions {
            version,
            section_vaddr: vaddr,
        },
    )
    .unwrap_or_else(|e| panic!("writing {version:?}: {e}"));
    let section = Section::parse(&bytes, vaddr).unwrap_or_else(|e| panic!("reading back: {e}"));
    let mut out = RoundTrip::default();
    for f in table.functions() {
        let rows: Vec<_> = table.rows(f).collect();
        let block = match f.pc_type {
            PcType::Inc => u64::from(f.size),
            PcType::Mask { rep_size } => u64::from(rep_size),
        };
        for (i, r) in rows.iter().enumerate() {
            let lo = u64::from(r.start_offset);
            let hi = rows
                .get(i + 1)
                .map_or(block, |n| u64::from(n.start_offset))
                .min(block);
            for off in [lo, lo + (hi - lo) / 2, hi.saturating_sub(1)] {
                if off >= hi {
                    continue;
                }
                let pc = f.start + off;
                let (_, want) = table.find_row(pc).expect("table lookup");
                assert_eq!(want.rule, r.rule, "table lookup at {pc:#x}");
                let got = section.find_fre(pc).map(|f| f.rule);
                assert_eq!(
                    got.map(stored),
                    r.rule.map(stored),
                    "{version:?}: function {:#x} row {i} at {pc:#x}",
                    f.start
                );
                out.pcs += 1;
                out.no_rule += u64::from(r.rule.is_none());
            }
        }
    }
    // Nothing is found outside the functions.
    if let (Some(first), Some(last)) = (table.functions().first(), table.functions().last()) {
        for pc in [first.start.wrapping_sub(1), last.end()] {
            assert_eq!(
                section.find_fre(pc),
                None,
                "{pc:#x} is outside every function"
            );
        }
    }
    out
}
