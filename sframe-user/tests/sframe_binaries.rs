//! Real binaries built with this machine's gcc and `-Wa,--gsframe` (SFrame v1 here):
//! the dump equals `objdump --sframe=.sframe`, and lookups agree with the rows.

mod sframe_support;

use sframe_support::{
    as_binutils_2_40, build_binaries, model_lookup, objdump_sframe, probe_addresses, tokens,
};
use sframe_user::sframe::{Section, dump_to_string, lookup_line};

#[test]
fn binaries_dump_and_lookup() {
    let Some(bins) = build_binaries() else { return };
    for (name, path) in &bins {
        let bytes = std::fs::read(path).expect("read binary");
        let section = Section::from_elf_bytes(&bytes).unwrap_or_else(|e| panic!("{name}: {e}"));
        let (objdump, old) = objdump_sframe(path);
        let mut ours = dump_to_string(&section);
        if old {
            ours = as_binutils_2_40(&ours);
        }
        assert_eq!(
            tokens(&ours),
            tokens(&objdump),
            "{name}:\n--- ours\n{ours}\n--- objdump\n{objdump}"
        );

        let table = section.to_table().expect("to_table");
        let plt = table
            .functions()
            .iter()
            .any(|f| matches!(f.pc_type, sframe_user::table::PcType::Mask { .. }));
        assert!(
            plt || name == "main-O2-nopie",
            "{name}: expected a PLT (PCMASK) function"
        );
        let mut found = 0;
        for pc in probe_addresses(&table) {
            let got = section
                .find_fre(pc)
                .map(|f| (section.fde(f.function).expect("fde").start, f.rule));
            let want = model_lookup(&table, pc).map(|(i, r)| (table.functions()[i].start, r));
            assert_eq!(got, want, "{name}: lookup {pc:#x}");
            let line = lookup_line(&section, pc);
            assert!(line.starts_with(&format!("{pc:#x} ")), "{line}");
            assert_eq!(line.contains(" FOUND "), got.is_some(), "{line}");
            found += usize::from(got.is_some());
        }
        assert!(found > 0, "{name}: no lookup found anything");
    }
}
