//! Per-object counters: what was converted, what was skipped and why, and how many rows
//! and bytes of code fall into each expressiveness category.

use std::collections::BTreeMap;
use std::path::PathBuf;

use sframe_common::{CfaBase, RegRule, RuleFlags, UnwindRule};

use super::error::{FdeError, SkipReason, Warning};
use crate::table::{Function, PcType, Row, Rows, UnwindTable};

/// How far a row is from what SFrame can encode.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum RowCategory {
    /// CFA = SP|FP + offset, RA at CFA+offset (or in LR on AArch64), FP unchanged or at
    /// CFA+offset: SFrame's default rows.
    Plain,
    /// Plain, but the RA is undefined: the outermost frame (`_start`, `clone3`).
    Outermost,
    /// CFA = *(base + offset), e.g. DRAP-realigned frames (CFA = *(rbp-8)) and signal
    /// trampolines (CFA = *(rsp+160)). SFrame v3 FLEX.
    CfaDeref,
    /// CFA computed from a register other than SP/FP (e.g. DRAP's r10 before the frame is
    /// set up). SFrame v3 FLEX, top frame only.
    CfaOtherReg,
    /// The RA is held in a register or at `*(reg + offset)`. SFrame v3 FLEX.
    RaInRegister,
    /// The other rows with a rule: FP in a register or at `*(reg + offset)` (SFrame v3
    /// FLEX), and `val_offset` rules for the RA or FP (no SFrame encoding: see
    /// [`crate::sframe::stores_rule`]).
    OtherFlex,
    /// No rule: CFI that no supported rule expresses (arbitrary DWARF expressions).
    NoRule,
}

impl RowCategory {
    /// Every category, in the order of [`DeriveStats::categories`].
    pub const ALL: [RowCategory; 7] = [
        Self::Plain,
        Self::Outermost,
        Self::CfaDeref,
        Self::CfaOtherReg,
        Self::RaInRegister,
        Self::OtherFlex,
        Self::NoRule,
    ];

    /// A short name for reports.
    pub fn name(self) -> &'static str {
        match self {
            Self::Plain => "plain",
            Self::Outermost => "outermost",
            Self::CfaDeref => "cfa-deref",
            Self::CfaOtherReg => "cfa-other-register",
            Self::RaInRegister => "ra-in-register",
            Self::OtherFlex => "other-flex",
            Self::NoRule => "no-rule",
        }
    }

    /// The category of a row with `rule` (`None`: a row without a rule).
    pub fn of(rule: Option<&UnwindRule>) -> Self {
        let Some(rule) = rule else {
            return Self::NoRule;
        };
        if matches!(rule.cfa.base, CfaBase::Reg(_)) {
            return Self::CfaOtherReg;
        }
        if rule.cfa.deref {
            return Self::CfaDeref;
        }
        match rule.ra {
            RegRule::InReg(_) | RegRule::AtReg { .. } => return Self::RaInRegister,
            RegRule::ValCfa(_) => return Self::OtherFlex,
            _ => {}
        }
        if !matches!(rule.fp, RegRule::Unchanged | RegRule::AtCfa(_)) {
            return Self::OtherFlex;
        }
        if matches!(rule.ra, RegRule::Undefined) {
            return Self::Outermost;
        }
        Self::Plain
    }
}

/// Rows and bytes of code in one category.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CategoryCount {
    /// Number of rows.
    pub rows: u64,
    /// Bytes of code the rows cover.
    pub bytes: u64,
}

/// Most per-FDE errors kept verbatim; the rest are only counted.
pub const MAX_KEPT_ERRORS: usize = 32;

/// What happened while deriving one object's table.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DeriveStats {
    /// FDEs found in all CFI sections (including ones later skipped).
    pub fdes_seen: u64,
    /// FDEs that contributed rows to the table.
    pub fdes_converted: u64,
    /// FDEs of `.debug_frame` (own or separate debug file) among the converted.
    pub fdes_from_debug_frame: u64,
    /// Skipped FDEs by reason.
    pub fdes_skipped: BTreeMap<SkipReason, u64>,
    /// The first [`MAX_KEPT_ERRORS`] skip reasons with their location.
    pub errors: Vec<FdeError>,
    /// What was worth reporting but did not stop the derivation.
    pub warnings: Vec<Warning>,
    /// Functions synthesized for PLT sections.
    pub plt_functions: u64,
    /// Whether `.eh_frame_hdr`'s table was used to enumerate FDEs.
    pub used_eh_frame_hdr: bool,
    /// The separate debug file whose `.debug_frame` was used.
    pub debug_file: Option<PathBuf>,
    /// Functions and rows in the final table.
    pub functions: u64,
    /// Rows in the final table.
    pub rows: u64,
    /// Rows and code bytes per category, indexed like [`RowCategory::ALL`].
    pub categories: [CategoryCount; 7],
    /// Rows with the SIGNAL / MANGLED_RA flag.
    pub signal_rows: u64,
    /// Rows with the MANGLED_RA flag.
    pub mangled_ra_rows: u64,
    /// Bytes of code covered by functions of the table (with or without a rule).
    pub code_bytes: u64,
    /// Bytes of the object's executable sections (`SHF_EXECINSTR`; 0 when the CFI
    /// came without its ELF file, e.g. the vDSO's).
    pub exec_bytes: u64,
    /// Of those, the alignment padding (NOPs, `int3`, zeros) that ends a gap between
    /// functions: never executed, so not code that lacks a rule.
    pub padding_bytes: u64,
    /// Of the executable bytes, those a row with a rule covers.
    pub exec_bytes_with_rule: u64,
}

impl DeriveStats {
    pub(crate) fn skip(&mut self, err: FdeError) {
        *self.fdes_skipped.entry(err.reason).or_insert(0) += 1;
        if self.errors.len() < MAX_KEPT_ERRORS {
            self.errors.push(err);
        }
    }

    /// FDEs skipped, all reasons together.
    pub fn skipped_total(&self) -> u64 {
        self.fdes_skipped.values().sum()
    }

    /// The rows and code bytes counted in category `cat`.
    pub fn category(&self, cat: RowCategory) -> CategoryCount {
        self.categories
            .get(cat as usize)
            .copied()
            .unwrap_or_default()
    }

    /// Bytes of code that have a rule (any category but [`RowCategory::NoRule`]).
    pub fn bytes_with_rule(&self) -> u64 {
        self.code_bytes - self.category(RowCategory::NoRule).bytes
    }

    /// Bytes of executable code, padding between functions left out.
    pub fn exec_code_bytes(&self) -> u64 {
        self.exec_bytes.saturating_sub(self.padding_bytes)
    }

    /// Bytes of executable code (padding left out) without a rule: code no FDE
    /// covers, and rows without a rule.
    pub fn exec_bytes_without_rule(&self) -> u64 {
        self.exec_code_bytes()
            .saturating_sub(self.exec_bytes_with_rule)
    }

    /// Fills the table-derived counters (functions, rows, categories, code bytes).
    pub(crate) fn count_table(&mut self, table: &UnwindTable) {
        self.functions = table.functions().len() as u64;
        self.rows = table.row_count() as u64;
        self.categories = Default::default();
        self.signal_rows = 0;
        self.mangled_ra_rows = 0;
        self.code_bytes = 0;
        for f in table.functions() {
            self.code_bytes += u64::from(f.size);
            for span in row_spans(f, table.rows(f)) {
                let row = span.row;
                let cat = RowCategory::of(row.rule.as_ref());
                if let Some(c) = self.categories.get_mut(cat as usize) {
                    c.rows += 1;
                    c.bytes += span.bytes();
                }
                if let Some(rule) = &row.rule {
                    if rule.flags.contains(RuleFlags::SIGNAL) {
                        self.signal_rows += 1;
                    }
                    if rule.flags.contains(RuleFlags::MANGLED_RA) {
                        self.mangled_ra_rows += 1;
                    }
                }
            }
        }
    }
}

/// One row of a function and where it holds ([`crate::table::row_ranges`]).
#[derive(Clone, Copy, Debug)]
pub(crate) struct RowSpan {
    pub row: Row,
    size: u32,
    pc_type: PcType,
    next: Option<u32>,
}

impl RowSpan {
    /// The code where the row holds, as offsets from the function's start.
    pub fn ranges(&self) -> impl Iterator<Item = (u64, u64)> + Clone {
        crate::table::row_ranges(self.size, self.pc_type, self.row.start_offset, self.next)
    }

    /// Bytes of code the row covers, in all blocks.
    pub fn bytes(&self) -> u64 {
        self.ranges().map(|(lo, hi)| hi - lo).sum()
    }
}

/// Each row of `f` with where it holds.
pub(crate) fn row_spans<'a>(f: &Function, rows: Rows<'a>) -> impl Iterator<Item = RowSpan> + 'a {
    let (size, pc_type) = (f.size, f.pc_type);
    let next = rows
        .clone()
        .skip(1)
        .map(|r| Some(r.start_offset))
        .chain([None]);
    rows.zip(next).map(move |(row, next)| RowSpan {
        row,
        size,
        pc_type,
        next,
    })
}
