//! The workloads of the VM tests, compiled on the host for the guest's architecture.
//! Each builds a known call chain, so the expected stack is known by construction.

use std::{
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::Result;

use super::Arch;
use crate::cmd;

/// `main → level1 → level2 → level3 → leaf_spin`, forever. Each call is followed by
/// work, so no call becomes a tail call.
const CHAIN_C: &str = r#"
volatile unsigned long sink;
__attribute__((noinline)) void leaf_spin(void) { for (int i = 0; i < 200000; i++) sink += i; }
__attribute__((noinline)) void level3(void) { leaf_spin(); sink++; }
__attribute__((noinline)) void level2(void) { level3(); sink++; }
__attribute__((noinline)) void level1(void) { level2(); sink++; }
int main(void) { for (;;) level1(); }
"#;

/// Off CPU: `main → nap_loop → nap → nanosleep(40 ms)`, 50 times (long sleeps: the
/// scheduler's own path at each end, emulated and descheduled with the guest's vCPU on
/// a busy host, is time the fixture counts off CPU and the profiler does not, measured
/// up to 1.8 ms per sleep: 18 % of a 10 ms sleep, 4.5 % of these); prints `asked NS`,
/// the time its sleeps asked for (each lasts at least that), `nap NS`,
/// the time the loop spent off CPU: its wall-clock time less the thread's CPU time
/// (around each call would count the system calls' entry and exit, on CPU, which
/// emulation makes slow), and `delay NS`, how long of that the thread waited runnable
/// on a run queue (`/proc/thread-self/schedstat`; absent where the kernel does not
/// keep it): a wait after a wake-up is part of a sleep as the profiler times it, a
/// preemption while running is not.
const SLEEPER_C: &str = concat!(
    include_str!("../../../sframe-user/tests/support/c/run_delay.h"),
    r#"
#include <stdio.h>
#include <time.h>
static double clock_s(clockid_t c) {
    struct timespec t;
    clock_gettime(c, &t);
    return t.tv_sec + t.tv_nsec / 1e9;
}
#define NAP_NS (40 * 1000 * 1000)
#define NAPS 50
__attribute__((noinline)) void nap(void) {
    struct timespec t = {0, NAP_NS};
    nanosleep(&t, 0);
    __asm__ volatile("");
}
__attribute__((noinline)) void nap_loop(int n) {
    for (int i = 0; i < n; i++) nap();
    __asm__ volatile("");
}
int main(void) {
    long long d = run_delay_ns();
    double w = clock_s(CLOCK_MONOTONIC), c = clock_s(CLOCK_THREAD_CPUTIME_ID);
    nap_loop(NAPS);
    double off = (clock_s(CLOCK_MONOTONIC) - w) - (clock_s(CLOCK_THREAD_CPUTIME_ID) - c);
    long long d2 = run_delay_ns();
    printf("nap %.0f\n", off * 1e9);
    printf("asked %lld\n", (long long)NAPS * NAP_NS);
    if (d >= 0 && d2 >= d) printf("delay %lld\n", d2 - d);
    return 0;
}
"#
);

/// `main → recurse × (DEPTH + 1) → deep_spin`.
const DEEP_C: &str = r#"
#define DEPTH 220
volatile unsigned long sink;
__attribute__((noinline)) void deep_spin(void) { for (;;) for (int i = 0; i < 200000; i++) sink += i; }
__attribute__((noinline)) int recurse(int n) {
    if (n == 0) { deep_spin(); return 0; }
    int r = recurse(n - 1);
    sink += r;
    return r + 1;
}
int main(void) { return recurse(DEPTH); }
"#;

/// Most of its time in the kernel: `main → sys_loop → read(/dev/zero, 64 KiB)`.
const SYSCALL_C: &str = r#"
#include <fcntl.h>
#include <unistd.h>
volatile unsigned long sink;
static char buf[1 << 16];
__attribute__((noinline)) void sys_loop(int fd) {
    for (int i = 0; i < 100; i++) if (read(fd, buf, sizeof buf) < 0) sink++;
    sink++;
}
int main(void) { int fd = open("/dev/zero", O_RDONLY); for (;;) sys_loop(fd); }
"#;

/// C++: a method calling through `std::function` into a lambda, and exceptions thrown
/// and caught through libstdc++ and libgcc's unwinder.
const CPP: &str = r#"
#include <functional>
#include <stdexcept>
volatile unsigned long sink;
__attribute__((noinline)) void cpp_leaf(int i) { for (int j = 0; j < 20000; j++) sink += j ^ i; }
__attribute__((noinline)) void thrower(int i) { if (i >= 0) throw std::runtime_error("x"); }
struct Worker {
    std::function<void(int)> f;
    __attribute__((noinline)) void run(int n) { for (int i = 0; i < n; i++) f(i); sink++; }
};
int main() {
    Worker w{[](int i) { cpp_leaf(i); }};
    for (;;) {
        w.run(100);
        try { thrower(1); } catch (const std::exception &) { sink++; }
    }
}
"#;

/// Waits for a byte on standard input (the profiler is attached), then forks and execs
/// `argv[1] argv[2]` one child after the other, forever.
const SPAWNER_C: &str = r#"
#include <sys/wait.h>
#include <unistd.h>
int main(int argc, char **argv) {
    char go;
    if (argc < 3 || read(0, &go, 1) != 1) return 2;
    for (;;) {
        pid_t p = fork();
        if (p == 0) { execl(argv[1], argv[1], argv[2], (char *)0); _exit(127); }
        if (p < 0) return 1;
        waitpid(p, 0, 0);
    }
}
"#;

/// Opens the library `argv[1]` with dlopen and spins in it for 300 ms of CPU:
/// `main → run_lib → dl_spin → dl_leaf`.
const DL_CHILD_C: &str = r#"
#include <dlfcn.h>
volatile unsigned long sink;
typedef void (*spin_fn)(double);
__attribute__((noinline)) void run_lib(spin_fn f) { f(0.3); sink++; }
int main(int argc, char **argv) {
    void *h = dlopen(argv[1], RTLD_NOW);
    if (!h) return 3;
    spin_fn f = (spin_fn)dlsym(h, "dl_spin");
    if (!f) return 4;
    run_lib(f);
    return 0;
}
"#;

const DL_LIB_C: &str = r#"
#include <time.h>
volatile unsigned long sink;
static double cpu(void) { struct timespec t; clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t); return t.tv_sec + t.tv_nsec / 1e9; }
__attribute__((noinline)) void dl_leaf(void) { for (int i = 0; i < 20000; i++) sink += i; }
__attribute__((noinline)) void dl_spin(double secs) { double s = cpu(); while (cpu() - s < secs) { dl_leaf(); sink++; } }
"#;

/// A shared library the program calls through its PLT:
/// `main → plt_loop → lib_work (PLT) → lib_leaf`.
const PLT_LIB_C: &str = r#"
volatile unsigned long lib_sink;
__attribute__((noinline)) void lib_leaf(void) { for (int i = 0; i < 200000; i++) lib_sink += i; }
void lib_work(void) { lib_leaf(); lib_sink++; }
"#;

const PLT_MAIN_C: &str = r#"
void lib_work(void);
volatile unsigned long sink;
__attribute__((noinline)) void plt_loop(void) { for (int i = 0; i < 10; i++) lib_work(); sink++; }
int main(void) { for (;;) plt_loop(); }
"#;

/// Paths of the compiled fixtures.
pub struct Fixtures {
    pub dir: PathBuf,
}

impl Fixtures {
    pub fn path(&self, name: &str) -> PathBuf {
        self.dir.join(name)
    }
    /// Every file, for the initramfs.
    pub fn files(&self) -> Vec<PathBuf> {
        NAMES
            .iter()
            .map(|n| self.path(n))
            .filter(|p| p.exists())
            .collect()
    }
}

/// The fixture files built by [`build`].
pub const NAMES: &[&str] = &[
    "chain_sframe",
    "chain_eh",
    "chain_fp",
    "chain_fp_only",
    "sleeper",
    "deep",
    "sysloop",
    "cpp_worker",
    "spawner",
    "dl_child",
    "libdlspin.so",
    "plt_main",
    "libpltspin.so",
    // AArch64 only: pointer-authenticated return addresses.
    "chain_pac",
];

fn compile(
    arch: Arch,
    dir: &Path,
    out: &str,
    src_name: &str,
    src: &str,
    flags: &[&str],
    cxx: bool,
) -> Result<()> {
    let src_path = dir.join(src_name);
    std::fs::write(&src_path, src)?;
    let compiler = match (arch, cxx) {
        (Arch::X86_64, false) => "gcc",
        (Arch::X86_64, true) => "g++",
        (Arch::Aarch64, false) => "aarch64-linux-gnu-gcc",
        (Arch::Aarch64, true) => "aarch64-linux-gnu-g++",
    };
    let mut c = Command::new(compiler);
    // Flags after the source, so that libraries resolve its symbols.
    c.arg("-o").arg(dir.join(out)).arg(&src_path).args(flags);
    cmd::run(&mut c, &format!("compile fixture {out}"))
}

/// Compiles every fixture for `arch` into `dir`. No frame pointers but in `chain_fp*`:
/// the stacks can only be complete if the tables are right.
pub fn build(arch: Arch, dir: &Path) -> Result<Fixtures> {
    std::fs::create_dir_all(dir)?;
    let base = ["-O2", "-g", "-fomit-frame-pointer"];
    let with = |extra: &[&'static str]| -> Vec<&'static str> {
        base.iter().copied().chain(extra.iter().copied()).collect()
    };
    compile(
        arch,
        dir,
        "chain_sframe",
        "chain_sframe.c",
        CHAIN_C,
        &with(&["-Wa,--gsframe"]),
        false,
    )?;
    compile(arch, dir, "chain_eh", "chain_eh.c", CHAIN_C, &base, false)?;
    // Frame pointers in every function, leaves too (what distributions that keep frame
    // pointers build with): with `.eh_frame` (its rules base the CFA on the frame
    // pointer), and with no unwind tables at all (only the frame-pointer fallback).
    let fp = [
        "-O2",
        "-g",
        "-fno-omit-frame-pointer",
        "-mno-omit-leaf-frame-pointer",
    ];
    compile(arch, dir, "chain_fp", "chain_fp.c", CHAIN_C, &fp, false)?;
    let fp_only: Vec<&str> = fp
        .iter()
        .copied()
        .chain(["-fno-asynchronous-unwind-tables", "-fno-unwind-tables"])
        .collect();
    compile(
        arch,
        dir,
        "chain_fp_only",
        "chain_fp_only.c",
        CHAIN_C,
        &fp_only,
        false,
    )?;
    compile(arch, dir, "deep", "deep.c", DEEP_C, &base, false)?;
    compile(arch, dir, "sleeper", "sleeper.c", SLEEPER_C, &base, false)?;
    compile(arch, dir, "sysloop", "sysloop.c", SYSCALL_C, &base, false)?;
    compile(arch, dir, "cpp_worker", "cpp_worker.cc", CPP, &base, true)?;
    compile(arch, dir, "spawner", "spawner.c", SPAWNER_C, &base, false)?;
    compile(
        arch,
        dir,
        "dl_child",
        "dl_child.c",
        DL_CHILD_C,
        &with(&["-ldl"]),
        false,
    )?;
    compile(
        arch,
        dir,
        "libdlspin.so",
        "dlspin.c",
        DL_LIB_C,
        &with(&["-shared", "-fPIC"]),
        false,
    )?;
    let dir_s = dir.to_string_lossy().into_owned();
    compile(
        arch,
        dir,
        "libpltspin.so",
        "pltspin.c",
        PLT_LIB_C,
        &with(&["-shared", "-fPIC"]),
        false,
    )?;
    let mut plt_flags: Vec<&str> = base.to_vec();
    plt_flags.extend(["-L", &dir_s, "-lpltspin", "-Wl,-rpath,$ORIGIN"]);
    compile(
        arch,
        dir,
        "plt_main",
        "plt_main.c",
        PLT_MAIN_C,
        &plt_flags,
        false,
    )?;
    if arch == Arch::Aarch64 {
        // PAC-signed return addresses (paciasp/autiasp) and SFrame: the walker strips the
        // authentication code from each saved RA.
        compile(
            arch,
            dir,
            "chain_pac",
            "chain_pac.c",
            CHAIN_C,
            &with(&["-Wa,--gsframe", "-mbranch-protection=standard"]),
            false,
        )?;
    }
    Ok(Fixtures {
        dir: dir.to_owned(),
    })
}
