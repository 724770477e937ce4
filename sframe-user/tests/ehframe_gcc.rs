//! Rows derived from `.eh_frame` of binaries built here with gcc and `-Wa,--gsframe`,
//! checked against known prologues and against the `.sframe` that GNU as/ld wrote for
//! the same code (as printed by `objdump --sframe`): on every PC where both have a row
//! SFrame can express, they must agree.

mod cfi_support;

use std::path::{Path, PathBuf};
use std::process::Command;

use object::{Object, ObjectSection, ObjectSymbol};
use sframe_common::{CfaBase, CfaRule, RegRule, UnwindRule};
use sframe_user::ehframe::{Derived, RowCategory, derive_from_elf};
use sframe_user::sframe::WriteVersion;
use sframe_user::table::{FunctionRows, PcType, Source};

const LIB_C: &str = r#"
int libf(int x) { return x * 3 + 1; }
int libg(int x) { return libf(x) + 2; }
"#;

const MAIN_C: &str = r#"
#include <alloca.h>
#include <stdio.h>
#include <string.h>
int libf(int);
int libg(int);
int drap(int n);
double avx(int n, double x);
__attribute__((noinline)) int leaf_fp(int x) { return libf(x) * 7; }
__attribute__((noinline)) int use_alloca(int n) {
    char *p = alloca(n);
    memset(p, 1, n);
    return p[n - 1] + libf(n);
}
__attribute__((noinline, force_align_arg_pointer)) int realign(int n) { return n + libg(n); }
int main(int argc, char **argv) {
    (void)argv;
    printf("%d\n", use_alloca(argc + 10) + realign(argc) + leaf_fp(argc) + drap(argc + 3));
    return (int)avx(argc + 1, 2.0);
}
"#;

// Stack realignment with alloca: gcc sets up a DRAP register (r10), so the CFA is first
// r10+0 and then *(rbp-N) (DW_CFA_def_cfa_expression), which SFrame cannot express.
const DRAP_C: &str = r#"
#include <alloca.h>
#include <string.h>
__attribute__((noipa)) int sink(char *p, int n) { return p[0] + n; }
__attribute__((noinline)) int drap(int n) {
    char buf[64] __attribute__((aligned(64)));
    char *p = alloca(n);
    memset(p, 0, n);
    memset(buf, 1, sizeof buf);
    return sink(p, n) + sink(buf, 64);
}
typedef double v4d __attribute__((vector_size(32)));
__attribute__((noinline)) double avx(int n, double x) {
    v4d a = {x, x, x, x};
    v4d *q = alloca(n * sizeof(v4d));
    for (int i = 0; i < n; i++) q[i] = a * (double)i;
    sink((char *)q, n);
    return q[n - 1][0];
}
"#;

fn run(cmd: &mut Command) {
    let out = cmd
        .output()
        .unwrap_or_else(|e| panic!("running {cmd:?}: {e}"));
    assert!(
        out.status.success(),
        "{cmd:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Builds `libt.so` and `main` with `flags` into a fresh directory.
fn build(name: &str, flags: &[&str]) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("ehframe-gcc-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    for (file, text) in [("lib.c", LIB_C), ("main.c", MAIN_C), ("drap.c", DRAP_C)] {
        std::fs::write(dir.join(file), text).unwrap();
    }
    run(Command::new("gcc").current_dir(&dir).args(flags).args([
        "-Wa,--gsframe",
        "-fPIC",
        "-shared",
        "-o",
        "libt.so",
        "lib.c",
    ]));
    run(Command::new("gcc").current_dir(&dir).args(flags).args([
        "-mavx",
        "-Wa,--gsframe",
        "-o",
        "main",
        "main.c",
        "drap.c",
        "-L.",
        "-lt",
    ]));
    dir
}

/// One function of `objdump --sframe` output.
#[derive(Debug)]
struct SfFunc {
    pc: u64,
    size: u64,
    mask: bool,
    rows: Vec<SfRow>,
}

#[derive(Debug)]
struct SfRow {
    /// Absolute for PCINC functions, offset in the 16-byte block for PCMASK ones.
    start: u64,
    cfa: CfaRule,
    fp: RegRule,
    ra: RegRule,
}

fn parse_off(s: &str) -> Option<i32> {
    s.parse().ok()
}

fn parse_reg(tok: &str, default: RegRule) -> Option<RegRule> {
    let tok = tok.trim_end_matches("[s]");
    if tok == "u" {
        return Some(default);
    }
    tok.strip_prefix('c')
        .and_then(parse_off)
        .map(RegRule::AtCfa)
}

fn parse_objdump_sframe(text: &str) -> Vec<SfFunc> {
    let mut funcs: Vec<SfFunc> = Vec::new();
    for line in text.lines() {
        let line = line.trim();
        if let Some(rest) = line.strip_prefix("func idx [") {
            // func idx [0]: pc = 0x1020, size = 16 bytes
            let pc = rest
                .split("pc = 0x")
                .nth(1)
                .and_then(|s| s.split(',').next())
                .unwrap();
            let size = rest
                .split("size = ")
                .nth(1)
                .and_then(|s| s.split(' ').next())
                .unwrap();
            funcs.push(SfFunc {
                pc: u64::from_str_radix(pc, 16).unwrap(),
                size: size.parse().unwrap(),
                mask: false,
                rows: Vec::new(),
            });
            continue;
        }
        if line.starts_with("STARTPC") {
            funcs.last_mut().unwrap().mask = line.starts_with("STARTPC[m]");
            continue;
        }
        let toks: Vec<&str> = line.split_whitespace().collect();
        let Some(f) = funcs.last_mut() else { continue };
        if toks.len() < 4 || !toks[0].bytes().all(|b| b.is_ascii_hexdigit()) {
            continue;
        }
        let cfa = if let Some(o) = toks[1].strip_prefix("sp") {
            CfaRule::sp(parse_off(o).unwrap())
        } else if let Some(o) = toks[1].strip_prefix("fp") {
            CfaRule::fp(parse_off(o).unwrap())
        } else {
            panic!("unknown CFA {line}")
        };
        f.rows.push(SfRow {
            start: u64::from_str_radix(toks[0], 16).unwrap(),
            cfa,
            fp: parse_reg(toks[2], RegRule::Unchanged).unwrap(),
            // AMD64 SFrame does not track the RA: it is always at CFA-8.
            ra: parse_reg(toks[3], RegRule::AtCfa(-8)).unwrap(),
        });
    }
    funcs
}

fn derived_rule(fns: &[FunctionRows], pc: u64) -> Option<(&FunctionRows, Option<UnwindRule>)> {
    let i = fns.partition_point(|f| f.end() <= pc);
    let f = fns.get(i).filter(|f| f.start <= pc)?;
    let off = match f.pc_type {
        PcType::Inc => pc - f.start,
        PcType::Mask { rep_size } => (pc - f.start) % u64::from(rep_size),
    };
    let r = f
        .rows
        .iter()
        .rev()
        .find(|r| u64::from(r.start_offset) <= off)?;
    Some((f, r.rule))
}

/// Compares every PC of every SFrame function with the derived rows; returns the PCs
/// compared and the disagreements.
fn compare_with_objdump(path: &Path, derived: &Derived) -> (u64, u64, Vec<String>) {
    let out = Command::new("objdump")
        .arg("--sframe=.sframe")
        .arg(path)
        .output()
        .unwrap();
    assert!(out.status.success());
    let funcs = parse_objdump_sframe(&String::from_utf8_lossy(&out.stdout));
    assert!(
        !funcs.is_empty(),
        "{}: objdump shows no SFrame functions",
        path.display()
    );
    let (mut compared, mut excluded, mut bad) = (0u64, 0u64, Vec::new());
    let fns = derived.table.to_function_rows();
    for sf in &funcs {
        for pc in sf.pc..sf.pc + sf.size {
            let key = if sf.mask { (pc - sf.pc) % 16 } else { pc };
            let row = sf.rows.iter().rev().find(|r| r.start <= key).unwrap();
            let Some((_, rule)) = derived_rule(&fns, pc) else {
                bad.push(format!(
                    "{pc:#x}: SFrame has a row, derived has no function"
                ));
                continue;
            };
            let Some(rule) = rule.filter(|r| RowCategory::of(Some(r)) == RowCategory::Plain) else {
                excluded += 1;
                continue;
            };
            compared += 1;
            if rule.cfa != row.cfa || rule.fp != row.fp || rule.ra != row.ra {
                bad.push(format!("{pc:#x}: sframe {row:?} derived {rule:?}"));
            }
        }
    }
    (compared, excluded, bad)
}

fn symbol(data: &[u8], name: &str) -> (u64, u64) {
    let file = object::File::parse(data).unwrap();
    file.symbols()
        .chain(file.dynamic_symbols())
        .find(|s| s.name() == Ok(name))
        .map(|s| (s.address(), s.size()))
        .unwrap_or_else(|| panic!("no symbol {name}"))
}

fn function_at(d: &Derived, addr: u64) -> FunctionRows {
    d.table
        .to_function_rows()
        .into_iter()
        .find(|f| f.start == addr)
        .unwrap_or_else(|| panic!("no derived function at {addr:#x}"))
}

fn rule_at(d: &Derived, pc: u64) -> Option<UnwindRule> {
    derived_rule(&d.table.to_function_rows(), pc).and_then(|(_, r)| r)
}

fn check_invariants(d: &Derived) {
    let fns = &d.table.to_function_rows();
    for w in fns.windows(2) {
        assert!(
            w[0].end() <= w[1].start,
            "overlap {:#x} {:#x}",
            w[0].start,
            w[1].start
        );
    }
    for f in fns {
        assert!(!f.rows.is_empty());
        assert_eq!(f.rows[0].start_offset, 0);
        for w in f.rows.windows(2) {
            assert!(w[0].start_offset < w[1].start_offset);
            assert_ne!(w[0].rule, w[1].rule, "unmerged rows in {:#x}", f.start);
        }
        assert!(u64::from(f.rows.last().unwrap().start_offset) < u64::from(f.size));
    }
}

fn check_variant(name: &str, flags: &[&str], frame_pointer: bool) {
    let dir = build(name, flags);
    for obj in ["main", "libt.so"] {
        let path = dir.join(obj);
        let data = std::fs::read(&path).unwrap();
        let d = derive_from_elf(&data).unwrap();
        check_invariants(&d);
        assert_eq!(d.table.source, Source::EhFrame);
        assert_eq!(d.stats.skipped_total(), 0, "{:?}", d.stats.errors);
        let (compared, excluded, bad) = compare_with_objdump(&path, &d);
        println!(
            "{name}/{obj}: {compared} PCs agree, {excluded} not comparable, stats {:?}",
            d.stats.categories
        );
        assert!(
            bad.is_empty(),
            "{name}/{obj}: {} disagreements:\n{}",
            bad.len(),
            bad[..bad.len().min(20)].join("\n")
        );
        assert!(compared > 20, "{name}/{obj}: only {compared} PCs compared");
        // Written as SFrame and read back, every row is found as derived: v3 keeps the
        // DRAP/AVX functions' FLEX rows of `main`; v2 takes the library (default rows).
        let rt = cfi_support::sframe_round_trip(&d.table, WriteVersion::V3, 0x40_0000);
        assert!(rt.pcs >= d.stats.rows, "{name}/{obj}: {rt:?}");
        if obj == "libt.so" {
            cfi_support::sframe_round_trip(&d.table, WriteVersion::V2, 0x40_0000);
        }
    }

    let data = std::fs::read(dir.join("main")).unwrap();
    let d = derive_from_elf(&data).unwrap();
    let plain_entry = UnwindRule {
        cfa: CfaRule::sp(8),
        ra: RegRule::AtCfa(-8),
        fp: RegRule::Unchanged,
        flags: Default::default(),
    };
    for f in ["leaf_fp", "use_alloca", "main", "drap"] {
        let (addr, _) = symbol(&data, f);
        assert_eq!(rule_at(&d, addr), Some(plain_entry), "{name}: entry of {f}");
    }

    // After `push rbp; mov rbp,rsp`: CFA = FP+16, FP saved at CFA-16.
    let fp_frame = |f: &FunctionRows| {
        f.rows.iter().any(|r| {
            r.rule
                .is_some_and(|r| r.cfa == CfaRule::fp(16) && r.fp == RegRule::AtCfa(-16))
        })
    };
    let (leaf, _) = symbol(&data, "leaf_fp");
    assert_eq!(
        fp_frame(&function_at(&d, leaf)),
        frame_pointer,
        "{name}: leaf_fp"
    );
    if frame_pointer {
        let r = rule_at(&d, leaf + 1).unwrap();
        assert_eq!(
            (r.cfa, r.fp),
            (CfaRule::sp(16), RegRule::AtCfa(-16)),
            "{name}: after push rbp"
        );
    }
    // alloca needs a frame pointer whatever the flags say.
    let (ua, _) = symbol(&data, "use_alloca");
    assert!(fp_frame(&function_at(&d, ua)), "{name}: use_alloca");

    // _start: the outermost frame.
    let (start, _) = symbol(&data, "_start");
    assert_eq!(rule_at(&d, start).unwrap().ra, RegRule::Undefined);

    // DRAP: CFA = r10 first, then *(rbp - N); the per-object counts see those rows.
    let mut drap_rows = [0u64; 7];
    for f in ["drap", "avx"] {
        let (addr, _) = symbol(&data, f);
        for r in function_at(&d, addr).rows {
            drap_rows[RowCategory::of(r.rule.as_ref()) as usize] += 1;
        }
    }
    let cats = &d.stats.categories;
    for cat in [RowCategory::CfaOtherReg, RowCategory::CfaDeref] {
        let i = cat as usize;
        assert!(
            drap_rows[i] >= 2,
            "{name}: {cat:?} rows of drap/avx: {drap_rows:?}"
        );
        assert!(
            cats[i].rows >= drap_rows[i] && cats[i].bytes > 0,
            "{name}: {cats:?}"
        );
    }
    assert_eq!(cats.iter().map(|c| c.rows).sum::<u64>(), d.stats.rows);
    assert_eq!(
        cats.iter().map(|c| c.bytes).sum::<u64>(),
        d.stats.code_bytes
    );
    assert!(
        d.stats.category(RowCategory::Outermost).rows >= 1,
        "{name}: _start"
    );
    for f in ["drap", "avx"] {
        let (addr, _) = symbol(&data, f);
        let func = function_at(&d, addr);
        let has = |p: &dyn Fn(&UnwindRule) -> bool| {
            func.rows.iter().any(|r| r.rule.as_ref().is_some_and(p))
        };
        assert!(
            has(&|r| r.cfa.base == CfaBase::Reg(10) && r.cfa.offset == 0),
            "{name}: {f} r10"
        );
        assert!(
            has(&|r| r.cfa.base == CfaBase::Fp && r.cfa.deref && r.cfa.offset < 0),
            "{name}: {f} deref: {:?}",
            func.rows
        );
    }

    // .plt: PLT0 (PCINC) and the entries (PCMASK, 16).
    let file = object::File::parse(&*data).unwrap();
    let plt = file.section_by_name(".plt").unwrap();
    let plt0 = function_at(&d, plt.address());
    assert_eq!(plt0.size, 16);
    let rules: Vec<_> = plt0
        .rows
        .iter()
        .map(|r| (r.start_offset, r.rule.unwrap().cfa))
        .collect();
    assert_eq!(rules, vec![(0, CfaRule::sp(16)), (6, CfaRule::sp(24))]);
    let entries = function_at(&d, plt.address() + 16);
    assert_eq!(entries.pc_type, PcType::Mask { rep_size: 16 });
    assert_eq!(u64::from(entries.size), plt.size() - 16);
    let rules: Vec<_> = entries
        .rows
        .iter()
        .map(|r| (r.start_offset, r.rule.unwrap().cfa))
        .collect();
    assert_eq!(rules, vec![(0, CfaRule::sp(8)), (11, CfaRule::sp(16))]);
    assert!(d.stats.plt_functions >= 2);
    // .plt.got (here `__cxa_finalize@plt`, `jmp *GOT(%rip)`): the caller's frame, CFA
    // sp+8 and RA at CFA-8, at every byte.
    let got = file
        .section_by_name(".plt.got")
        .unwrap_or_else(|| panic!("{name}: the executable has a .plt.got"));
    for pc in got.address()..got.address() + got.size() {
        let r = rule_at(&d, pc).unwrap_or_else(|| panic!("{name}: .plt.got {pc:#x}"));
        assert_eq!(
            (r.cfa, r.ra),
            (CfaRule::sp(8), RegRule::AtCfa(-8)),
            "{pc:#x}"
        );
    }

    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn gcc_o0() {
    check_variant("o0", &["-O0"], true);
}

#[test]
fn gcc_o2() {
    check_variant("o2", &["-O2"], false);
}

#[test]
fn gcc_o2_omit_frame_pointer() {
    check_variant("o2-omit", &["-O2", "-fomit-frame-pointer"], false);
}

#[test]
fn gcc_o2_frame_pointer() {
    check_variant("o2-fp", &["-O2", "-fno-omit-frame-pointer"], true);
}

/// IBT PLTs (`-z ibtplt`): `.plt` entries are `endbr64; push; jmp`, `.plt.sec` entries
/// only jump. (ld 2.40's own SFrame for these is wrong, so rows are checked directly.)
#[test]
fn gcc_ibt_plt() {
    let dir = build("ibt", &["-O2", "-fcf-protection=full", "-Wl,-z,ibtplt"]);
    let data = std::fs::read(dir.join("main")).unwrap();
    let d = derive_from_elf(&data).unwrap();
    check_invariants(&d);
    let file = object::File::parse(&*data).unwrap();
    let plt = file.section_by_name(".plt").unwrap();
    let entries = function_at(&d, plt.address() + 16);
    let rules: Vec<_> = entries
        .rows
        .iter()
        .map(|r| (r.start_offset, r.rule.unwrap().cfa))
        .collect();
    assert_eq!(rules, vec![(0, CfaRule::sp(8)), (9, CfaRule::sp(16))]);
    let sec = file.section_by_name(".plt.sec").unwrap();
    for pc in sec.address()..sec.address() + sec.size() {
        assert_eq!(rule_at(&d, pc).unwrap().cfa, CfaRule::sp(8), "{pc:#x}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// Code without `.eh_frame` (`-fno-asynchronous-unwind-tables -g`): its rows come from
/// `.debug_frame`, in the object or in a separate debug file found by `.gnu_debuglink`
/// or by build-id.
#[test]
fn gcc_debug_frame_and_separate_debug_file() {
    use sframe_user::ehframe::{DebugFileError, DeriveOptions, Warning, derive_from_elf_with};
    let dir = std::env::temp_dir().join(format!("ehframe-gcc-{}-debugframe", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    // Enough functions for a `.debug_frame` that objcopy finds worth compressing.
    let extra: String = (0..200)
        .map(|i| {
            format!(
                "__attribute__((noinline)) long gen{i}(long x) {{ volatile long a[{n}]; a[0] = x; return a[0] * {i}; }}\n",
                n = 1 + i % 7
            )
        })
        .collect();
    std::fs::write(dir.join("lib.c"), format!("{LIB_C}\n{extra}")).unwrap();
    run(Command::new("gcc").current_dir(&dir).args([
        "-O2",
        "-g",
        "-fno-asynchronous-unwind-tables",
        "-Wl,--build-id",
        "-fPIC",
        "-shared",
        "-o",
        "libd.so",
        "lib.c",
    ]));
    let data = std::fs::read(dir.join("libd.so")).unwrap();
    let (libf, _) = symbol(&data, "libf");
    let d = derive_from_elf(&data).unwrap();
    assert!(d.stats.fdes_from_debug_frame >= 2, "{:?}", d.stats);
    assert_eq!(rule_at(&d, libf).unwrap().cfa, CfaRule::sp(8));

    run(Command::new("objcopy").current_dir(&dir).args([
        "--only-keep-debug",
        "libd.so",
        "libd.debug",
    ]));
    run(Command::new("objcopy").current_dir(&dir).args([
        "--strip-debug",
        "--add-gnu-debuglink=libd.debug",
        "libd.so",
        "libd.stripped.so",
    ]));
    let stripped_path = dir.join("libd.stripped.so");
    let stripped = std::fs::read(&stripped_path).unwrap();
    assert!(rule_at(&derive_from_elf(&stripped).unwrap(), libf).is_none());

    // By .gnu_debuglink, next to the object.
    let opts = DeriveOptions {
        debug_root: Some(dir.join("no-such-root")),
        object_path: Some(stripped_path.clone()),
    };
    let d = derive_from_elf_with(&stripped, &opts).unwrap();
    assert_eq!(
        d.stats.debug_file.as_deref(),
        Some(dir.join("libd.debug").as_path())
    );
    assert_eq!(rule_at(&d, libf).unwrap().cfa, CfaRule::sp(8));

    // By build-id under the debug root.
    let file = object::File::parse(&*stripped).unwrap();
    let id = file.build_id().unwrap().unwrap();
    let hex: String = id.iter().map(|b| format!("{b:02x}")).collect();
    let id_dir = dir.join("root/.build-id").join(&hex[..2]);
    std::fs::create_dir_all(&id_dir).unwrap();
    let by_id = id_dir.join(format!("{}.debug", &hex[2..]));
    std::fs::copy(dir.join("libd.debug"), &by_id).unwrap();
    let opts = DeriveOptions {
        debug_root: Some(dir.join("root")),
        object_path: None,
    };
    let d = derive_from_elf_with(&stripped, &opts).unwrap();
    assert_eq!(d.stats.debug_file.as_deref(), Some(by_id.as_path()));
    assert!(d.stats.fdes_from_debug_frame >= 2);

    // Without build-ids, the .gnu_debuglink's CRC-32 decides: the right file is used,
    // a different file of the same name is not (and the warning says why).
    run(Command::new("gcc").current_dir(&dir).args([
        "-O2",
        "-g",
        "-fno-asynchronous-unwind-tables",
        "-Wl,--build-id=none",
        "-fPIC",
        "-shared",
        "-o",
        "libn.so",
        "lib.c",
    ]));
    run(Command::new("objcopy").current_dir(&dir).args([
        "--only-keep-debug",
        "libn.so",
        "libn.debug",
    ]));
    run(Command::new("objcopy").current_dir(&dir).args([
        "--strip-debug",
        "--add-gnu-debuglink=libn.debug",
        "libn.so",
        "libn.stripped.so",
    ]));
    let n_path = dir.join("libn.stripped.so");
    let n_stripped = std::fs::read(&n_path).unwrap();
    let n_opts = DeriveOptions {
        debug_root: Some(dir.join("no-such-root")),
        object_path: Some(n_path.clone()),
    };
    let d = derive_from_elf_with(&n_stripped, &n_opts).unwrap();
    assert_eq!(
        d.stats.debug_file.as_deref(),
        Some(dir.join("libn.debug").as_path())
    );
    let mut other = std::fs::read(dir.join("libn.debug")).unwrap();
    other.extend_from_slice(b"not the same file");
    std::fs::write(dir.join("libn.debug"), &other).unwrap();
    let d = derive_from_elf_with(&n_stripped, &n_opts).unwrap();
    assert_eq!(d.stats.debug_file, None);
    assert!(
        d.stats.warnings.iter().any(|w| matches!(
            w,
            Warning::DebugFile {
                reason: DebugFileError::Crc { found, expected },
                ..
            } if found != expected
        )),
        "{:?}",
        d.stats.warnings
    );
    let uncompressed = derive_from_elf(&data).unwrap().table.to_function_rows();

    // Compressed `.debug_frame` (SHF_COMPRESSED, as Debian's debug files ship it), in
    // the object and in the separate debug file, with zlib and (when this objcopy
    // can) zstd: the same rows as uncompressed.
    for format in ["zlib", "zstd"] {
        let object = dir.join(format!("libd.{format}.so"));
        let status = Command::new("objcopy")
            .arg(format!("--compress-debug-sections={format}"))
            .arg(dir.join("libd.so"))
            .arg(&object)
            .status()
            .unwrap();
        if !status.success() {
            assert_eq!(format, "zstd", "objcopy cannot compress with {format}");
            eprintln!("objcopy cannot write zstd sections here; zstd not covered");
            continue;
        }
        let bytes = std::fs::read(&object).unwrap();
        let file = object::File::parse(&*bytes).unwrap();
        let section = file.section_by_name(".debug_frame").unwrap();
        let flags = match section.flags() {
            object::SectionFlags::Elf { sh_flags } => sh_flags,
            _ => 0,
        };
        assert_ne!(
            flags & u64::from(object::elf::SHF_COMPRESSED),
            0,
            "{format}: .debug_frame is not compressed"
        );
        let d = derive_from_elf(&bytes).unwrap();
        assert!(
            d.stats.warnings.is_empty(),
            "{format}: {:?}",
            d.stats.warnings
        );
        assert_eq!(
            d.table.to_function_rows(),
            uncompressed,
            "{format}: in the object"
        );

        let debug = by_id.with_extension(format!("{format}.debug"));
        run(Command::new("objcopy")
            .arg(format!("--compress-debug-sections={format}"))
            .arg(dir.join("libd.debug"))
            .arg(&debug));
        std::fs::rename(&debug, &by_id).unwrap();
        let d = derive_from_elf_with(&stripped, &opts).unwrap();
        assert_eq!(d.stats.debug_file.as_deref(), Some(by_id.as_path()));
        assert!(
            d.stats.warnings.is_empty(),
            "{format}: {:?}",
            d.stats.warnings
        );
        assert!(
            d.stats.fdes_from_debug_frame >= 2,
            "{format}: {:?}",
            d.stats
        );
        assert_eq!(rule_at(&d, libf).unwrap().cfa, CfaRule::sp(8));
    }
    let _ = std::fs::remove_dir_all(&dir);
}
