//! Helpers shared by the SFrame integration tests.
#![allow(dead_code)]

pub mod build;

use std::path::PathBuf;

/// One test vector: raw section bytes + the objdump text binutils printed for them.
pub struct Vector {
    pub name: String,
    pub section_base: u64,
    pub content: Vec<u8>,
    pub groundtruth: String,
}

/// `../shared/sframe-vectors` relative to the workspace root.
pub fn vectors_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../shared/sframe-vectors")
}

/// All vectors, or `None` (after printing why) when the directory is missing outside CI.
/// Panics in CI (env `CI` set) when they are missing: the tests must not silently pass.
pub fn load_vectors() -> Option<Vec<Vector>> {
    let dir = vectors_dir();
    let entries = match std::fs::read_dir(&dir) {
        Ok(e) => e,
        Err(e) => {
            if sframe_user::privileges::in_ci() {
                panic!(
                    "SFrame vectors missing at {}: {e} (CI is set)",
                    dir.display()
                );
            }
            eprintln!(
                "skipping: SFrame vectors not found at {}: {e}",
                dir.display()
            );
            return None;
        }
    };
    let mut out = Vec::new();
    for entry in entries {
        let path = entry.expect("read_dir entry").path();
        if path.extension().and_then(|e| e.to_str()) != Some("json") {
            continue;
        }
        let text = std::fs::read_to_string(&path).expect("read vector");
        let v: serde_json::Value = serde_json::from_str(&text).expect("vector JSON");
        let content = v["content"]
            .as_array()
            .expect("content array")
            .iter()
            .map(|b| u8::try_from(b.as_u64().expect("byte")).expect("byte range"))
            .collect();
        out.push(Vector {
            name: path
                .file_stem()
                .and_then(|s| s.to_str())
                .unwrap_or("?")
                .to_string(),
            section_base: v["section_base"].as_u64().expect("section_base"),
            content,
            groundtruth: v["groundtruth"].as_str().expect("groundtruth").to_string(),
        });
    }
    out.sort_by(|a, b| a.name.cmp(&b.name));
    assert!(!out.is_empty(), "no vectors in {}", dir.display());
    Some(out)
}

/// Tokens of an objdump text, without the ELF file-name line, compared modulo whitespace.
pub fn tokens(text: &str) -> Vec<String> {
    text.lines()
        .filter(|l| !l.contains("file format"))
        .flat_map(|l| l.split_whitespace().map(str::to_string))
        .collect()
}

/// binutils up to 2.40 printed the same data slightly differently than 2.46 (same meaning):
/// no "CFA fixed RA offset: N" header line, and `u` instead of `f` in the RA column for
/// the fixed (untracked) AMD64 RA. Rewrite our 2.46-style text to that form.
pub fn as_binutils_2_40(text: &str) -> String {
    let mut out = String::new();
    for line in text.lines() {
        if line.trim_start().starts_with("CFA fixed RA offset:") {
            continue;
        }
        let toks: Vec<&str> = line.split_whitespace().collect();
        let is_row = toks
            .first()
            .is_some_and(|t| t.len() == 16 && t.chars().all(|c| c.is_ascii_hexdigit()));
        if is_row && toks.len() == 4 && toks[3].starts_with('f') {
            let ra = toks[3].replacen('f', "u", 1);
            out.push_str(&format!(
                "    {}  {}  {}  {}\n",
                toks[0], toks[1], toks[2], ra
            ));
        } else {
            out.push_str(line);
            out.push('\n');
        }
    }
    out
}

/// Whether a vector's ground truth comes from binutils 2.40 (named in the file name).
pub fn is_binutils_2_40(name: &str) -> bool {
    name.ends_with("2.40")
}

use sframe_common::UnwindRule;
use sframe_user::table::{PcType, UnwindTable};

/// Reference lookup on the table (independent of the reader's code): the function with
/// `start <= pc < start + size`, then libsframe's row scan (PCMASK: offset mod rep_size
/// for the range test, unmasked offset for the early stop).
pub fn model_lookup(table: &UnwindTable, pc: u64) -> Option<(usize, UnwindRule)> {
    let fns = table.to_function_rows();
    let (fi, f) = fns
        .iter()
        .enumerate()
        .find(|(_, f)| f.start <= pc && pc < f.end())?;
    let off = (pc - f.start) as u32;
    let masked = match f.pc_type {
        PcType::Mask { rep_size } => off % u32::from(rep_size),
        PcType::Inc => off,
    };
    for (i, r) in f.rows.iter().enumerate() {
        let end = f
            .rows
            .get(i + 1)
            .map_or(f.size.wrapping_sub(1), |n| n.start_offset.wrapping_sub(1));
        if r.start_offset > off {
            return None;
        }
        if r.start_offset <= masked && masked <= end {
            return r.rule.map(|rule| (fi, rule));
        }
    }
    None
}

/// Addresses worth looking up in a table: every row start and last byte, a few
/// repetitions of PCMASK blocks, gaps between functions and addresses outside all.
pub fn probe_addresses(table: &UnwindTable) -> Vec<u64> {
    let mut out = Vec::new();
    let fns = table.to_function_rows();
    for (i, f) in fns.iter().enumerate() {
        out.push(f.start.wrapping_sub(1));
        out.push(f.end());
        for (j, r) in f.rows.iter().enumerate() {
            let end = f.rows.get(j + 1).map_or(f.size, |n| n.start_offset);
            let s = f.start + u64::from(r.start_offset);
            out.push(s);
            if end > r.start_offset {
                out.push(f.start + u64::from(end) - 1);
            }
            if let PcType::Mask { rep_size } = f.pc_type {
                for k in 0..(f.size / u32::from(rep_size).max(1)).min(8) {
                    let base = f.start + u64::from(k) * u64::from(rep_size);
                    out.push(base + u64::from(r.start_offset));
                    out.push(base + u64::from(r.start_offset) + 1);
                }
            }
        }
        if let Some(n) = fns.get(i + 1)
            && n.start > f.end()
        {
            out.push(f.end() + (n.start - f.end()) / 2);
        }
    }
    out.push(0);
    out.push(u64::MAX);
    out
}

/// Tool availability: `None` (after printing why) when missing outside CI; panics in CI.
pub fn have_tool(tool: &str) -> bool {
    let ok = std::process::Command::new(tool)
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    if !ok {
        if sframe_user::privileges::in_ci() {
            panic!("{tool} not available (CI is set)");
        }
        eprintln!("skipping: {tool} not available");
    }
    ok
}

const LIB_C: &str = r#"
#include <stdio.h>
#include <stdlib.h>
int helper(int x) { return x * 3; }
int libfn(int a) { printf("%d\n", a); return helper(a) + abs(a); }
"#;

const MAIN_C: &str = r#"
#include <stdio.h>
#include <string.h>
#include <stdlib.h>
#include <alloca.h>
extern int libfn(int);
static int rec(int n) { char buf[64]; memset(buf, n, sizeof buf); return n ? rec(n - 1) + buf[3] : puts("x"); }
static int vla(int n) { char *p = alloca(n + 16); memset(p, 1, n + 16); return p[n] + (int)strlen(p); }
double fl(double x) { return x > 1 ? fl(x / 2) * 3 : x; }
int main(int argc, char **argv) {
  printf("%d %d %f\n", rec(argc), vla(argc * 100), fl(argc * 1000.0));
  return libfn(argc) + (int)strlen(argv[0]) + getchar();
}
"#;

/// Build the test binaries with this machine's gcc and `-Wa,--gsframe` (once per test
/// process); returns (name, path) pairs.
pub fn build_binaries() -> Option<Vec<(String, PathBuf)>> {
    if !have_tool("gcc") || !have_tool("objdump") {
        return None;
    }
    let dir = std::env::temp_dir().join(format!("sframe-bins-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    std::fs::write(dir.join("lib.c"), LIB_C).expect("write lib.c");
    std::fs::write(dir.join("main.c"), MAIN_C).expect("write main.c");
    let gcc = |args: &[&str]| {
        let out = std::process::Command::new("gcc")
            .current_dir(&dir)
            .args(args)
            .output()
            .expect("run gcc");
        assert!(
            out.status.success(),
            "gcc {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    };
    gcc(&[
        "-O2",
        "-fPIC",
        "-shared",
        "-Wa,--gsframe",
        "lib.c",
        "-o",
        "libx.so",
    ]);
    let mut out = vec![("libx.so".to_string(), dir.join("libx.so"))];
    let configs: [(&str, &[&str]); 5] = [
        ("O0", &["-O0"]),
        ("O2", &["-O2"]),
        ("O2-omitfp", &["-O2", "-fomit-frame-pointer"]),
        ("O0-fp", &["-O0", "-fno-omit-frame-pointer"]),
        ("O2-nopie", &["-O2", "-no-pie", "-fno-pie"]),
    ];
    for (name, flags) in configs {
        let exe = format!("main-{name}");
        let mut args: Vec<&str> = flags.to_vec();
        args.extend_from_slice(&["-Wa,--gsframe", "main.c", "-L.", "-lx", "-o", &exe]);
        gcc(&args);
        out.push((exe.clone(), dir.join(&exe)));
    }
    Some(out)
}

/// `objdump --sframe=.sframe FILE` text, and whether objdump is binutils 2.40 or older.
pub fn objdump_sframe(path: &std::path::Path) -> (String, bool) {
    let v = std::process::Command::new("objdump")
        .arg("--version")
        .output()
        .expect("objdump --version");
    let first = String::from_utf8_lossy(&v.stdout)
        .lines()
        .next()
        .unwrap_or("")
        .to_string();
    let ver = first.rsplit(' ').next().unwrap_or("");
    let mut it = ver.split('.').map(|p| p.parse::<u32>().unwrap_or(0));
    let (maj, min) = (it.next().unwrap_or(0), it.next().unwrap_or(0));
    let old = (maj, min) <= (2, 40);
    let out = std::process::Command::new("objdump")
        .arg("--sframe=.sframe")
        .arg(path)
        .output()
        .expect("objdump");
    assert!(out.status.success(), "objdump failed on {}", path.display());
    (String::from_utf8_lossy(&out.stdout).into_owned(), old)
}
