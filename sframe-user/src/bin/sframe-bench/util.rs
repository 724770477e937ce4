//! Helpers shared by the sections: statistics and formatting, temporary directories,
//! child processes killed on drop, `kernel.bpf_stats_enabled`.

use std::{fs, path::PathBuf, process::Child, time::Instant};

use anyhow::{Context as _, Result};

pub(crate) fn ratio(a: f64, b: f64) -> Option<f64> {
    (b > 0.0).then(|| a / b)
}

/// Sets `kernel.bpf_stats_enabled` to 1 and puts the old value back when dropped.
pub(crate) struct BpfStats {
    old: String,
}

const BPF_STATS_SYSCTL: &str = "/proc/sys/kernel/bpf_stats_enabled";

impl BpfStats {
    pub fn enable() -> Result<Self> {
        let old = fs::read_to_string(BPF_STATS_SYSCTL)
            .with_context(|| format!("reading {BPF_STATS_SYSCTL}"))?;
        fs::write(BPF_STATS_SYSCTL, "1")
            .with_context(|| format!("writing 1 to {BPF_STATS_SYSCTL} (root needed)"))?;
        Ok(Self {
            old: old.trim().to_string(),
        })
    }
}

impl Drop for BpfStats {
    fn drop(&mut self) {
        if let Err(err) = fs::write(BPF_STATS_SYSCTL, &self.old) {
            eprintln!(
                "sframe-bench: could not restore {BPF_STATS_SYSCTL} to {}: {err}",
                self.old
            );
        }
    }
}

/// A running fixture process, killed when dropped.
pub(crate) struct Fixture {
    pub child: Child,
}

impl Fixture {
    pub fn pid(&self) -> u32 {
        self.child.id()
    }
}

impl Drop for Fixture {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A temporary directory, removed when dropped.
pub(crate) struct TempDir(pub PathBuf);

impl TempDir {
    pub fn new() -> Result<Self> {
        let dir = std::env::temp_dir().join(format!("sframe-bench-{}", std::process::id()));
        fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
        Ok(Self(dir))
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.0);
    }
}

pub(crate) fn fmt_opt(v: Option<f64>, decimals: usize) -> String {
    v.map_or_else(|| "–".into(), |v| format!("{v:.decimals$}"))
}

pub(crate) fn pct(a: f64, b: f64) -> String {
    ratio(a * 100.0, b).map_or_else(|| "–".into(), |p| format!("{p:.1} %"))
}

pub(crate) fn one_line(s: &str) -> String {
    s.replace(['\n', '|'], " ")
}

/// `value` with `decimals`, and whether it meets its goal.
pub(crate) fn verdict(value: f64, met: bool, decimals: usize) -> String {
    format!(
        "{value:.decimals$} ({})",
        if met { "met" } else { "not met" }
    )
}

/// Median, min and max of `v` (sorted in place).
pub(crate) fn stats(v: &mut [f64]) -> Option<(f64, f64, f64)> {
    v.sort_by(f64::total_cmp);
    let (first, last) = (*v.first()?, *v.last()?);
    let mid = v.len() / 2;
    let median = if v.len() % 2 == 1 {
        v[mid]
    } else {
        (v[mid - 1] + v[mid]) / 2.0
    };
    Some((median, first, last))
}

pub(crate) fn fmt_stats(v: &[f64], decimals: usize) -> String {
    let mut v = v.to_vec();
    stats(&mut v).map_or_else(
        || "–".into(),
        |(m, lo, hi)| format!("{m:.decimals$} ({lo:.decimals$}–{hi:.decimals$})"),
    )
}

/// xorshift64*: reproducible PCs without a dependency.
pub(crate) struct Rng(pub u64);

impl Rng {
    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
}

pub(crate) fn time_ms<T>(f: impl FnOnce() -> T) -> (T, f64) {
    let t = Instant::now();
    let out = f();
    (out, t.elapsed().as_secs_f64() * 1e3)
}

pub(crate) fn median(v: &[f64]) -> f64 {
    let mut v = v.to_vec();
    stats(&mut v).map_or(f64::NAN, |s| s.0)
}

/// While alive, the process runs on one CPU (the one it is on): single-threaded
/// timings are then "on one core" and not moved between CPUs. The previous CPU set is
/// restored on drop; without permission to change it, nothing changes.
pub(crate) struct PinnedToOneCpu {
    previous: Option<libc::cpu_set_t>,
}

impl PinnedToOneCpu {
    pub(crate) fn new() -> Self {
        // SAFETY: cpu_set_t is plain data; the calls get a valid pointer and its size.
        unsafe {
            let mut previous: libc::cpu_set_t = std::mem::zeroed();
            if libc::sched_getaffinity(0, size_of::<libc::cpu_set_t>(), &mut previous) != 0 {
                return Self { previous: None };
            }
            let cpu = libc::sched_getcpu();
            if cpu < 0 {
                return Self { previous: None };
            }
            let mut one: libc::cpu_set_t = std::mem::zeroed();
            libc::CPU_SET(cpu as usize, &mut one);
            if libc::sched_setaffinity(0, size_of::<libc::cpu_set_t>(), &one) != 0 {
                return Self { previous: None };
            }
            Self {
                previous: Some(previous),
            }
        }
    }
}

impl Drop for PinnedToOneCpu {
    fn drop(&mut self) {
        if let Some(previous) = &self.previous {
            // SAFETY: as in `new`, with the set read there.
            unsafe {
                libc::sched_setaffinity(0, size_of::<libc::cpu_set_t>(), previous);
            }
        }
    }
}
