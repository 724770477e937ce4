//! Booting a kernel and an initramfs under qemu, with its serial console captured.
//!
//! KVM is used when `/dev/kvm` works. On this project's machines (Firecracker VMs) nested
//! KVM hangs right after "Probing EDD" without printing anything more, so a KVM boot
//! that does not reach the guest's `/init` within [`KVM_PROBE`] is stopped and the run
//! falls back to TCG (full emulation, `-cpu max`), remembered for the rest of the run.

use std::{
    io::{BufRead as _, BufReader, Write as _},
    path::Path,
    process::{Command, Stdio},
    sync::{
        Mutex,
        atomic::{AtomicU8, Ordering},
        mpsc,
    },
    thread,
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result, bail};

use super::Arch;

/// The line `/init` prints first: the guest reached user space.
pub const INIT_MARKER: &str = "SFRAME-VM: init";
/// The line `/init` prints last.
pub const END_MARKER: &str = "SFRAME-VM: end";
/// How long a KVM boot may take to reach `/init` before KVM is judged unusable.
const KVM_PROBE: Duration = Duration::from_secs(20);

/// 0: not tried, 1: works, 2: unusable.
static KVM: AtomicU8 = AtomicU8::new(0);
static KVM_NOTE: Mutex<String> = Mutex::new(String::new());

/// How the guests run: "kvm" or "tcg" (and why).
pub fn accel_note() -> String {
    KVM_NOTE.lock().map(|s| s.clone()).unwrap_or_default()
}

fn kvm_usable(arch: Arch) -> bool {
    arch == Arch::host()
        && std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open("/dev/kvm")
            .is_ok()
}

fn set_note(s: String) {
    if let Ok(mut n) = KVM_NOTE.lock() {
        *n = s;
    }
}

/// Boots `kernel` with `initrd`, returns the console lines (also written to `log`).
/// Fails when the guest does not print [`END_MARKER`] within `timeout`.
pub fn boot(
    arch: Arch,
    kernel: &Path,
    initrd: &Path,
    log: &Path,
    timeout: Duration,
) -> Result<Vec<String>> {
    if KVM.load(Ordering::Relaxed) != 2 && kvm_usable(arch) {
        match run(arch, kernel, initrd, log, timeout, true)? {
            Outcome::Done(lines) => {
                KVM.store(1, Ordering::Relaxed);
                set_note("KVM".into());
                return Ok(lines);
            }
            Outcome::NoInit => {
                KVM.store(2, Ordering::Relaxed);
                set_note(format!(
                    "TCG (a KVM boot did not reach /init within {} s: nested KVM hangs on this machine kind)",
                    KVM_PROBE.as_secs()
                ));
                eprintln!("xtask: vm: KVM boot did not reach /init; falling back to TCG");
            }
            Outcome::Timeout(lines) => return timed_out(lines, timeout, log),
            Outcome::Exited(lines) => return exited(lines, log),
        }
    } else if KVM.load(Ordering::Relaxed) == 0 {
        set_note(if arch == Arch::host() {
            "TCG (/dev/kvm not usable)".into()
        } else {
            "TCG (emulating another architecture)".into()
        });
    }
    match run(arch, kernel, initrd, log, timeout, false)? {
        Outcome::Done(lines) => Ok(lines),
        Outcome::NoInit => bail!(
            "the guest never reached /init (console in {})",
            log.display()
        ),
        Outcome::Timeout(lines) => timed_out(lines, timeout, log),
        Outcome::Exited(lines) => exited(lines, log),
    }
}

fn exited(lines: Vec<String>, log: &Path) -> Result<Vec<String>> {
    let tail: Vec<&String> = lines.iter().rev().take(25).rev().collect();
    bail!(
        "the guest stopped before its tests finished (a kernel panic?); last console lines (all in {}):\n{}",
        log.display(),
        tail.iter()
            .map(|s| s.as_str())
            .collect::<Vec<_>>()
            .join("\n")
    )
}

fn timed_out(lines: Vec<String>, timeout: Duration, log: &Path) -> Result<Vec<String>> {
    let tail: Vec<&String> = lines.iter().rev().take(15).rev().collect();
    bail!(
        "the guest did not finish within {} s; last console lines (all in {}):\n{}",
        timeout.as_secs(),
        log.display(),
        tail.iter()
            .map(|s| s.as_str())
            .collect::<Vec<_>>()
            .join("\n")
    )
}

enum Outcome {
    Done(Vec<String>),
    /// KVM only: `/init` not reached within the probe time.
    NoInit,
    Timeout(Vec<String>),
    /// qemu exited without the end marker.
    Exited(Vec<String>),
}

fn run(
    arch: Arch,
    kernel: &Path,
    initrd: &Path,
    log: &Path,
    timeout: Duration,
    kvm: bool,
) -> Result<Outcome> {
    let mut qemu = match arch {
        Arch::X86_64 => {
            let mut c = Command::new("qemu-system-x86_64");
            c.args(["-machine", "q35"]);
            c.args(["-append", "console=ttyS0 panic=-1 edd=off quiet loglevel=4"]);
            c
        }
        Arch::Aarch64 => {
            let mut c = Command::new("qemu-system-aarch64");
            c.args(["-machine", "virt"]);
            c.args(["-append", "console=ttyAMA0 panic=-1 quiet loglevel=4"]);
            c
        }
    };
    if kvm {
        qemu.args(["-accel", "kvm", "-cpu", "host"]);
    } else {
        match arch {
            // One host thread for both vCPUs: with multi-threaded TCG, a 6.12 guest
            // took an int3 oops in syscall exit code while the kernel live-patched a
            // static branch (tracepoints being attached): cross-vCPU code
            // modification is not reliable there.
            Arch::X86_64 => qemu.args(["-accel", "tcg,thread=single", "-cpu", "max"]),
            // pauth-impdef: pointer authentication with a cheap emulated hash.
            Arch::Aarch64 => {
                qemu.args(["-accel", "tcg,thread=single", "-cpu", "max,pauth-impdef=on"])
            }
        };
    }
    qemu.args(["-smp", "2", "-m", "2048", "-nic", "none", "-no-reboot"])
        .args(["-display", "none", "-serial", "stdio", "-monitor", "none"])
        .arg("-kernel")
        .arg(kernel)
        .arg("-initrd")
        .arg(initrd)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = qemu
        .spawn()
        .with_context(|| format!("starting {}", crate::cmd::display(&qemu)))?;
    let (tx, rx) = mpsc::channel::<String>();
    let stdout = child.stdout.take().context("qemu stdout")?;
    let stderr = child.stderr.take().context("qemu stderr")?;
    let tx2 = tx.clone();
    thread::spawn(move || {
        for line in BufReader::new(stdout).split(b'\n').map_while(Result::ok) {
            let line = String::from_utf8_lossy(&line).trim_end().to_owned();
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            if tx2.send(format!("qemu: {line}")).is_err() {
                break;
            }
        }
    });
    let mut file =
        std::fs::File::create(log).with_context(|| format!("creating {}", log.display()))?;
    let _ = writeln!(
        file,
        "# {} ({})",
        kernel.display(),
        if kvm { "kvm" } else { "tcg" }
    );
    let start = Instant::now();
    let mut lines = Vec::new();
    let mut init_seen = false;
    let outcome = loop {
        let limit = if kvm && !init_seen {
            KVM_PROBE.min(timeout)
        } else {
            timeout
        };
        let Some(left) = limit.checked_sub(start.elapsed()) else {
            break if kvm && !init_seen {
                Outcome::NoInit
            } else {
                Outcome::Timeout(std::mem::take(&mut lines))
            };
        };
        match rx.recv_timeout(left) {
            Ok(line) => {
                let _ = writeln!(file, "{line}");
                if line.contains(INIT_MARKER) {
                    init_seen = true;
                }
                let end = line.contains(END_MARKER);
                lines.push(line);
                if end {
                    break Outcome::Done(std::mem::take(&mut lines));
                }
            }
            Err(mpsc::RecvTimeoutError::Timeout) => continue,
            Err(mpsc::RecvTimeoutError::Disconnected) => {
                break if init_seen || !kvm {
                    Outcome::Exited(std::mem::take(&mut lines))
                } else {
                    Outcome::NoInit
                };
            }
        }
    };
    let _ = child.kill();
    let _ = child.wait();
    if let Outcome::Done(_) = outcome {
        eprintln!(
            "xtask: vm: {} finished in {:.0} s",
            kernel.display(),
            start.elapsed().as_secs_f64()
        );
    }
    Ok(outcome)
}
