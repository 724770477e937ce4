//! Test support: C fixtures compiled at test time, child processes that are always
//! killed, and the BPF privilege gate.
#![allow(dead_code, reason = "each test binary uses a different subset")]

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

/// Gate for tests that load BPF: returns false (after printing why) when they must be
/// skipped; panics under CI instead of skipping.
pub fn bpf_or_skip(test: &str) -> bool {
    sframe_user::privileges::require_bpf(test)
}
