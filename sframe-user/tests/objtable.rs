//! `table_for_elf`: the source chosen per object, the fallback when `.sframe` is bad, and
//! PLT rows added to `.sframe` tables.

use std::path::PathBuf;
use std::process::Command;

use object::{Object, ObjectSection};
use sframe_user::objtable::{ObjTableOptions, SFrameRejection, table_for_elf};
use sframe_user::sframe::Section;
use sframe_user::table::Source;

const SRC: &str = r#"
#include <stdio.h>
#include <stdlib.h>
int main(int argc, char **argv) { printf("%s\n", argv[0]); atexit(NULL); return abs(argc); }
"#;

fn build(name: &str, flags: &[&str]) -> Option<Vec<u8>> {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("objtable-{}-{name}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("m.c"), SRC).unwrap();
    let out = Command::new("gcc")
        .current_dir(&dir)
        .args(flags)
        .args(["m.c", "-o", "m"])
        .output()
        .ok()?;
    if !out.status.success() {
        if sframe_user::privileges::in_ci() {
            panic!("gcc failed: {}", String::from_utf8_lossy(&out.stderr));
        }
        eprintln!("skipping: gcc failed");
        return None;
    }
    std::fs::read(dir.join("m")).ok()
}

fn file_entry(data: &[u8]) -> u64 {
    use object::Object as _;
    object::File::parse(data).unwrap().entry()
}

#[test]
fn sframe_preferred_and_plt_gaps_filled() {
    // -z now: calls through .plt.got / .plt.sec-style GOT entries; ld 2.40 writes no
    // SFrame for .plt.got.
    let Some(data) = build("sf", &["-O2", "-Wa,--gsframe", "-fno-plt", "-Wl,-z,now"]) else {
        return;
    };
    let t = table_for_elf(&data, &ObjTableOptions::default()).unwrap();
    assert_eq!(t.source, Source::SFrame { version: 1 });
    assert!(t.sframe_error.is_none() && t.stats.is_none());
    let section = Section::from_elf_bytes(&data).unwrap();
    let sf = section.to_table().unwrap();
    // Every .sframe function is there unchanged; added ones are PLT functions.
    let all = t.table.to_function_rows();
    for f in &sf.to_function_rows() {
        assert!(all.contains(f));
    }
    assert_eq!(
        t.table.functions().len(),
        sf.functions().len() + t.plt_functions + t.cfi_functions
    );
    // crt1.o's _start has CFI but no SFrame: filled in from the CFI, RA undefined.
    assert!(t.cfi_functions >= 1);
    let entry = file_entry(&data);
    let start = all
        .iter()
        .find(|f| f.start <= entry && entry < f.end())
        .expect("_start covered");
    assert!(
        start
            .rows
            .iter()
            .any(|r| r.rule.is_some_and(|r| r.is_outermost()))
    );
    let file = object::File::parse(&*data).unwrap();
    for name in [".plt", ".plt.got", ".plt.sec"] {
        if let Some(s) = file.section_by_name(name) {
            let covered = t
                .table
                .functions()
                .iter()
                .any(|f| f.start < s.address() + s.size() && f.end() > s.address());
            assert!(covered, "{name} not covered");
        }
    }
    for w in t.table.functions().windows(2) {
        assert!(w[0].end() <= w[1].start);
    }
    let none = ObjTableOptions {
        synthesize_plt: false,
        fill_from_cfi: false,
        ..Default::default()
    };
    assert_eq!(table_for_elf(&data, &none).unwrap().table, sf);
}

#[test]
fn cfi_without_sframe_and_fallback_on_bad_sframe() {
    let Some(data) = build("plain", &["-O2"]) else {
        return;
    };
    let t = table_for_elf(&data, &ObjTableOptions::default()).unwrap();
    assert_eq!(t.source, Source::EhFrame);
    assert!(t.sframe_error.is_none());
    assert!(t.stats.as_ref().is_some_and(|s| s.fdes_converted > 0));

    let Some(mut data) = build("bad", &["-O2", "-Wa,--gsframe"]) else {
        return;
    };
    let (off, _) = object::File::parse(&*data)
        .unwrap()
        .section_by_name(".sframe")
        .unwrap()
        .file_range()
        .unwrap();
    data[off as usize + 2] = 9; // version 9
    let t = table_for_elf(&data, &ObjTableOptions::default()).unwrap();
    assert_eq!(t.source, Source::EhFrame);
    assert!(
        matches!(t.sframe_error, Some(SFrameRejection::Invalid(_))),
        "{:?}",
        t.sframe_error
    );
    let ignore = ObjTableOptions {
        ignore_sframe: true,
        ..Default::default()
    };
    assert_eq!(
        table_for_elf(&data, &ignore).unwrap().table.source,
        Source::EhFrame
    );
}

#[test]
fn system_libraries_are_fast() {
    for lib in [
        "/lib/x86_64-linux-gnu/libc.so.6",
        "/lib/x86_64-linux-gnu/ld-linux-x86-64.so.2",
    ] {
        let Ok(data) = std::fs::read(lib) else {
            continue;
        };
        let t0 = std::time::Instant::now();
        let t = table_for_elf(&data, &ObjTableOptions::default()).unwrap();
        let stats = t.stats.unwrap();
        println!(
            "{lib}: {:?}, {} functions, {} rows, {:.1}% of code with a rule, {:?} (debug build)",
            t.source,
            t.table.functions().len(),
            t.table.row_count(),
            100.0 * stats.bytes_with_rule() as f64 / stats.code_bytes.max(1) as f64,
            t0.elapsed()
        );
        assert!(stats.bytes_with_rule() * 100 >= stats.code_bytes * 99);
    }
}

/// glibc's dynamic loader has no CFI for its entry (`_start`, `_dl_start_user`): the
/// table marks it as the outermost frame, so walks through ld.so's start-up end
/// complete; code with CFI keeps its rows.
#[test]
fn an_entry_point_without_cfi_is_the_outermost_frame() {
    let ld = ["/lib64/ld-linux-x86-64.so.2", "/lib/ld-linux-aarch64.so.1"]
        .into_iter()
        .find(|p| std::path::Path::new(p).exists());
    let Some(ld) = ld else {
        assert!(!sframe_user::privileges::in_ci(), "no dynamic loader found");
        eprintln!("skipping: no dynamic loader found");
        return;
    };
    let data = std::fs::read(ld).unwrap();
    let entry = file_entry(&data);
    let t = table_for_elf(&data, &ObjTableOptions::default())
        .unwrap()
        .table;
    let (f, row) = t.find_row(entry).expect("a row at the entry");
    assert_eq!(f.start, entry);
    let rule = row.rule.expect("a rule");
    assert_eq!(rule.ra, sframe_common::RegRule::Undefined, "{rule:?}");
    // The return address of `call _dl_start` (a few bytes in) is covered too.
    let (_, row) = t.find_row(entry + 8).expect("a row after the entry");
    assert_eq!(
        row.rule.map(|r| r.ra),
        Some(sframe_common::RegRule::Undefined)
    );
    // A program's own _start has CFI (crt1.o): nothing is added there.
    if let Some(exe) = build("entry", &["-O2"]) {
        let t = table_for_elf(&exe, &ObjTableOptions::default()).unwrap();
        let e = file_entry(&exe);
        let (f, _) = t.table.find_row(e).expect("_start has a row");
        assert_ne!(t.table.source, Source::Synthesized);
        assert!(f.size > 8, "crt1.o's own FDE, not a synthesized one");
    }
}
