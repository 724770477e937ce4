//! Byte-level malformed sections, one per validation rule, plus small writer/reader
//! unit tests. Sections are produced by the writer (known layout) and then corrupted.

use sframe_common::{CfaBase, CfaRule, RegRule, RuleFlags, UnwindRule};

use super::error::{FlexProblem, SFrameError, Subsection};
use super::read::Section;
use super::write::{WriteOptions, WriteVersion, write_section};
use crate::table::{Arch, FunctionRows, PcType, Row, Source, UnwindTable};

const VADDR: u64 = 0x2000;

fn rule(cfa: i32) -> UnwindRule {
    UnwindRule {
        cfa: CfaRule::sp(cfa),
        ra: RegRule::AtCfa(-8),
        fp: RegRule::Unchanged,
        flags: RuleFlags::default(),
    }
}

fn row(start: u32, r: UnwindRule) -> Row {
    Row {
        start_offset: start,
        rule: Some(r),
    }
}

/// v2 AMD64: header 28 bytes, FDE0 at 28, FDE1 at 48, FREs at 68 (3 bytes each:
/// f0 rows at 68 and 71, f1 row at 74), 77 bytes in all.
fn table() -> UnwindTable {
    UnwindTable::from_functions(
        Arch::Amd64,
        Source::Synthesized,
        vec![
            FunctionRows {
                start: 0x1000,
                size: 0x20,
                pc_type: PcType::Inc,
                rows: vec![row(0, rule(8)), row(4, rule(16))],
            },
            FunctionRows {
                start: 0x1020,
                size: 0x10,
                pc_type: PcType::Inc,
                rows: vec![row(0, rule(8))],
            },
        ],
    )
}

fn v2() -> Vec<u8> {
    let (b, _) = write_section(
        &table(),
        &WriteOptions {
            version: WriteVersion::V2,
            section_vaddr: VADDR,
        },
    )
    .unwrap();
    assert_eq!(b.len(), 77);
    b
}

fn put32(b: &mut [u8], off: usize, v: u32) {
    b[off..off + 4].copy_from_slice(&v.to_le_bytes());
}

fn get32(b: &[u8], off: usize) -> u32 {
    u32::from_le_bytes(b[off..off + 4].try_into().unwrap())
}

fn err(b: &[u8]) -> SFrameError {
    Section::parse(b, VADDR).expect_err("section should be rejected")
}

#[test]
fn valid_section_parses_and_looks_up() {
    let b = v2();
    let s = Section::parse(&b, VADDR).unwrap();
    assert_eq!(s.find_fre(0x1000).map(|f| f.rule.cfa.offset), Some(8));
    assert_eq!(s.find_fre(0x1004).map(|f| f.rule.cfa.offset), Some(16));
    assert_eq!(s.find_fre(0x101f).map(|f| f.rule.cfa.offset), Some(16));
    assert_eq!(s.find_fre(0x1020).map(|f| f.function), Some(1));
    assert_eq!(s.find_fre(0x1030), None);
    assert_eq!(s.find_fre(0xfff), None);
    assert_eq!(
        s.to_table().unwrap().to_function_rows(),
        table().to_function_rows()
    );
}

#[test]
fn header_checks() {
    let b = v2();
    assert!(matches!(
        err(&b[..10]),
        SFrameError::TruncatedHeader { len: 10, .. }
    ));
    let mut m = b.clone();
    m[0] = 0;
    assert!(matches!(err(&m), SFrameError::BadMagic { .. }));
    let mut m = b.clone();
    m.swap(0, 1);
    assert!(matches!(err(&m), SFrameError::AbiEndianMismatch { abi: 3 }));
    let mut m = b.clone();
    m[2] = 9;
    assert!(matches!(
        err(&m),
        SFrameError::UnsupportedVersion { version: 9 }
    ));
    let mut m = b.clone();
    m[3] |= 0x80;
    assert!(matches!(
        err(&m),
        SFrameError::UnknownFlags {
            flags: 0x85,
            version: 2
        }
    ));
    let mut m = b.clone();
    m[4] = 9;
    assert!(matches!(err(&m), SFrameError::UnknownAbi { abi: 9 }));
    let mut m = b.clone();
    m[7] = 200;
    assert!(matches!(
        err(&m),
        SFrameError::SubsectionOutOfBounds {
            which: Subsection::AuxHeader,
            ..
        }
    ));
}

#[test]
fn subsection_checks() {
    let b = v2();
    let mut m = b.clone();
    put32(&mut m, 20, 100);
    assert!(matches!(
        err(&m),
        SFrameError::SubsectionOrder {
            fdeoff: 100,
            freoff: 40
        }
    ));
    let mut m = b.clone();
    put32(&mut m, 8, 1000);
    assert!(matches!(
        err(&m),
        SFrameError::SubsectionOutOfBounds {
            which: Subsection::Fdes,
            ..
        }
    ));
    let mut m = b.clone();
    put32(&mut m, 8, 1);
    assert!(matches!(
        err(&m),
        SFrameError::FdeCountMismatch {
            num_fdes: 1,
            space: 40,
            ..
        }
    ));
    let mut m = b.clone();
    put32(&mut m, 16, 10_000);
    assert!(matches!(
        err(&m),
        SFrameError::SubsectionOutOfBounds {
            which: Subsection::Fres,
            ..
        }
    ));
    let mut m = b.clone();
    m.push(1);
    assert!(matches!(err(&m), SFrameError::TrailingData { offset: 77 }));
    let mut m = b.clone();
    m.push(0); // zero padding after the FRE sub-section is fine
    assert!(Section::parse(&m, VADDR).is_ok());
    let mut m = b.clone();
    put32(&mut m, 12, 4);
    assert!(matches!(
        err(&m),
        SFrameError::FreCountMismatch {
            header: 4,
            found: 3,
            offset: 12
        }
    ));
    let mut m = b.clone();
    m.push(0);
    put32(&mut m, 16, 10);
    assert!(matches!(
        err(&m),
        SFrameError::FreLenMismatch {
            header: 10,
            used: 9,
            offset: 16
        }
    ));
}

#[test]
fn fde_checks() {
    let b = v2();
    let mut m = b.clone();
    m[28 + 16] = 3;
    assert!(matches!(
        err(&m),
        SFrameError::InvalidFreType {
            fde: 0,
            offset: 28,
            code: 3
        }
    ));
    let mut m = b.clone();
    m[28 + 16] |= 0x40;
    assert!(matches!(
        err(&m),
        SFrameError::FdeReservedBits {
            fde: 0,
            offset: 28,
            ..
        }
    ));
    let mut m = b.clone();
    m[48 + 16] |= 0x20; // pauth key on AMD64
    assert!(matches!(
        err(&m),
        SFrameError::FdeReservedBits {
            fde: 1,
            offset: 48,
            ..
        }
    ));
    let mut m = b.clone();
    m[28 + 16] |= 0x10; // PCMASK with rep_size 0
    assert!(matches!(
        err(&m),
        SFrameError::ZeroRepSize { fde: 0, offset: 28 }
    ));
    let mut m = b.clone();
    let v = get32(&m, 48).wrapping_sub(0x100);
    put32(&mut m, 48, v); // FDE1 now starts before FDE0
    assert!(matches!(
        err(&m),
        SFrameError::FdesNotSorted { fde: 1, offset: 48 }
    ));
    m[3] &= !super::header::F_FDE_SORTED; // without SORTED: accepted, private index
    let s = Section::parse(&m, VADDR).unwrap();
    assert_eq!(s.find_fre(0x1020 - 0x100).map(|f| f.function), Some(1));
    assert_eq!(s.find_fre(0x1004).map(|f| f.function), Some(0));
    assert_eq!(
        s.functions_sorted().map(|f| f.index).collect::<Vec<_>>(),
        vec![1, 0]
    );
    let mut m = b.clone();
    put32(&mut m, 48 + 8, 14); // FRE offset past the FRE sub-section
    assert_eq!(
        err(&m),
        SFrameError::FreOffsetOutOfBounds {
            fde: 1,
            offset: 48,
            fres: 68 + 14
        }
    );
    let mut m = b.clone();
    put32(&mut m, 48 + 12, 2); // FDE1 claims a second FRE, past the end of the section
    put32(&mut m, 12, 4);
    assert_eq!(
        err(&m),
        SFrameError::FreDataOutOfBounds {
            fde: 1,
            fre: 1,
            offset: 77,
            len: 2
        }
    );
    let mut m = b.clone();
    put32(&mut m, 48 + 8, 0); // FDE1 shares FDE0's first FRE (3 bytes, like its own)
    assert!(matches!(
        err(&m),
        SFrameError::FreDataOverlap { fde: 1, offset: 68 }
    ));
}

#[test]
fn fre_checks() {
    let b = v2();
    let mut m = b.clone();
    m[69] |= 0x60;
    assert!(matches!(
        err(&m),
        SFrameError::InvalidDataWordSize {
            fde: 0,
            fre: 0,
            offset: 68,
            code: 3
        }
    ));
    let mut m = b.clone();
    m[71] = 0;
    assert!(matches!(
        err(&m),
        SFrameError::FreStartNotIncreasing {
            fde: 0,
            fre: 1,
            offset: 71,
            start: 0
        }
    ));
    let mut m = b.clone();
    put32(&mut m, 28 + 4, 3); // function size 3 < row start 4
    assert!(matches!(
        err(&m),
        SFrameError::FreStartBeyondFunction {
            fde: 0,
            fre: 1,
            start: 4,
            size: 3,
            ..
        }
    ));
    let mut m = b.clone();
    m[75] |= 0x80; // mangled-RA bit on AMD64
    assert!(matches!(
        err(&m),
        SFrameError::FreReservedBits {
            fde: 1,
            fre: 0,
            offset: 74,
            ..
        }
    ));
    // Last FRE: 1 word -> 3 words (AMD64 uses at most 2), two more bytes.
    let mut m = b.clone();
    m[75] = (m[75] & !0x1e) | (3 << 1);
    m.extend_from_slice(&[0, 0]);
    put32(&mut m, 16, 11);
    assert!(matches!(
        err(&m),
        SFrameError::LeftoverDataWords {
            fde: 1,
            fre: 0,
            offset: 74,
            count: 3,
            max: 2
        }
    ));
    // Zero data words: RA undefined in v2 ...
    let mut m = b.clone();
    m[75] &= !0x1e;
    m.pop();
    put32(&mut m, 16, 8);
    let s = Section::parse(&m, VADDR).unwrap();
    assert!(s.find_fre(0x1020).unwrap().rule.is_outermost());
    // ... but not valid in v1.
    m[2] = 1;
    let v1 = to_v1(&m);
    assert!(matches!(
        err(&v1),
        SFrameError::EmptyFreInV1 { fde: 1, fre: 0, .. }
    ));
}

/// Rewrite a v2 section from `v2()` (PCREL) as v1: 17-byte FDEs, section-relative starts.
fn to_v1(v2: &[u8]) -> Vec<u8> {
    let n = get32(v2, 8) as usize;
    let mut out = v2[..28].to_vec();
    out[2] = 1;
    out[3] = super::header::F_FDE_SORTED;
    put32(&mut out, 24, (n * 17) as u32);
    for k in 0..n {
        let f = &v2[28 + 20 * k..48 + 20 * k];
        let start = (get32(f, 0) as i32 as i64 + (28 + 20 * k) as i64) as i32;
        out.extend_from_slice(&start.to_le_bytes());
        out.extend_from_slice(&f[4..17]);
    }
    out.extend_from_slice(&v2[28 + 20 * n..]);
    out
}

#[test]
fn v1_sections() {
    let v1 = to_v1(&v2());
    let s = Section::parse(&v1, VADDR).unwrap();
    assert_eq!(
        s.to_table().unwrap().to_function_rows(),
        table().to_function_rows()
    );
    // v1 PCMASK: understood on AMD64 (16-byte PLT entries) only.
    let mut m = v1.clone();
    m[28 + 16] |= 0x10;
    let s = Section::parse(&m, VADDR).unwrap();
    assert_eq!(s.fde(0).unwrap().pc_type, PcType::Mask { rep_size: 16 });
    m[4] = 2; // AArch64 little-endian
    assert!(matches!(
        err(&m),
        SFrameError::V1PcMaskUnsupported { fde: 0, offset: 28 }
    ));
}

fn flex_table() -> UnwindTable {
    let drap = UnwindRule {
        cfa: CfaRule {
            base: CfaBase::Reg(10),
            offset: 0,
            deref: false,
        },
        ra: RegRule::AtCfa(-8),
        fp: RegRule::AtReg { reg: 6, offset: 0 },
        flags: RuleFlags::default(),
    };
    UnwindTable::from_functions(
        Arch::Amd64,
        Source::Synthesized,
        vec![FunctionRows {
            start: 0x1000,
            size: 0x20,
            pc_type: PcType::Inc,
            rows: vec![row(0, rule(8)), row(9, drap)],
        }],
    )
}

#[test]
fn v3_checks() {
    let t = flex_table();
    let (b, _) = write_section(
        &t,
        &WriteOptions {
            version: WriteVersion::V3,
            section_vaddr: VADDR,
        },
    )
    .unwrap();
    let s = Section::parse(&b, VADDR).unwrap();
    assert!(s.fde(0).unwrap().flex);
    assert_eq!(
        s.to_table().unwrap().to_function_rows(),
        t.to_function_rows()
    );
    // Layout: header 28, FDE index 28..44, attr 44..49, FRE0 at 49 (sp+8 FLEX: 1+1+2 words).
    let mut m = b.clone();
    m[47] = 5;
    assert!(matches!(
        err(&m),
        SFrameError::InvalidFdeType {
            fde: 0,
            offset: 28,
            code: 5
        }
    ));
    let mut m = b.clone();
    m[28..36].copy_from_slice(&i64::MAX.to_le_bytes());
    assert!(matches!(
        err(&m),
        SFrameError::FunctionStartOverflow { fde: 0, offset: 28 }
    ));
    let mut m = b.clone();
    m[51] &= !1; // CFA control word without reg_p
    assert!(matches!(
        err(&m),
        SFrameError::BadFlexRule {
            fde: 0,
            fre: 0,
            offset: 49,
            problem: FlexProblem::CfaNotRegister
        }
    ));
}

#[test]
fn writer_reports_unrepresentable_in_v2() {
    let t = flex_table();
    let e = write_section(
        &t,
        &WriteOptions {
            version: WriteVersion::V2,
            section_vaddr: VADDR,
        },
    )
    .unwrap_err();
    assert!(matches!(
        e,
        super::error::WriteError::Unrepresentable {
            function: 0,
            row: 1,
            version: 2,
            ..
        }
    ));
}

#[test]
fn writer_splits_at_none_rows() {
    let mut fns = table().to_function_rows();
    fns[0].rows.insert(
        1,
        Row {
            start_offset: 2,
            rule: None,
        },
    );
    let t = UnwindTable::from_functions(Arch::Amd64, Source::Synthesized, fns);
    let (b, stats) = write_section(
        &t,
        &WriteOptions {
            version: WriteVersion::V3,
            section_vaddr: VADDR,
        },
    )
    .unwrap();
    assert_eq!((stats.fdes, stats.none_rows), (3, 1));
    let s = Section::parse(&b, VADDR).unwrap();
    assert_eq!(s.find_fre(0x1001).map(|f| f.rule.cfa.offset), Some(8));
    assert_eq!(s.find_fre(0x1002), None);
    assert_eq!(s.find_fre(0x1003), None);
    assert_eq!(s.find_fre(0x1004).map(|f| f.rule.cfa.offset), Some(16));
}

/// xorshift64: reproducible pseudo-random numbers for the generated tables below.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
}

/// A table with functions of 1 to 80 rows (so some get lookup checkpoints), sizes
/// that need 1-, 2- and 4-byte row starts, offsets of every data word width, PCMASK
/// functions, and gaps; `overlap` also adds zero-size functions and functions that
/// start inside the previous one (a section that is not "simple").
fn generated_table(rng: &mut Rng, arch: Arch, overlap: bool) -> UnwindTable {
    let mut functions = Vec::new();
    let mut pc = 0x10_000u64;
    for i in 0..300 {
        let rows_n = match rng.below(4) {
            0 => 1 + rng.below(3) as u32,
            1 => 15 + rng.below(4) as u32,
            2 => 30 + rng.below(50) as u32,
            _ => 1 + rng.below(12) as u32,
        };
        let spacing = [1u64, 3, 40, 700, 5000][rng.below(5) as usize];
        let mask = i % 17 == 5;
        let mut rows = Vec::new();
        let mut off = 0u32;
        for _ in 0..rows_n {
            let cfa = [8i32, 16, -100, 3000, 100_000][rng.below(5) as usize];
            let fp = match (arch, rng.below(3)) {
                (_, 0) => RegRule::Unchanged,
                (_, 1) => RegRule::AtCfa(-16),
                _ => RegRule::AtCfa(-40_000),
            };
            let ra = match arch {
                Arch::Amd64 => RegRule::AtCfa(-8),
                _ => [RegRule::Unchanged, RegRule::AtCfa(-8)][rng.below(2) as usize],
            };
            rows.push(Row {
                start_offset: off,
                rule: Some(UnwindRule {
                    cfa: if rng.below(2) == 0 {
                        CfaRule::sp(cfa)
                    } else {
                        CfaRule::fp(cfa)
                    },
                    ra,
                    fp,
                    flags: RuleFlags::default(),
                }),
            });
            off += 1 + rng.below(spacing) as u32;
        }
        let last = rows.last().map_or(0, |r| r.start_offset);
        // Some functions end right at or after their last row (boundaries of checks).
        let size = match rng.below(4) {
            0 => last,
            1 => last + 1,
            _ => off + rng.below(spacing) as u32,
        };
        let pc_type = if mask {
            PcType::Mask { rep_size: 16 }
        } else {
            PcType::Inc
        };
        functions.push(FunctionRows {
            start: pc,
            size,
            pc_type,
            rows,
        });
        pc += u64::from(size.max(1)) + rng.below(3) * 8;
        if overlap && i % 7 == 3 {
            pc -= u64::from(size / 2); // the next function starts inside this one
        }
        if overlap && i % 11 == 4 {
            functions.push(FunctionRows {
                start: pc,
                size: 0,
                pc_type: PcType::Inc,
                rows: vec![row(0, rule(8))],
            });
        }
    }
    // One function far away: the address index spans a gap of 1 GiB.
    functions.push(FunctionRows {
        start: pc + (1 << 30),
        size: 64,
        pc_type: PcType::Inc,
        rows: vec![row(0, rule(8)), row(4, rule(16))],
    });
    UnwindTable::from_functions(arch, Source::Synthesized, functions)
}

/// Lookups agree with libsframe's search and scan (the reference versions) at every
/// row start, every row's last byte, and pseudo-random PCs in and around every
/// function; on simple sections (the fence search) and overlapping ones.
#[test]
fn fast_lookup_matches_libsframe_on_generated_sections() {
    let mut rng = Rng(0x1234_5678_9abc_def1);
    let arches = [
        Arch::Amd64,
        Arch::Aarch64 { big_endian: false },
        Arch::Aarch64 { big_endian: true },
    ];
    for arch in arches {
        for overlap in [false, true] {
            let t = generated_table(&mut rng, arch, overlap);
            for version in [WriteVersion::V2, WriteVersion::V3] {
                let (b, _) = write_section(
                    &t,
                    &WriteOptions {
                        version,
                        section_vaddr: VADDR,
                    },
                )
                .unwrap();
                let s = Section::parse(&b, VADDR).unwrap();
                let r = Section::parse_reference(&b, VADDR).unwrap();
                assert!(s.checkpoint_count() > 0);
                assert_eq!(s.addr_index().is_none(), overlap, "index only when simple");
                let mut pcs = vec![0, u64::MAX, VADDR];
                for f in &t.to_function_rows() {
                    for x in [f.start.wrapping_sub(1), f.start, f.end(), f.end() - 1] {
                        pcs.push(x);
                    }
                    for row in &f.rows {
                        pcs.push(f.start + u64::from(row.start_offset));
                        pcs.push((f.start + u64::from(row.start_offset)).wrapping_sub(1));
                    }
                    for _ in 0..8 {
                        pcs.push(f.start + rng.below(u64::from(f.size) + 16));
                    }
                }
                for pc in pcs {
                    let fast = s.find_fre_raw(pc);
                    assert_eq!(s.find_fde(pc), s.find_fde_libsframe(pc), "{pc:#x}");
                    assert_eq!(fast, s.find_fre_raw_linear(pc), "{pc:#x}");
                    assert_eq!(fast, r.find_fre_raw(pc), "{pc:#x}");
                }
            }
        }
    }
}

/// The fast validation accepts exactly what the careful reference accepts, with the
/// same error, on byte mutations of generated sections (functions with checkpoints,
/// every row width, both byte orders).
#[test]
fn fast_validation_matches_reference_on_mutations() {
    let mut rng = Rng(0x0bad_cafe_f00d_d00d);
    for arch in [Arch::Amd64, Arch::Aarch64 { big_endian: true }] {
        let t = generated_table(&mut rng, arch, false);
        for version in [WriteVersion::V2, WriteVersion::V3] {
            let (b, _) = write_section(
                &t,
                &WriteOptions {
                    version,
                    section_vaddr: VADDR,
                },
            )
            .unwrap();
            for _ in 0..800 {
                let mut m = b.clone();
                for _ in 0..1 + rng.below(3) {
                    let pos = rng.below(m.len() as u64) as usize;
                    // Bit flips, and ±1 (which lands on the boundaries of the checks).
                    m[pos] = match rng.below(3) {
                        0 => m[pos] ^ (1 << rng.below(8)),
                        1 => m[pos].wrapping_add(1),
                        _ => m[pos].wrapping_sub(1),
                    };
                }
                let fast = Section::parse(&m, VADDR);
                let slow = Section::parse_reference(&m, VADDR);
                assert_eq!(fast.as_ref().err(), slow.as_ref().err());
                if let (Ok(fast), Ok(_)) = (fast, slow) {
                    for fde in fast.functions() {
                        assert_eq!(Ok(fde), fast.fde_reference(fde.index));
                        let rows: Vec<_> = fast.rows(&fde).collect();
                        assert_eq!(rows, fast.rows_reference(&fde));
                        // Internal iteration (`fold`, specialized per width) agrees.
                        let mut folded = Vec::new();
                        fast.rows(&fde).for_each(|r| folded.push(r));
                        assert_eq!(folded, rows);
                        // So does a fold started part-way (lookups resume there).
                        let mut rest = fast.rows(&fde);
                        let first = rest.next();
                        let tail = rest.fold(Vec::new(), |mut v, r| {
                            v.push(r);
                            v
                        });
                        assert_eq!(first.into_iter().chain(tail).collect::<Vec<_>>(), rows);
                    }
                }
            }
        }
    }
}

/// Sections without `SFRAME_F_FDE_SORTED` whose FDE entries are out of address order
/// (and whose FRE data is then out of FDE order): the fast validation agrees with the
/// reference, and lookups (through the private sort index) with libsframe's search.
#[test]
fn unsorted_sections_match_reference() {
    let mut rng = Rng(0x5eed_5eed_1234_4321);
    let t = generated_table(&mut rng, Arch::Amd64, false);
    for (version, fde_size) in [(WriteVersion::V2, 20usize), (WriteVersion::V3, 16)] {
        let (b, _) = write_section(
            &t,
            &WriteOptions {
                version,
                section_vaddr: VADDR,
            },
        )
        .unwrap();
        let mut m = b.clone();
        m[3] &= !super::header::F_FDE_SORTED;
        let n = get32(&m, 8) as usize;
        let fdes = 28 + m[7] as usize + get32(&m, 20) as usize;
        for _ in 0..40 {
            let (i, j) = (rng.below(n as u64) as usize, rng.below(n as u64) as usize);
            for k in 0..fde_size {
                m.swap(fdes + i * fde_size + k, fdes + j * fde_size + k);
            }
        }
        let fast = Section::parse(&m, VADDR);
        let slow = Section::parse_reference(&m, VADDR);
        assert_eq!(fast.as_ref().err(), slow.as_ref().err(), "{version:?}");
        let s = fast.expect("swapped entries still describe a valid section");
        let starts: Vec<i64> = s.functions().map(|f| f.rel_start).collect();
        assert!(
            starts.windows(2).any(|w| w[0] > w[1]),
            "out of order on disk"
        );
        let mut pcs = vec![0, VADDR, u64::MAX];
        for f in s.functions() {
            pcs.extend([
                f.start,
                f.start.wrapping_sub(1),
                f.start.wrapping_add(u64::from(f.size)),
            ]);
            for _ in 0..4 {
                pcs.push(f.start.wrapping_add(rng.below(u64::from(f.size) + 1)));
            }
        }
        for pc in pcs {
            assert_eq!(
                s.find_fde(pc),
                s.find_fde_libsframe(pc),
                "{version:?} {pc:#x}"
            );
            assert_eq!(
                s.find_fre_raw(pc),
                s.find_fre_raw_linear(pc),
                "{version:?} {pc:#x}"
            );
        }
    }
}

/// A section of ten million FDEs, consistent in every count and length (a quarter of a
/// gigabyte, zero pages), is refused from its header before anything is read or
/// allocated for its functions.
#[test]
fn ten_million_functions_are_refused_from_the_header() {
    let header = v2();
    let hsize = 28;
    let fdes = 10_000_000u32;
    let fres = 10_000_000u32;
    let fre_len = 3 * fres;
    let len = hsize + fdes as usize * 20 + fre_len as usize;
    let mut m = vec![0u8; len];
    m[..hsize].copy_from_slice(&header[..hsize]);
    put32(&mut m, 8, fdes);
    put32(&mut m, 12, fres);
    put32(&mut m, 16, fre_len);
    put32(&mut m, 20, 0);
    put32(&mut m, 24, fdes * 20);
    let e = err(&m);
    assert!(
        matches!(
            e,
            SFrameError::LimitExceeded {
                what: "FDEs",
                count: 10_000_000,
                limit: super::MAX_FUNCTIONS,
                offset: 8,
            }
        ),
        "{e}"
    );
    // Rows alone over their limit.
    let mut m = header.clone();
    put32(&mut m, 12, super::MAX_SECTION_ROWS + 1);
    assert!(matches!(
        err(&m),
        SFrameError::LimitExceeded {
            what: "FREs",
            offset: 12,
            ..
        }
    ));
}

/// The probe [`super::write::stores_rule`] replaced: write a one-row section and read it back.
fn stored_by_probe(arch: Arch, version: WriteVersion, rule: &UnwindRule) -> bool {
    let probe = UnwindTable::from_functions(
        arch,
        Source::Synthesized,
        [FunctionRows {
            start: 0x1000,
            size: 16,
            pc_type: PcType::Inc,
            rows: vec![row(0, *rule)],
        }],
    );
    let opts = WriteOptions {
        version,
        section_vaddr: VADDR,
    };
    let Ok((bytes, _)) = write_section(&probe, &opts) else {
        return false;
    };
    Section::parse(&bytes, VADDR)
        .ok()
        .and_then(|s| s.find_fre(0x1000))
        .is_some_and(|found| {
            let r = found.rule;
            r == *rule
                || (rule.is_outermost()
                    && r.is_outermost()
                    && r.cfa.base == rule.cfa.base
                    && r.flags == rule.flags)
        })
}

#[test]
fn stores_agrees_with_writing_and_reading_back_every_rule_shape() {
    // Other registers than each architecture's SP and FP (which read back as `Sp`, `Fp`).
    let bases = [CfaBase::Sp, CfaBase::Fp, CfaBase::Reg(2), CfaBase::Reg(12)];
    let offsets = [8, -8, 160, 40_000, i32::MAX];
    let regs = [
        RegRule::Unchanged,
        RegRule::AtCfa(-8),
        RegRule::AtCfa(-16),
        RegRule::AtCfa(0),
        RegRule::AtCfa(-3),
        RegRule::AtCfa(i32::MIN),
        RegRule::ValCfa(-8),
        RegRule::InReg(30),
        RegRule::AtReg { reg: 6, offset: -8 },
        RegRule::Undefined,
    ];
    let flags = [
        RuleFlags::default(),
        RuleFlags::default().with(RuleFlags::SIGNAL),
        RuleFlags::default().with(RuleFlags::MANGLED_RA),
        RuleFlags::default()
            .with(RuleFlags::MANGLED_RA)
            .with(RuleFlags::PAUTH_KEY_B),
    ];
    let archs = [
        Arch::Amd64,
        Arch::Aarch64 { big_endian: false },
        Arch::Aarch64 { big_endian: true },
        Arch::S390x,
    ];
    let (mut checked, mut stored) = (0u32, [0u32; 2]);
    for base in bases {
        for deref in [false, true] {
            for offset in offsets {
                for ra in regs {
                    for fp in regs {
                        for flags in flags {
                            let rule = UnwindRule {
                                cfa: CfaRule {
                                    base,
                                    offset,
                                    deref,
                                },
                                ra,
                                fp,
                                flags,
                            };
                            for arch in archs {
                                for (i, v) in
                                    [WriteVersion::V2, WriteVersion::V3].into_iter().enumerate()
                                {
                                    let want = stored_by_probe(arch, v, &rule);
                                    assert_eq!(
                                        super::write::stores_rule(arch, v, &rule),
                                        want,
                                        "{arch:?} {v:?} {rule:?}"
                                    );
                                    checked += 1;
                                    stored[i] += u32::from(want);
                                }
                            }
                        }
                    }
                }
            }
        }
    }
    // Both answers occur in both versions, and v3 stores strictly more.
    assert!(checked > 100_000, "{checked}");
    assert!(stored[0] > 1_000 && stored[1] > stored[0], "{stored:?}");
    assert!(stored[1] < checked / 2, "{stored:?} of {checked}");
}

/// Found by `fuzz/sframe_read`: a v3 start that fits in 64 signed bits relative to its
/// FDE field but not relative to the section's start (which a reader computes) is
/// refused by the writer, not written for the reader to reject.
#[test]
fn v3_start_beyond_the_readers_range_is_refused() {
    let t = UnwindTable::from_functions(
        Arch::Amd64,
        Source::Synthesized,
        vec![FunctionRows {
            start: (i64::MAX as u64) + 8,
            size: 0x10,
            pc_type: PcType::Inc,
            rows: vec![row(0, rule(8))],
        }],
    );
    let opts = |section_vaddr| WriteOptions {
        version: WriteVersion::V3,
        section_vaddr,
    };
    // The field is past the start's distance: relative to it, the start fits.
    assert!(matches!(
        write_section(&t, &opts(0)),
        Err(super::error::WriteError::StartOutOfRange { function: 0 })
    ));
    // From a section higher up, the start is within reach and reads back.
    let (b, _) = write_section(&t, &opts(0x1000)).expect("within range");
    Section::parse(&b, 0x1000).expect("the writer's output parses");
}
