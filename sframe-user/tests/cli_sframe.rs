//! `sframe-user dump` and `lookup` run as the built binary on malformed and hand-built
//! `.sframe` sections: a gcc `-Wa,--gsframe` build with a byte of its section corrupted
//! (exit 2, one line naming the file, the check and the offset), and small ELF files
//! around the hand-built sections of `sframe_support::build` for the literal `lookup`
//! lines of rules the gcc builds never have (CFA from the frame pointer next to FLEX
//! rows, a dereferenced register CFA, RA undefined, a mangled RA with either key, signal
//! frames).

mod sframe_support;

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use sframe_support::build::{
    self, ABI_AMD64, Fre, Func, INFO_SIGNAL, Spec, build, ctl_reg, elf_with_sframe,
};
use sframe_support::have_tool;
use sframe_user::sframe::{Section, dump_to_string};

const BIN: &str = env!("CARGO_BIN_EXE_sframe-user");
const EM_X86_64: u16 = 62;
const EM_AARCH64: u16 = 183;

fn run(args: &[&str], stdin: Option<&str>) -> Output {
    use std::io::Write as _;
    let mut child = Command::new(BIN)
        .args(args)
        .stdin(if stdin.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run sframe-user");
    if let Some(text) = stdin {
        let mut pipe = child.stdin.take().expect("stdin");
        // A command that fails on its file exits without reading stdin: the pipe
        // may close before (or while) the text is written.
        match pipe.write_all(text.as_bytes()) {
            Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => {}
            r => r.expect("write stdin"),
        }
    }
    child.wait_with_output().expect("wait")
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

fn dir(tag: &str) -> PathBuf {
    let d = PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("cli-sframe-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// A gcc `-Wa,--gsframe` executable (SFrame v1 with this machine's binutils).
fn gcc_binary(d: &Path) -> Option<PathBuf> {
    if !have_tool("gcc") {
        return None;
    }
    std::fs::write(
        d.join("m.c"),
        "#include <stdio.h>\nint f(int x) { return printf(\"%d\\n\", x) * 2; }\n\
         int main(int c, char **v) { return f(c) + (v[0][0] == 0); }\n",
    )
    .unwrap();
    let out = Command::new("gcc")
        .current_dir(d)
        .args(["-O2", "-Wa,--gsframe", "m.c", "-o", "m"])
        .output()
        .expect("run gcc");
    assert!(
        out.status.success(),
        "gcc: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    Some(d.join("m"))
}

/// The file range and address of the `.sframe` section of an ELF file.
fn sframe_range(elf: &[u8]) -> (usize, usize, u64) {
    use object::{Object, ObjectSection};
    let f = object::File::parse(elf).unwrap();
    let s = f.section_by_name(".sframe").expect(".sframe");
    let (off, len) = s.file_range().expect("in the file");
    (off as usize, len as usize, s.address())
}

/// `dump`, `lookup` and `check` of `file` fail with exit status 2 and the one line
/// `sframe-user: FILE: MESSAGE`, where MESSAGE is `want`'s, which names `check` and
/// `offset`.
fn fails_with(file: &Path, want: &sframe_user::sframe::SFrameError, check: &str, offset: usize) {
    let msg = want.to_string();
    assert!(msg.starts_with(check), "{msg}");
    assert!(msg.contains(&format!("offset {offset}")), "{msg}");
    let f = file.to_str().unwrap();
    for args in [
        vec!["dump", f],
        vec!["lookup", f, "0x1000"],
        vec!["lookup", f],
        vec!["check", f],
    ] {
        let o = run(&args, Some("0x1000\n"));
        assert_eq!(o.status.code(), Some(2), "{args:?}: {}", stderr(&o));
        assert_eq!(stderr(&o), format!("sframe-user: {f}: {msg}\n"), "{args:?}");
        assert!(o.stdout.is_empty(), "{args:?}: {}", stdout(&o));
    }
}

#[test]
fn corrupted_sframe_in_a_gcc_binary_is_one_line_and_exit_2() {
    let d = dir("corrupt");
    let Some(exe) = gcc_binary(&d) else { return };
    let data = std::fs::read(&exe).unwrap();
    let (off, len, addr) = sframe_range(&data);
    let section = Section::parse(&data[off..off + len], addr).expect("gcc's .sframe is valid");
    let o = run(&["dump", exe.to_str().unwrap()], None);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));

    let fde = section.fde(0).unwrap();
    let fre = section.rows(&fde).next().unwrap();
    let info = fre.offset + fde.addr_size();
    let corrupt = |name: &str, at: usize, f: &dyn Fn(u8) -> u8| {
        let mut m = data.clone();
        m[off + at] = f(m[off + at]);
        let path = d.join(name);
        std::fs::write(&path, &m).unwrap();
        let err = Section::parse(&m[off..off + len], addr).expect_err("corrupted");
        (path, err)
    };
    // The first FRE's data word size code becomes 3 (invalid).
    let (path, err) = corrupt("word-size", info, &|b| b | 0x60);
    assert_eq!(
        err,
        sframe_user::sframe::SFrameError::InvalidDataWordSize {
            fde: 0,
            fre: 0,
            offset: fre.offset,
            code: 3
        }
    );
    fails_with(&path, &err, "word size check", fre.offset);
    // The section claims version 9.
    let (path, err) = corrupt("version", 2, &|_| 9);
    fails_with(&path, &err, "version check", 2);
    // One FRE more than the FDEs describe (the low byte of sfh_num_fres, little-endian).
    let (path, err) = corrupt("fre-count", 12, &|b| b.wrapping_add(1));
    assert!(matches!(
        err,
        sframe_user::sframe::SFrameError::FreCountMismatch { offset: 12, .. }
    ));
    fails_with(&path, &err, "count check", 12);
    // The first FDE's FRE count is one too many: its next FRE runs into the next FDE's
    // (or past the end).
    let n = section.num_fdes();
    assert!(n > 1);
    let fde_off = fde.offset;
    let (path, err) = corrupt("fde-fres", fde_off + 12, &|b| b.wrapping_add(1));
    let msg = err.to_string();
    assert!(msg.contains("FDE "), "{msg}");
    let f = path.to_str().unwrap();
    let o = run(&["dump", f], None);
    assert_eq!(o.status.code(), Some(2));
    assert_eq!(stderr(&o), format!("sframe-user: {f}: {msg}\n"));
}

/// Writes `spec` as a small ELF file and returns its path.
fn elf(d: &Path, name: &str, spec: &Spec, machine: u16) -> PathBuf {
    let b = build(spec);
    let path = d.join(name);
    std::fs::write(
        &path,
        elf_with_sframe(&b.bytes, spec.vaddr, machine, spec.big_endian()),
    )
    .unwrap();
    path
}

fn lookup_lines(file: &Path, args: &[&str]) -> Vec<String> {
    let mut all = vec!["lookup", file.to_str().unwrap()];
    all.extend_from_slice(args);
    let o = run(&all, None);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert!(o.stderr.is_empty(), "{}", stderr(&o));
    stdout(&o).lines().map(str::to_string).collect()
}

/// AMD64 v3: a DEFAULT function with a frame-pointer-based row, a FLEX function whose
/// CFA is `*(r10 - 8)` then RA undefined, a signal trampoline.
fn amd64_rules_section() -> Spec {
    Spec::new(
        3,
        ABI_AMD64,
        0x4000,
        vec![
            Func::new(0x1000, 0x10, vec![Fre::sp(0, &[8]), Fre::fp(1, &[16, -16])]),
            Func::new(
                0x1010,
                0x10,
                vec![Fre::sp(0, &[ctl_reg(10, true), -8]), Fre::sp(8, &[])],
            )
            .flex(),
            Func::new(0x1020, 0x10, vec![Fre::sp(0, &[160])]).info(INFO_SIGNAL),
        ],
    )
}

#[test]
fn lookup_prints_the_documented_forms() {
    let d = dir("lookup");
    let amd64 = elf(&d, "amd64", &amd64_rules_section(), EM_X86_64);
    let want = [
        "0x1001 FOUND cfa_base=fp cfa_off=16 fp_off=-16 ra_off=-8",
        "0x1010 FOUND cfa_base=r10 cfa_off=-8 fp_off=none ra_off=-8 cfa_deref=1",
        "0x1018 FOUND cfa_base=none cfa_off=none fp_off=none ra_off=none ra=undefined",
        "0x101f FOUND cfa_base=none cfa_off=none fp_off=none ra_off=none ra=undefined",
        "0x1020 FOUND cfa_base=sp cfa_off=160 fp_off=none ra_off=-8 signal=1",
        "0x1030 NOTFOUND",
        "zz INVALID",
    ];
    assert_eq!(
        lookup_lines(
            &amd64,
            &["1001", "0x1010", "0X1018", "101f", "1020", "1030", "zz"]
        ),
        want
    );
    // The same from stdin, one address per line.
    let o = run(
        &["lookup", amd64.to_str().unwrap()],
        Some("1001\n0x1010\n0X1018\n\n101f\n1020\n1030\nzz\n"),
    );
    assert_eq!(o.status.code(), Some(0));
    assert_eq!(stdout(&o).lines().collect::<Vec<_>>(), want);
    // -v: the FDE index and function start after the fields.
    assert_eq!(
        lookup_lines(&amd64, &["-v", "0x1011", "0x1030"]),
        [
            "0x1011 FOUND cfa_base=r10 cfa_off=-8 fp_off=none ra_off=-8 cfa_deref=1 fde=1 func_start=0x1010",
            "0x1030 NOTFOUND",
        ]
    );

    // AArch64: signed return addresses, key B (little-endian) and key A (big-endian).
    let key_b = elf(&d, "aarch64-b", &build::aarch64_v3(false, true), EM_AARCH64);
    assert_eq!(
        lookup_lines(&key_b, &["0x1000", "0x1004", "0x1008", "0x1024", "0x1020"]),
        [
            "0x1000 FOUND cfa_base=sp cfa_off=16 fp_off=-16 ra_off=none mangled_ra=1 pauth_key=b",
            "0x1004 FOUND cfa_base=fp cfa_off=16 fp_off=-16 ra_off=-8 mangled_ra=1 pauth_key=b",
            "0x1008 FOUND cfa_base=sp cfa_off=0 fp_off=none ra_off=none ra=r30",
            "0x1024 FOUND cfa_base=sp cfa_off=16 fp_off=-16 ra_off=-8 mangled_ra=1 pauth_key=b",
            "0x1020 FOUND cfa_base=sp cfa_off=0 fp_off=none ra_off=none",
        ]
    );
    let key_a = elf(&d, "aarch64-a", &build::aarch64_v3(true, false), EM_AARCH64);
    assert_eq!(
        lookup_lines(&key_a, &["0x1024"]),
        ["0x1024 FOUND cfa_base=sp cfa_off=16 fp_off=-16 ra_off=-8 mangled_ra=1"]
    );

    // Every extra field used above is documented in --help.
    let help = stdout(&run(&["lookup", "--help"], None));
    for needle in [
        "cfa_base=sp|fp",
        "cfa_base=rN",
        "cfa_deref=1",
        "ra=undefined",
        "ra=rN",
        "signal=1",
        "mangled_ra=1",
        "pauth_key=b",
        "fde=I",
        "INVALID",
    ] {
        assert!(help.contains(needle), "--help lacks {needle}:\n{help}");
    }
}

/// `dump FILE` of the small ELF files: objdump's file-format line, then the dump.
#[test]
fn dump_of_hand_built_elf_files() {
    let d = dir("dump");
    for (name, spec, machine, format) in [
        ("amd64", amd64_rules_section(), EM_X86_64, "elf64-x86-64"),
        (
            "aarch64-be",
            build::aarch64_v3(true, true),
            EM_AARCH64,
            "elf64-bigaarch64",
        ),
    ] {
        let path = elf(&d, name, &spec, machine);
        let o = run(&["dump", path.to_str().unwrap()], None);
        assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
        let b = build(&spec);
        let section = Section::parse(&b.bytes, spec.vaddr).unwrap();
        assert_eq!(
            stdout(&o),
            format!(
                "\n{}:     file format {format}\n\n{}",
                path.display(),
                dump_to_string(&section)
            )
        );
        // The same section raw.
        let raw = d.join(format!("{name}.raw"));
        std::fs::write(&raw, &b.bytes).unwrap();
        let addr = format!("{:#x}", spec.vaddr);
        let o = run(
            &[
                "dump",
                "--raw",
                raw.to_str().unwrap(),
                "--section-addr",
                &addr,
            ],
            None,
        );
        assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
        assert!(stdout(&o).ends_with(&dump_to_string(&section)));
    }
}
