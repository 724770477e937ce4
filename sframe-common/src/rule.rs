//! The normalized unwind rule.
//!
//! Both sources of unwind information, SFrame sections and DWARF CFI (`.eh_frame`,
//! `.debug_frame`), are reduced to this one type: how to find the canonical frame address
//! (CFA) of a frame, and from it the caller's return address (RA) and frame pointer (FP).
//! It is plain data (`Copy`, no allocation) so the frame step can use it in `no_std` code.
//!
//! Register numbers in [`CfaBase::Reg`], [`RegRule::InReg`] and [`RegRule::AtReg`] are
//! DWARF register numbers of the object's architecture (AMD64: 0..=16, AArch64: 0..=31).

/// The register a CFA is computed from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum CfaBase {
    /// The stack pointer.
    Sp,
    /// The frame pointer (rbp on AMD64, x29 on AArch64).
    Fp,
    /// Another register, by DWARF number. Its value is only known in the frame that was
    /// interrupted (the top frame), so such rules cannot be used for caller frames.
    Reg(u16),
}

/// How the CFA is computed: `base + offset`, or with `deref`, `*(base + offset)`
/// (e.g. a DRAP-realigned frame on AMD64: CFA = *(rbp - 8)).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct CfaRule {
    /// The register the CFA is computed from.
    pub base: CfaBase,
    /// Bytes added to the base register's value.
    pub offset: i32,
    /// The CFA is the word read at `base + offset`, not the sum itself.
    pub deref: bool,
}

impl CfaRule {
    /// `CFA = SP + offset`.
    pub const fn sp(offset: i32) -> Self {
        Self {
            base: CfaBase::Sp,
            offset,
            deref: false,
        }
    }
    /// `CFA = FP + offset`.
    pub const fn fp(offset: i32) -> Self {
        Self {
            base: CfaBase::Fp,
            offset,
            deref: false,
        }
    }
}

/// How the caller's value of a register (RA or FP) is recovered.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum RegRule {
    /// Not saved by this frame: the caller's value is the current value. For the RA on
    /// AArch64 this means "still in the link register" (usable in the top frame only).
    Unchanged,
    /// Saved in memory at `CFA + offset`.
    AtCfa(i32),
    /// The caller's value is `CFA + offset` itself (DWARF `val_offset`).
    ValCfa(i32),
    /// Held in another register (DWARF number); known in the top frame only.
    InReg(u16),
    /// Saved in memory at `*(reg + offset)` (SFrame v3 FLEX, DWARF expressions of the
    /// form `DW_OP_bregN off`); known in the top frame only unless `reg` is SP/FP.
    AtReg {
        /// DWARF register number.
        reg: u16,
        /// Bytes added to the register's value.
        offset: i32,
    },
    /// Undefined. For the RA this marks the outermost frame (`_start`, `clone`): the walk
    /// is complete.
    Undefined,
}

/// Flag bits of a rule.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct RuleFlags(pub u8);

impl RuleFlags {
    /// The function is a signal trampoline: the caller's registers are in a signal frame.
    pub const SIGNAL: u8 = 1 << 0;
    /// The RA is signed (AArch64 pointer authentication) and must be stripped.
    pub const MANGLED_RA: u8 = 1 << 1;
    /// The signing key is B (else A); meaningful with `MANGLED_RA`.
    pub const PAUTH_KEY_B: u8 = 1 << 2;

    /// Whether flag `bit` (one of the constants above) is set.
    pub const fn contains(self, bit: u8) -> bool {
        self.0 & bit != 0
    }
    /// These flags with `bit` set too.
    pub const fn with(self, bit: u8) -> Self {
        Self(self.0 | bit)
    }
}

/// The rule for one PC: how to get from this frame's registers to the caller's.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct UnwindRule {
    /// How to compute the CFA.
    pub cfa: CfaRule,
    /// How to recover the caller's return address.
    pub ra: RegRule,
    /// How to recover the caller's frame pointer.
    pub fp: RegRule,
    /// Signal frame and return-address signing ([`RuleFlags`] bits).
    pub flags: RuleFlags,
}

impl UnwindRule {
    /// The outermost frame marker (RA undefined).
    pub const fn is_outermost(&self) -> bool {
        matches!(self.ra, RegRule::Undefined)
    }
}

impl core::fmt::Display for CfaBase {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            CfaBase::Sp => f.write_str("sp"),
            CfaBase::Fp => f.write_str("fp"),
            CfaBase::Reg(n) => write!(f, "r{n}"),
        }
    }
}

/// `sp+16`, `(fp-8)` (dereferenced).
impl core::fmt::Display for CfaRule {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        if self.deref {
            write!(f, "({}{:+})", self.base, self.offset)
        } else {
            write!(f, "{}{:+}", self.base, self.offset)
        }
    }
}

/// `u` unchanged, `c-8` at CFA-8, `=c+0` the value CFA+0, `r30` in a register,
/// `(r6-8)` at a register plus offset, `U` undefined (DWARF register numbers).
impl core::fmt::Display for RegRule {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            RegRule::Unchanged => f.write_str("u"),
            RegRule::AtCfa(o) => write!(f, "c{o:+}"),
            RegRule::ValCfa(o) => write!(f, "=c{o:+}"),
            RegRule::InReg(n) => write!(f, "r{n}"),
            RegRule::AtReg { reg, offset } => write!(f, "(r{reg}{offset:+})"),
            RegRule::Undefined => f.write_str("U"),
        }
    }
}

/// One line: `cfa=sp+16 fp=c-16 ra=c-8`, then ` signal`, ` mangled_ra` and ` key_b` for
/// the flags that are set.
impl core::fmt::Display for UnwindRule {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        write!(f, "cfa={} fp={} ra={}", self.cfa, self.fp, self.ra)?;
        if self.flags.contains(RuleFlags::SIGNAL) {
            f.write_str(" signal")?;
        }
        if self.flags.contains(RuleFlags::MANGLED_RA) {
            f.write_str(" mangled_ra")?;
            if self.flags.contains(RuleFlags::PAUTH_KEY_B) {
                f.write_str(" key_b")?;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    extern crate std;
    use std::string::ToString;

    use super::*;

    #[test]
    fn rules_display_in_one_line() {
        let plain = UnwindRule {
            cfa: CfaRule::sp(16),
            ra: RegRule::AtCfa(-8),
            fp: RegRule::Unchanged,
            flags: RuleFlags::default(),
        };
        assert_eq!(plain.to_string(), "cfa=sp+16 fp=u ra=c-8");
        let drap = UnwindRule {
            cfa: CfaRule {
                base: CfaBase::Fp,
                offset: -8,
                deref: true,
            },
            ra: RegRule::AtReg { reg: 6, offset: -8 },
            fp: RegRule::ValCfa(0),
            flags: RuleFlags::default().with(RuleFlags::SIGNAL),
        };
        assert_eq!(drap.to_string(), "cfa=(fp-8) fp==c+0 ra=(r6-8) signal");
        let pac = UnwindRule {
            cfa: CfaRule {
                base: CfaBase::Reg(12),
                offset: 0,
                deref: false,
            },
            ra: RegRule::InReg(30),
            fp: RegRule::Undefined,
            flags: RuleFlags::default()
                .with(RuleFlags::MANGLED_RA)
                .with(RuleFlags::PAUTH_KEY_B),
        };
        assert_eq!(pac.to_string(), "cfa=r12+0 fp=U ra=r30 mangled_ra key_b");
    }
}
