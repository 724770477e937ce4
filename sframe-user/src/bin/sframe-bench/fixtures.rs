//! Workloads the overhead, accuracy and startup sections profile: a C and a C++ program
//! built without frame pointers, a pure-Python loop, a bash loop.

use std::{
    fs,
    path::{Path, PathBuf},
    process::{Command, Stdio},
};

use anyhow::{Context as _, Result, bail};

/// Functions between `main` and the leaf of the C workload.
pub const C_CHAIN: usize = 12;

/// C, `-O2 -fomit-frame-pointer`: `main` → `w0` → … → `w11` → `leaf`, the leaf mixing
/// arithmetic with `memcpy` calls into libc (through the PLT), so stacks end in the
/// executable and in libc. Without arguments it runs until killed; with `--rounds N` it
/// waits for a byte on its standard input, runs N rounds and prints the wall-clock
/// nanoseconds they took (CLOCK_MONOTONIC).
const C_SOURCE: &str = r#"#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#define NOIPA __attribute__((noipa))
volatile unsigned long sink;
static char a[256], b[256];
NOIPA void leaf(void) {
    unsigned long s = sink;
    for (int i = 0; i < 2000; i++) {
        s = s * 6364136223846793005UL + (unsigned long)i;
        if ((i & 63) == 0) { a[i & 255] = (char)s; memcpy(b, a, sizeof a); s += (unsigned char)b[7]; }
    }
    sink = s;
}
CHAIN
static long long now_ns(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec * 1000000000LL + t.tv_nsec; }
int main(int argc, char **argv) {
    if (argc > 2 && strcmp(argv[1], "--rounds") == 0) {
        long rounds = atol(argv[2]);
        char c;
        if (read(0, &c, 1) != 1) return 2;
        long long t0 = now_ns();
        for (long r = 0; r < rounds; r++) w0();
        printf("%lld\n", now_ns() - t0);
        return 0;
    }
    for (;;) w0();
}
"#;

/// C++ (g++ `-O2 -fomit-frame-pointer`): a virtual call and a template chain into
/// `std::map` inserts and erases (libstdc++'s red-black tree, `operator new` → malloc)
/// and `std::sort` with a lambda; runs until killed.
const CPP_SOURCE: &str = r#"#include <algorithm>
#include <map>
#include <vector>
#define NOIPA __attribute__((noipa))
volatile unsigned long sink;
struct Work { virtual ~Work() = default; virtual void run(int n) = 0; };
struct Tree : Work {
    std::map<int, int> m;
    NOIPA void run(int n) override {
        for (int i = 0; i < n; i++) m[(i * 7919) % 4096] = i;
        for (int i = 0; i < n; i += 2) m.erase((i * 7919) % 4096);
        sink += m.size();
    }
};
struct Sort : Work {
    std::vector<unsigned> v;
    NOIPA void run(int n) override {
        v.resize(n);
        for (int i = 0; i < n; i++) v[i] = (unsigned)(i * 2654435761u);
        std::sort(v.begin(), v.end(), [](unsigned a, unsigned b) { return (a ^ 0x5555u) < (b ^ 0x5555u); });
        sink += v[n / 2];
    }
};
template <int N> struct Level { NOIPA static void go(Work &w) { Level<N - 1>::go(w); sink += N; } };
template <> struct Level<0> { NOIPA static void go(Work &w) { w.run(2000); sink += 1; } };
int main() {
    Tree t; Sort s;
    for (unsigned long k = 0;; k++) Level<6>::go(k & 1 ? (Work &)t : (Work &)s);
}
"#;

/// The pure-Python loop: three Python functions deep, arithmetic in the innermost.
pub const PYTHON_SCRIPT: &str = "def leaf(n):\n    s = 0\n    for i in range(n):\n        s += i * i % 7\n    return s\n\ndef mid(n):\n    return leaf(n) + 1\n\ndef top():\n    while True:\n        mid(1000)\n\ntop()\n";

/// The bash loop: arithmetic expansion and a test, in the shell itself (no fork).
pub const BASH_SCRIPT: &str =
    "i=0; while :; do i=$((i + 1)); if [ $((i % 1000)) -eq 0 ]; then i=0; fi; done";

fn c_chain() -> String {
    let mut s = String::new();
    for i in (0..C_CHAIN).rev() {
        let call = if i + 1 == C_CHAIN {
            "leaf();".to_string()
        } else {
            format!("w{}();", i + 1)
        };
        s.push_str(&format!(
            "NOIPA void w{i}(void) {{ {call} sink += {i}; }}\n"
        ));
    }
    s
}

fn compile(compiler: &str, dir: &Path, name: &str, ext: &str, source: &str) -> Result<PathBuf> {
    let src = dir.join(format!("{name}.{ext}"));
    let exe = dir.join(name);
    fs::write(&src, source).with_context(|| format!("writing {}", src.display()))?;
    let out = Command::new(compiler)
        .args(["-O2", "-fomit-frame-pointer", "-o"])
        .arg(&exe)
        .arg(&src)
        .output()
        .with_context(|| format!("running {compiler}"))?;
    if !out.status.success() {
        bail!(
            "{compiler} failed on {}: {}",
            src.display(),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(exe)
}

/// Builds the C workload into `dir` (its command name is `name`).
pub fn c_workload(dir: &Path, name: &str) -> Result<PathBuf> {
    compile(
        "gcc",
        dir,
        name,
        "c",
        &C_SOURCE.replace("CHAIN", &c_chain()),
    )
}

/// Builds the C++ workload into `dir`.
pub fn cpp_workload(dir: &Path, name: &str) -> Result<PathBuf> {
    compile("g++", dir, name, "cc", CPP_SOURCE)
}

/// A workload of the accuracy and startup sections: how to start it.
pub struct Workload {
    pub name: &'static str,
    pub program: PathBuf,
    pub args: Vec<String>,
}

impl Workload {
    pub fn command(&self) -> Command {
        let mut c = Command::new(&self.program);
        c.args(&self.args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        c
    }
}

/// The four workloads of the accuracy section (those that could be built).
pub fn all(dir: &Path) -> Vec<Result<Workload>> {
    vec![
        c_workload(dir, "acc_c").map(|program| Workload {
            name: "C, no frame pointers",
            program,
            args: Vec::new(),
        }),
        cpp_workload(dir, "acc_cpp").map(|program| Workload {
            name: "C++ (g++), no frame pointers",
            program,
            args: Vec::new(),
        }),
        Ok(Workload {
            name: "python3, pure-Python loop",
            program: PathBuf::from("/usr/bin/python3"),
            args: vec!["-c".into(), PYTHON_SCRIPT.into()],
        }),
        Ok(Workload {
            name: "bash loop",
            program: PathBuf::from("/bin/bash"),
            args: vec!["-c".into(), BASH_SCRIPT.into()],
        }),
    ]
}
