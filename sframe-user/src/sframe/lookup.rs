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
//! Differences, deliberate: libsframe truncates `pc - start` to 32 bits in the FDE test;
//! here the full 64-bit difference is compared (a PC 4 GiB past a function is not in it).
//! libsframe refuses lookups in unsorted sections; here a private sorted index is used.
//! Version 1 PCMASK FDEs carry no rep_size; 16 (the AMD64 PLT entry size, as libsframe
//! 2.40 assumed) is used.

use sframe_common::{CfaBase, RegRule, RuleFlags, UnwindRule};

use super::read::{Fde, Fre, Section};
use crate::table::PcType;

impl Section<'_> {
    /// Find the FDE containing `pc` (absolute address), libsframe's binary search.
    pub fn find_fde(&self, pc: u64) -> Option<Fde> {
        let n = self.num_fdes();
        if n == 0 {
            return None;
        }
        let pc_rel = i128::from(pc.wrapping_sub(self.section_vaddr()) as i64);
        let (mut low, mut high) = (0i64, i64::from(n) - 1);
        while low <= high {
            let mid = low + (high - low) / 2;
            let fde = self.fde_sorted(mid as u32)?;
            let start = i128::from(fde.rel_start);
            if start <= pc_rel && pc_rel - start < i128::from(fde.size) {
                return Some(fde);
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
    pub fn find_fre_raw(&self, pc: u64) -> Option<(Fde, Fre)> {
        let fde = self.find_fde(pc)?;
        // find_fde guarantees 0 <= pc - start < size <= u32::MAX.
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

    /// The rule for `pc`: the FDE index (on-disk order) and the normalized rule.
    pub fn find_fre(&self, pc: u64) -> Option<(u32, UnwindRule)> {
        let (fde, fre) = self.find_fre_raw(pc)?;
        Some((fde.index, self.rule(&fde, &fre)))
    }
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
/// `0xADDR NOTFOUND`.
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
    let Some((_, rule)) = section.find_fre(addr) else {
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
    let mut s = format!(
        "{addr:#x} FOUND cfa_base={base} cfa_off={} fp_off={} ra_off={}",
        rule.cfa.offset,
        slot(&rule.fp),
        slot(&rule.ra)
    );
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
