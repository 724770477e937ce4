//! Sections built byte by byte from the binutils SFrame spec (`sframe_support::build`),
//! not by the crate's writer: s390x (big-endian; its CFA and register encodings), FLEX
//! rows (v3) of every control-word form, the v3 signal bit, AArch64 pointer
//! authentication with key B, the header's fixed FP offset. Each is read (rules,
//! lookups), dumped in `objdump --sframe` form and round-tripped through the writer
//! (byte for byte where the writer produces the same encoding).

mod sframe_support;

use sframe_common::{CfaBase, CfaRule, RegRule, RuleFlags, UnwindRule};
use sframe_support::build::{self, Built, Spec, build, norm_lines};
use sframe_user::sframe::{
    Section, WriteError, WriteOptions, WriteVersion, dump_to_string, lookup_line, write_section,
};
use sframe_user::table::{Arch, UnwindTable};

const VADDR: u64 = build::SAMPLE_VADDR;

fn parse(b: &Built) -> Section<'_> {
    let s = Section::parse(&b.bytes, VADDR).unwrap_or_else(|e| panic!("{e}"));
    // The careful reference decoders accept it too.
    Section::parse_reference(&b.bytes, VADDR).unwrap_or_else(|e| panic!("reference: {e}"));
    s
}

fn rule(cfa: CfaRule, ra: RegRule, fp: RegRule) -> UnwindRule {
    UnwindRule {
        cfa,
        ra,
        fp,
        flags: RuleFlags::default(),
    }
}

fn flags(r: UnwindRule, bits: &[u8]) -> UnwindRule {
    let mut r = r;
    for &b in bits {
        r.flags = r.flags.with(b);
    }
    r
}

const fn reg(base: CfaBase, offset: i32) -> CfaRule {
    CfaRule {
        base,
        offset,
        deref: false,
    }
}

const fn deref(base: CfaBase, offset: i32) -> CfaRule {
    CfaRule {
        base,
        offset,
        deref: true,
    }
}

fn undefined(base_sp: bool) -> UnwindRule {
    rule(
        if base_sp {
            CfaRule::sp(0)
        } else {
            CfaRule::fp(0)
        },
        RegRule::Undefined,
        RegRule::Unchanged,
    )
}

/// The rules of every row, function by function (on-disk order).
fn rules(s: &Section<'_>) -> Vec<Vec<UnwindRule>> {
    s.functions()
        .map(|f| s.rows(&f).map(|r| s.rule(&f, &r)).collect())
        .collect()
}

/// What `find_fre` gives at `pc`: FDE index and rule.
fn at(s: &Section<'_>, pc: u64) -> Option<(u32, UnwindRule)> {
    s.find_fre(pc).map(|f| (f.function, f.rule))
}

fn write(t: &UnwindTable, version: WriteVersion) -> Result<Vec<u8>, WriteError> {
    write_section(
        t,
        &WriteOptions {
            version,
            section_vaddr: VADDR,
        },
    )
    .map(|(b, _)| b)
}

/// The section through `to_table` and the writer in `version`: the rules read back
/// equal, and the bytes are returned.
fn round_trip(s: &Section<'_>, version: WriteVersion) -> Vec<u8> {
    let t = s.to_table().expect("to_table");
    let bytes = write(&t, version).unwrap_or_else(|e| panic!("{version:?}: {e}"));
    let back = Section::parse(&bytes, VADDR).expect("writer output parses");
    assert_eq!(
        back.to_table().unwrap().to_function_rows(),
        t.to_function_rows(),
        "{version:?}"
    );
    bytes
}

fn assert_dump(s: &Section<'_>, want: &str) {
    let got = norm_lines(&dump_to_string(s));
    let want = norm_lines(want);
    assert_eq!(got, want, "\n--- dump\n{}", dump_to_string(s));
}

// ---------------------------------------------------------------------------------------
// s390x

fn s390x_rules() -> Vec<Vec<UnwindRule>> {
    use CfaBase::{Fp, Sp};
    use RegRule::{AtCfa, InReg, Unchanged};
    vec![
        vec![
            rule(reg(Sp, 160), Unchanged, Unchanged),
            rule(reg(Sp, 320), AtCfa(-48), AtCfa(-72)),
            rule(reg(Fp, 320), InReg(24), InReg(25)),
            rule(reg(Sp, 320), Unchanged, AtCfa(-80)),
            undefined(true),
        ],
        vec![
            rule(reg(Sp, 152), Unchanged, Unchanged),
            rule(reg(Sp, 8160), InReg(0), AtCfa(-4000)),
        ],
    ]
}

#[test]
fn s390x_v2_rules_lookups_dump_and_writer() {
    let b = build(&build::s390x_v2());
    assert_eq!(&b.bytes[..2], &[0xde, 0xe2], "big-endian magic");
    let s = parse(&b);
    assert_eq!(s.arch(), Arch::S390x);
    assert_eq!(rules(&s), s390x_rules());

    let want = s390x_rules();
    for (pc, fde, row) in [
        (0x1000u64, 0u32, 0usize),
        (0x1005, 0, 0),
        (0x1006, 0, 1),
        (0x100f, 0, 1),
        (0x1010, 0, 2),
        (0x1020, 0, 3),
        (0x1030, 0, 4),
        (0x103f, 0, 4),
        (0x1100, 1, 0),
        (0x1203, 1, 0),
        (0x1204, 1, 1),
        (0x12ff, 1, 1),
    ] {
        assert_eq!(at(&s, pc), Some((fde, want[fde as usize][row])), "{pc:#x}");
    }
    for pc in [0xfff, 0x1040, 0x10ff, 0x1300] {
        assert_eq!(at(&s, pc), None, "{pc:#x}");
    }
    assert_eq!(
        lookup_line(&s, 0x1006),
        "0x1006 FOUND cfa_base=sp cfa_off=320 fp_off=-72 ra_off=-48"
    );
    assert_eq!(
        lookup_line(&s, 0x1010),
        "0x1010 FOUND cfa_base=fp cfa_off=320 fp_off=none ra_off=none ra=r24 fp=r25"
    );
    assert_eq!(
        lookup_line(&s, 0x1030),
        "0x1030 FOUND cfa_base=none cfa_off=none fp_off=none ra_off=none ra=undefined"
    );

    // binutils 2.45's objdump (sframe-dump.c): decoded CFA offsets, `rN` for
    // register-saved RA/FP, `U` for the RA padding word.
    assert_dump(
        &s,
        "Contents of the SFrame section .sframe:
          Header :
            Version: SFRAME_VERSION_2
            Flags: SFRAME_F_FDE_SORTED,
                   SFRAME_F_FDE_FUNC_START_PCREL
            Num FDEs: 2
            Num FREs: 7
          Function Index :
            func idx [0]: pc = 0x1000, size = 64 bytes
            STARTPC CFA FP RA
            0000000000001000 sp+160 u u
            0000000000001006 sp+320 c-72 c-48
            0000000000001010 fp+320 r25 r24
            0000000000001020 sp+320 c-80 U
            0000000000001030 RA undefined
            func idx [1]: pc = 0x1100, size = 512 bytes
            STARTPC CFA FP RA
            0000000000001100 sp+152 u u
            0000000000001204 sp+8160 c-4000 r0",
    );

    // The writer encodes the same rows to the same bytes in v2, and to FLEX rows in v3
    // (v3 has no register encoding in DEFAULT rows), which are the hand-built v3 bytes.
    assert_eq!(round_trip(&s, WriteVersion::V2), b.bytes, "v2 bytes");
    assert_eq!(
        round_trip(&s, WriteVersion::V3),
        build(&build::s390x_v3()).bytes,
        "v3 bytes"
    );
}

#[test]
fn s390x_v3_flex_rows_and_dump() {
    let b = build(&build::s390x_v3());
    let s = parse(&b);
    assert!(s.functions().all(|f| f.flex));
    // Same rules as the v2 encoding: the CFA offset is decoded in FLEX rows too (as
    // libsframe 2.46's sframe_fre_get_cfa_offset does).
    assert_eq!(rules(&s), s390x_rules());
    assert_dump(
        &s,
        "Contents of the SFrame section .sframe:
          Header :
            Version: SFRAME_VERSION_3
            Flags: SFRAME_F_FDE_SORTED,
                   SFRAME_F_FDE_FUNC_START_PCREL
            Num FDEs: 2
            Num FREs: 7
          Function Index :
            func idx [0]: pc = 0x1000, size = 64 bytes, attr = \"F\"
            STARTPC CFA FP RA
            0000000000001000 sp+160 u u
            0000000000001006 sp+320 c-72 c-48
            0000000000001010 fp+320 r25+0 r24+0
            0000000000001020 sp+320 c-80 U
            0000000000001030 RA undefined
            func idx [1]: pc = 0x1100, size = 512 bytes, attr = \"F\"
            STARTPC CFA FP RA
            0000000000001100 sp+152 u u
            0000000000001204 sp+8160 c-4000 r0+0",
    );
    assert_eq!(round_trip(&s, WriteVersion::V3), b.bytes);
}

/// In v3 DEFAULT rows an odd s390x offset is an ordinary CFA offset (binutils 2.46:
/// `sframe_s390x_offset_regnum_p` is false for v3), not a register.
#[test]
fn s390x_v3_default_rows_have_no_register_encoding() {
    let spec = Spec::new(
        3,
        build::ABI_S390X,
        VADDR,
        vec![build::Func::new(
            0x1000,
            0x10,
            vec![build::Fre::sp(0, &[2, -49, -51])],
        )],
    );
    let b = build(&spec);
    let s = parse(&b);
    assert_eq!(
        rules(&s),
        vec![vec![rule(
            reg(CfaBase::Sp, 176),
            RegRule::AtCfa(-49),
            RegRule::AtCfa(-51)
        )]]
    );
    let dump = dump_to_string(&s);
    assert!(
        norm_lines(&dump).contains(&"0000000000001000 sp+176 c-51 c-49".to_string()),
        "{dump}"
    );
    // v2 cannot store an odd CFA slot on s390x (it would read back as a register).
    let t = s.to_table().unwrap();
    assert!(matches!(
        write(&t, WriteVersion::V2),
        Err(WriteError::Unrepresentable { version: 2, .. })
    ));
    assert_eq!(round_trip(&s, WriteVersion::V3), b.bytes);
}

// ---------------------------------------------------------------------------------------
// FLEX (v3)

#[test]
fn flex_rows_decode_each_control_word_form() {
    use CfaBase::{Fp, Reg, Sp};
    use RegRule::{AtCfa, AtReg, InReg, Unchanged};
    let b = build(&build::amd64_flex());
    let s = parse(&b);
    let fixed_ra = AtCfa(-8);
    let rbp0 = AtReg { reg: 6, offset: 0 };
    assert_eq!(
        rules(&s),
        vec![
            vec![
                // No RA/FP words: the fixed RA slot, FP unchanged.
                rule(reg(Sp, 8), fixed_ra, Unchanged),
                // CFA in r10; RA padding (control word 0) falls back to the fixed slot.
                rule(reg(Reg(10), 0), fixed_ra, rbp0),
                // CFA = *(rbp - 8).
                rule(deref(Fp, -8), fixed_ra, rbp0),
                // RA in a register (rbx).
                rule(reg(Sp, 16), InReg(3), Unchanged),
                // RA saved at register + offset.
                rule(reg(Sp, 16), AtReg { reg: 6, offset: 8 }, Unchanged),
                // RA and FP saved at CFA + offset.
                rule(reg(Sp, 24), AtCfa(-16), AtCfa(-24)),
                rule(reg(Sp, 4000), fixed_ra, Unchanged),
                undefined(true),
            ],
            vec![
                rule(reg(Sp, 8), fixed_ra, Unchanged),
                rule(reg(Fp, 16), fixed_ra, AtCfa(-16)),
            ],
        ]
    );
    for (pc, line) in [
        (
            0x1000,
            "0x1000 FOUND cfa_base=sp cfa_off=8 fp_off=none ra_off=-8",
        ),
        (
            0x1004,
            "0x1004 FOUND cfa_base=r10 cfa_off=0 fp_off=none ra_off=-8 fp=(fp+0)",
        ),
        (
            0x1008,
            "0x1008 FOUND cfa_base=fp cfa_off=-8 fp_off=none ra_off=-8 cfa_deref=1 fp=(fp+0)",
        ),
        (
            0x100c,
            "0x100c FOUND cfa_base=sp cfa_off=16 fp_off=none ra_off=none ra=r3",
        ),
        (
            0x1013,
            "0x1013 FOUND cfa_base=sp cfa_off=16 fp_off=none ra_off=none ra=(fp+8)",
        ),
        (
            0x1014,
            "0x1014 FOUND cfa_base=sp cfa_off=24 fp_off=-24 ra_off=-16",
        ),
        (
            0x103f,
            "0x103f FOUND cfa_base=none cfa_off=none fp_off=none ra_off=none ra=undefined",
        ),
        (
            0x1041,
            "0x1041 FOUND cfa_base=fp cfa_off=16 fp_off=-16 ra_off=-8",
        ),
        (0x1050, "0x1050 NOTFOUND"),
    ] {
        assert_eq!(lookup_line(&s, pc), line);
    }
    // libsframe 2.46's sframe_format_fre_disp: `reg+off`, `(reg+off)` when
    // dereferenced, `c` for the CFA; RA padding prints `U`, no RA words `f` (fixed).
    assert_dump(
        &s,
        "Contents of the SFrame section .sframe:
          Header :
            Version: SFRAME_VERSION_3
            Flags: SFRAME_F_FDE_SORTED,
                   SFRAME_F_FDE_FUNC_START_PCREL
            CFA fixed RA offset: -8
            Num FDEs: 2
            Num FREs: 10
          Function Index :
            func idx [0]: pc = 0x1000, size = 64 bytes, attr = \"F\"
            STARTPC CFA FP RA
            0000000000001000 sp+8 u f
            0000000000001004 r10+0 (fp+0) U
            0000000000001008 (fp-8) (fp+0) U
            000000000000100c sp+16 u r3+0
            0000000000001010 sp+16 u (fp+8)
            0000000000001014 sp+24 c-24 c-16
            0000000000001018 sp+4000 u f
            000000000000101c RA undefined
            func idx [1]: pc = 0x1040, size = 16 bytes
            STARTPC CFA FP RA
            0000000000001040 sp+8 u f
            0000000000001041 fp+16 c-16 f",
    );
    // The writer produces exactly these FLEX words; v2 cannot express them.
    assert_eq!(round_trip(&s, WriteVersion::V3), b.bytes);
    assert!(matches!(
        write(&s.to_table().unwrap(), WriteVersion::V2),
        Err(WriteError::Unrepresentable {
            function: 0,
            row: 1,
            version: 2,
            ..
        })
    ));
}

/// Without a fixed RA offset (AArch64), RA padding falls back to "RA unchanged".
#[test]
fn flex_ra_padding_without_fixed_ra_is_unchanged() {
    let b = build(&build::aarch64_v3(false, false));
    let s = parse(&b);
    let r = &rules(&s)[0];
    assert_eq!(r[0].ra, RegRule::Unchanged);
    assert_eq!(r[0].fp, RegRule::AtCfa(-16));
    assert_eq!(r[2].ra, RegRule::InReg(30));
}

// ---------------------------------------------------------------------------------------
// Signal frames, pointer authentication, fixed FP offset

#[test]
fn v3_signal_bit_read_dumped_and_written() {
    use CfaBase::{Fp, Sp};
    use RegRule::{AtCfa, Unchanged};
    let b = build(&build::amd64_signal());
    let s = parse(&b);
    let sig = RuleFlags::SIGNAL;
    assert_eq!(
        rules(&s),
        vec![
            vec![
                flags(rule(reg(Sp, 160), AtCfa(-8), Unchanged), &[sig]),
                flags(rule(reg(Fp, 16), AtCfa(-8), AtCfa(-16)), &[sig]),
            ],
            vec![flags(rule(deref(Sp, 160), AtCfa(-8), Unchanged), &[sig])],
            vec![rule(reg(Sp, 8), AtCfa(-8), Unchanged)],
        ]
    );
    assert!(s.fde(0).unwrap().signal && s.fde(1).unwrap().signal && !s.fde(2).unwrap().signal);
    assert_eq!(
        lookup_line(&s, 0x1000),
        "0x1000 FOUND cfa_base=sp cfa_off=160 fp_off=none ra_off=-8 signal=1"
    );
    assert_eq!(
        lookup_line(&s, 0x1010),
        "0x1010 FOUND cfa_base=sp cfa_off=160 fp_off=none ra_off=-8 cfa_deref=1 signal=1"
    );
    assert_dump(
        &s,
        "Contents of the SFrame section .sframe:
          Header :
            Version: SFRAME_VERSION_3
            Flags: SFRAME_F_FDE_SORTED,
                   SFRAME_F_FDE_FUNC_START_PCREL
            CFA fixed RA offset: -8
            Num FDEs: 3
            Num FREs: 4
          Function Index :
            func idx [0]: pc = 0x1000, size = 16 bytes, attr = \"S\"
            STARTPC CFA FP RA
            0000000000001000 sp+160 u f
            0000000000001008 fp+16 c-16 f
            func idx [1]: pc = 0x1010, size = 16 bytes, attr = \"SF\"
            STARTPC CFA FP RA
            0000000000001010 (sp+160) u f
            func idx [2]: pc = 0x1020, size = 16 bytes
            STARTPC CFA FP RA
            0000000000001020 sp+8 u f",
    );
    assert_eq!(round_trip(&s, WriteVersion::V3), b.bytes);
    // v2 has no signal bit (bit 7 of its info byte is reserved).
    assert!(matches!(
        write(&s.to_table().unwrap(), WriteVersion::V2),
        Err(WriteError::Unrepresentable {
            function: 0,
            version: 2,
            what: "a signal frame",
            ..
        })
    ));
}

fn aarch64_rules(key_b: bool) -> Vec<Vec<UnwindRule>> {
    use CfaBase::{Fp, Sp};
    use RegRule::{AtCfa, InReg, Unchanged};
    let signed: &[u8] = if key_b {
        &[RuleFlags::MANGLED_RA, RuleFlags::PAUTH_KEY_B]
    } else {
        &[RuleFlags::MANGLED_RA]
    };
    vec![
        vec![
            flags(rule(reg(Sp, 16), Unchanged, AtCfa(-16)), signed),
            flags(rule(reg(Fp, 16), AtCfa(-8), AtCfa(-16)), signed),
            rule(reg(Sp, 0), InReg(30), Unchanged),
        ],
        vec![
            rule(reg(Sp, 0), Unchanged, Unchanged),
            flags(rule(reg(Sp, 16), AtCfa(-8), AtCfa(-16)), signed),
            flags(rule(reg(Fp, 16), AtCfa(-8), AtCfa(-16)), signed),
            rule(reg(Sp, 0), Unchanged, Unchanged),
        ],
    ]
}

#[test]
fn aarch64_pauth_key_b_read_dumped_and_written() {
    for (big_endian, key_b) in [(false, true), (true, true), (true, false), (false, false)] {
        let what = format!("big_endian {big_endian} key_b {key_b}");
        let b = build(&build::aarch64_v3(big_endian, key_b));
        let s = parse(&b);
        assert_eq!(s.arch(), Arch::Aarch64 { big_endian }, "{what}");
        assert_eq!(rules(&s), aarch64_rules(key_b), "{what}");
        assert!(s.functions().all(|f| f.pauth_key_b == key_b), "{what}");
        let key = if key_b { ", pauth = B key" } else { "" };
        assert_dump(
            &s,
            &format!(
                "Contents of the SFrame section .sframe:
                  Header :
                    Version: SFRAME_VERSION_3
                    Flags: SFRAME_F_FDE_SORTED,
                           SFRAME_F_FDE_FUNC_START_PCREL
                    Num FDEs: 2
                    Num FREs: 7
                  Function Index :
                    func idx [0]: pc = 0x1000, size = 32 bytes, attr = \"F\"{key}
                    STARTPC CFA FP RA
                    0000000000001000 sp+16 c-16 U[s]
                    0000000000001004 fp+16 c-16 c-8[s]
                    0000000000001008 sp+0 u r30+0
                    func idx [1]: pc = 0x1020, size = 32 bytes{key}
                    STARTPC CFA FP RA
                    0000000000001020 sp+0 u u
                    0000000000001024 sp+16 c-16 c-8[s]
                    0000000000001028 fp+16 c-16 c-8[s]
                    000000000000102c sp+0 u u"
            ),
        );
        let key_field = if key_b { " pauth_key=b" } else { "" };
        assert_eq!(
            lookup_line(&s, 0x1000),
            format!(
                "0x1000 FOUND cfa_base=sp cfa_off=16 fp_off=-16 ra_off=none mangled_ra=1{key_field}"
            )
        );
        assert_eq!(
            lookup_line(&s, 0x1008),
            "0x1008 FOUND cfa_base=sp cfa_off=0 fp_off=none ra_off=none ra=r30"
        );
        // The key is stored per function from the signed rows: the same bytes.
        assert_eq!(round_trip(&s, WriteVersion::V3), b.bytes, "{what}");
        // v2 stores the key in the same info bit (the FLEX function aside).
        let t = s.to_table().unwrap();
        let plain =
            UnwindTable::from_functions(t.arch, t.source, t.to_function_rows().into_iter().skip(1));
        let v2 = write(&plain, WriteVersion::V2).expect("v2");
        let back = Section::parse(&v2, VADDR).unwrap();
        assert_eq!(
            rules(&back),
            vec![aarch64_rules(key_b)[1].clone()],
            "{what}"
        );
        assert_eq!(back.fde(0).unwrap().pauth_key_b, key_b, "{what}");
    }
}

/// The writer refuses one function whose signed rows use both keys.
#[test]
fn writer_refuses_mixed_pauth_keys() {
    let s_b = build(&build::aarch64_v3(false, true));
    let s = parse(&s_b);
    let mut fns = s.to_table().unwrap().to_function_rows();
    let row = fns[1].rows[2].rule.as_mut().unwrap();
    row.flags = RuleFlags(RuleFlags::MANGLED_RA);
    let t = UnwindTable::from_functions(
        Arch::Aarch64 { big_endian: false },
        s.to_table().unwrap().source,
        fns,
    );
    assert!(matches!(
        write(&t, WriteVersion::V3),
        Err(WriteError::InconsistentFunction {
            function: 1,
            what: "the pointer-authentication key"
        })
    ));
}

#[test]
fn header_fixed_fp_offset_read_dumped_and_written() {
    use CfaBase::{Fp, Reg, Sp};
    use RegRule::AtCfa;
    let b = build(&build::amd64_fixed_fp());
    let s = parse(&b);
    assert_eq!(s.header().cfa_fixed_fp_offset, -16);
    // libsframe's sframe_fre_get_fp_offset: the fixed offset for every DEFAULT row and
    // for FLEX rows without FP words, but not for RA-undefined rows.
    assert_eq!(
        rules(&s),
        vec![
            vec![
                rule(reg(Sp, 8), AtCfa(-8), AtCfa(-16)),
                rule(reg(Fp, 16), AtCfa(-8), AtCfa(-16)),
                undefined(true),
            ],
            vec![rule(reg(Reg(10), 0), AtCfa(-8), AtCfa(-16))],
        ]
    );
    assert_eq!(
        lookup_line(&s, 0x1000),
        "0x1000 FOUND cfa_base=sp cfa_off=8 fp_off=-16 ra_off=-8"
    );
    // objdump prints the header line, `c-16` in DEFAULT rows, and `u` in the FLEX row
    // (its FP column shows FP words only).
    assert_dump(
        &s,
        "Contents of the SFrame section .sframe:
          Header :
            Version: SFRAME_VERSION_3
            Flags: SFRAME_F_FDE_SORTED,
                   SFRAME_F_FDE_FUNC_START_PCREL
            CFA fixed FP offset: -16
            CFA fixed RA offset: -8
            Num FDEs: 2
            Num FREs: 4
          Function Index :
            func idx [0]: pc = 0x1000, size = 32 bytes
            STARTPC CFA FP RA
            0000000000001000 sp+8 c-16 f
            0000000000001001 fp+16 c-16 f
            0000000000001010 RA undefined
            func idx [1]: pc = 0x1020, size = 16 bytes, attr = \"F\"
            STARTPC CFA FP RA
            0000000000001020 r10+0 u f",
    );
    // The writer has no fixed FP offset: it stores FP words, the rules read back equal.
    for version in [WriteVersion::V3, WriteVersion::V2] {
        let t = s.to_table().unwrap();
        let t = if version == WriteVersion::V2 {
            UnwindTable::from_functions(t.arch, t.source, t.to_function_rows().into_iter().take(1))
        } else {
            t
        };
        let bytes = write(&t, version).unwrap();
        let back = Section::parse(&bytes, VADDR).unwrap();
        assert_eq!(back.header().cfa_fixed_fp_offset, 0);
        assert_eq!(
            back.to_table().unwrap().to_function_rows(),
            t.to_function_rows()
        );
    }
}
