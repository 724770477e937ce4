//! Rows derived from the system's own objects (Debian: `.eh_frame` only). Prints the
//! numbers and asserts bounds on FDEs converted, rows and code covered by a rule.

mod cfi_support;

use std::path::PathBuf;
use std::time::Instant;

use object::{Object, ObjectSection, SectionFlags};
use sframe_common::{CfaRule, RegRule, RuleFlags};
use sframe_user::ehframe::{Derived, RowCategory, derive_from_elf};
use sframe_user::sframe::WriteVersion;
use sframe_user::table::{PcType, Source, UnwindTable};

struct Bounds {
    min_fdes: u64,
    min_rows: u64,
    /// Minimum share of the object's executable code (its `SHF_EXECINSTR` sections:
    /// `.init`, the PLTs, `.text`, `.fini`, without the alignment padding between
    /// functions) that has a rule, in per mille.
    min_covered_permille: u64,
}

/// Bytes of the object's executable sections, and how many of them have a rule.
fn exec_coverage(data: &[u8], table: &UnwindTable) -> (u64, u64) {
    let file = object::File::parse(data).unwrap();
    let exec: Vec<(u64, u64)> = file
        .sections()
        .filter(|s| {
            matches!(s.flags(), SectionFlags::Elf { sh_flags }
                if sh_flags & u64::from(object::elf::SHF_EXECINSTR) != 0)
        })
        .map(|s| (s.address(), s.address() + s.size()))
        .collect();
    let total = exec.iter().map(|(a, b)| b - a).sum();
    let overlap = |a: u64, b: u64| -> u64 {
        exec.iter()
            .map(|&(x, y)| b.min(y).saturating_sub(a.max(x)))
            .sum()
    };
    let mut covered = 0;
    for f in table.functions() {
        let rows: Vec<_> = table.rows(f).collect();
        let (block, blocks) = match f.pc_type {
            PcType::Inc => (u64::from(f.size), 1),
            // Every entry, a partial last one included (lookups match
            // `(pc - start) % rep_size` anywhere in the function).
            PcType::Mask { rep_size } => (
                u64::from(rep_size),
                u64::from(f.size).div_ceil(u64::from(rep_size)),
            ),
        };
        for (i, r) in rows.iter().enumerate() {
            if r.rule.is_none() {
                continue;
            }
            let lo = u64::from(r.start_offset);
            let hi = rows
                .get(i + 1)
                .map_or(block, |n| u64::from(n.start_offset))
                .min(block);
            for k in 0..blocks {
                let base = f.start + k * block;
                covered += overlap(base + lo, (base + hi).min(f.end()));
            }
        }
    }
    (total, covered)
}

fn derive(path: &str, b: Bounds) -> (PathBuf, Vec<u8>, Derived) {
    let path = std::fs::canonicalize(path).unwrap_or_else(|e| panic!("{path}: {e}"));
    let data = std::fs::read(&path).unwrap();
    let t = Instant::now();
    let d = derive_from_elf(&data).unwrap();
    let elapsed = t.elapsed();
    let s = &d.stats;
    println!(
        "{}: {:?}, FDEs seen {} converted {} skipped {:?}; {} functions ({} PLT), {} rows; code {} bytes, {} with a rule ({:.3}%)",
        path.display(),
        elapsed,
        s.fdes_seen,
        s.fdes_converted,
        s.fdes_skipped,
        s.functions,
        s.plt_functions,
        s.rows,
        s.code_bytes,
        s.bytes_with_rule(),
        100.0 * s.bytes_with_rule() as f64 / s.code_bytes.max(1) as f64
    );
    for c in RowCategory::ALL {
        println!("    {c:?}: {:?}", s.category(c));
    }
    assert_eq!(d.table.source, Source::EhFrame);
    assert!(s.used_eh_frame_hdr);
    assert!(
        s.fdes_converted >= b.min_fdes,
        "FDEs converted {}",
        s.fdes_converted
    );
    assert!(
        s.fdes_converted * 100 >= s.fdes_seen * 99,
        "too many skipped: {:?}",
        s.errors
    );
    assert!(s.rows >= b.min_rows, "rows {}", s.rows);
    // The executable code with a rule, counted here independently of the library's
    // counters; the padding between functions is not code.
    let (exec, covered) = exec_coverage(&data, &d.table);
    assert_eq!((exec, covered), (s.exec_bytes, s.exec_bytes_with_rule));
    let code = s.exec_code_bytes();
    println!(
        "    executable sections {exec} bytes, {} of padding between functions; of the \
         {code} bytes of code {covered} have a rule ({:.3}%), {} do not",
        s.padding_bytes,
        100.0 * covered as f64 / code.max(1) as f64,
        s.exec_bytes_without_rule(),
    );
    assert!(s.padding_bytes < exec / 20, "padding {}", s.padding_bytes);
    assert!(
        covered * 1000 >= code * b.min_covered_permille,
        "{covered} of {code} bytes of executable code have a rule"
    );
    // Written as SFrame v3 and read back, every row is found as derived.
    let rt = cfi_support::sframe_round_trip(&d.table, WriteVersion::V3, 0x10_0000);
    assert!(rt.pcs >= s.rows, "{rt:?}");
    let fns = d.table.functions();
    assert!(
        fns.windows(2).all(|w| w[0].end() <= w[1].start),
        "sorted, non-overlapping"
    );
    (path, data, d)
}

#[test]
fn libc() {
    let (_, data, d) = derive(
        "/lib/x86_64-linux-gnu/libc.so.6",
        Bounds {
            min_fdes: 2000,
            min_rows: 10_000,
            min_covered_permille: 990,
        },
    );
    // __restore_rt (`mov $15,%rax; syscall`): a signal frame whose CFA is the saved
    // rsp in the ucontext, *(rsp+160), and whose RA is the saved rip at rsp+168.
    let file = object::File::parse(&*data).unwrap();
    let text = file.section_by_name(".text").unwrap();
    let bytes = text.data().unwrap();
    let fns = d.table.to_function_rows();
    let signal: Vec<_> = fns
        .iter()
        .filter(|f| {
            f.rows
                .iter()
                .any(|r| r.rule.is_some_and(|r| r.flags.contains(RuleFlags::SIGNAL)))
        })
        .collect();
    assert_eq!(signal.len(), 1, "one signal trampoline in libc");
    let f = signal[0];
    let off = usize::try_from(f.start - text.address()).unwrap();
    let code = &bytes[off..off + f.size as usize];
    const RT_SIGRETURN: [u8; 9] = [0x48, 0xc7, 0xc0, 0x0f, 0x00, 0x00, 0x00, 0x0f, 0x05];
    assert!(code.windows(9).any(|w| w == RT_SIGRETURN), "{code:x?}");
    let rule = f.rows[0].rule.unwrap();
    assert_eq!(
        rule.cfa,
        CfaRule {
            base: sframe_common::CfaBase::Sp,
            offset: 160,
            deref: true
        }
    );
    assert_eq!(
        rule.ra,
        RegRule::AtReg {
            reg: 7,
            offset: 168
        }
    );
    // clone / clone3 mark the child's outermost frame.
    assert!(d.stats.category(RowCategory::Outermost).rows >= 1);
}

#[test]
fn ld_so() {
    derive(
        "/lib64/ld-linux-x86-64.so.2",
        Bounds {
            min_fdes: 200,
            min_rows: 1000,
            min_covered_permille: 990,
        },
    );
}

#[test]
fn libstdcxx() {
    derive(
        "/usr/lib/x86_64-linux-gnu/libstdc++.so.6",
        Bounds {
            min_fdes: 3000,
            min_rows: 15_000,
            min_covered_permille: 990,
        },
    );
}

#[test]
fn python3() {
    let (_, data, d) = derive(
        "/usr/bin/python3",
        Bounds {
            min_fdes: 5000,
            min_rows: 30_000,
            min_covered_permille: 990,
        },
    );
    // The entry point is _start: RA undefined.
    let entry = object::File::parse(&*data).unwrap().entry();
    let fns = d.table.to_function_rows();
    let f = fns
        .iter()
        .find(|f| f.start <= entry && entry < f.end())
        .unwrap();
    assert_eq!(f.rows[0].rule.unwrap().ra, RegRule::Undefined);
}
