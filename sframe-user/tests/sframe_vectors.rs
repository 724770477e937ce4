//! Every vector in `../shared/sframe-vectors` dumps like the objdump that produced it.

mod sframe_support;

use sframe_support::{as_binutils_2_40, is_binutils_2_40, load_vectors, tokens};
use sframe_user::sframe::{Section, dump_to_string};

#[test]
fn vectors_dump_like_objdump() {
    let Some(vectors) = load_vectors() else {
        return;
    };
    let mut failures = Vec::new();
    for v in &vectors {
        let section = match Section::parse(&v.content, v.section_base) {
            Ok(s) => s,
            Err(e) => {
                failures.push(format!("{}: parse error: {e}", v.name));
                continue;
            }
        };
        let mut ours = dump_to_string(&section);
        if is_binutils_2_40(&v.name) {
            ours = as_binutils_2_40(&ours);
        }
        if tokens(&ours) != tokens(&v.groundtruth) {
            failures.push(format!(
                "{}:\n--- ours\n{ours}\n--- objdump\n{}",
                v.name, v.groundtruth
            ));
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {} vectors differ:\n{}",
        failures.len(),
        vectors.len(),
        failures.join("\n")
    );
}

#[test]
fn vectors_round_trip_through_table() {
    let Some(vectors) = load_vectors() else {
        return;
    };
    for v in &vectors {
        let section = Section::parse(&v.content, v.section_base).expect(&v.name);
        let table = section.to_table().expect("to_table");
        assert_eq!(
            table.functions().len() as u32,
            section.num_fdes(),
            "{}",
            v.name
        );
        assert_eq!(
            table.row_count() as u32,
            section.header().num_fres,
            "{}",
            v.name
        );
    }
}
