//! Test support: C fixtures compiled at test time, child processes that are always
//! killed, and the BPF privilege gate.
#![allow(dead_code, reason = "each test binary uses a different subset")]

pub mod hostile;
pub mod profiling;
pub mod prometheus;

use std::{
    path::{Path, PathBuf},
    process::{Child, Command},
    sync::atomic::{AtomicUsize, Ordering},
};

/// A fresh directory under the target dir for this test binary's fixtures.
pub fn fixture_dir(name: &str) -> PathBuf {
    static COUNTER: AtomicUsize = AtomicUsize::new(0);
    let base = Path::new(env!("CARGO_TARGET_TMPDIR")).join("fixtures");
    let dir = base.join(format!(
        "{name}-{}-{}",
        std::process::id(),
        COUNTER.fetch_add(1, Ordering::Relaxed)
    ));
    std::fs::create_dir_all(&dir).expect("create fixture dir");
    dir
}

/// Compiles C `source` into an executable with gcc and the given flags.
pub fn compile_c(name: &str, source: &str, flags: &[&str]) -> PathBuf {
    let dir = fixture_dir(name);
    let src = dir.join(format!("{name}.c"));
    let out = dir.join(name);
    std::fs::write(&src, source).expect("write C source");
    let status = Command::new("gcc")
        .args(flags)
        .arg("-o")
        .arg(&out)
        .arg(&src)
        .status()
        .expect("run gcc");
    assert!(status.success(), "gcc {flags:?} {name}.c failed");
    out
}

/// `main → f0 → f1 → f2 → leaf`, spinning in `leaf`; -O2 without frame pointers, with
/// line tables.
pub fn chain_fixture() -> PathBuf {
    let src = "volatile unsigned long sink;\n\
        __attribute__((noinline)) void leaf(void) { for (;;) sink++; }\n\
        __attribute__((noinline)) void f2(void) { leaf(); sink += 2; }\n\
        __attribute__((noinline)) void f1(void) { f2(); sink += 1; }\n\
        __attribute__((noinline)) void f0(void) { f1(); sink += 3; }\n\
        int main(void) { f0(); return (int)sink; }\n";
    compile_c("chain", src, &["-O2", "-fomit-frame-pointer", "-g"])
}

pub const CHAIN: &str = "main;f0;f1;f2;leaf";

pub fn spawn_chain() -> KillOnDrop {
    let chain = KillOnDrop::spawn(&mut Command::new(chain_fixture()));
    // Let it reach `leaf`.
    std::thread::sleep(std::time::Duration::from_millis(200));
    chain
}

/// A child process killed (and reaped) on drop.
pub struct KillOnDrop(pub Child);

impl KillOnDrop {
    pub fn spawn(cmd: &mut Command) -> Self {
        Self(cmd.spawn().expect("spawn child"))
    }
    pub fn pid(&self) -> u32 {
        self.0.id()
    }
}

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The cgroup v2 hierarchy's root, or `None` (after saying so) outside CI.
pub fn cgroup2_root() -> Option<PathBuf> {
    let root = ["/sys/fs/cgroup/unified", "/sys/fs/cgroup"]
        .into_iter()
        .map(PathBuf::from)
        .find(|p| p.join("cgroup.procs").exists() && p.join("cgroup.controllers").exists());
    if root.is_none() {
        assert!(
            !sframe_user::privileges::in_ci(),
            "CI machines mount a cgroup v2 hierarchy"
        );
        eprintln!("SKIPPED: no cgroup v2 hierarchy here");
    }
    root
}

/// Cgroups made by a test under the v2 root, removed (innermost first) on drop.
pub struct TestCgroups {
    pub root: PathBuf,
    made: Vec<PathBuf>,
}

impl TestCgroups {
    pub fn new(root: PathBuf) -> Self {
        Self {
            root,
            made: Vec::new(),
        }
    }

    /// Makes `rel` (and its parents) under the root; returns its absolute path.
    pub fn make(&mut self, rel: &str) -> PathBuf {
        let mut dir = self.root.clone();
        for part in rel.split('/').filter(|p| !p.is_empty()) {
            dir.push(part);
            if !dir.exists() {
                std::fs::create_dir(&dir).expect("create a test cgroup");
                self.made.push(dir.clone());
            }
        }
        dir
    }
}

impl Drop for TestCgroups {
    fn drop(&mut self) {
        for dir in self.made.iter().rev() {
            let _ = std::fs::remove_dir(dir);
        }
    }
}

/// Gate for tests that load BPF: returns false (after printing why) when they must be
/// skipped; panics under CI instead of skipping.
pub fn bpf_or_skip(test: &str) -> bool {
    sframe_user::privileges::require_bpf(test)
}

/// Runs gcc in `dir` with `args`, panicking with its stderr on failure.
pub fn gcc(dir: &Path, args: &[&str]) {
    let out = Command::new("gcc")
        .current_dir(dir)
        .args(args)
        .output()
        .expect("run gcc");
    assert!(
        out.status.success(),
        "gcc {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Compiles C `source` into the shared library `dir/lib{name}.so` (`-shared -fPIC`).
pub fn compile_c_shared(dir: &Path, name: &str, source: &str, flags: &[&str]) -> PathBuf {
    let src = format!("{name}.c");
    let lib = format!("lib{name}.so");
    std::fs::write(dir.join(&src), source).expect("write C source");
    let mut args = flags.to_vec();
    args.extend(["-shared", "-fPIC", "-o", &lib, &src]);
    gcc(dir, &args);
    dir.join(lib)
}

/// Compiles C `source` into the executable `dir/{name}`, linked against `dir/lib{lib}.so`
/// for each of `libs` and finding them at run time through an rpath.
pub fn compile_c_linked(
    dir: &Path,
    name: &str,
    source: &str,
    flags: &[&str],
    libs: &[&str],
) -> PathBuf {
    let src = format!("{name}.c");
    std::fs::write(dir.join(&src), source).expect("write C source");
    let rpath = format!("-Wl,-rpath,{}", dir.display());
    let lib_args: Vec<String> = libs.iter().map(|l| format!("-l{l}")).collect();
    let mut args = flags.to_vec();
    args.extend(["-o", name, &src, "-L."]);
    args.extend(lib_args.iter().map(String::as_str));
    args.push(&rpath);
    gcc(dir, &args);
    dir.join(name)
}

/// Does the ELF file at `path` have a section called `name`?
pub fn has_section(path: &Path, name: &str) -> bool {
    use object::{Object, ObjectSection};
    let data = std::fs::read(path).expect("read ELF file");
    let file = object::File::parse(&*data).expect("parse ELF file");
    file.sections().any(|s| s.name() == Ok(name))
}

/// The file offsets `[start, end)` of the ELF section `name` in `path`, if it has one.
pub fn section_file_range(path: &Path, name: &str) -> Option<(u64, u64)> {
    use object::{Object, ObjectSection};
    let data = std::fs::read(path).expect("read ELF file");
    let file = object::File::parse(&*data).expect("parse ELF file");
    let (offset, size) = file.section_by_name(name)?.file_range()?;
    Some((offset, offset + size))
}

/// `pprof -traces` of `profile` (with `extra` arguments, e.g. `-lines`): (samples,
/// frames innermost first) per trace.
pub fn pprof_traces(pprof: &Path, profile: &Path, extra: &[&str]) -> Vec<(u64, Vec<String>)> {
    let out = Command::new(pprof)
        .args(["-traces", "-sample_index=samples"])
        .args(extra)
        .arg(profile)
        .env("HOME", env!("CARGO_TARGET_TMPDIR"))
        .output()
        .expect("run pprof");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}{text}",
        String::from_utf8_lossy(&out.stderr)
    );
    let mut traces: Vec<(u64, Vec<String>)> = Vec::new();
    for line in text.lines() {
        if line.starts_with("-----") {
            continue;
        }
        let mut words = line.split_whitespace();
        let Some(first) = words.next() else { continue };
        // A trace: `   COUNT   innermost`, then a frame per line, indented.
        if line.starts_with("             ") {
            if let Some(t) = traces.last_mut() {
                t.1.push(line.trim().to_owned());
            }
        } else if let Ok(n) = first.parse::<u64>() {
            traces.push((n, vec![words.collect::<Vec<_>>().join(" ")]));
        }
    }
    traces
}

/// Builds Google's pprof from Debian's sources (once, into the target dir). `None`
/// (after printing why) when Go or the sources are missing outside CI.
pub fn pprof_tool() -> Option<PathBuf> {
    // One build at a time within a test binary (its tests run on threads of one
    // process, and the temporary name is per process).
    static BUILD: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _one = BUILD
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("pprof-tool");
    let bin = dir.join("pprof");
    if bin.exists() {
        return Some(bin);
    }
    let sources = Path::new("/usr/share/gocode/src/github.com/google/pprof");
    let missing = if which_go().is_none() {
        Some("go is not installed (apt-get install golang-go)")
    } else if !sources.exists() {
        Some("pprof sources missing (apt-get install golang-github-google-pprof-dev)")
    } else {
        None
    };
    if let Some(why) = missing {
        if sframe_user::privileges::in_ci() {
            panic!("{why}: cargo xtask setup installs it");
        }
        eprintln!("SKIPPED pprof tool check: {why}");
        return None;
    }
    std::fs::create_dir_all(&dir).unwrap();
    // Build into a temporary name: concurrent tests never see a half-written binary.
    let tmp = dir.join(format!("pprof.{}", std::process::id()));
    let out = Command::new("go")
        .args(["build", "-o"])
        .arg(&tmp)
        .arg("github.com/google/pprof")
        .env("GO111MODULE", "off")
        .env("GOPATH", "/usr/share/gocode")
        .env("GOCACHE", dir.join("gocache"))
        .output()
        .expect("run go build");
    assert!(
        out.status.success(),
        "go build pprof: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    std::fs::rename(&tmp, &bin).unwrap();
    Some(bin)
}

fn which_go() -> Option<()> {
    Command::new("go")
        .arg("version")
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|_| ())
}
