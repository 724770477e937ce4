//! PC lookup with GNU libsframe's `sframe_find_fre` semantics, and the one-line
//! `lookup` output format.
//!
//! The algorithm, as in libsframe (2.45+):
//! 1. binary search over the FDEs in address order: FDE `mid` matches when
//!    `start <= pc && pc - start < size`; otherwise go right when `start < pc`, else left
//!    (so gaps between functions, and zero-size functions, find nothing);
//! 2. scan the function's FREs in order: FRE `i` covers `[start_i, start_{i+1} - 1]`
//!    (the last one `[start_i, size - 1]`); stop with "not found" as soon as
//!    `start_i > pc - func_start`; for PCMASK functions the PC offset is taken modulo
//!    `rep_size` before the range test (but not for the early stop, exactly as libsframe).
//!
//! The implementation gives exactly these answers with less work: step 1 becomes a
//! look-up in an index of function starts by address bucket when the section's
//! functions are strictly ordered and disjoint (the only case where it is equivalent;
//! otherwise libsframe's search runs as written), and step 2 a binary search over per-function
//! checkpoints plus a scan of at most 16 FREs (see [`Section::find_fre_raw`]). Both
//! reference versions stay here (`find_fde_libsframe`, `find_fre_raw_linear`), and the
//! tests and the fuzz target compare them with the fast ones.
//!
//! Differences, deliberate: libsframe truncates `pc - start` to 32 bits in the FDE test;
//! here the full 64-bit difference is compared (a PC 4 GiB past a function is not in it).
//! libsframe refuses lookups in unsorted sections; here a private sorted index is used.
//! Version 1 PCMASK FDEs carry no rep_size; 16 (the AMD64 PLT entry size, as libsframe
//! 2.40 assumed) is used.

use sframe_common::{CfaBase, RegRule, RuleFlags, UnwindRule};

use super::read::{Fde, Fre, Section};
use super::scan::CHECKPOINT_STEP;
use crate::table::PcType;

impl<'a> Section<'a> {
    /// Find the FDE containing `pc` (absolute address), as libsframe's binary search does.
    ///
    /// When the section is simple (function starts strictly increasing in address
    /// order, functions not overlapping; checked at open), at most one function
    /// contains `pc` and libsframe's search always reaches it (every probe left of it
    /// starts below `pc`, every probe right of it starts past its end), so any search
    /// gives the same answer: here the address bucket of `pc` (see `AddrIndex`) bounds
    /// the number of functions starting at or before it to a range of about one, which
    /// a few reads of FDE starts settle. Otherwise libsframe's own search runs.
    #[inline]
    pub fn find_fde(&self, pc: u64) -> Option<Fde> {
        let Some(idx) = self.addr_index() else {
            return self.find_fde_libsframe(pc);
        };
        let pc_rel = pc.wrapping_sub(self.section_vaddr()) as i64;
        let d = i128::from(pc_rel) - i128::from(idx.base);
        if d < 0 {
            return None;
        }
        let n = self.num_fdes();
        let b = usize::try_from((d as u128) >> idx.shift).unwrap_or(usize::MAX);
        let (mut lo, mut hi) = match (idx.counts.get(b), idx.counts.get(b.wrapping_add(1))) {
            (Some(&lo), Some(&hi)) => (lo, hi),
            // Past the last bucket: every function starts before `pc`.
            _ => (n, n),
        };
        // The number of functions starting at or before pc_rel is in [lo, hi].
        let starts_at_or_before = |k: u32| {
            self.sorted_start_size(k)
                .is_some_and(|(start, _)| start <= pc_rel)
        };
        while hi - lo > 4 {
            let mid = lo + (hi - lo) / 2;
            if starts_at_or_before(mid) {
                lo = mid + 1;
            } else {
                hi = mid;
            }
        }
        while lo < hi && starts_at_or_before(lo) {
            lo += 1;
        }
        let k = lo.checked_sub(1)?;
        let (start, size) = self.sorted_start_size(k)?;
        let off = i128::from(pc_rel) - i128::from(start);
        if off < 0 || off >= i128::from(size) {
            return None;
        }
        self.fde(self.sorted_to_disk(k)?)
    }

    #[inline]
    fn sorted_start_size(&self, k: u32) -> Option<(i64, u32)> {
        self.fde_start_size(self.sorted_to_disk(k)?)
    }

    /// libsframe's binary search over the FDEs, step by step: FDE `mid` matches when
    /// `start <= pc && pc - start < size`; otherwise go right when `start < pc`, else
    /// left. Used for sections that are not simple, and as the reference in tests.
    #[doc(hidden)]
    pub fn find_fde_libsframe(&self, pc: u64) -> Option<Fde> {
        let n = self.num_fdes();
        if n == 0 {
            return None;
        }
        let pc_rel = i128::from(pc.wrapping_sub(self.section_vaddr()) as i64);
        let (mut low, mut high) = (0i64, i64::from(n) - 1);
        while low <= high {
            let mid = low + (high - low) / 2;
            let index = self.sorted_to_disk(mid as u32)?;
            let (rel_start, size) = self.fde_start_size(index)?;
            let start = i128::from(rel_start);
            if start <= pc_rel && pc_rel - start < i128::from(size) {
                return self.fde(index);
            }
            if start < pc_rel {
                low = mid + 1;
            } else {
                high = mid - 1;
            }
        }
        None
    }

    /// The FDE and FRE covering `pc`, libsframe's `sframe_find_fre`.
    #[inline]
    ///
    /// libsframe scans the FREs in order; since validated FRE starts strictly increase,
    /// its answer is the last FRE whose start is ≤ the (PCMASK: masked) offset, or none
    /// when the first start is above it (its early stop at `start > pc_off` can never
    /// come before that FRE, as masked offset ≤ pc_off). That FRE is found here by a
    /// binary search over the function's checkpoints (functions with more than
    /// `CHECKPOINT_STEP` FREs) and a scan of at most that many FREs.
    pub fn find_fre_raw(&self, pc: u64) -> Option<(Fde, Fre<'a>)> {
        let fde = self.find_fde(pc)?;
        // find_fde guarantees 0 <= pc - start < size <= u32::MAX.
        let pc_off = u32::try_from(pc.wrapping_sub(fde.start)).ok()?;
        let target = match fde.pc_type {
            PcType::Mask { rep_size } if rep_size != 0 => pc_off % u32::from(rep_size),
            _ => pc_off,
        };
        let (mut first, mut off) = (0u32, fde.fres_offset);
        if fde.num_fres > CHECKPOINT_STEP {
            let cps = self.checkpoints_of(fde.index);
            let k = cps.partition_point(|c| c.start <= target);
            if let Some(c) = k.checked_sub(1).and_then(|k| cps.get(k)) {
                first = c.fre;
                off = self.fres_start().checked_add(c.rel_offset as usize)?;
            } else if !cps.is_empty() {
                // The first FRE (checkpoint 0) starts above the target.
                return None;
            }
        }
        let mut found = None;
        for fre in self.rows_from(&fde, first, off) {
            if fre.start_offset > target {
                break;
            }
            found = Some(fre);
        }
        Some((fde, found?))
    }

    /// `find_fre_raw` as libsframe writes it: a linear scan of the FDE's FREs with its
    /// range tests and early stop. The reference the fast lookup is tested against.
    #[doc(hidden)]
    pub fn find_fre_raw_linear(&self, pc: u64) -> Option<(Fde, Fre<'a>)> {
        let fde = self.find_fde_libsframe(pc)?;
        let pc_off = u32::try_from(pc.wrapping_sub(fde.start)).ok()?;
        let masked = match fde.pc_type {
            PcType::Mask { rep_size } if rep_size != 0 => pc_off % u32::from(rep_size),
            _ => pc_off,
        };
        let mut rows = self.rows(&fde).peekable();
        while let Some(fre) = rows.next() {
            let end = match rows.peek() {
                Some(next) => next.start_offset.wrapping_sub(1),
                None => fde.size.wrapping_sub(1),
            };
            if fre.start_offset > pc_off {
                return None;
            }
            if fre.start_offset <= masked && end >= masked {
                return Some((fde, fre));
            }
        }
        None
    }

    /// The rule for `pc` and the function it belongs to.
    #[inline]
    pub fn find_fre(&self, pc: u64) -> Option<FoundRule> {
        let (fde, fre) = self.find_fre_raw(pc)?;
        Some(FoundRule {
            function: fde.index,
            rule: self.rule(&fde, &fre),
        })
    }
}

/// What [`Section::find_fre`] found for a PC.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct FoundRule {
    /// Index of the function (FDE) in the section's on-disk order ([`Section::fde`]).
    pub function: u32,
    /// The normalized rule that holds at the PC.
    pub rule: UnwindRule,
}

fn reg_name(section: &Section<'_>, reg: u16) -> String {
    let (sp, fp) = section.abi().sp_fp_dwarf();
    if reg == sp {
        "sp".into()
    } else if reg == fp {
        "fp".into()
    } else {
        format!("r{reg}")
    }
}

/// One line for the `lookup` command:
/// `0xADDR FOUND cfa_base=sp|fp cfa_off=N fp_off=N|none ra_off=N|none` or
/// `0xADDR NOTFOUND`; an outermost frame (RA undefined) has no CFA:
/// `cfa_base=none cfa_off=none`.
///
/// `fp_off`/`ra_off` are the CFA-relative save slots (`ra_off` on AMD64 is the fixed
/// header offset). Rules that do not fit these fields add fields after them:
/// - `cfa_base=rN` for a CFA based on DWARF register N (FLEX), `cfa_deref=1` when the
///   CFA is loaded from `base + off`;
/// - `ra=undefined` (outermost frame; `ra_off=none`), `ra=rN` / `fp=rN` (value in
///   register N), `ra=(rN+off)` / `fp=(rN+off)` (saved at register N + off),
///   `ra=c+off` / `fp=c+off` (value is CFA + off);
/// - `signal=1` (signal trampoline), `mangled_ra=1` and `pauth_key=b` (AArch64 PAC).
pub fn lookup_line(section: &Section<'_>, addr: u64) -> String {
    let Some(FoundRule { rule, .. }) = section.find_fre(addr) else {
        return format!("{addr:#x} NOTFOUND");
    };
    format_rule(section, addr, &rule)
}

fn format_rule(section: &Section<'_>, addr: u64, rule: &UnwindRule) -> String {
    use core::fmt::Write;
    let base = match rule.cfa.base {
        CfaBase::Sp => "sp".to_string(),
        CfaBase::Fp => "fp".to_string(),
        CfaBase::Reg(r) => reg_name(section, r),
    };
    let slot = |r: &RegRule| match r {
        RegRule::AtCfa(o) => o.to_string(),
        _ => "none".to_string(),
    };
    // An outermost-frame row (RA undefined: an FRE without offsets) carries no CFA, as
    // libsframe returns none for it.
    let mut s = if matches!(rule.ra, RegRule::Undefined) {
        format!(
            "{addr:#x} FOUND cfa_base=none cfa_off=none fp_off={} ra_off={}",
            slot(&rule.fp),
            slot(&rule.ra)
        )
    } else {
        format!(
            "{addr:#x} FOUND cfa_base={base} cfa_off={} fp_off={} ra_off={}",
            rule.cfa.offset,
            slot(&rule.fp),
            slot(&rule.ra)
        )
    };
    if rule.cfa.deref {
        s.push_str(" cfa_deref=1");
    }
    let extra = |name: &str, r: &RegRule, s: &mut String| {
        let v = match r {
            RegRule::Unchanged | RegRule::AtCfa(_) => return,
            RegRule::Undefined => "undefined".to_string(),
            RegRule::InReg(n) => reg_name(section, *n),
            RegRule::AtReg { reg, offset } => format!("({}{offset:+})", reg_name(section, *reg)),
            RegRule::ValCfa(o) => format!("c{o:+}"),
        };
        let _ = write!(s, " {name}={v}");
    };
    extra("ra", &rule.ra, &mut s);
    extra("fp", &rule.fp, &mut s);
    if rule.flags.contains(RuleFlags::SIGNAL) {
        s.push_str(" signal=1");
    }
    if rule.flags.contains(RuleFlags::MANGLED_RA) {
        s.push_str(" mangled_ra=1");
        if rule.flags.contains(RuleFlags::PAUTH_KEY_B) {
            s.push_str(" pauth_key=b");
        }
    }
    s
}
