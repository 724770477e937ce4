//! Malformed sections built byte by byte (`sframe_support::build`), one per validation
//! rule not covered by the unit tests in `src/sframe/tests.rs`: each FLEX problem, the
//! v3 info2 reserved bits and attribute record bounds, flags of another version and
//! unknown flags, s390x's reserved bits and word counts, the count/length mismatches and
//! FRE bounds of a big-endian section. Each gives its own typed error (fast validation
//! and the careful reference alike), whose one-line message names the check and where.

mod sframe_support;

use sframe_support::build::{self, Built, Fre, Func, Spec, build, ctl_cfa, ctl_raw, ctl_reg};
use sframe_user::sframe::{FlexProblem, SFrameError, Section};

const VADDR: u64 = build::SAMPLE_VADDR;

/// `bytes` are rejected with exactly `want`, by both validation paths; its message is
/// one line starting with `check` and naming `offset`.
fn rejects(bytes: &[u8], want: SFrameError, check: &str, offset: usize) {
    let got = Section::parse(bytes, VADDR).expect_err("rejected");
    assert_eq!(got, want);
    assert_eq!(
        Section::parse_reference(bytes, VADDR).expect_err("reference rejects"),
        want
    );
    let msg = got.to_string();
    assert!(!msg.contains('\n'), "{msg}");
    assert!(
        msg.starts_with(check),
        "{msg:?} should start with {check:?}"
    );
    assert!(msg.contains(&format!("offset {offset}")), "{msg}");
}

/// An AMD64 v3 section with one FLEX function: a valid first row, then `bad`.
fn flex_with(bad: Fre) -> Built {
    build(&Spec::new(
        3,
        build::ABI_AMD64,
        VADDR,
        vec![Func::new(0x1000, 0x20, vec![Fre::sp(0, &[ctl_reg(7, false), 8]), bad]).flex()],
    ))
}

fn flex_rejects(bad: Fre, problem: FlexProblem) {
    let b = flex_with(bad);
    let off = b.fre[0][1];
    rejects(
        &b.bytes,
        SFrameError::BadFlexRule {
            fde: 0,
            fre: 1,
            offset: off,
            problem,
        },
        "FLEX rule check",
        off,
    );
}

#[test]
fn each_flex_problem() {
    use FlexProblem::*;
    let sp = ctl_reg(7, false);
    // CFA control word without reg_p: CFA-based (0b10) or padding (0).
    flex_rejects(Fre::sp(4, &[ctl_cfa(true), 8]), CfaNotRegister);
    flex_rejects(Fre::sp(4, &[ctl_cfa(false), 8]), CfaNotRegister);
    // A control word with no offset word: the CFA's, or the RA's.
    flex_rejects(Fre::sp(4, &[sp]), MissingOffset);
    flex_rejects(Fre::sp(4, &[sp, 8, ctl_reg(3, false)]), MissingOffset);
    flex_rejects(
        Fre::sp(4, &[sp, 8, 0, ctl_reg(6, true)]),
        MissingOffset, // FP control after RA padding, no FP offset
    );
    // Words after the FP rule, or after FP padding.
    flex_rejects(
        Fre::sp(4, &[sp, 8, ctl_reg(3, false), 0, ctl_reg(6, true), 0, 1]),
        Leftover,
    );
    flex_rejects(Fre::sp(4, &[sp, 8, 0, 0, 5]), Leftover);
    // RA = rbx + 8, no dereference: not a recovery rule.
    flex_rejects(Fre::sp(4, &[sp, 8, ctl_reg(3, false), 8]), RegPlusOffset);
    flex_rejects(
        Fre::sp(4, &[sp, 8, 0, ctl_reg(3, false), -8]),
        RegPlusOffset, // the FP's
    );
    // Reserved bit 2, in the CFA's control word and in the RA's.
    flex_rejects(Fre::sp(4, &[ctl_raw(0x39 | 4), 8]), ReservedBit);
    flex_rejects(Fre::sp(4, &[sp, 8, ctl_raw(0x19 | 4), 0]), ReservedBit);
    // Register numbers over 65535 (4-byte control words).
    flex_rejects(Fre::sp(4, &[ctl_reg(70_000, false), 8]), BadRegister);
    flex_rejects(Fre::sp(4, &[sp, 8, ctl_reg(1 << 20, true), 0]), BadRegister);
}

#[test]
fn v3_info2_reserved_bits() {
    for bit in [0x20u8, 0x40, 0x80] {
        let mut b = build(&build::amd64_flex());
        let info2 = b.data[1] + 3; // attribute record: num_fres (2), info, info2, rep_size
        b.bytes[info2] |= bit;
        rejects(
            &b.bytes,
            SFrameError::FdeInfo2ReservedBits {
                fde: 1,
                offset: info2,
                value: bit,
            },
            "reserved bits check",
            info2,
        );
    }
}

#[test]
fn v3_attribute_record_out_of_bounds() {
    let mut b = build(&build::amd64_flex());
    let fre_len = b.get(16, 4) as usize;
    // FDE 1's attribute record would start 2 bytes before the end of the FRE sub-section.
    let rel = fre_len - 2;
    b.put(b.fde[1] + 12, 4, rel as u64);
    let fde1 = b.fde[1];
    rejects(
        &b.bytes,
        SFrameError::FdeAttrOutOfBounds {
            fde: 1,
            offset: fde1,
            attr: (b.fres_start + rel) as u64,
        },
        "bounds check",
        fde1,
    );
    // Far past the section (no overflow on the way).
    b.put(b.fde[1] + 12, 4, u64::from(u32::MAX));
    assert!(matches!(
        Section::parse(&b.bytes, VADDR),
        Err(SFrameError::FdeAttrOutOfBounds { fde: 1, .. })
    ));
}

#[test]
fn flags_of_another_version_and_unknown_flags() {
    // SFRAME_F_FRAME_POINTER was removed in v3; v1 has no PCREL; 0x08..0x80 are unknown.
    let mut v3 = build(&build::amd64_flex()).bytes;
    v3[3] |= build::F_FRAME_POINTER;
    rejects(
        &v3,
        SFrameError::FlagNotInVersion {
            flag: build::F_FRAME_POINTER,
            version: 3,
        },
        "flags check: SFRAME_F_FRAME_POINTER",
        3,
    );
    let v1_spec = Spec::new(
        1,
        build::ABI_AMD64,
        VADDR,
        vec![Func::new(0x1000, 0x10, vec![Fre::sp(0, &[8])])],
    );
    let v1 = build(&v1_spec).bytes;
    Section::parse(&v1, VADDR).expect("v1 is valid");
    let mut m = v1.clone();
    m[3] |= build::F_PCREL;
    rejects(
        &m,
        SFrameError::FlagNotInVersion {
            flag: build::F_PCREL,
            version: 1,
        },
        "flags check: SFRAME_F_FDE_FUNC_START_PCREL",
        3,
    );
    // FRAME_POINTER is a v1/v2 flag.
    let mut m = v1.clone();
    m[3] |= build::F_FRAME_POINTER;
    Section::parse(&m, VADDR).expect("v1 FRAME_POINTER");
    let mut v2 = build(&build::s390x_v2()).bytes;
    v2[3] |= build::F_FRAME_POINTER;
    Section::parse(&v2, VADDR).expect("v2 FRAME_POINTER");
    for bit in [0x08u8, 0x10, 0x20, 0x40, 0x80] {
        for (version, bytes) in [(1u8, &v1), (2, &v2), (3, &v3)] {
            let mut m = bytes.clone();
            m[3] |= bit;
            // Unknown bits are reported before a flag of another version.
            rejects(
                &m,
                SFrameError::UnknownFlags {
                    flags: m[3],
                    version,
                },
                "flags check",
                3,
            );
            assert!(
                Section::parse(&m, VADDR)
                    .unwrap_err()
                    .to_string()
                    .contains(&format!("unknown bits {bit:#04x}")),
                "{bit:#x}"
            );
        }
    }
}

#[test]
fn s390x_reserved_bits_and_word_counts() {
    let b = build(&build::s390x_v2());
    // Mangled-RA bit (AArch64 only) on an s390x FRE.
    let mut m = b.clone();
    let fre = b.fre[0][1];
    m.bytes[fre + 1] |= build::FRE_MANGLED_RA;
    rejects(
        &m.bytes,
        SFrameError::FreReservedBits {
            fde: 0,
            fre: 1,
            offset: fre,
            value: m.bytes[fre + 1],
        },
        "reserved bits check",
        fre,
    );
    // Pointer-authentication key bit (AArch64 only) on an s390x FDE.
    let mut m = b.clone();
    let fde = b.fde[1];
    m.bytes[fde + 16] |= build::INFO_PAUTH_KEY_B;
    rejects(
        &m.bytes,
        SFrameError::FdeReservedBits {
            fde: 1,
            offset: fde,
            value: m.bytes[fde + 16],
        },
        "reserved bits check",
        fde,
    );
    // Four data words: s390x uses at most three (CFA, RA, FP).
    let mut spec = build::s390x_v2();
    spec.funcs[1].fres[1] = Fre::sp(0x104, &[1000, 1, -4000, 8]);
    let m = build(&spec);
    let fre = m.fre[1][1];
    rejects(
        &m.bytes,
        SFrameError::LeftoverDataWords {
            fde: 1,
            fre: 1,
            offset: fre,
            count: 4,
            max: 3,
        },
        "word count check",
        fre,
    );
    // s390x is big-endian only: a little-endian magic with its ABI code.
    let mut m = b.bytes.clone();
    m.swap(0, 1);
    assert_eq!(
        Section::parse(&m, VADDR).unwrap_err(),
        SFrameError::AbiEndianMismatch {
            abi: build::ABI_S390X
        }
    );
    // v2 has no signal bit: bit 7 of the info byte is reserved.
    let mut m = b.bytes.clone();
    m[b.fde[0] + 16] |= build::INFO_SIGNAL;
    assert!(matches!(
        Section::parse(&m, VADDR),
        Err(SFrameError::FdeReservedBits { fde: 0, .. })
    ));
}

/// The count and length checks name the header field; FRE bounds name the FRE.
#[test]
fn count_length_and_fre_bounds_say_where() {
    let b = build(&build::s390x_v2()); // big-endian counts
    let mut m = b.clone();
    m.put(12, 4, 8);
    rejects(
        &m.bytes,
        SFrameError::FreCountMismatch {
            header: 8,
            found: 7,
            offset: 12,
        },
        "count check",
        12,
    );
    let fre_len = b.get(16, 4);
    let mut m = b.clone();
    m.bytes.push(0);
    m.put(16, 4, fre_len + 1);
    rejects(
        &m.bytes,
        SFrameError::FreLenMismatch {
            header: fre_len as u32 + 1,
            used: fre_len,
            offset: 16,
        },
        "length check",
        16,
    );
    // The last FRE claims one more data word than the section holds.
    let mut m = b.clone();
    let last = b.fre[1][1];
    let aw = 2; // function 1 is 0x200 bytes: 2-byte FRE starts
    let info = m.bytes[last + aw];
    m.bytes[last + aw] = (info & !0x1e) | (3 << 1); // 3 words of 2 bytes...
    m.bytes.truncate(last + aw + 1 + 4); // ...but only 2 of them left
    let new_len = (m.bytes.len() - b.fres_start) as u64;
    m.put(16, 4, new_len);
    rejects(
        &m.bytes,
        SFrameError::FreDataOutOfBounds {
            fde: 1,
            fre: 1,
            offset: last,
            len: (aw + 1 + 6) as u64,
        },
        "bounds check",
        last,
    );
    // v2: FRE offset past the FRE sub-section.
    let mut m = b.clone();
    m.put(b.fde[1] + 8, 4, fre_len + 1);
    let fde1 = b.fde[1];
    rejects(
        &m.bytes,
        SFrameError::FreOffsetOutOfBounds {
            fde: 1,
            offset: fde1,
            fres: b.fres_start as u64 + fre_len + 1,
        },
        "bounds check",
        fde1,
    );
}

/// With a fixed FP offset in the header, a DEFAULT row has no FP word: a word in its
/// place is leftover (the kernel's reader rejects it; libsframe would ignore it and use
/// the fixed offset, so accepting it would hide what the producer meant).
#[test]
fn fixed_fp_offset_leaves_no_room_for_an_fp_word() {
    // AMD64 (fixed RA and FP): the CFA word only.
    let mut spec = build::amd64_fixed_fp();
    spec.funcs[0].fres[1] = Fre::fp(1, &[16, -24]);
    let b = build(&spec);
    let fre = b.fre[0][1];
    rejects(
        &b.bytes,
        SFrameError::LeftoverDataWords {
            fde: 0,
            fre: 1,
            offset: fre,
            count: 2,
            max: 1,
        },
        "word count check",
        fre,
    );
    // AArch64 (no fixed RA) with a fixed FP offset: CFA and RA words.
    let mut spec = build::aarch64_v3(false, false);
    spec.fixed_fp = -16;
    spec.funcs.remove(0); // the FLEX function
    let b = build(&spec);
    let fre = b.fre[0][1];
    rejects(
        &b.bytes,
        SFrameError::LeftoverDataWords {
            fde: 0,
            fre: 1,
            offset: fre,
            count: 3,
            max: 2,
        },
        "word count check",
        fre,
    );
    // Two words there are the CFA and the RA.
    spec.funcs[0].fres[1] = Fre::sp(4, &[16, -8]).mangled();
    spec.funcs[0].fres[2] = Fre::fp(8, &[16, -8]).mangled();
    let b = build(&spec);
    let s = Section::parse(&b.bytes, VADDR).expect("valid");
    let f = s.fde(0).unwrap();
    let r = s.rule(&f, &s.rows(&f).nth(1).unwrap());
    assert_eq!(
        (r.ra, r.fp),
        (
            sframe_common::RegRule::AtCfa(-8),
            sframe_common::RegRule::AtCfa(-16)
        )
    );
}
