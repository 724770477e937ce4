//! The `dump`, `lookup`, `check` and `gen` subcommands, run as the built binary on
//! binaries compiled here with gcc `-Wa,--gsframe` (SFrame v1 on this machine) and on
//! system libraries.

mod sframe_support;

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use sframe_support::{as_binutils_2_40, have_tool, objdump_sframe, probe_addresses, tokens};
use sframe_user::ehframe::derive_from_elf;
use sframe_user::sframe::{Section, lookup_line};

const BIN: &str = env!("CARGO_BIN_EXE_sframe-user");

const LIB_C: &str = r#"
#include <stdio.h>
int libf(int x) { printf("%d\n", x); return x * 3 + 1; }
int libg(int x) { return libf(x) + puts("g"); }
"#;

const MAIN_C: &str = r#"
#include <alloca.h>
#include <stdio.h>
#include <string.h>
int libf(int);
int libg(int);
__attribute__((noinline)) int use_alloca(int n) {
    char *p = alloca(n);
    memset(p, 1, n);
    return p[n - 1] + libf(n);
}
__attribute__((noinline, force_align_arg_pointer)) int realign(int n) { return n + libg(n); }
static int rec(int n) { char b[32]; memset(b, n, sizeof b); return n ? rec(n - 1) + b[1] : 0; }
int main(int argc, char **argv) {
    printf("%d\n", use_alloca(argc + 10) + realign(argc) + rec(argc));
    return (int)strlen(argv[0]) == 0;
}
"#;

fn sframe(args: &[&std::ffi::OsStr]) -> Output {
    Command::new(BIN)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .expect("run sframe-user")
}

fn run(args: &[&str]) -> Output {
    let os: Vec<&std::ffi::OsStr> = args.iter().map(std::ffi::OsStr::new).collect();
    sframe(&os)
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

fn gcc(dir: &Path, args: &[&str]) {
    let out = Command::new("gcc")
        .current_dir(dir)
        .args(args)
        .output()
        .expect("run gcc");
    assert!(
        out.status.success(),
        "gcc {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Builds the fixtures once per configuration: (name, path) of a shared object with PLT
/// calls and an executable calling it, per flag set.
fn fixtures(gsframe: bool) -> Option<(PathBuf, Vec<(String, PathBuf)>)> {
    type Built = Option<(PathBuf, Vec<(String, PathBuf)>)>;
    static WITH: std::sync::OnceLock<Built> = std::sync::OnceLock::new();
    static WITHOUT: std::sync::OnceLock<Built> = std::sync::OnceLock::new();
    let cell = if gsframe { &WITH } else { &WITHOUT };
    cell.get_or_init(|| build_fixtures(gsframe)).clone()
}

fn build_fixtures(gsframe: bool) -> Option<(PathBuf, Vec<(String, PathBuf)>)> {
    if !have_tool("gcc") || !have_tool("objdump") {
        return None;
    }
    let tag = if gsframe { "sf" } else { "nosf" };
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("cli-tables-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("lib.c"), LIB_C).unwrap();
    std::fs::write(dir.join("main.c"), MAIN_C).unwrap();
    let sf: &[&str] = if gsframe { &["-Wa,--gsframe"] } else { &[] };
    let mut out = Vec::new();
    let configs: [(&str, &[&str]); 4] = [
        ("O0", &["-O0"]),
        ("O2", &["-O2"]),
        ("O2-omitfp", &["-O2", "-fomit-frame-pointer"]),
        ("O2-fp", &["-O2", "-fno-omit-frame-pointer"]),
    ];
    for (name, flags) in configs {
        let lib = format!("lib{name}.so");
        let mut args = flags.to_vec();
        args.extend_from_slice(sf);
        args.extend_from_slice(&["-fPIC", "-shared", "lib.c", "-o", &lib]);
        gcc(&dir, &args);
        let exe = format!("main-{name}");
        let mut args = flags.to_vec();
        args.extend_from_slice(sf);
        let l = format!("-l{name}");
        args.extend_from_slice(&["main.c", "-L.", &l, "-o", &exe]);
        gcc(&dir, &args);
        out.push((lib.clone(), dir.join(&lib)));
        out.push((exe.clone(), dir.join(&exe)));
    }
    Some((dir, out))
}

#[test]
fn dump_equals_objdump_and_lookup_matches() {
    let Some((_, bins)) = fixtures(true) else {
        return;
    };
    for (name, path) in &bins {
        let p = path.to_str().unwrap();
        let o = run(&["dump", p]);
        assert_eq!(o.status.code(), Some(0), "{name}: {}", stderr(&o));
        let ours = stdout(&o);
        assert!(
            ours.starts_with(&format!(
                "\n{p}:     file format elf64-x86-64\n\nContents of the SFrame section .sframe:\n"
            )),
            "{name}: header: {ours}"
        );
        let (objdump, old) = objdump_sframe(path);
        let ours_cmp = if old {
            as_binutils_2_40(&ours)
        } else {
            ours.clone()
        };
        assert_eq!(tokens(&ours_cmp), tokens(&objdump), "{name}:\n{ours}");
        // The file-name line is objdump's too.
        assert_eq!(ours.lines().nth(1), objdump.lines().nth(1), "{name}");

        // lookup: every probe address, as arguments and on stdin, equals the library's.
        let data = std::fs::read(path).unwrap();
        let section = Section::from_elf_bytes(&data).unwrap();
        let table = section.to_table().unwrap();
        let probes = probe_addresses(&table);
        let want: Vec<String> = probes.iter().map(|&a| lookup_line(&section, a)).collect();
        let args: Vec<String> = probes
            .iter()
            .enumerate()
            .map(|(i, a)| {
                if i % 2 == 0 {
                    format!("{a:#x}")
                } else {
                    format!("{a:x}")
                }
            })
            .collect();
        let mut argv = vec!["lookup".to_string(), p.to_string()];
        argv.extend(args.iter().cloned());
        let argv: Vec<&str> = argv.iter().map(String::as_str).collect();
        let o = run(&argv);
        assert_eq!(o.status.code(), Some(0));
        let got: Vec<String> = stdout(&o).lines().map(str::to_string).collect();
        assert_eq!(got, want, "{name}: lookup");
        assert!(
            got.iter()
                .any(|l| l.contains(" FOUND cfa_base=sp cfa_off="))
        );
        assert!(got.iter().any(|l| l.ends_with(" NOTFOUND")));

        let mut child = Command::new(BIN)
            .args(["lookup", p])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        {
            use std::io::Write;
            let mut stdin = child.stdin.take().unwrap();
            writeln!(stdin, "{}", args.join("\n")).unwrap();
        }
        let o = child.wait_with_output().unwrap();
        assert_eq!(o.status.code(), Some(0));
        let got: Vec<String> = stdout(&o).lines().map(str::to_string).collect();
        assert_eq!(got, want, "{name}: lookup on stdin");
    }
}

#[test]
fn lookup_format_and_help() {
    let Some((_, bins)) = fixtures(true) else {
        return;
    };
    let p = bins[1].1.to_str().unwrap();
    let data = std::fs::read(&bins[1].1).unwrap();
    let section = Section::from_elf_bytes(&data).unwrap();
    let f = section.functions_sorted().last().unwrap();
    let pc = format!("{:x}", f.start);
    let o = run(&["lookup", p, &pc, "nothex", "-v"]);
    assert_eq!(o.status.code(), Some(0));
    let text = stdout(&o);
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 2, "{text}");
    assert!(
        lines[0].starts_with(&format!(
            "{:#x} FOUND cfa_base=sp cfa_off=8 fp_off=none ra_off=-8",
            f.start
        )),
        "{text}"
    );
    assert!(lines[0].contains(" fde="), "{text}");
    assert_eq!(lines[1], "nothex INVALID");
    let help = stdout(&run(&["lookup", "--help"]));
    for needle in ["cfa_base=rN", "cfa_deref=1", "ra=undefined", "mangled_ra=1"] {
        assert!(help.contains(needle), "--help lacks {needle}:\n{help}");
    }
    // No .sframe: the file cannot be looked up in.
    let o = run(&["lookup", "/bin/sh", "0x1000"]);
    assert_eq!(o.status.code(), Some(2));
}

#[test]
fn check_agrees_on_gcc_builds() {
    let Some((_, bins)) = fixtures(true) else {
        return;
    };
    for (name, path) in &bins {
        let o = run(&["check", path.to_str().unwrap()]);
        let text = stdout(&o);
        println!("{text}");
        assert_eq!(o.status.code(), Some(0), "{name}: {text}{}", stderr(&o));
        assert!(text.contains(" 0 ranges (0 bytes) disagree"), "{text}");
        let agree: u64 = text
            .split("disagree; ")
            .nth(1)
            .and_then(|s| s.split(' ').next())
            .and_then(|s| s.parse().ok())
            .unwrap();
        assert!(agree > 50, "{name}: only {agree} bytes compared: {text}");
    }
}

/// Replace the first FRE's CFA offset of the function at `pc` in the `.sframe` bytes.
fn corrupt_sframe(data: &mut [u8], pc: u64) {
    use object::{Object, ObjectSection};
    let file = object::File::parse(&*data).unwrap();
    let sec = file.section_by_name(".sframe").unwrap();
    let (off, _) = sec.file_range().unwrap();
    let section = Section::from_elf_bytes(&*data).unwrap();
    let fde = section
        .functions()
        .find(|f| f.start <= pc && pc < f.start + u64::from(f.size))
        .unwrap();
    let fre = section.rows(&fde).next().unwrap();
    let word = off as usize + fre.offset + fde.addr_size() + 1;
    drop(file);
    data[word] = data[word].wrapping_add(8);
}

#[test]
fn check_reports_a_corrupted_pair() {
    let Some((dir, bins)) = fixtures(true) else {
        return;
    };
    let (_, path) = bins.iter().find(|(n, _)| n == "main-O2").unwrap();
    let mut data = std::fs::read(path).unwrap();
    let main = {
        use object::{Object, ObjectSymbol};
        let f = object::File::parse(&*data).unwrap();
        f.symbols()
            .find(|s| s.name() == Ok("main"))
            .unwrap()
            .address()
    };
    corrupt_sframe(&mut data, main);
    let bad = dir.join("main-corrupt");
    std::fs::write(&bad, &data).unwrap();
    let o = run(&["check", bad.to_str().unwrap()]);
    let text = stdout(&o);
    assert_eq!(o.status.code(), Some(1), "{text}{}", stderr(&o));
    let first = text.lines().next().unwrap();
    assert!(
        first.starts_with(&format!("{main:#x}-")) && first.contains(".sframe cfa=sp+16"),
        "{text}"
    );
    assert!(first.contains(".eh_frame cfa=sp+8"), "{text}");
}

#[test]
fn gen_round_trips() {
    let Some((dir, bins)) = fixtures(false) else {
        return;
    };
    for (name, path) in &bins {
        let p = path.to_str().unwrap();
        for version in ["2", "3"] {
            let out = dir.join(format!("{name}.v{version}.sframe"));
            let out_elf = dir.join(format!("{name}.v{version}.elf"));
            let o = run(&[
                "gen",
                p,
                "-o",
                out.to_str().unwrap(),
                "--version",
                version,
                "--elf",
                out_elf.to_str().unwrap(),
            ]);
            assert_eq!(o.status.code(), Some(0), "{name}: {}", stderr(&o));
            let report = stdout(&o);
            let addr = report
                .split("for address ")
                .nth(1)
                .and_then(|s| s.split(',').next())
                .unwrap()
                .to_string();

            // gen then dump equals dump --from-eh-frame (modulo the file-name line).
            let raw = run(&[
                "dump",
                "--raw",
                out.to_str().unwrap(),
                "--section-addr",
                &addr,
            ]);
            assert_eq!(raw.status.code(), Some(0), "{}", stderr(&raw));
            let from = run(&["dump", "--from-eh-frame", p, "--version", version]);
            assert_eq!(from.status.code(), Some(0), "{}", stderr(&from));
            assert_eq!(
                tokens(&stdout(&raw)),
                tokens(&stdout(&from)),
                "{name} v{version}"
            );
            assert!(stdout(&raw).contains(&format!("SFRAME_VERSION_{version}")));
            assert!(stdout(&raw).contains("SFRAME_F_FDE_FUNC_START_PCREL"));

            // --elf: the added section is where its bytes say, with the same rows.
            let bytes = std::fs::read(&out).unwrap();
            let standalone = Section::parse(&bytes, u64::from_str_radix(&addr[2..], 16).unwrap())
                .unwrap()
                .to_table()
                .unwrap();
            // ... which are the derived rows themselves (nothing left out for these
            // objects; outermost rows as SFrame stores them: CFA base and flags only).
            assert!(report.contains("left out: 0 rows"), "{report}");
            assert!(report.contains("rows by kind: plain "), "{report}");
            let derived = derive_from_elf(&std::fs::read(path).unwrap()).unwrap();
            let as_stored = |t: &sframe_user::table::UnwindTable| {
                let mut fns = t.to_function_rows();
                for r in fns.iter_mut().flat_map(|f| f.rows.iter_mut()) {
                    if let Some(rule) = r.rule.as_mut().filter(|r| r.is_outermost()) {
                        rule.cfa.offset = 0;
                        rule.fp = sframe_common::RegRule::Unchanged;
                    }
                }
                fns
            };
            assert_eq!(as_stored(&standalone), as_stored(&derived.table), "{name}");
            let elf = std::fs::read(&out_elf).unwrap();
            let added = Section::from_elf_bytes(&elf).unwrap();
            assert_eq!(format!("{:#x}", added.section_vaddr()), addr);
            assert_eq!(
                added.to_table().unwrap().to_function_rows(),
                standalone.to_function_rows()
            );
            let dump = run(&["dump", out_elf.to_str().unwrap()]);
            assert_eq!(tokens(&stdout(&dump)), tokens(&stdout(&raw)), "{name}");
            // A loader maps it: the program still runs. (objdump 2.40 reads only v1.)
            if name.starts_with("main") {
                let o = Command::new(&out_elf)
                    .env("LD_LIBRARY_PATH", &dir)
                    .output()
                    .unwrap();
                assert_eq!(o.status.code(), Some(0), "{name}: rewritten binary fails");
            }
            assert_in_load_segment(&elf, added.section_vaddr(), bytes.len() as u64);
        }
    }
}

fn assert_in_load_segment(elf: &[u8], vaddr: u64, len: u64) {
    use object::read::elf::{ElfFile64, ProgramHeader};
    let f = ElfFile64::<object::Endianness>::parse(elf).unwrap();
    let e = f.endian();
    assert!(
        f.elf_program_headers().iter().any(|p| {
            p.p_type(e) == object::elf::PT_LOAD
                && p.p_vaddr(e) <= vaddr
                && vaddr + len <= p.p_vaddr(e) + p.p_filesz(e)
        }),
        "the .sframe is not in a PT_LOAD segment"
    );
}

#[test]
fn malformed_input_is_one_line_and_exit_2() {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("cli-tables-malformed");
    std::fs::create_dir_all(&dir).unwrap();
    let garbage = dir.join("garbage");
    std::fs::write(&garbage, b"\xe2\xde\x02\x00garbage-garbage-garbage-garbage").unwrap();
    let g = garbage.to_str().unwrap();
    let missing = dir.join("missing");
    let cases: Vec<Vec<&str>> = vec![
        vec!["dump", g],
        vec!["dump", "--raw", g, "--section-addr", "0x1000"],
        vec!["dump", "--from-eh-frame", g],
        vec!["lookup", g, "0x10"],
        vec!["check", g],
        vec!["gen", g, "-o", "/dev/null"],
        vec!["dump", missing.to_str().unwrap()],
    ];
    for args in cases {
        let o = run(&args);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {}", stderr(&o));
        let err = stderr(&o);
        assert_eq!(err.lines().count(), 1, "{args:?}: {err}");
        assert!(err.starts_with("sframe-user: "), "{err}");
        assert!(
            err.contains(g) || err.contains(missing.to_str().unwrap()),
            "{err}"
        );
        assert!(o.stdout.is_empty(), "{args:?}");
    }
    // A truncated raw section: the error names the check and the offset.
    let o = run(&["dump", "--raw", g, "--section-addr", "1000"]);
    let err = stderr(&o);
    assert!(
        err.contains(g) && err.contains("check") && err.contains("offset"),
        "{err}"
    );
}

fn system_objects() -> Vec<PathBuf> {
    let mut out = Vec::new();
    for name in [
        "libc.so.6",
        "ld-linux-x86-64.so.2",
        "libstdc++.so.6",
        "libgcc_s.so.1",
    ] {
        for dir in [
            "/lib/x86_64-linux-gnu",
            "/usr/lib/x86_64-linux-gnu",
            "/lib64",
        ] {
            let p = Path::new(dir).join(name);
            if p.exists() {
                out.push(p);
                break;
            }
        }
    }
    if Path::new("/usr/bin/python3").exists() {
        out.push(std::fs::canonicalize("/usr/bin/python3").unwrap());
    }
    out
}

#[test]
fn system_objects_check_gen_dump() {
    let objs = system_objects();
    if objs.is_empty() {
        eprintln!("skipping: no system objects found");
        return;
    }
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("cli-tables-system");
    std::fs::create_dir_all(&dir).unwrap();
    for path in &objs {
        let p = path.to_str().unwrap();
        let name = path.file_name().unwrap().to_str().unwrap();
        let o = run(&["check", p]);
        assert_eq!(o.status.code(), Some(0), "{name}: {}", stderr(&o));
        let out = dir.join(format!("{name}.sframe"));
        let t = std::time::Instant::now();
        let o = run(&["gen", p, "-o", out.to_str().unwrap()]);
        let ms = t.elapsed().as_millis();
        assert_eq!(o.status.code(), Some(0), "{name}: {}", stderr(&o));
        let report = stdout(&o);
        println!("{report}  ({ms} ms)");
        let fdes: u64 = report
            .split(" FDEs, ")
            .next()
            .and_then(|s| s.rsplit(' ').next())
            .and_then(|s| s.parse().ok())
            .unwrap();
        assert!(fdes > 100, "{name}: {report}");
        let o = run(&["dump", "--from-eh-frame", p]);
        assert_eq!(o.status.code(), Some(0), "{name}: {}", stderr(&o));
        let text = stdout(&o);
        assert!(text.contains("SFRAME_VERSION_3") && text.contains("func idx [100]"));
        // gen then dump equals dump --from-eh-frame, line for line (but the file name).
        let addr = report
            .split("for address ")
            .nth(1)
            .and_then(|s| s.split(',').next())
            .unwrap();
        let raw = run(&[
            "dump",
            "--raw",
            out.to_str().unwrap(),
            "--section-addr",
            addr,
        ]);
        assert_eq!(raw.status.code(), Some(0), "{name}: {}", stderr(&raw));
        let body = |t: &str| -> Vec<String> {
            t.lines()
                .filter(|l| !l.contains("file format"))
                .map(str::to_string)
                .collect()
        };
        assert_eq!(body(&stdout(&raw)), body(&text), "{name}");
        // The report counts rows and code bytes by kind, and they add up.
        let kinds = report
            .lines()
            .find(|l| l.trim_start().starts_with("rows by kind:"))
            .unwrap_or_else(|| panic!("{name}: {report}"));
        let rows: u64 = kinds
            .split(" signal ")
            .next()
            .unwrap()
            .split(" (")
            .filter_map(|part| part.rsplit(' ').next()?.parse::<u64>().ok())
            .sum();
        let derived = derive_from_elf(&std::fs::read(path).unwrap()).unwrap();
        assert_eq!(rows, derived.stats.rows, "{name}: {kinds}");
    }
}
