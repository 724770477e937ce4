//! Writer round trips: vectors through v2/v3, and large synthetic tables (≥ 100k rows).

mod sframe_support;

use sframe_common::{CfaBase, CfaRule, RegRule, RuleFlags, UnwindRule};
use sframe_support::{load_vectors, model_lookup};
use sframe_user::sframe::{Section, WriteError, WriteOptions, WriteVersion, write_section};
use sframe_user::table::{Arch, FunctionRows, PcType, Row, Source, UnwindTable};

fn round_trip(
    table: &UnwindTable,
    version: WriteVersion,
    vaddr: u64,
) -> Result<UnwindTable, WriteError> {
    let (bytes, stats) = write_section(
        table,
        &WriteOptions {
            version,
            section_vaddr: vaddr,
        },
    )?;
    let section =
        Section::parse(&bytes, vaddr).unwrap_or_else(|e| panic!("writer output rejected: {e}"));
    assert_eq!(stats.fres, section.header().num_fres);
    Ok(section.to_table().expect("to_table"))
}

#[test]
fn vectors_round_trip_v2_and_v3() {
    let Some(vectors) = load_vectors() else {
        return;
    };
    for v in &vectors {
        let table = Section::parse(&v.content, v.section_base)
            .expect(&v.name)
            .to_table()
            .expect("table");
        for (version, base) in [
            (WriteVersion::V3, v.section_base),
            (WriteVersion::V2, v.section_base + 0x1000),
        ] {
            match round_trip(&table, version, base) {
                Ok(back) => {
                    assert_eq!(
                        back.to_function_rows(),
                        table.to_function_rows(),
                        "{} {version:?}",
                        v.name
                    );
                    assert_eq!(back.arch, table.arch);
                }
                // v2 has no FLEX rows and no signal bit; everything else must round-trip.
                Err(WriteError::Unrepresentable { version: 2, .. }) => {
                    assert!(
                        v.name.contains("esc-expr"),
                        "{}: unexpected v2 failure",
                        v.name
                    )
                }
                Err(e) => panic!("{} {version:?}: {e}", v.name),
            }
        }
    }
}

/// A deterministic pseudo-random table of `n` rows over many functions.
fn big_table(arch: Arch, n: usize, flex: bool) -> UnwindTable {
    let mut seed = 0x2545_f491_4f6c_dd1du64;
    let mut rnd = move || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed
    };
    let mut functions = Vec::new();
    let mut start = 0x40_0000u64;
    let mut rows_left = n;
    while rows_left > 0 {
        let nrows = (1 + (rnd() % 40) as usize).min(rows_left);
        rows_left -= nrows;
        let mut rows = Vec::with_capacity(nrows);
        let mut off = 0u32;
        for i in 0..nrows {
            let r = rnd();
            let cfa_off = 8 * (1 + (r % 600) as i32); // exercises 1-, 2-byte words
            let mut rule = UnwindRule {
                cfa: CfaRule {
                    base: if r & 1 == 0 { CfaBase::Sp } else { CfaBase::Fp },
                    offset: cfa_off,
                    deref: false,
                },
                ra: RegRule::AtCfa(-8),
                fp: if r & 2 == 0 {
                    RegRule::Unchanged
                } else {
                    RegRule::AtCfa(-16)
                },
                flags: RuleFlags::default(),
            };
            if let Arch::Aarch64 { .. } = arch {
                rule.ra = if r & 4 == 0 {
                    RegRule::Unchanged
                } else {
                    RegRule::AtCfa(-8)
                };
                if r & 8 != 0 {
                    rule.flags = RuleFlags(RuleFlags::MANGLED_RA);
                }
            }
            if flex && r % 7 == 0 {
                rule.cfa = CfaRule {
                    base: CfaBase::Reg(10),
                    offset: 0,
                    deref: r & 16 != 0,
                };
                rule.fp = RegRule::AtReg { reg: 6, offset: 0 };
            }
            if i + 1 == nrows && r % 11 == 0 {
                rule = UnwindRule {
                    cfa: CfaRule::sp(0),
                    ra: RegRule::Undefined,
                    fp: RegRule::Unchanged,
                    flags: rule.flags,
                };
            }
            rows.push(Row {
                start_offset: off,
                rule: Some(rule),
            });
            off += 1 + (rnd() % 300) as u32; // some functions need 2-byte FRE starts
        }
        let size = off + (rnd() % 4) as u32;
        functions.push(FunctionRows {
            start,
            size,
            pc_type: PcType::Inc,
            rows,
        });
        start += u64::from(size) + (rnd() % 3) * 16; // some gaps
    }
    UnwindTable::from_functions(arch, Source::Synthesized, functions)
}

#[test]
fn big_tables_round_trip() {
    let cases = [
        (Arch::Amd64, false, WriteVersion::V2),
        (Arch::Amd64, true, WriteVersion::V3),
        (Arch::Aarch64 { big_endian: true }, false, WriteVersion::V3),
        (Arch::Aarch64 { big_endian: false }, false, WriteVersion::V2),
    ];
    for (arch, flex, version) in cases {
        let table = big_table(arch, 120_000, flex);
        assert!(table.row_count() >= 100_000);
        let back = round_trip(&table, version, 0x10_0000).expect("write");
        assert_eq!(
            back.functions().len(),
            table.functions().len(),
            "{arch:?} {version:?}"
        );
        assert!(
            back.to_function_rows() == table.to_function_rows(),
            "{arch:?} {version:?}: tables differ"
        );
        // Spot-check lookups against the reference model.
        let (bytes, _) = write_section(
            &table,
            &WriteOptions {
                version,
                section_vaddr: 0x10_0000,
            },
        )
        .unwrap();
        let section = Section::parse(&bytes, 0x10_0000).unwrap();
        for f in table.functions().iter().step_by(97) {
            for pc in [
                f.start,
                f.start + u64::from(f.size) / 2,
                f.end(),
                f.start.wrapping_sub(1),
            ] {
                let got = section.find_fre(pc).map(|f| f.rule);
                assert_eq!(got, model_lookup(&table, pc).map(|r| r.1), "{pc:#x}");
            }
        }
    }
}

#[test]
fn v3_splits_functions_over_65535_rows() {
    let rule = UnwindRule {
        cfa: CfaRule::sp(8),
        ra: RegRule::AtCfa(-8),
        fp: RegRule::Unchanged,
        flags: RuleFlags::default(),
    };
    let rows = (0..70_000u32)
        .map(|i| Row {
            start_offset: i * 2,
            rule: Some(rule),
        })
        .collect();
    let table = UnwindTable::from_functions(
        Arch::Amd64,
        Source::Synthesized,
        [FunctionRows {
            start: 0x1000,
            size: 140_000,
            pc_type: PcType::Inc,
            rows,
        }],
    );
    let (bytes, stats) = write_section(
        &table,
        &WriteOptions {
            version: WriteVersion::V3,
            section_vaddr: 0,
        },
    )
    .unwrap();
    assert_eq!((stats.fdes, stats.splits, stats.fres), (2, 1, 70_000));
    let section = Section::parse(&bytes, 0).unwrap();
    for pc in [
        0x1000u64,
        0x1000 + 131_069,
        0x1000 + 131_070,
        0x1000 + 139_999,
    ] {
        assert_eq!(section.find_fre(pc).map(|f| f.rule), Some(rule), "{pc:#x}");
    }
    assert_eq!(section.find_fre(0x1000 + 140_000), None);
}
