//! Body of the `sframe_read` fuzz target, shared with a plain test in `sframe-user`
//! (`tests/sframe_fuzz_body.rs`) so it is compiled and exercised on stable too.
//!
//! Input: 8 bytes of section virtual address (little endian), then the section bytes.
//! Properties: nothing panics; the fast validation accepts exactly what the careful
//! reference accepts, with the same error, and its decoders give the same FDEs and FREs;
//! a section that opens can be fully iterated, dumped and looked up; lookups agree with
//! libsframe's linear scan and with the row iteration; whatever the writer accepts reads
//! back, and without splits reads back as the same functions and rows.

use sframe_user::sframe::{
    Section, WriteOptions, WriteVersion, dump_to_string, lookup_line, write_section,
};
use sframe_user::table::PcType;

pub fn run(data: &[u8]) {
    let (addr, bytes) = match data.split_first_chunk::<8>() {
        Some((a, rest)) => (u64::from_le_bytes(*a), rest),
        None => (0, data),
    };
    let _ = Section::from_elf_bytes(data);
    let parsed = Section::parse(bytes, addr);
    let reference = Section::parse_reference(bytes, addr);
    assert_eq!(
        parsed.as_ref().err(),
        reference.as_ref().err(),
        "fast and reference validation agree"
    );
    let (Ok(section), Ok(reference)) = (parsed, reference) else {
        return;
    };
    for fde in section.functions() {
        assert_eq!(
            Ok(fde),
            section.fde_reference(fde.index),
            "FDE decoders agree"
        );
        let rows: Vec<_> = section.rows(&fde).collect();
        assert_eq!(rows, section.rows_reference(&fde), "FRE decoders agree");
        assert_eq!(rows.len(), fde.num_fres as usize, "every row decodes");
    }
    assert_eq!(
        section.functions().count(),
        section.num_fdes() as usize,
        "every FDE decodes"
    );
    let mut probes = vec![0, u64::MAX, addr];
    for fde in section.functions() {
        probes.extend([
            fde.start,
            fde.start.wrapping_sub(1),
            fde.start.wrapping_add(u64::from(fde.size)),
        ]);
        let mut prev = None;
        for fre in section.rows(&fde) {
            let _ = section.rule(&fde, &fre);
            let pc = fde.start.wrapping_add(u64::from(fre.start_offset));
            probes.push(pc);
            probes.push(pc.wrapping_sub(1));
            if let Some(p) = prev {
                assert!(fre.start_offset > p, "validated rows increase");
            }
            prev = Some(fre.start_offset);
        }
    }
    for &pc in probes.iter().take(4096) {
        let raw = section.find_fre_raw(pc);
        assert_eq!(
            section.find_fde(pc),
            section.find_fde_libsframe(pc),
            "FDE search = libsframe's"
        );
        assert_eq!(
            raw,
            section.find_fre_raw_linear(pc),
            "lookup = libsframe's scan"
        );
        assert_eq!(
            raw,
            reference.find_fre_raw(pc),
            "lookup without checkpoints"
        );
        if let Some((fde, fre)) = raw {
            let off = pc.wrapping_sub(fde.start);
            assert!(off < u64::from(fde.size), "lookup inside its function");
            if fde.pc_type == PcType::Inc {
                assert!(
                    u64::from(fre.start_offset) <= off,
                    "row starts at or before pc"
                );
            }
        }
        let line = lookup_line(&section, pc);
        assert_eq!(line.contains(" FOUND "), raw.is_some());
    }
    let _ = dump_to_string(&section);
    let Ok(table) = section.to_table() else {
        return;
    };
    for version in [WriteVersion::V2, WriteVersion::V3] {
        let opts = WriteOptions {
            version,
            section_vaddr: addr,
        };
        if let Ok((out, stats)) = write_section(&table, &opts) {
            let back = Section::parse(&out, addr).expect("writer output must parse");
            if stats.splits == 0 && stats.none_rows == 0 {
                let back = back.to_table().expect("table");
                assert_eq!(
                    back.to_function_rows(),
                    table.to_function_rows(),
                    "round trip"
                );
            }
        }
    }
}
