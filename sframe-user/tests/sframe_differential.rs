//! Differential test against the `simple-frame-rs` crate on all vectors, built binaries
//! and the hand-built samples of `sframe_support::build` (s390x, big-endian AArch64,
//! FLEX-heavy v3): same functions (pc, size, row count, pointer-authentication key,
//! signal bit), same rows (start, mangled-RA bit, CFA base and offset, RA and FP rules),
//! same PCINC lookups.
//!
//! Known differences, skipped or adjusted and explained where they occur:
//! - zero-data-word FREs (RA undefined): simple-frame-rs reports no CFA offset; we
//!   report the outermost-frame rule;
//! - FLEX rows (v3): simple-frame-rs' default-type accessors read the control words as
//!   offsets; compared through its `get_flex_recovery_rules` instead, with three
//!   adjustments: (1) it reads control words sign-extended like offsets, so a 1- or
//!   2-byte control word with its top bit set (AArch64's SP is DWARF 31: 0xf9) comes out
//!   negative; it is compared modulo the word size; (2) it returns the s390x CFA offset
//!   as stored, where libsframe 2.46 (`sframe_fre_get_cfa_offset`) and we decode it
//!   (`stored * 8 + 160`); (3) an RA or FP that is absent and one that is padding (control
//!   word 0) both mean "the default rule" (the fixed header offset, else unchanged), which
//!   simple-frame-rs leaves to the caller: that default is taken from the header;
//! - AArch64/s390x RA data word 0 is padding ("RA not saved"): simple-frame-rs returns
//!   `Some(0)`, we return `RegRule::Unchanged`;
//! - s390x v2 odd RA/FP words 2N+1 ("saved in register N"): simple-frame-rs returns the
//!   word as an offset; compared as that encoding of our `RegRule::InReg(N)`;
//! - the header's fixed FP offset: simple-frame-rs ignores it (its FP offset is the FRE's
//!   word); where the header has one, our FP rule is compared with the fixed offset
//!   instead (libsframe's `sframe_fre_get_fp_offset`);
//! - PCMASK lookups: simple-frame-rs matches `pc % fre_start >= fre_start`, which differs
//!   from libsframe's `(pc - start) % rep_size` for multi-row blocks; not compared.

mod sframe_support;

use fallible_iterator::FallibleIterator;
use sframe_common::{CfaBase, RegRule, RuleFlags, UnwindRule};
use sframe_support::{build_binaries, load_vectors};
use sframe_user::sframe::{Abi, Section};
use sframe_user::table::PcType;

/// One row as simple-frame-rs sees it.
struct TheirRow {
    start: u32,
    cfa_base_reg_id: u8,
    mangled: bool,
    cfa: Option<i32>,
    ra: Option<i32>,
    fp: Option<i32>,
    /// FLEX rows: CFA control word and offset, RA control and offset, FP control and
    /// offset (control words re-encoded from its accessors; absent or padding: 0, 0).
    flex: Option<[i32; 6]>,
}

/// One function as simple-frame-rs sees it.
struct TheirFde {
    pc: u64,
    size: u32,
    pauth_key_b: bool,
    signal: bool,
    rows: Vec<TheirRow>,
}

fn theirs(data: &[u8], base: u64) -> Vec<TheirFde> {
    use simple_frame_rs::SFrameSection as S;
    let sec = S::from(data, base).expect("simple-frame-rs parse");
    let mut out = Vec::new();
    macro_rules! walk {
        ($s:expr, $module:ident, $signal:expr, $flex:expr) => {{
            let mut fdes = $s.iter_fde();
            while let Some(fde) = fdes.next().expect("fde") {
                let mut rows = Vec::new();
                let mut fres = fde.iter_fre($s);
                while let Some(fre) = fres.next().expect("fre") {
                    rows.push(TheirRow {
                        start: fre.start_address.get(),
                        cfa_base_reg_id: fre.info.get_cfa_base_reg_id(),
                        mangled: fre.info.get_mangled_ra_p(),
                        cfa: fre.get_cfa_offset($s),
                        ra: fre.get_ra_offset($s),
                        fp: fre.get_fp_offset($s),
                        flex: $flex(&fde, &fre),
                    });
                }
                out.push(TheirFde {
                    pc: fde.get_pc($s),
                    size: fde.func_size,
                    pauth_key_b: matches!(
                        fde.func_info.get_aarch64_pauth_key(),
                        Ok(simple_frame_rs::$module::SFrameAArch64PAuthKey::KeyB)
                    ),
                    signal: $signal(&fde),
                    rows,
                });
            }
        }};
    }
    match &sec {
        S::V1(s) => walk!(s, v1, |_: &_| false, |_: &_, _: &_| None),
        S::V2(s) => walk!(s, v2, |_: &_| false, |_: &_, _: &_| None),
        S::V3(s) => walk!(
            s,
            v3,
            |fde: &simple_frame_rs::v3::SFrameFDE| matches!(
                fde.func_info.is_signal_frame(),
                Ok(true)
            ),
            |fde: &simple_frame_rs::v3::SFrameFDE, fre: &simple_frame_rs::v3::SFrameFRE| {
                match fde.func_info2.get_fde_type() {
                    Ok(simple_frame_rs::v3::SFrameFDEType::Flex) => {
                        fre.get_flex_recovery_rules().map(|r| {
                            let ctl = |c: &simple_frame_rs::v3::SFrameFlexControlData| {
                                c.regnum() << 3 | (c.deref_p() as i32) << 1 | c.reg_p() as i32
                            };
                            let pair = |x: Option<simple_frame_rs::v3::SFrameFlexRecoveryRule>| {
                                x.map_or((0, 0), |x| (ctl(&x.control), x.offset))
                            };
                            let (ra, fp) = (pair(r.ra), pair(r.fp));
                            [ctl(&r.cfa.control), r.cfa.offset, ra.0, ra.1, fp.0, fp.1]
                        })
                    }
                    _ => None,
                }
            }
        ),
    }
    out
}

/// A FLEX (control, offset) pair as the rule it means (our semantics, see the module
/// comment); `None` for `reg + offset` without dereference (which validation rejects).
fn flex_rule(ctl: u32, off: i32, default: RegRule) -> Option<RegRule> {
    if ctl == 0 {
        return Some(default);
    }
    let reg = u16::try_from(ctl >> 3).ok()?;
    Some(match (ctl & 1 != 0, ctl & 2 != 0) {
        (false, true) => RegRule::AtCfa(off),
        (false, false) => RegRule::ValCfa(off),
        (true, true) => RegRule::AtReg { reg, offset: off },
        (true, false) if off == 0 => RegRule::InReg(reg),
        (true, false) => return None,
    })
}

/// Our DEFAULT-row RA or FP rule as the word simple-frame-rs returns.
fn default_word(rule: RegRule, s390x_v2: bool, theirs: Option<i32>) -> Option<i32> {
    match rule {
        RegRule::AtCfa(o) => Some(o),
        // Padding 0 (see above), or no word.
        RegRule::Unchanged => theirs.filter(|o| *o == 0),
        RegRule::InReg(n) if s390x_v2 => Some(i32::from(n) * 2 + 1),
        _ => Some(i32::MIN),
    }
}

fn compare_flex(ours: &Section<'_>, fre_ws: usize, rule: &UnwindRule, f: [i32; 6], ctx: &str) {
    let h = ours.header();
    let (sp, fp_reg) = ours.abi().sp_fp_dwarf();
    // (1) control words modulo the word size.
    let mask = if fre_ws == 4 {
        u32::MAX
    } else {
        (1u32 << (8 * fre_ws)) - 1
    };
    let ctl = |v: i32| v as u32 & mask;
    let (cfa_reg, cfa_deref) = match rule.cfa.base {
        CfaBase::Sp => (sp, rule.cfa.deref),
        CfaBase::Fp => (fp_reg, rule.cfa.deref),
        CfaBase::Reg(r) => (r, rule.cfa.deref),
    };
    let their_cfa = ctl(f[0]);
    assert_eq!(their_cfa & 1, 1, "{ctx}: CFA control names a register");
    assert_eq!(
        (their_cfa >> 3, their_cfa & 2 != 0),
        (u32::from(cfa_reg), cfa_deref),
        "{ctx}: CFA register"
    );
    // (2) the s390x CFA offset, decoded.
    let their_off = if ours.abi() == Abi::S390xBigEndian {
        f[1] * 8 + 160
    } else {
        f[1]
    };
    assert_eq!(rule.cfa.offset, their_off, "{ctx}: CFA offset");
    // (3) absent or padding: the header's default.
    let fixed = |o: i8| {
        if o != 0 {
            RegRule::AtCfa(i32::from(o))
        } else {
            RegRule::Unchanged
        }
    };
    let ra = flex_rule(ctl(f[2]), f[3], fixed(h.cfa_fixed_ra_offset));
    let fp = flex_rule(ctl(f[4]), f[5], fixed(h.cfa_fixed_fp_offset));
    assert_eq!(Some(rule.ra), ra, "{ctx}: RA");
    assert_eq!(Some(rule.fp), fp, "{ctx}: FP");
}

fn compare(name: &str, data: &[u8], base: u64) {
    let ours = Section::parse(data, base).unwrap_or_else(|e| panic!("{name}: {e}"));
    let theirs = theirs(data, base);
    assert_eq!(theirs.len() as u32, ours.num_fdes(), "{name}");
    let h = *ours.header();
    let s390x_v2 = h.abi == Abi::S390xBigEndian && h.version == 2;
    for (fde, t_fde) in ours.functions().zip(&theirs) {
        let ctx = format!("{name} fde {}", fde.index);
        assert_eq!((fde.start, fde.size), (t_fde.pc, t_fde.size), "{ctx}");
        assert_eq!(fde.signal, t_fde.signal, "{ctx}: signal");
        if ours.abi().is_aarch64() {
            assert_eq!(fde.pauth_key_b, t_fde.pauth_key_b, "{ctx}: pauth key");
        }
        let rows = &t_fde.rows;
        let our_rows: Vec<_> = ours.rows(&fde).collect();
        assert_eq!(our_rows.len(), rows.len(), "{ctx}");
        for (fre, t) in our_rows.iter().zip(rows) {
            let rule = ours.rule(&fde, fre);
            let ctx = format!("{ctx} fre {}", fre.index);
            assert_eq!(fre.start_offset, t.start, "{ctx}");
            assert_eq!(
                rule.flags.contains(RuleFlags::MANGLED_RA),
                t.mangled,
                "{ctx}"
            );
            assert_eq!(rule.flags.contains(RuleFlags::SIGNAL), fde.signal, "{ctx}");
            if fre.count() == 0 {
                assert!(rule.is_outermost(), "{ctx}"); // simple-frame-rs: no CFA offset
                continue;
            }
            if fde.flex {
                let f = t.flex.expect("flex rules");
                compare_flex(&ours, fre.word_size(), &rule, f, &ctx);
                continue;
            }
            assert_eq!(u8::from(fre.base_is_sp()), t.cfa_base_reg_id, "{ctx}");
            assert_eq!(Some(rule.cfa.offset), t.cfa, "{ctx}");
            assert_eq!(default_word(rule.ra, s390x_v2, t.ra), t.ra, "{ctx}: RA");
            if h.cfa_fixed_fp_offset != 0 {
                // simple-frame-rs ignores the header's fixed FP offset (see above).
                assert_eq!(
                    rule.fp,
                    RegRule::AtCfa(i32::from(h.cfa_fixed_fp_offset)),
                    "{ctx}: fixed FP"
                );
            } else {
                let fp = match rule.fp {
                    RegRule::Unchanged => None,
                    r => default_word(r, s390x_v2, t.fp),
                };
                assert_eq!(fp, t.fp, "{ctx}: FP");
            }
        }
        // PCINC lookups at every row start agree with simple-frame-rs' row choice.
        if fde.pc_type == PcType::Inc && fde.size > 0 {
            for t in rows.iter().filter(|t| t.start < fde.size) {
                let pc = fde.start + u64::from(t.start);
                let (_, fre) = ours.find_fre_raw(pc).expect("row start found");
                assert_eq!(fre.start_offset, t.start, "{name} lookup {pc:#x}");
            }
        }
    }
}

#[test]
fn differential_vectors() {
    let Some(vectors) = load_vectors() else {
        return;
    };
    for v in &vectors {
        compare(&v.name, &v.content, v.section_base);
    }
}

#[test]
fn differential_binaries() {
    let Some(bins) = build_binaries() else { return };
    for (name, path) in &bins {
        let bytes = std::fs::read(path).expect("read");
        let file = object::File::parse(&*bytes).expect("ELF");
        use object::{Object, ObjectSection};
        let sec = file.section_by_name(".sframe").expect(".sframe");
        compare(name, sec.data().expect("data"), sec.address());
    }
}

#[test]
fn differential_hand_built() {
    for (name, spec) in sframe_support::build::samples() {
        let b = sframe_support::build::build(&spec);
        compare(name, &b.bytes, spec.vaddr);
    }
}
