//! Body of the `ehframe_derive` fuzz target, shared with a plain test in `sframe-user`
//! (`tests/ehframe_fuzz_body.rs`) so it is compiled and exercised on stable too.
//!
//! Input: the bytes of an ELF file. Properties: nothing panics; whatever table comes out
//! has functions sorted by address and disjoint, and rows in increasing order; and the
//! whole object loader's last step, flattening into the kernel layout, gives page
//! entries in order that point into the rows.

use sframe_user::ehframe::derive_from_elf;
use sframe_user::flatten::{RuleDict, flatten};
use sframe_user::objtable::{ObjTableOptions, table_for_elf};
use sframe_user::table::UnwindTable;

fn check(table: &UnwindTable, what: &str) {
    for w in table.functions().windows(2) {
        assert!(w[0].end() <= w[1].start, "{what}: functions overlap");
    }
    let mut rows = 0;
    for f in table.functions() {
        let starts: Vec<u32> = table.rows(f).map(|r| r.start_offset).collect();
        for w in starts.windows(2) {
            assert!(w[0] < w[1], "{what}: rows out of order");
        }
        rows += starts.len();
    }
    assert_eq!(rows, table.row_count(), "{what}: every row in one function");
}

pub fn run(data: &[u8]) {
    if let Ok(d) = derive_from_elf(data) {
        check(&d.table, "derive_from_elf");
        assert_eq!(d.stats.rows, d.table.row_count() as u64);
    }
    // Default options: no separate debug file, so no file system access.
    if let Ok(t) = table_for_elf(data, &ObjTableOptions::default()) {
        check(&t.table, "table_for_elf");
        assert_eq!(t.source, t.table.source);
        let mut dict = RuleDict::default();
        if let Ok(flat) = flatten(&t.table, &mut dict) {
            assert!(
                flat.pages.windows(2).all(|w| w[0] <= w[1]),
                "pages in order"
            );
            assert!(
                flat.pages
                    .last()
                    .is_none_or(|&l| l as usize == flat.rows.len()),
                "the page sentinel is the row count"
            );
            assert!(
                flat.rows.iter().all(|r| usize::from(r.rule) < dict.len()),
                "rows refer to interned rules"
            );
            assert!(
                (sframe_common::budget::MIN_PAGE_SHIFT..=sframe_common::budget::MAX_PAGE_SHIFT)
                    .contains(&flat.page_shift),
                "a page size the kernel takes"
            );
            assert!(
                flat.rows
                    .iter()
                    .all(|r| u64::from(r.addr_low) < 1u64 << flat.page_shift),
                "rows inside their page"
            );
        }
    }
}
