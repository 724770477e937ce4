//! Symbolization of live processes built here with gcc/g++: names of the functions whose
//! addresses the fixture prints, demangled C++ names, inlined frames, the offset fallback
//! for stripped and unmapped code, deleted-but-mapped executables, kernel symbols, and
//! the caches (a second pass over the same addresses does no new work).

mod support;

use std::{
    io::{BufRead, BufReader},
    path::{Path, PathBuf},
    process::{Command, Stdio},
    time::Instant,
};

use object::{Object, ObjectSegment, ObjectSymbol};
use sframe_user::{
    procfs::{Mapping, find, read_maps},
    symbolize::{Frame, KERNEL_OBJECT, Symbolizer, UNKNOWN_OBJECT, object_basename},
};
use support::{KillOnDrop, compile_c, fixture_dir};

/// Heap bytes counted per thread, as in the profiler's binary: what symbolizing holds.
#[global_allocator]
static HEAP: sframe_user::heap::Counting = sframe_user::heap::Counting;

/// Prints the addresses of its functions, then waits to be killed.
const FIXTURE_C: &str = r#"
#include <stdio.h>
#include <unistd.h>
__attribute__((noinline)) int alpha_leaf(int x) { return x * 3 + 1; }
__attribute__((noinline)) int beta_caller(int x) { return alpha_leaf(x) + 2; }
static inline __attribute__((always_inline)) int gamma_inlined(int x) {
    volatile int v = x;
    for (int i = 0; i < 3; i++) v = v * 7 + i;
    return v;
}
__attribute__((noinline)) int delta_outer(int x) { return gamma_inlined(x) + gamma_inlined(x + 1); }
int main(void) {
    printf("%p %p %p\n", (void *)alpha_leaf, (void *)beta_caller, (void *)delta_outer);
    fflush(stdout);
    volatile int sink = beta_caller(1) + delta_outer(2);
    (void)sink;
    for (;;) pause();
}
"#;

const FIXTURE_CXX: &str = r#"
#include <cstdio>
#include <unistd.h>
namespace ns {
__attribute__((noinline)) int func(int x) { return x * 5 + 3; }
template <typename T> struct Box { __attribute__((noinline)) static T twice(T v) { return v + v; } };
}
int main() {
    std::printf("%p %p\n", (void *)&ns::func, (void *)&ns::Box<long>::twice);
    std::fflush(stdout);
    volatile long sink = ns::func(1) + ns::Box<long>::twice(2);
    (void)sink;
    for (;;) pause();
}
"#;

/// A running fixture with its mappings and the addresses it printed.
struct Running {
    child: KillOnDrop,
    maps: Vec<Mapping>,
    addrs: Vec<u64>,
}

impl Running {
    fn pid(&self) -> u32 {
        self.child.pid()
    }
}

fn spawn(exe: &Path) -> Running {
    spawn_command(&mut Command::new(exe))
}

fn spawn_command(command: &mut Command) -> Running {
    let mut child = KillOnDrop::spawn(command.stdout(Stdio::piped()));
    let stdout = child.0.stdout.take().expect("piped stdout");
    let mut line = String::new();
    BufReader::new(stdout)
        .read_line(&mut line)
        .expect("read fixture's addresses");
    let addrs = line
        .split_whitespace()
        .map(|a| u64::from_str_radix(a.trim_start_matches("0x"), 16).expect("hex address"))
        .collect::<Vec<_>>();
    assert!(!addrs.is_empty(), "fixture printed {line:?}");
    let maps = read_maps(child.pid()).expect("read fixture's maps");
    Running { child, maps, addrs }
}

fn compile_cxx(name: &str, source: &str, flags: &[&str]) -> PathBuf {
    let dir = fixture_dir(name);
    let src = dir.join(format!("{name}.cc"));
    let out = dir.join(name);
    std::fs::write(&src, source).expect("write C++ source");
    let status = Command::new("g++")
        .args(flags)
        .arg("-o")
        .arg(&out)
        .arg(&src)
        .status()
        .expect("run g++");
    assert!(status.success(), "g++ {flags:?} {name}.cc failed");
    out
}

/// (file offset, size) of symbol `name` in the ELF file at `path`, from its symbol table
/// and program headers: an oracle independent of blazesym.
fn symbol_file_offset(path: &Path, name: &str) -> (u64, u64) {
    let data = std::fs::read(path).unwrap();
    let file = object::File::parse(&*data).unwrap();
    let sym = file
        .symbols()
        .find(|s| s.name() == Ok(name))
        .unwrap_or_else(|| panic!("{name} not in {}", path.display()));
    let addr = sym.address();
    let seg = file
        .segments()
        .find(|s| s.address() <= addr && addr < s.address() + s.size())
        .expect("symbol in a segment");
    (addr - seg.address() + seg.file_range().0, sym.size())
}

/// An attacker's executable running: as root (CI), the file is made nobody's and runs
/// as nobody (checked in `/proc/PID/status`), the threat model's unprivileged user.
fn spawn_attackers(path: &Path) -> Running {
    if !is_root() {
        return spawn(path);
    }
    std::os::unix::fs::chown(path, Some(65534), Some(65534)).unwrap();
    let p = spawn_command(&mut support::hostile::as_nobody(path));
    let status = std::fs::read_to_string(format!("/proc/{}/status", p.pid())).unwrap();
    assert!(
        status.lines().any(|l| l.starts_with("Uid:\t65534")),
        "not run as nobody: {status}"
    );
    p
}

fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

fn names(frames: &[Frame]) -> Vec<Option<&str>> {
    frames.iter().map(|f| f.name.as_deref()).collect()
}

#[test]
fn c_functions_symbolize_to_exact_names_and_file_offsets() {
    let exe = compile_c("symfix", FIXTURE_C, &["-O2", "-g"]);
    let p = spawn(&exe);
    let [alpha, beta, delta] = p.addrs[..] else {
        panic!("{:?}", p.addrs)
    };
    let mut s = Symbolizer::new();
    // Unmapped address in the middle of the batch: an unknown frame, the rest is fine.
    let frames = s.symbolize_user(p.pid(), &p.maps, &[alpha, 0x10, beta + 1, delta]);
    assert_eq!(
        names(&frames),
        [
            Some("alpha_leaf"),
            None,
            Some("beta_caller"),
            Some("delta_outer")
        ]
    );
    assert_eq!(frames[1].object, UNKNOWN_OBJECT);
    assert!(frames[1].reason.as_deref().unwrap().contains("no mapping"));
    for (frame, name, extra) in [
        (&frames[0], "alpha_leaf", 0),
        (&frames[2], "beta_caller", 1),
    ] {
        assert_eq!(frame.object, "symfix");
        assert_eq!(frame.reason, None);
        assert_eq!(frame.file_offset, symbol_file_offset(&exe, name).0 + extra);
        assert_eq!(frame.folded_name(), name);
        let loc = frame.location.as_ref().expect("DWARF line info");
        assert!(loc.file.ends_with("symfix.c"), "{loc:?}");
        assert!(loc.line.is_some());
    }
    assert!(
        frames[0]
            .build_id
            .as_deref()
            .is_some_and(|id| id.len() >= 16),
        "gcc links with --build-id: {:?}",
        frames[0].build_id
    );
}

#[test]
fn inlined_functions_are_their_own_frames() {
    let exe = compile_c("syminl", FIXTURE_C, &["-O2", "-g"]);
    let p = spawn(&exe);
    let delta = p.addrs[2];
    let (_, size) = symbol_file_offset(&exe, "delta_outer");
    assert!(size > 0);
    let addrs: Vec<u64> = (delta..delta + size).collect();
    let mut s = Symbolizer::new();
    let frames = s.symbolize_user(p.pid(), &p.maps, &addrs);
    assert!(
        frames
            .iter()
            .all(|f| f.name.as_deref() == Some("delta_outer"))
    );
    let inlined = frames
        .iter()
        .find(|f| !f.inlined.is_empty())
        .expect("some address of delta_outer is in inlined gamma_inlined");
    assert_eq!(inlined.folded_names(), ["delta_outer", "gamma_inlined"]);
    assert!(inlined.inlined[0].location.is_some());
}

#[test]
fn cxx_names_are_demangled() {
    for flags in [&["-O2"][..], &["-O2", "-g"]] {
        let exe = compile_cxx("symcxx", FIXTURE_CXX, flags);
        let p = spawn(&exe);
        let mut s = Symbolizer::new();
        let frames = s.symbolize_user(p.pid(), &p.maps, &p.addrs);
        let [func, twice] = &names(&frames)[..] else {
            panic!("{frames:?}")
        };
        let (func, twice) = (func.unwrap_or_default(), twice.unwrap_or_default());
        assert!(func.contains("ns::func"), "{flags:?}: {func:?}");
        assert!(!func.starts_with("_Z"), "{flags:?}: {func:?}");
        assert!(
            twice.contains("ns::Box<long>::twice"),
            "{flags:?}: {twice:?}"
        );
    }
}

#[test]
fn stripped_binary_falls_back_to_object_and_file_offset() {
    let exe = compile_c("symstrip", FIXTURE_C, &["-O2"]);
    let stripped = exe.with_file_name("symstrip-stripped");
    std::fs::copy(&exe, &stripped).unwrap();
    let status = Command::new("strip").arg(&stripped).status().unwrap();
    assert!(status.success());
    let p = spawn(&stripped);
    let mut s = Symbolizer::new();
    let frames = s.symbolize_user(p.pid(), &p.maps, &p.addrs);
    for (frame, name) in frames
        .iter()
        .zip(["alpha_leaf", "beta_caller", "delta_outer"])
    {
        // The unstripped twin has the same layout: its symbol table is the oracle.
        let (offset, _) = symbol_file_offset(&exe, name);
        assert_eq!(frame.name, None, "{frame:?}");
        assert!(frame.reason.is_some());
        assert_eq!(frame.file_offset, offset);
        assert_eq!(
            frame.folded_name(),
            format!("[symstrip-stripped+{offset:#x}]")
        );
    }
}

#[test]
fn deleted_but_mapped_executable_symbolizes_through_map_files() {
    if !is_root() {
        assert!(
            !sframe_user::privileges::in_ci(),
            "CI runs as root: /proc/PID/map_files must be readable"
        );
        println!("SKIPPED: /proc/PID/map_files needs CAP_SYS_ADMIN; not root");
        return;
    }
    let exe = compile_c("symdel", FIXTURE_C, &["-O2", "-g"]);
    let p = spawn(&exe);
    std::fs::remove_file(&exe).unwrap();
    // A new file at the same path must not be used instead.
    std::fs::write(&exe, b"not an ELF file").unwrap();
    let maps = read_maps(p.pid()).unwrap();
    let m = find(&maps, p.addrs[0]).unwrap();
    assert!(m.path.ends_with(" (deleted)"), "{}", m.path);
    let mut s = Symbolizer::new();
    let frames = s.symbolize_user(p.pid(), &maps, &p.addrs);
    assert_eq!(
        names(&frames),
        [Some("alpha_leaf"), Some("beta_caller"), Some("delta_outer")]
    );
    assert_eq!(frames[0].object, "symdel");
    assert_eq!(object_basename(&m.path), "symdel");
}

#[test]
fn kernel_address_symbolizes_from_kallsyms() {
    let text = std::fs::read_to_string("/proc/kallsyms").unwrap();
    // (address, name) of text symbols; pick one whose address no alias shares.
    let mut syms: Vec<(u64, &str)> = text
        .lines()
        .filter_map(|l| {
            let mut f = l.split_whitespace();
            let addr = u64::from_str_radix(f.next()?, 16).ok()?;
            let kind = f.next()?;
            let name = f.next()?;
            (kind == "T" || kind == "t").then_some((addr, name))
        })
        .collect();
    let mut s = Symbolizer::new();
    if syms.iter().all(|&(a, _)| a == 0) {
        assert!(
            !sframe_user::privileges::in_ci(),
            "CI runs as root: /proc/kallsyms must show addresses"
        );
        println!("SKIPPED: /proc/kallsyms shows no addresses (not root / kptr_restrict)");
        let frames = s.symbolize_kernel(&[0xffff_ffff_8100_0000]);
        assert_eq!(frames[0].name, None);
        assert!(frames[0].reason.is_some());
        return;
    }
    syms.sort_unstable();
    let unique = |i: usize| {
        (i == 0 || syms[i - 1].0 != syms[i].0)
            && syms.get(i + 1).is_none_or(|n| n.0 > syms[i].0 + 1)
    };
    let i = syms
        .iter()
        .position(|&(_, n)| n == "do_sys_open")
        .filter(|&i| unique(i))
        .or_else(|| (0..syms.len()).find(|&i| syms[i].0 != 0 && unique(i)))
        .expect("a kernel text symbol with a unique address");
    let (addr, name) = syms[i];
    let frames = s.symbolize_kernel(&[addr, addr + 1, 0]);
    assert_eq!(frames[0].name.as_deref(), Some(name), "{:?}", frames[0]);
    assert_eq!(frames[1].name.as_deref(), Some(name), "{:?}", frames[1]);
    assert_eq!(frames[0].object, KERNEL_OBJECT);
    assert_eq!(frames[2].name, None, "{:?}", frames[2]);
}

#[test]
fn vdso_addresses_symbolize() {
    let exe = compile_c("symvdso", FIXTURE_C, &["-O2"]);
    let p = spawn(&exe);
    let Some(vdso) = p.maps.iter().find(|m| m.path == "[vdso]") else {
        assert!(
            !sframe_user::privileges::in_ci(),
            "every process has a [vdso] mapping on the CI machine kind"
        );
        println!("SKIPPED: no [vdso] mapping");
        return;
    };
    let addrs: Vec<u64> = (vdso.start..vdso.end).step_by(4).collect();
    let mut s = Symbolizer::new();
    let frames = s.symbolize_user(p.pid(), &p.maps, &addrs);
    assert_eq!(frames.len(), addrs.len());
    assert!(
        frames
            .iter()
            .filter_map(|f| f.name.as_deref())
            .any(|n| n.contains("clock_gettime")),
        "no clock_gettime in the vDSO"
    );
    assert!(frames.iter().all(|f| f.object == "[vdso]"));
}

#[test]
fn second_pass_and_second_process_hit_the_caches() {
    let exe = compile_c("symcache", FIXTURE_C, &["-O2", "-g"]);
    let p = spawn(&exe);
    // 10k addresses over the fixture's code and libc's (two objects).
    let exec: Vec<&Mapping> = p
        .maps
        .iter()
        .filter(|m| m.executable && m.is_file())
        .filter(|m| m.path.ends_with("/symcache") || m.path.contains("libc"))
        .collect();
    assert_eq!(exec.len(), 2, "{exec:?}");
    let addrs: Vec<u64> = (0..10_000u64)
        .map(|i| {
            let m = exec[(i % 2) as usize];
            m.start + (i * 61) % (m.end - m.start)
        })
        .collect();
    let distinct = addrs.iter().collect::<std::collections::HashSet<_>>().len() as u64;

    let mut s = Symbolizer::new();
    let t = Instant::now();
    let first = s.symbolize_user(p.pid(), &p.maps, &addrs);
    let first_time = t.elapsed();
    let after_first = s.stats();
    assert_eq!(after_first.objects_opened, 2);
    assert_eq!(after_first.frames_symbolized, distinct);
    assert!(first.iter().any(|f| f.name.is_some()));

    let t = Instant::now();
    let second = s.symbolize_user(p.pid(), &p.maps, &addrs);
    let second_time = t.elapsed();
    let after_second = s.stats();
    assert_eq!(first, second);
    assert_eq!(after_second.objects_opened, 2, "no file reopened");
    assert_eq!(
        after_second.frames_symbolized, distinct,
        "nothing re-symbolized"
    );
    assert_eq!(
        after_second.frame_cache_hits - after_first.frame_cache_hits,
        addrs.len() as u64
    );
    println!("10k addresses: first pass {first_time:?}, second pass {second_time:?}");

    // Another process of the same executable: same objects, same cache entries.
    let q = spawn(&exe);
    let frames = s.symbolize_user(q.pid(), &q.maps, &q.addrs);
    assert_eq!(
        names(&frames),
        [Some("alpha_leaf"), Some("beta_caller"), Some("delta_outer")]
    );
    assert_eq!(
        s.stats().objects_opened,
        2,
        "objects shared across processes"
    );
}

const FIXTURE_RS: &str = r#"
mod inner {
    #[inline(never)]
    pub fn rust_func(x: u64) -> u64 {
        std::hint::black_box(x) * 3
    }
}
fn main() {
    let f: fn(u64) -> u64 = inner::rust_func;
    println!("{:p}", f as *const ());
    std::hint::black_box(inner::rust_func(std::hint::black_box(2)));
    loop {
        std::thread::sleep(std::time::Duration::from_secs(3600));
    }
}
"#;

#[test]
fn rust_names_are_demangled_without_hash() {
    let rustc = std::env::var_os("RUSTC").unwrap_or_else(|| "rustc".into());
    for flags in [&["-O"][..], &["-O", "-g", "-Csymbol-mangling-version=v0"]] {
        let dir = fixture_dir("symrs");
        let src = dir.join("symrs.rs");
        std::fs::write(&src, FIXTURE_RS).unwrap();
        let exe = dir.join("symrs");
        let status = Command::new(&rustc)
            .args(flags)
            .arg("-o")
            .arg(&exe)
            .arg(&src)
            .status()
            .expect("run rustc");
        assert!(status.success(), "rustc {flags:?} failed");
        let p = spawn(&exe);
        let mut s = Symbolizer::new();
        let frames = s.symbolize_user(p.pid(), &p.maps, &p.addrs);
        assert_eq!(
            frames[0].name.as_deref(),
            Some("symrs::inner::rust_func"),
            "{flags:?}: {:?}",
            frames[0]
        );
    }
}

/// A PLT stub is `NAME@plt` (PLT0, which has no target of its own, is `[plt]`), not the
/// preceding symbol (`_init`).
#[test]
fn plt_stubs_are_named_after_their_target() {
    use object::ObjectSection as _;
    let exe = compile_c(
        "symplt",
        "#include <unistd.h>\nint main(void) { volatile long s = 0; for (;;) s += getppid(); }\n",
        &["-O2"],
    );
    let data = std::fs::read(&exe).unwrap();
    let file = object::File::parse(&*data).unwrap();
    let plt = file.section_by_name(".plt").expect(".plt");
    let (plt_off, plt_size) = plt.file_range().expect(".plt file range");
    let child = KillOnDrop::spawn(&mut std::process::Command::new(&exe));
    std::thread::sleep(std::time::Duration::from_millis(100));
    let maps = sframe_user::procfs::read_maps(child.pid()).unwrap();
    let exe_path = std::fs::canonicalize(&exe).unwrap();
    let first = maps
        .iter()
        .find(|m| std::path::Path::new(&m.path) == exe_path && m.offset == 0)
        .expect("first mapping of the executable");
    let base = first.start;
    let mut sym = sframe_user::symbolize::Symbolizer::new();
    let frames = sym.symbolize_user(
        child.pid(),
        &maps,
        &[base + plt_off + 4, base + plt_off + plt_size - 1],
    );
    assert_eq!(
        names(&frames),
        [Some(sframe_user::symbolize::PLT_NAME), Some("getppid@plt")]
    );
    assert_eq!(frames[1].file_offset, plt_off + plt_size - 1);
    assert_eq!(frames[1].reason, None);
}

/// Opening an object to name its frames reads its headers, not its sections: the check
/// of compressed sections once asked every section for its data, which read each one
/// into the heap (150 MB for rustc's driver library, on every new generation of the
/// symbolizer: 251 MB peak RSS on the busy bench).
#[test]
fn opening_a_large_object_reads_none_of_its_sections() {
    let src = format!("{FIXTURE_C}\nconst char big_rodata[96 << 20] = {{1}};\n");
    let exe = compile_c("symbig", &src, &["-O2"]);
    assert!(std::fs::metadata(&exe).unwrap().len() > 96 << 20);
    let p = spawn(&exe);
    let mut s = Symbolizer::new();
    sframe_user::heap::thread_peak_reset();
    let before = sframe_user::heap::thread_net();
    let frames = s.symbolize_user(p.pid(), &p.maps, &p.addrs);
    let peak = sframe_user::heap::thread_peak_reset() - before;
    assert_eq!(
        names(&frames),
        [Some("alpha_leaf"), Some("beta_caller"), Some("delta_outer")]
    );
    assert!(
        peak < 16 << 20,
        "naming 3 frames of a 96 MiB object held {peak} bytes of heap at once"
    );
}

/// `.gnu_debuglink` contents: the name, NUL-padded to 4 bytes, and a CRC-32.
fn debuglink_section(name: &str) -> Vec<u8> {
    let mut b = name.as_bytes().to_vec();
    b.push(0);
    while !b.len().is_multiple_of(4) {
        b.push(0);
    }
    b.extend_from_slice(&0x1234_5678u32.to_le_bytes());
    b
}

/// A user's object whose separate debug file is named (`.gnu_debuglink`, or
/// `.gnu_debugaltlink` with a build-id) as a FIFO with no writer: next to the object,
/// by absolute path, or up and back down with `..`. blazesym looked for debug files by
/// those names, in the object's own directory and at absolute paths, and opening the
/// FIFO waited for a writer for ever: the naming thread of the root profiler stopped at
/// a user's will, and it opened files of the user's choice. Only root's debug
/// directories are searched now, by build-id or a plain file name, and a debug file is
/// opened only if it is a regular file; the objects are named from their symbol
/// tables.
#[test]
fn debug_links_to_a_users_fifo_do_not_stop_the_symbolizer() {
    let root = is_root();
    let dir = if root {
        support::hostile::nobody_dir("symlink-nobody")
    } else {
        fixture_dir("symlink-user")
    };
    let exe = compile_c("symlinked", FIXTURE_C, &["-O2"]);
    let fifo = dir.join("fifo");
    let _ = std::fs::remove_file(&fifo);
    let c = std::ffi::CString::new(fifo.as_os_str().as_encoded_bytes()).unwrap();
    // SAFETY: a NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o666) }, 0, "mkfifo");
    let dir_name = dir.file_name().unwrap().to_str().unwrap().to_owned();
    let mut altlink = fifo.as_os_str().as_encoded_bytes().to_vec();
    altlink.push(0);
    altlink.extend_from_slice(&[0xab; 20]);
    let cases: [(&str, &str, Vec<u8>); 4] = [
        ("beside", ".gnu_debuglink", debuglink_section("fifo")),
        (
            "absolute",
            ".gnu_debuglink",
            debuglink_section(fifo.to_str().unwrap()),
        ),
        (
            "dotdot",
            ".gnu_debuglink",
            debuglink_section(&format!("../{dir_name}/fifo")),
        ),
        ("altlink", ".gnu_debugaltlink", altlink),
    ];
    let mut waited = Vec::new();
    for (name, section, contents) in cases {
        let data = dir.join(format!("{name}.bin"));
        std::fs::write(&data, &contents).unwrap();
        let path = dir.join(format!("symlinked-{name}"));
        let status = Command::new("objcopy")
            .arg(format!("--add-section={section}={}", data.display()))
            .arg(&exe)
            .arg(&path)
            .status()
            .unwrap();
        assert!(status.success(), "objcopy {name}");
        let p = spawn_attackers(&path);
        // On another thread, so that a symbolizer waiting on the FIFO fails the test
        // instead of hanging it; the FIFO is then opened for writing to let it go.
        let (tx, rx) = std::sync::mpsc::channel();
        let (pid, maps, addrs) = (p.pid(), p.maps.clone(), p.addrs.clone());
        std::thread::spawn(move || {
            let mut s = Symbolizer::new();
            let frames = s.symbolize_user(pid, &maps, &addrs);
            let _ = tx.send(frames);
        });
        let frames = match rx.recv_timeout(std::time::Duration::from_secs(120)) {
            Ok(frames) => frames,
            Err(_) => {
                waited.push(name);
                let _writer = std::fs::OpenOptions::new()
                    .read(true)
                    .write(true)
                    .open(&fifo);
                continue;
            }
        };
        assert_eq!(
            names(&frames),
            [Some("alpha_leaf"), Some("beta_caller"), Some("delta_outer")],
            "{name}: {frames:?}"
        );
    }
    assert!(
        waited.is_empty(),
        "the symbolizer waited on the user's FIFO for {waited:?}"
    );
}

/// The file offsets of the `Elf64_Chdr` of every `SHF_COMPRESSED` section of `data`,
/// with the section's name offset in the section-name table.
fn compression_headers(data: &[u8]) -> Vec<usize> {
    const SHF_COMPRESSED: u64 = 0x800;
    let shoff = u64::from_le_bytes(data[0x28..0x30].try_into().unwrap()) as usize;
    let shentsize = u16::from_le_bytes(data[0x3a..0x3c].try_into().unwrap()) as usize;
    let shnum = u16::from_le_bytes(data[0x3c..0x3e].try_into().unwrap()) as usize;
    (0..shnum)
        .filter_map(|i| {
            let h = &data[shoff + i * shentsize..][..shentsize];
            let flags = u64::from_le_bytes(h[8..16].try_into().unwrap());
            let offset = u64::from_le_bytes(h[24..32].try_into().unwrap()) as usize;
            (flags & SHF_COMPRESSED != 0).then_some(offset)
        })
        .collect()
}

/// A user's object whose compressed debug sections claim (`Elf64_Chdr.ch_size`) what
/// they do not hold, as an unprivileged user can map one: blazesym allocated the claim
/// (a terabyte aborted the profiler) and reads on past it. Such objects are named from
/// their symbol tables, without their debug information; an honest claim over the
/// bound is treated the same; an honest object keeps its inlined frames.
#[test]
fn compressed_sections_that_lie_about_their_size_cost_no_memory() {
    let exe = compile_c("symbomb", FIXTURE_C, &["-O2", "-g"]);
    let honest = exe.with_file_name("symbomb-compressed");
    let status = Command::new("objcopy")
        .arg("--compress-debug-sections=zlib")
        .arg(&exe)
        .arg(&honest)
        .status()
        .unwrap();
    assert!(status.success());
    let data = std::fs::read(&honest).unwrap();
    let headers = compression_headers(&data);
    assert!(!headers.is_empty(), "objcopy compressed nothing");
    // As root (CI), the attacker's files are nobody's and run as nobody.
    let root = is_root();
    let dir = if root {
        support::hostile::nobody_dir("symbomb-nobody")
    } else {
        exe.parent().unwrap().to_path_buf()
    };
    for (name, claim) in [
        ("symbomb-terabyte", 1u64 << 40),
        ("symbomb-short", 16),
        ("symbomb-huge", (64 << 20) + 1),
    ] {
        let mut lying = data.clone();
        for &h in &headers {
            lying[h + 8..h + 16].copy_from_slice(&claim.to_le_bytes());
        }
        let path = dir.join(name);
        std::fs::write(&path, &lying).unwrap();
        std::fs::set_permissions(&path, std::os::unix::fs::PermissionsExt::from_mode(0o755))
            .unwrap();
        let p = spawn_attackers(&path);
        let mut s = Symbolizer::new();
        let frames = s.symbolize_user(p.pid(), &p.maps, &p.addrs);
        // Named from the symbol table; no inlined frames (those are DWARF's).
        assert_eq!(
            names(&frames),
            [Some("alpha_leaf"), Some("beta_caller"), Some("delta_outer")],
            "{name}: {frames:?}"
        );
        assert!(
            frames
                .iter()
                .all(|f| f.inlined.is_empty() && f.location.is_none()),
            "{name}: {frames:?}"
        );
        // The file may change after that check: blazesym itself (patched,
        // third_party/blazesym/PATCHED.md) refuses such a section when asked for its
        // debug information, rather than allocating the claim (the release aborted).
        let offsets: Vec<u64> = frames.iter().map(|f| f.file_offset).collect();
        let src =
            blazesym::symbolize::source::Source::Elf(blazesym::symbolize::source::Elf::new(&path));
        let blaze = blazesym::symbolize::Symbolizer::new();
        let direct = blaze.symbolize(&src, blazesym::symbolize::Input::FileOffset(&offsets));
        let message = format!("{direct:?}");
        assert!(
            direct.is_err() && message.contains("section claims"),
            "{name}: {message}"
        );
    }
    // Honest sections that together decompress past the bound (two of 40 MiB): not
    // decompressed past it, even to be checked; named from the symbol table.
    let zeros = dir.join("zeros");
    std::fs::write(&zeros, vec![0u8; 40 << 20]).unwrap();
    let many = dir.join("symbomb-together");
    let plain = dir.join("symbomb-together-plain");
    let status = Command::new("objcopy")
        .arg(format!("--add-section=.debug_junk1={}", zeros.display()))
        .arg(format!("--add-section=.debug_junk2={}", zeros.display()))
        .arg(&exe)
        .arg(&plain)
        .status()
        .unwrap();
    assert!(status.success());
    let status = Command::new("objcopy")
        .arg("--compress-debug-sections=zlib")
        .arg(&plain)
        .arg(&many)
        .status()
        .unwrap();
    assert!(status.success());
    let _ = std::fs::remove_file(&plain);
    let _ = std::fs::remove_file(&zeros);
    assert!(
        std::fs::metadata(&many).unwrap().len() < 8 << 20,
        "not compressed"
    );
    let p = spawn_attackers(&many);
    let mut s = Symbolizer::new();
    let frames = s.symbolize_user(p.pid(), &p.maps, &p.addrs);
    assert_eq!(
        names(&frames),
        [Some("alpha_leaf"), Some("beta_caller"), Some("delta_outer")]
    );
    assert!(
        frames
            .iter()
            .all(|f| f.inlined.is_empty() && f.location.is_none()),
        "together: {frames:?}"
    );
    // The honest one, with its debug information.
    let p = spawn(&honest);
    let mut s = Symbolizer::new();
    let frames = s.symbolize_user(p.pid(), &p.maps, &p.addrs);
    assert_eq!(
        names(&frames),
        [Some("alpha_leaf"), Some("beta_caller"), Some("delta_outer")]
    );
    assert!(
        frames.iter().any(|f| f.location.is_some()),
        "no line information from the compressed DWARF: {frames:?}"
    );
}

/// Root's separate debug files are still found by build-id (libc's, from `libc6-dbg`,
/// under `/usr/lib/debug/.build-id`): a stripped libc frame gets its source line.
#[test]
fn system_debug_files_are_still_found_by_build_id() {
    let exe = compile_c("symlibc", FIXTURE_C, &["-O2"]);
    let p = spawn(&exe);
    let libc = p
        .maps
        .iter()
        .find(|m| m.path.contains("libc.so") && m.offset == 0)
        .expect("libc mapped");
    let data = std::fs::read(&libc.path).unwrap();
    let file = object::File::parse(&*data).unwrap();
    let sym = file
        .dynamic_symbols()
        .find(|s| s.name() == Ok("getppid"))
        .expect("getppid");
    let seg = file
        .segments()
        .find(|s| s.address() <= sym.address() && sym.address() < s.address() + s.size())
        .unwrap();
    let off = sym.address() - seg.address() + seg.file_range().0;
    let m = p
        .maps
        .iter()
        .find(|m| m.path == libc.path && m.offset <= off && off < m.offset + (m.end - m.start))
        .unwrap();
    let addr = m.start + off - m.offset;
    let mut s = Symbolizer::new();
    let frames = s.symbolize_user(p.pid(), &p.maps, &[addr]);
    assert!(
        frames[0]
            .name
            .as_deref()
            .is_some_and(|n| n.contains("getppid")),
        "{frames:?}"
    );
    let id: String = file
        .build_id()
        .unwrap()
        .expect("libc has a build-id")
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    let debug = format!("/usr/lib/debug/.build-id/{}/{}.debug", &id[..2], &id[2..]);
    if std::path::Path::new(&debug).is_file() {
        assert!(frames[0].location.is_some(), "{debug}: {frames:?}");
    } else {
        eprintln!("no {debug} (libc6-dbg not installed): source lines not checked");
    }
}
