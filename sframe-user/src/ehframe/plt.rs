//! Rows for PLT sections, synthesized the way GNU ld does for SFrame on AMD64.
//!
//! The `.eh_frame` FDE that ld writes for `.plt` describes the entries with a
//! `DW_CFA_def_cfa_expression` (CFA = rsp+8, +8 more once the entry has pushed its
//! relocation index) that no rule can express, and `.plt.sec` / `.plt.got` often have
//! no FDE at all. Their code is fixed, so the rows are known:
//! - PLT0 (`push GOT+8(%rip); jmp *GOT+16(%rip)`): CFA = SP+16, then SP+24 after the
//!   6-byte push.
//! - pltN (`jmp *GOT(%rip); push $n; jmp PLT0`, 16 bytes each): CFA = SP+8, then SP+16
//!   after the push; one PCMASK function with `rep_size` 16 covers all entries.
//! - `.plt.sec` / `.plt.got` entries only jump: CFA = SP+8 throughout.

use sframe_common::{CfaRule, RegRule, RuleFlags, UnwindRule};

use crate::table::{Arch, FunctionRows, PcType, Row};

/// Which PLT section.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum PltKind {
    /// `.plt`: PLT0 followed by lazy-binding entries.
    Plt,
    /// `.plt.sec`: IBT/MPX second PLT, `endbr64; jmp *GOT(%rip)` entries.
    PltSec,
    /// `.plt.got`: entries for GOT slots without lazy binding.
    PltGot,
}

impl PltKind {
    /// The section's name (`.plt`, `.plt.sec` or `.plt.got`).
    pub fn name(self) -> &'static str {
        match self {
            Self::Plt => ".plt",
            Self::PltSec => ".plt.sec",
            Self::PltGot => ".plt.got",
        }
    }

    pub(crate) fn from_name(name: &str) -> Option<Self> {
        match name {
            ".plt" => Some(Self::Plt),
            ".plt.sec" => Some(Self::PltSec),
            ".plt.got" => Some(Self::PltGot),
            _ => None,
        }
    }
}

/// A PLT section: its address, size and (when known) its bytes.
#[derive(Clone, Copy, Debug)]
pub struct PltSection<'a> {
    /// Which PLT section.
    pub kind: PltKind,
    /// Virtual address of the section.
    pub address: u64,
    /// Size of the section in bytes.
    pub size: u64,
    /// The section's bytes, used to recognize the entry layout. Empty when unknown
    /// (the classic layout is assumed).
    pub data: &'a [u8],
}

/// AMD64 PLT entry size.
const ENTRY: u64 = 16;

const fn sp_rule(offset: i32) -> Option<UnwindRule> {
    Some(UnwindRule {
        cfa: CfaRule::sp(offset),
        ra: RegRule::AtCfa(-8),
        fp: RegRule::Unchanged,
        flags: RuleFlags(0),
    })
}

/// The functions covering `plt`, or `None` when the architecture or layout is not one
/// this knows (the caller keeps whatever the CFI says).
pub(crate) fn synthesize(arch: Arch, plt: &PltSection<'_>) -> Option<Vec<FunctionRows>> {
    if matches!(arch, Arch::Aarch64 { .. }) && plt.kind == PltKind::Plt {
        return synthesize_aarch64(plt);
    }
    if arch != Arch::Amd64 || plt.size == 0 {
        return None;
    }
    let size = u32::try_from(plt.size).ok()?;
    match plt.kind {
        PltKind::Plt => {
            if plt.size < ENTRY || !plt.size.is_multiple_of(ENTRY) {
                return None;
            }
            let push_end = lazy_entry_push_end(plt.data)?;
            let mut out = vec![FunctionRows {
                start: plt.address,
                size: ENTRY as u32,
                pc_type: PcType::Inc,
                rows: vec![
                    Row {
                        start_offset: 0,
                        rule: sp_rule(16),
                    },
                    Row {
                        start_offset: 6,
                        rule: sp_rule(24),
                    },
                ],
            }];
            if plt.size > ENTRY {
                out.push(FunctionRows {
                    start: plt.address.checked_add(ENTRY)?,
                    size: size - ENTRY as u32,
                    pc_type: PcType::Mask {
                        rep_size: ENTRY as u8,
                    },
                    rows: vec![
                        Row {
                            start_offset: 0,
                            rule: sp_rule(8),
                        },
                        Row {
                            start_offset: push_end,
                            rule: sp_rule(16),
                        },
                    ],
                });
            }
            Some(out)
        }
        PltKind::PltSec | PltKind::PltGot => {
            plt.address.checked_add(plt.size)?;
            Some(vec![FunctionRows {
                start: plt.address,
                size,
                pc_type: PcType::Inc,
                rows: vec![Row {
                    start_offset: 0,
                    rule: sp_rule(8),
                }],
            }])
        }
    }
}

/// AArch64 `.plt` (GNU ld): PLT0 is 32 bytes, `stp x16, x30, [sp, #-16]!` first (the
/// return address is saved at CFA−8 from its second instruction on: CFA = SP+16), then
/// it jumps to the resolver; every entry after it (16 bytes: `adrp x16; ldr x17; add
/// x16; br x17`) leaves SP and x30 alone: CFA = SP, the return address still in the link
/// register (a rule for the top frame only, where a sample lands in a stub).
fn synthesize_aarch64(plt: &PltSection<'_>) -> Option<Vec<FunctionRows>> {
    const PLT0: u64 = 32;
    const A64_ENTRY: u64 = 16;
    if plt.size < PLT0 || !(plt.size - PLT0).is_multiple_of(A64_ENTRY) {
        return None;
    }
    plt.address.checked_add(plt.size)?;
    let in_lr = Some(UnwindRule {
        cfa: CfaRule::sp(0),
        ra: RegRule::Unchanged,
        fp: RegRule::Unchanged,
        flags: RuleFlags(0),
    });
    let saved = Some(UnwindRule {
        cfa: CfaRule::sp(16),
        ra: RegRule::AtCfa(-8),
        fp: RegRule::Unchanged,
        flags: RuleFlags(0),
    });
    let mut out = vec![FunctionRows {
        start: plt.address,
        size: PLT0 as u32,
        pc_type: PcType::Inc,
        rows: vec![
            Row {
                start_offset: 0,
                rule: in_lr,
            },
            Row {
                start_offset: 4,
                rule: saved,
            },
        ],
    }];
    if plt.size > PLT0 {
        out.push(FunctionRows {
            start: plt.address + PLT0,
            size: u32::try_from(plt.size - PLT0).ok()?,
            pc_type: PcType::Inc,
            rows: vec![Row {
                start_offset: 0,
                rule: in_lr,
            }],
        });
    }
    Some(out)
}

/// Where the `push $n` of a lazy `.plt` entry ends, from the first entry's bytes.
fn lazy_entry_push_end(data: &[u8]) -> Option<u32> {
    let Some(entry) = data.get(ENTRY as usize..2 * ENTRY as usize) else {
        // No bytes to look at (or only PLT0): ld's classic layout.
        return Some(11);
    };
    const PUSH_IMM32: u8 = 0x68;
    match entry {
        // jmp *disp32(%rip); push $n; jmp PLT0
        [0xff, 0x25, _, _, _, _, PUSH_IMM32, ..] => Some(11),
        // bnd jmp *disp32(%rip); push $n (MPX)
        [0xf2, 0xff, 0x25, _, _, _, _, PUSH_IMM32, ..] => Some(12),
        // endbr64; push $n; jmp PLT0 (IBT lazy PLT, with .plt.sec)
        [0xf3, 0x0f, 0x1e, 0xfa, PUSH_IMM32, ..] => Some(9),
        // push $n; bnd jmp PLT0 (MPX lazy PLT, with .plt.sec)
        [PUSH_IMM32, ..] => Some(5),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classic_plt() {
        let mut data = vec![0u8; 48];
        data[16..23].copy_from_slice(&[0xff, 0x25, 0, 0, 0, 0, 0x68]);
        let fs = synthesize(
            Arch::Amd64,
            &PltSection {
                kind: PltKind::Plt,
                address: 0x1020,
                size: 48,
                data: &data,
            },
        )
        .unwrap();
        assert_eq!(fs.len(), 2);
        assert_eq!(fs[0].rows[1].start_offset, 6);
        assert_eq!(fs[1].pc_type, PcType::Mask { rep_size: 16 });
        assert_eq!(fs[1].start, 0x1030);
        assert_eq!(fs[1].size, 32);
        assert_eq!(fs[1].rows[1].start_offset, 11);
    }

    #[test]
    fn aarch64_plt0_saves_the_link_register_and_entries_leave_it() {
        let plt = PltSection {
            kind: PltKind::Plt,
            address: 0x4000,
            size: 32 + 3 * 16,
            data: &[],
        };
        let fs = synthesize(Arch::Aarch64 { big_endian: false }, &plt).unwrap();
        assert_eq!((fs[0].start, fs[0].size), (0x4000, 32));
        let r0 = fs[0].rows[0].rule.unwrap();
        assert_eq!((r0.cfa.offset, r0.ra), (0, RegRule::Unchanged));
        let r1 = fs[0].rows[1].rule.unwrap();
        assert_eq!(
            (fs[0].rows[1].start_offset, r1.cfa.offset, r1.ra),
            (4, 16, RegRule::AtCfa(-8))
        );
        assert_eq!((fs[1].start, fs[1].size), (0x4020, 48));
        assert_eq!(fs[1].rows[0].rule.unwrap().ra, RegRule::Unchanged);
        // Not a whole number of entries, or a section that is not .plt: nothing.
        assert!(
            synthesize(
                Arch::Aarch64 { big_endian: false },
                &PltSection { size: 40, ..plt }
            )
            .is_none()
        );
        assert!(
            synthesize(
                Arch::Aarch64 { big_endian: false },
                &PltSection {
                    kind: PltKind::PltGot,
                    ..plt
                }
            )
            .is_none()
        );
    }

    #[test]
    fn ibt_plt_and_odd_sizes() {
        let mut data = vec![0u8; 32];
        data[16..21].copy_from_slice(&[0xf3, 0x0f, 0x1e, 0xfa, 0x68]);
        let plt = PltSection {
            kind: PltKind::Plt,
            address: 0x1000,
            size: 32,
            data: &data,
        };
        assert_eq!(
            synthesize(Arch::Amd64, &plt).unwrap()[1].rows[1].start_offset,
            9
        );
        assert!(synthesize(Arch::Amd64, &PltSection { size: 20, ..plt }).is_none());
        assert!(synthesize(Arch::S390x, &plt).is_none());
        let garbage = [0xccu8; 32];
        assert!(
            synthesize(
                Arch::Amd64,
                &PltSection {
                    data: &garbage,
                    ..plt
                }
            )
            .is_none()
        );
    }
}
