//! Malformed CFI built byte by byte: every case ends in a typed error or a counted
//! per-FDE skip, never a panic, and good FDEs next to bad ones still convert.

use sframe_common::{CfaRule, RegRule};
use sframe_user::ehframe::{
    CfiSections, Derived, SectionData, SkipReason, derive_from_elf, derive_from_sections,
};
use sframe_user::table::Arch;

const EH_ADDR: u64 = 0x2000;

/// Builds an `.eh_frame` section; pointers are absolute `udata4` (augmentation "zR", 0x03).
#[derive(Default)]
struct EhFrame {
    bytes: Vec<u8>,
}

impl EhFrame {
    /// An x86-64 CIE with augmentation `aug`; returns its offset.
    fn cie(&mut self, aug: &str, insns: &[u8]) -> usize {
        // caf 1, daf -8, RA column 16; def_cfa rsp+8; offset r16 at cfa-8
        let mut all = vec![0x0c, 7, 8, 0x90, 1];
        all.extend_from_slice(insns);
        self.cie_with(aug, &[1, 0x78, 16], &all)
    }

    /// A CIE with augmentation `aug`, the alignment factors and RA column `factors`
    /// (encoded) and initial instructions `insns`; returns its offset.
    fn cie_with(&mut self, aug: &str, factors: &[u8], insns: &[u8]) -> usize {
        let off = self.bytes.len();
        let mut body = vec![0, 0, 0, 0, 1]; // CIE id 0, version 1
        body.extend_from_slice(aug.as_bytes());
        body.push(0);
        body.extend_from_slice(factors);
        if aug.starts_with('z') {
            body.extend_from_slice(&[1, 0x03]); // augmentation data: R = udata4
        }
        body.extend_from_slice(insns);
        self.push_entry(body);
        off
    }

    fn fde(&mut self, cie: usize, start: u32, len: u32, insns: &[u8]) -> usize {
        let off = self.bytes.len();
        let cie_ptr = u32::try_from(off + 4 - cie).unwrap();
        let mut body = cie_ptr.to_le_bytes().to_vec();
        body.extend_from_slice(&start.to_le_bytes());
        body.extend_from_slice(&len.to_le_bytes());
        body.push(0); // augmentation data length
        body.extend_from_slice(insns);
        self.push_entry(body);
        off
    }

    fn push_entry(&mut self, mut body: Vec<u8>) {
        while !(body.len() + 4).is_multiple_of(8) {
            body.push(0); // DW_CFA_nop
        }
        self.bytes
            .extend_from_slice(&u32::try_from(body.len()).unwrap().to_le_bytes());
        self.bytes.extend_from_slice(&body);
    }

    fn raw(&mut self, b: &[u8]) {
        self.bytes.extend_from_slice(b);
    }

    fn derive(&self) -> Derived {
        self.derive_for(Arch::Amd64)
    }

    fn derive_for(&self, arch: Arch) -> Derived {
        derive_from_sections(&CfiSections {
            arch,
            eh_frame: Some(SectionData {
                data: &self.bytes,
                address: EH_ADDR,
            }),
            eh_frame_hdr: None,
            debug_frame: None,
            text_address: None,
            got_address: None,
            plts: &[],
        })
        .unwrap()
    }
}

// push rbp; mov rbp,rsp: advance 1, def_cfa_offset 16, offset r6 at cfa-16,
// advance 3, def_cfa_register r6.
const PROLOGUE: &[u8] = &[0x41, 0x0e, 16, 0x86, 2, 0x43, 0x0d, 6];

fn skipped(d: &Derived, r: SkipReason) -> u64 {
    d.stats.fdes_skipped.get(&r).copied().unwrap_or(0)
}

#[test]
fn well_formed_reference() {
    let mut eh = EhFrame::default();
    let cie = eh.cie("zR", &[]);
    eh.fde(cie, 0x1000, 0x20, PROLOGUE);
    let d = eh.derive();
    assert_eq!(d.stats.fdes_converted, 1);
    let f = &d.table.to_function_rows()[0].clone();
    assert_eq!((f.start, f.size), (0x1000, 0x20));
    let r: Vec<_> = f
        .rows
        .iter()
        .map(|r| (r.start_offset, r.rule.unwrap()))
        .collect();
    assert_eq!(r.len(), 3);
    assert_eq!(
        (r[0].0, r[0].1.cfa, r[0].1.ra, r[0].1.fp),
        (0, CfaRule::sp(8), RegRule::AtCfa(-8), RegRule::Unchanged)
    );
    assert_eq!(
        (r[1].0, r[1].1.cfa, r[1].1.fp),
        (1, CfaRule::sp(16), RegRule::AtCfa(-16))
    );
    assert_eq!(
        (r[2].0, r[2].1.cfa, r[2].1.fp),
        (4, CfaRule::fp(16), RegRule::AtCfa(-16))
    );
}

/// Return address and frame pointer held in other registers (`DW_CFA_register`), as
/// hand-written assembly and some trampolines have them: FLEX rows, counted by kind,
/// and kept through SFrame version 3.
#[test]
fn register_held_return_address_and_frame_pointer() {
    use sframe_user::ehframe::RowCategory;
    use sframe_user::sframe::{Section, WriteOptions, WriteVersion, write_section};
    let mut eh = EhFrame::default();
    let cie = eh.cie("zR", &[]);
    // 0: RA in rax (DW_CFA_register 16, 0); advance 2; RA back at CFA-8 (offset r16, 1)
    // and rbp held in rbx (DW_CFA_register 6, 3); advance 2; rbp restored (same_value).
    eh.fde(
        cie,
        0x3000,
        0x10,
        &[0x09, 16, 0, 0x42, 0x90, 1, 0x09, 6, 3, 0x42, 0x08, 6],
    );
    let d = eh.derive();
    assert_eq!(d.stats.fdes_converted, 1, "{:?}", d.stats.errors);
    let f = &d.table.to_function_rows()[0];
    let rows: Vec<_> = f
        .rows
        .iter()
        .map(|r| (r.start_offset, r.rule.unwrap()))
        .collect();
    assert_eq!(rows.len(), 3, "{rows:?}");
    assert_eq!(
        (rows[0].0, rows[0].1.cfa, rows[0].1.ra, rows[0].1.fp),
        (0, CfaRule::sp(8), RegRule::InReg(0), RegRule::Unchanged)
    );
    assert_eq!(
        (rows[1].0, rows[1].1.ra, rows[1].1.fp),
        (2, RegRule::AtCfa(-8), RegRule::InReg(3))
    );
    assert_eq!(
        (rows[2].0, rows[2].1.ra, rows[2].1.fp),
        (4, RegRule::AtCfa(-8), RegRule::Unchanged)
    );
    let count = |c: RowCategory| d.stats.category(c);
    assert_eq!(
        (
            count(RowCategory::RaInRegister).rows,
            count(RowCategory::RaInRegister).bytes
        ),
        (1, 2)
    );
    assert_eq!(
        (
            count(RowCategory::OtherFlex).rows,
            count(RowCategory::OtherFlex).bytes
        ),
        (1, 2)
    );
    assert_eq!(
        (
            count(RowCategory::Plain).rows,
            count(RowCategory::Plain).bytes
        ),
        (1, 12)
    );
    let (bytes, _) = write_section(
        &d.table,
        &WriteOptions {
            version: WriteVersion::V3,
            section_vaddr: 0,
        },
    )
    .unwrap();
    let back = Section::parse(&bytes, 0).unwrap().to_table().unwrap();
    assert_eq!(back.to_function_rows(), d.table.to_function_rows());
}

#[test]
fn truncated_cie_ends_the_walk() {
    let mut eh = EhFrame::default();
    let cie = eh.cie("zR", &[]);
    eh.fde(cie, 0x1000, 0x10, &[]);
    // A CIE whose length runs past the section end.
    eh.raw(&[0x40, 0, 0, 0, 0, 0, 0, 0, 1, b'z']);
    let d = eh.derive();
    assert_eq!(d.stats.fdes_converted, 1);
    assert_eq!(
        skipped(&d, SkipReason::Truncated),
        1,
        "{:?}",
        d.stats.errors
    );
}

#[test]
fn truncated_fde() {
    let mut eh = EhFrame::default();
    let cie = eh.cie("zR", &[]);
    eh.fde(cie, 0x1000, 0x10, &[]);
    let second = eh.fde(cie, 0x1010, 0x10, PROLOGUE);
    eh.bytes.truncate(second + 10);
    let d = eh.derive();
    assert_eq!(d.stats.fdes_converted, 1);
    assert_eq!(d.stats.skipped_total(), 1);
    // An FDE whose body is too short for its pointers.
    let mut eh = EhFrame::default();
    let cie = eh.cie("zR", &[]);
    let off = eh.bytes.len();
    eh.raw(&[8, 0, 0, 0]);
    eh.raw(&u32::try_from(off + 4 - cie).unwrap().to_le_bytes());
    eh.raw(&[0, 0x10, 0, 0]);
    let d = eh.derive();
    assert_eq!(d.stats.fdes_converted, 0);
    assert_eq!(d.stats.skipped_total(), 1, "{:?}", d.stats.errors);
}

#[test]
fn bad_augmentation_skips_only_its_fdes() {
    let mut eh = EhFrame::default();
    let bad = eh.cie("zX", &[]);
    let good = eh.cie("zR", &[]);
    eh.fde(bad, 0x1000, 0x10, &[]);
    eh.fde(good, 0x1010, 0x10, &[]);
    eh.fde(bad, 0x1020, 0x10, &[]);
    let d = eh.derive();
    assert_eq!(d.stats.fdes_converted, 1);
    assert_eq!(
        skipped(&d, SkipReason::UnknownAugmentation),
        2,
        "{:?}",
        d.stats.errors
    );
    let e = &d.stats.errors[0];
    assert_eq!(
        (e.section, e.index),
        (sframe_user::ehframe::CfiSection::EhFrame, 0)
    );
    assert_eq!(d.table.functions()[0].start, 0x1010);
}

#[test]
fn huge_lengths() {
    for header in [
        &[0xf0, 0xff, 0xff, 0xff][..], // reserved length
        &[
            0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x7f,
        ][..], // 64-bit
        &[0xfe, 0xff, 0xff, 0x7f, 0, 0, 0, 0][..],
    ] {
        let mut eh = EhFrame::default();
        let cie = eh.cie("zR", &[]);
        eh.fde(cie, 0x1000, 0x10, &[]);
        eh.raw(header);
        eh.raw(&[0; 16]);
        let d = eh.derive();
        assert_eq!(d.stats.fdes_converted, 1);
        assert_eq!(d.stats.skipped_total(), 1, "{:?}", d.stats.errors);
    }
    // An FDE covering more than 4 GiB cannot be a function: only its pc_range is huge.
    let mut eh = EhFrame::default();
    let cie = eh.cie("zR", &[]);
    eh.fde(cie, 0xffff_fff0, 0x20, &[]);
    eh.fde(cie, 0x1000, 0, &[]);
    let d = eh.derive();
    assert_eq!(d.stats.fdes_converted, 1, "{:?}", d.stats.errors);
    assert_eq!(skipped(&d, SkipReason::Empty), 1);
}

#[test]
fn remember_restore_abuse() {
    let mut eh = EhFrame::default();
    let cie = eh.cie("zR", &[]);
    // Nested remember_state beyond the evaluator's stack.
    eh.fde(cie, 0x1000, 0x10, &[0x0a; 64]);
    // restore_state without remember_state.
    eh.fde(cie, 0x1010, 0x10, &[0x0b]);
    // A long but balanced remember/advance/restore sequence: fine, and bounded.
    let mut seq = Vec::new();
    for _ in 0..2000 {
        seq.extend_from_slice(&[0x0a, 0x0e, 32, 0x41, 0x0b, 0x41]);
    }
    eh.fde(cie, 0x1020, 0x10000, &seq);
    // remember_state in the CIE's initial instructions, restore in the FDE.
    let cie2 = eh.cie("zR", &[0x0a, 0x0a, 0x0a, 0x0a, 0x0a]);
    eh.fde(cie2, 0x20000, 0x10, &[0x0b]);
    let d = eh.derive();
    assert_eq!(
        skipped(&d, SkipReason::StateStack),
        3,
        "{:?}",
        d.stats.errors
    );
    assert_eq!(d.stats.fdes_converted, 1);
    // Rows alternate between two rules: merged where identical, one per advance else.
    let f = &d.table.to_function_rows()[0].clone();
    assert_eq!(f.start, 0x1020);
    assert!(f.rows.len() <= 4001);
}

#[test]
fn cie_pointer_to_garbage() {
    let mut eh = EhFrame::default();
    let cie = eh.cie("zR", &[]);
    let fde = eh.fde(cie, 0x1000, 0x10, &[]);
    // A second FDE whose CIE pointer points at the first FDE, and one pointing before
    // the section start.
    eh.fde(fde, 0x1010, 0x10, &[]);
    let off = eh.bytes.len();
    let mut body = u32::try_from(off + 4 + 100).unwrap().to_le_bytes().to_vec();
    body.extend_from_slice(&[0; 12]);
    eh.push_entry(body);
    let d = eh.derive();
    assert_eq!(d.stats.fdes_converted, 1);
    assert_eq!(d.stats.skipped_total(), 2, "{:?}", d.stats.errors);
}

#[test]
fn advance_past_the_end_and_bad_instructions() {
    let mut eh = EhFrame::default();
    let cie = eh.cie("zR", &[]);
    // advance_loc4 far beyond the FDE end, then a rule change.
    eh.fde(
        cie,
        0x1000,
        0x10,
        &[0x41, 0x0e, 16, 0x04, 0, 0, 0, 1, 0x0e, 24],
    );
    // def_cfa_offset after def_cfa_expression is invalid.
    eh.fde(cie, 0x1010, 0x10, &[0x0f, 1, 0x96, 0x0e, 8]);
    // Unknown opcode.
    eh.fde(cie, 0x1020, 0x10, &[0x3e, 0x3e]);
    // LEB128 operand truncated by the end of the entry (7 bytes: no padding follows).
    eh.fde(
        cie,
        0x1030,
        0x10,
        &[0x0e, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80],
    );
    let d = eh.derive();
    let f = &d.table.to_function_rows()[0].clone();
    assert_eq!((f.start, f.size, f.rows.len()), (0x1000, 0x10, 2));
    assert_eq!(d.stats.fdes_converted, 1);
    assert_eq!(d.stats.skipped_total(), 3, "{:?}", d.stats.errors);
}

#[test]
fn unrecognized_expression_is_an_explicit_no_rule_range() {
    let mut eh = EhFrame::default();
    let cie = eh.cie("zR", &[]);
    // The PLT's CFA expression, then back to rsp+8.
    let expr = [
        0x77, 0x08, 0x80, 0x00, 0x3f, 0x1a, 0x3b, 0x2a, 0x33, 0x24, 0x22,
    ];
    let mut insns = vec![0x44, 0x0f, expr.len() as u8];
    insns.extend_from_slice(&expr);
    insns.extend_from_slice(&[0x44, 0x0c, 7, 8]);
    eh.fde(cie, 0x1000, 0x10, &insns);
    let d = eh.derive();
    let rows: Vec<_> = d.table.to_function_rows()[0]
        .rows
        .iter()
        .map(|r| (r.start_offset, r.rule.is_some()))
        .collect();
    assert_eq!(rows, vec![(0, true), (4, false), (8, true)]);
    assert_eq!(
        d.stats
            .category(sframe_user::ehframe::RowCategory::NoRule)
            .bytes,
        4
    );
}

fn hdr(eh: &EhFrame, entries: &[(u32, u32)], count: u32) -> Vec<u8> {
    // version 1; eh_frame_ptr, fde_count and table all udata4 (absolute).
    let mut h = vec![1, 0x03, 0x03, 0x03];
    h.extend_from_slice(&(EH_ADDR as u32).to_le_bytes());
    h.extend_from_slice(&count.to_le_bytes());
    for &(pc, fde) in entries {
        h.extend_from_slice(&pc.to_le_bytes());
        h.extend_from_slice(&fde.to_le_bytes());
    }
    let _ = eh;
    h
}

fn derive_with_hdr(eh: &EhFrame, hdr: &[u8]) -> Derived {
    derive_from_sections(&CfiSections {
        arch: Arch::Amd64,
        eh_frame: Some(SectionData {
            data: &eh.bytes,
            address: EH_ADDR,
        }),
        eh_frame_hdr: Some(SectionData {
            data: hdr,
            address: 0x1800,
        }),
        debug_frame: None,
        text_address: None,
        got_address: None,
        plts: &[],
    })
    .unwrap()
}

#[test]
fn eh_frame_hdr_table() {
    let mut eh = EhFrame::default();
    let cie = eh.cie("zR", &[]);
    let a = eh.fde(cie, 0x1000, 0x10, PROLOGUE) as u32;
    let b = eh.fde(cie, 0x1010, 0x10, &[]) as u32;
    let base = EH_ADDR as u32;
    // Valid, with a duplicate entry: used, duplicates ignored.
    let h = hdr(
        &eh,
        &[(0x1000, base + a), (0x1010, base + b), (0x1010, base + b)],
        3,
    );
    let d = derive_with_hdr(&eh, &h);
    assert!(d.stats.used_eh_frame_hdr);
    assert_eq!((d.stats.fdes_seen, d.stats.fdes_converted), (2, 2));
    // A count far beyond the table, a pointer before .eh_frame, a pointer into a CIE:
    // the walk still finds both FDEs.
    for h in [
        hdr(&eh, &[(0x1000, base + a)], u32::MAX),
        hdr(&eh, &[(0x1000, base - 8)], 1),
        hdr(&eh, &[(0x1000, base + 5)], 1),
    ] {
        let d = derive_with_hdr(&eh, &h);
        assert_eq!(d.stats.fdes_converted, 2, "{:?}", d.stats);
    }
    // A pointer into the middle of an FDE: that entry is skipped and counted; the walk
    // adds the FDE the table misses.
    let d = derive_with_hdr(
        &eh,
        &hdr(&eh, &[(0x1000, base + a), (0x1010, base + a + 4)], 2),
    );
    assert_eq!(d.stats.fdes_converted, 2);
    assert_eq!(d.stats.skipped_total(), 1, "{:?}", d.stats.errors);
}

#[test]
fn not_elf_and_no_cfi() {
    assert!(derive_from_elf(b"").is_err());
    assert!(derive_from_elf(b"\x7fELF garbage").is_err());
    assert!(derive_from_elf(&[0u8; 4096]).is_err());
}

/// Mutates bytes of real ELF files (deterministic xorshift) and derives each: errors are
/// fine, panics are not. A cheap stand-in for the cargo-fuzz target.
#[test]
fn mutated_elf_never_panics() {
    let mut seed = 0x9e37_79b9_7f4a_7c15u64;
    let mut next = move || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed
    };
    let original = std::fs::read("/proc/self/exe").unwrap();
    let file = object::File::parse(&*original).unwrap();
    let mut ranges = Vec::new();
    for name in [".eh_frame", ".eh_frame_hdr"] {
        if let Some(s) = object::Object::section_by_name(&file, name) {
            let (off, size) = object::ObjectSection::file_range(&s).unwrap();
            ranges.push((off as usize, size as usize));
        }
    }
    assert_eq!(ranges.len(), 2);
    let baseline = derive_from_elf(&original).unwrap();
    assert!(baseline.stats.fdes_converted > 100);
    let mut data = original.clone();
    for round in 0..120 {
        data.copy_from_slice(&original);
        let (off, size) = ranges[round % 2];
        for _ in 0..(1 + next() % 16) {
            let i = off + (next() as usize % size);
            data[i] = next() as u8;
        }
        if let Ok(d) = derive_from_elf(&data) {
            let fns = d.table.functions();
            assert!(fns.windows(2).all(|w| w[0].end() <= w[1].start));
        }
    }
    // Truncations of the whole file.
    for cut in [64, 1000, original.len() / 2, original.len() - 1] {
        let _ = derive_from_elf(&original[..cut]);
    }
}

/// An `.eh_frame` of ten million FDEs (240 MB) is refused from its entry headers alone,
/// before any FDE is evaluated or any row allocated.
#[test]
fn ten_million_fdes_are_refused_before_conversion() {
    use sframe_user::ehframe::{EhFrameError, MAX_FDES};
    let mut eh = EhFrame::default();
    let cie = eh.cie("zR", &[]);
    eh.fde(cie, 0x1000, 0x10, &[]);
    let fde = eh.bytes[cie + 24..].to_vec();
    assert_eq!(fde.len(), 24, "one FDE entry");
    let n = 10_000_000;
    assert!(n > MAX_FDES as usize);
    // The same entry again and again: its CIE pointer is wrong past the first copy,
    // which the count (headers only) does not look at.
    let mut bytes = eh.bytes[..cie + 24].to_vec();
    bytes.extend_from_slice(&fde.repeat(n));
    let start = std::time::Instant::now();
    let err = derive_from_sections(&CfiSections {
        arch: Arch::Amd64,
        eh_frame: Some(SectionData {
            data: &bytes,
            address: EH_ADDR,
        }),
        eh_frame_hdr: None,
        debug_frame: None,
        text_address: None,
        got_address: None,
        plts: &[],
    })
    .expect_err("refused");
    eprintln!("refused in {:?}: {err}", start.elapsed());
    assert!(
        matches!(err, EhFrameError::LimitExceeded { what: "FDEs", limit, .. } if limit == MAX_FDES),
        "{err}"
    );
}

/// AArch64's `B` (return address signed with the B key) and `G` (MTE) augmentations,
/// which gimli does not know, are flags without data: their CIEs convert like any other.
#[test]
fn flag_augmentations_b_and_g_are_understood() {
    use sframe_common::RuleFlags;
    use sframe_user::sframe::{Section, WriteOptions, WriteVersion, write_section};
    let mut eh = EhFrame::default();
    let plain = eh.cie("zR", &[]);
    let b = eh.cie("zRB", &[]);
    let bg = eh.cie("zRBG", &[]);
    eh.fde(plain, 0x1000, 0x20, PROLOGUE);
    eh.fde(b, 0x1020, 0x20, PROLOGUE);
    eh.fde(bg, 0x1040, 0x20, PROLOGUE);
    let d = eh.derive();
    assert_eq!(d.stats.fdes_converted, 3, "{:?}", d.stats.errors);
    let fns = d.table.to_function_rows();
    assert_eq!(fns.len(), 3);
    assert_eq!(fns[0].rows, fns[1].rows);
    assert_eq!(fns[0].rows, fns[2].rows);

    // An AArch64 function with return-address signing under the B key:
    // paciasp/pacibsp (negate_ra_state), then stp x29, x30, [sp, #-16]!.
    let mut eh = EhFrame::default();
    // caf 4, daf -8, RA column 30; def_cfa sp+0
    let cie = eh.cie_with("zRB", &[4, 0x78, 30], &[0x0c, 31, 0]);
    // negate_ra_state; advance 1 (4 bytes); def_cfa_offset 16; x29 at cfa-16; x30 at cfa-8
    eh.fde(cie, 0x4000, 0x40, &[0x2d, 0x41, 0x0e, 16, 0x9d, 2, 0x9e, 1]);
    let d = eh.derive_for(Arch::Aarch64 { big_endian: false });
    assert_eq!(d.stats.fdes_converted, 1, "{:?}", d.stats.errors);
    let f = &d.table.to_function_rows()[0];
    let rows: Vec<_> = f
        .rows
        .iter()
        .map(|r| (r.start_offset, r.rule.unwrap()))
        .collect();
    assert_eq!(rows.len(), 2, "{rows:?}");
    assert_eq!((rows[0].0, rows[0].1.cfa), (0, CfaRule::sp(0)));
    assert_eq!(rows[0].1.ra, RegRule::Unchanged);
    let (at, r) = rows[1];
    assert_eq!(at, 4);
    assert_eq!(
        (r.cfa, r.ra, r.fp),
        (CfaRule::sp(16), RegRule::AtCfa(-8), RegRule::AtCfa(-16))
    );
    for (_, r) in &rows {
        assert!(r.flags.contains(RuleFlags::MANGLED_RA), "{r:?}");
        assert!(r.flags.contains(RuleFlags::PAUTH_KEY_B), "{r:?}");
    }

    // The A key (no `B`), and the state toggled back by the second negate_ra_state
    // (autiasp before the return): paciasp; stp; ...; ldp; autiasp; ret.
    let mut eh = EhFrame::default();
    let a_key = eh.cie_with("zR", &[4, 0x78, 30], &[0x0c, 31, 0]);
    let b_key = eh.cie_with("zRB", &[4, 0x78, 30], &[0x0c, 31, 0]);
    // negate; advance 1; def_cfa_offset 16; x29, x30 saved; advance 2; restore x29,
    // x30 (0xdd, 0xde); def_cfa_offset 0; advance 1; negate (autiasp)
    let body: &[u8] = &[
        0x2d, 0x41, 0x0e, 16, 0x9d, 2, 0x9e, 1, 0x42, 0xdd, 0xde, 0x0e, 0, 0x41, 0x2d,
    ];
    eh.fde(a_key, 0x5000, 0x20, body);
    eh.fde(b_key, 0x6000, 0x20, body);
    let d = eh.derive_for(Arch::Aarch64 { big_endian: false });
    assert_eq!(d.stats.fdes_converted, 2, "{:?}", d.stats.errors);
    for (f, key_b) in d.table.to_function_rows().iter().zip([false, true]) {
        let rows: Vec<_> = f
            .rows
            .iter()
            .map(|r| (r.start_offset, r.rule.unwrap()))
            .collect();
        // 0: signed, CFA sp+0; 4: frame set up; 12: frame torn down (still signed);
        // 16: authenticated again, RA plain in x30.
        let at: Vec<u32> = rows.iter().map(|r| r.0).collect();
        assert_eq!(at, [0, 4, 12, 16], "{rows:?}");
        for (i, (_, r)) in rows.iter().enumerate() {
            let signed = i < 3;
            assert_eq!(
                r.flags.contains(RuleFlags::MANGLED_RA),
                signed,
                "{i}: {r:?}"
            );
            assert_eq!(
                r.flags.contains(RuleFlags::PAUTH_KEY_B),
                signed && key_b,
                "{i}: {r:?}"
            );
        }
        assert_eq!(rows[3].1.ra, RegRule::Unchanged);
        assert_eq!(rows[2].1.cfa, rows[3].1.cfa);
    }
    // The key survives SFrame version 3 (stored per function, read back on signed rows).
    let (bytes, _) = write_section(
        &d.table,
        &WriteOptions {
            version: WriteVersion::V3,
            section_vaddr: 0,
        },
    )
    .unwrap();
    let back = Section::parse(&bytes, 0).unwrap().to_table().unwrap();
    assert_eq!(back.to_function_rows(), d.table.to_function_rows());
}
