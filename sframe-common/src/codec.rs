//! The kernel encoding of a normalized rule ([`RuleEntry`]), beside its decoding.
//!
//! The walker (`step.rs`) reads a [`RuleEntry`]'s fields directly; [`decode`] states what
//! those fields mean as a normalized rule, and the round-trip test holds [`encode`] to it.

use crate::{
    dwarf::DwarfRegs,
    layout::*,
    rule::{CfaBase, CfaRule, RegRule, RuleFlags, UnwindRule},
};

/// Registers below this can be named by a rule ([`CFA_BASE_REG`], [`REG_IN_REG`]): the
/// kernel captures `TOP_REGS` of the interrupted frame.
const NAMEABLE_REGS: u16 = crate::step::TOP_REGS as u16;

/// Encodes a normalized rule for the kernel, or `None` when the kernel walker cannot
/// apply it (the row then becomes "no rule", and the walker falls back to frame pointers
/// there). `regs` are the object's architecture's.
///
/// Not kept: [`RuleFlags::PAUTH_KEY_B`] (the walker strips signed return addresses to the
/// process's address bits, whichever key signed them). An undefined FP is encoded as
/// unchanged (the FP is only used by a frame-pointer fallback further up).
pub fn encode(rule: &UnwindRule, regs: &DwarfRegs) -> Option<RuleEntry> {
    let (sp, fp) = regs.sp_fp();
    let cfa_base = match rule.cfa.base {
        CfaBase::Sp => CFA_BASE_SP,
        CfaBase::Fp => CFA_BASE_FP,
        CfaBase::Reg(r) if r == sp => CFA_BASE_SP,
        CfaBase::Reg(r) if r == fp => CFA_BASE_FP,
        CfaBase::Reg(r) if r < NAMEABLE_REGS => CFA_BASE_REG | r as u8,
        CfaBase::Reg(_) => return None,
    };
    let reg = |r: RegRule| -> Option<(u8, i16)> {
        Some(match r {
            RegRule::Unchanged => (REG_UNCHANGED, 0),
            RegRule::AtCfa(o) => (REG_AT_CFA, i16::try_from(o).ok()?),
            RegRule::ValCfa(o) => (REG_VAL_CFA, i16::try_from(o).ok()?),
            RegRule::InReg(r) if r < NAMEABLE_REGS => (REG_IN_REG, r as i16),
            RegRule::InReg(_) => return None,
            RegRule::AtReg { reg, offset } if reg == sp => (REG_AT_SP, i16::try_from(offset).ok()?),
            RegRule::AtReg { reg, offset } if reg == fp => (REG_AT_FP, i16::try_from(offset).ok()?),
            RegRule::AtReg { .. } => return None,
            RegRule::Undefined => (REG_UNDEFINED, 0),
        })
    };
    let (ra_kind, ra_offset) = reg(rule.ra)?;
    let (fp_kind, fp_offset) = match rule.fp {
        RegRule::Undefined => (REG_UNCHANGED, 0),
        r => reg(r)?,
    };
    let mut flags = 0;
    if rule.cfa.deref {
        flags |= RULE_FLAG_CFA_DEREF;
    }
    if rule.flags.contains(RuleFlags::SIGNAL) {
        flags |= RULE_FLAG_SIGNAL;
    }
    if rule.flags.contains(RuleFlags::MANGLED_RA) {
        flags |= RULE_FLAG_MANGLED_RA;
    }
    Some(RuleEntry {
        cfa_offset: rule.cfa.offset,
        ra_offset,
        fp_offset,
        cfa_base,
        ra_kind,
        fp_kind,
        flags,
    })
}

/// What the walker does with `entry`, as a normalized rule; `None` for the "no rule"
/// entry and for kinds the walker rejects. A [`RULE_FLAG_PLT16`] entry decodes as the
/// rule at the start of a PLT entry ([`RuleEntry::at`] gives the rule at any PC).
pub fn decode(entry: &RuleEntry, regs: &DwarfRegs) -> Option<UnwindRule> {
    let e = entry.at(0);
    let base = match e.cfa_base {
        CFA_BASE_NONE => return None,
        CFA_BASE_SP => CfaBase::Sp,
        CFA_BASE_FP => CfaBase::Fp,
        b if b & CFA_BASE_REG != 0 => CfaBase::Reg(u16::from(b & 0x1f)),
        _ => return None,
    };
    let reg = |kind: u8, off: i16| -> Option<RegRule> {
        let o = i32::from(off);
        Some(match kind {
            REG_UNCHANGED => RegRule::Unchanged,
            REG_AT_CFA => RegRule::AtCfa(o),
            REG_AT_SP => RegRule::AtReg {
                reg: regs.sp,
                offset: o,
            },
            REG_AT_FP => RegRule::AtReg {
                reg: regs.fp,
                offset: o,
            },
            REG_UNDEFINED => RegRule::Undefined,
            REG_VAL_CFA => RegRule::ValCfa(o),
            REG_IN_REG => RegRule::InReg(u16::try_from(off).ok()? & 0x1f),
            _ => return None,
        })
    };
    let mut flags = RuleFlags::default();
    if e.flags & RULE_FLAG_SIGNAL != 0 {
        flags = flags.with(RuleFlags::SIGNAL);
    }
    if e.flags & RULE_FLAG_MANGLED_RA != 0 {
        flags = flags.with(RuleFlags::MANGLED_RA);
    }
    Some(UnwindRule {
        cfa: CfaRule {
            base,
            offset: e.cfa_offset,
            deref: e.flags & RULE_FLAG_CFA_DEREF != 0,
        },
        ra: reg(e.ra_kind, e.ra_offset)?,
        fp: reg(e.fp_kind, e.fp_offset)?,
        flags,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{
        dwarf::{AARCH64, AMD64},
        test_rng::Rng,
    };

    /// The rule the kernel applies for `r`: what [`encode`] keeps of it.
    fn canonical(r: &UnwindRule, regs: &DwarfRegs) -> UnwindRule {
        let base = match r.cfa.base {
            CfaBase::Reg(x) if x == regs.sp => CfaBase::Sp,
            CfaBase::Reg(x) if x == regs.fp => CfaBase::Fp,
            b => b,
        };
        let fp = match r.fp {
            RegRule::Undefined => RegRule::Unchanged,
            f => f,
        };
        UnwindRule {
            cfa: CfaRule { base, ..r.cfa },
            fp,
            flags: RuleFlags(r.flags.0 & (RuleFlags::SIGNAL | RuleFlags::MANGLED_RA)),
            ..*r
        }
    }

    /// Random rules covering every variant.
    struct Gen(Rng);
    impl Gen {
        fn next(&mut self) -> u64 {
            self.0.next()
        }
        fn reg(&mut self) -> u16 {
            self.0.pick(&[0, 6, 7, 16, 29, 30, 31, 32, 40])
        }
        fn offset(&mut self) -> i32 {
            self.0
                .pick(&[0, 8, -8, -16, 255, -32768, 32767, 32768, -40000])
        }
        fn reg_rule(&mut self) -> RegRule {
            match self.next() % 6 {
                0 => RegRule::Unchanged,
                1 => RegRule::AtCfa(self.offset()),
                2 => RegRule::ValCfa(self.offset()),
                3 => RegRule::InReg(self.reg()),
                4 => RegRule::AtReg {
                    reg: self.reg(),
                    offset: self.offset(),
                },
                _ => RegRule::Undefined,
            }
        }
        fn rule(&mut self) -> UnwindRule {
            let base = match self.next() % 3 {
                0 => CfaBase::Sp,
                1 => CfaBase::Fp,
                _ => CfaBase::Reg(self.reg()),
            };
            UnwindRule {
                cfa: CfaRule {
                    base,
                    offset: self.offset(),
                    deref: self.next().is_multiple_of(2),
                },
                ra: self.reg_rule(),
                fp: self.reg_rule(),
                flags: RuleFlags((self.next() % 8) as u8),
            }
        }
    }

    #[test]
    fn decoding_an_encoded_rule_gives_back_what_the_kernel_applies() {
        for regs in [&AMD64, &AARCH64] {
            let mut g = Gen(Rng(0x9e37_79b9_7f4a_7c15));
            let (mut encoded, mut rejected) = (0, 0);
            for _ in 0..20_000 {
                let r = g.rule();
                match encode(&r, regs) {
                    Some(e) => {
                        encoded += 1;
                        assert_eq!(
                            decode(&e, regs),
                            Some(canonical(&r, regs)),
                            "{r:?} -> {e:?}"
                        );
                        assert!(!e.is_none());
                    }
                    None => rejected += 1,
                }
            }
            // Both outcomes are exercised.
            assert!(encoded > 1000 && rejected > 1000, "{encoded} {rejected}");
        }
    }

    #[test]
    fn rules_the_kernel_cannot_apply_are_not_encoded() {
        let ok = UnwindRule {
            cfa: CfaRule::sp(16),
            ra: RegRule::AtCfa(-8),
            fp: RegRule::Unchanged,
            flags: RuleFlags::default(),
        };
        assert!(encode(&ok, &AMD64).is_some());
        let far = UnwindRule {
            ra: RegRule::AtCfa(1 << 16),
            ..ok
        };
        assert_eq!(encode(&far, &AMD64), None, "offset past i16");
        let high = UnwindRule {
            cfa: CfaRule {
                base: CfaBase::Reg(32),
                ..ok.cfa
            },
            ..ok
        };
        assert_eq!(
            encode(&high, &AARCH64),
            None,
            "register the kernel does not capture"
        );
        let other = UnwindRule {
            ra: RegRule::AtReg { reg: 3, offset: 0 },
            ..ok
        };
        assert_eq!(
            encode(&other, &AMD64),
            None,
            "memory at a register other than SP/FP"
        );
        // SP and FP by number are SP and FP.
        let by_number = UnwindRule {
            cfa: CfaRule {
                base: CfaBase::Reg(AARCH64.fp),
                ..ok.cfa
            },
            ..ok
        };
        assert_eq!(
            encode(&by_number, &AARCH64).map(|e| e.cfa_base),
            Some(CFA_BASE_FP)
        );
    }

    #[test]
    fn the_no_rule_entry_decodes_to_nothing() {
        assert_eq!(decode(&RuleEntry::NONE, &AMD64), None);
    }
}
