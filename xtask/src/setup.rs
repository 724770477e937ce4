//! Idempotent provisioning of a fresh machine.
//!
//! Every step first checks whether its result is already there, so a second run is a
//! fast no-op. A failing step says which step failed and what to run by hand.

use std::{
    env,
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{Context as _, Result, bail};

use crate::cmd;

/// bpf-linker release built by setup (the newest that builds with rustc 1.95's nightly).
const BPF_LINKER_VERSION: &str = "0.13.0";

/// Debian packages the tests and benchmarks use, with a binary that proves each is there.
const DEBIAN_PACKAGES: &[(&str, &str)] = &[
    ("linux-perf", "perf"),
    ("bpftool", "bpftool"),
    ("gcc", "gcc"),
    ("g++", "g++"),
    ("binutils", "objdump"),
    // Google's pprof, built from these sources by the export tests.
    ("golang-go", "go"),
    ("golang-github-google-pprof-dev", "go"),
    // A real Prometheus server scrapes the exporter in the export tests; promtool (same
    // package) lints the exposition.
    ("prometheus", "prometheus"),
    // libbpf-tools' offcputime (the CO-RE build of bcc's tool, which needs no kernel
    // headers): the off-CPU bench section measures it beside the profiler.
    ("libbpf-tools", "/usr/sbin/offcputime"),
    // Runtimes whose JIT frames the profiler names from perf maps (tests/jit.rs).
    ("nodejs", "node"),
    ("openjdk-17-jdk-headless", "jcmd"),
    // elfutils' debuginfod server: the symbolizer's debuginfod client is tested against
    // it (tests/debuginfod.rs).
    ("debuginfod", "debuginfod"),
];

pub fn setup() -> Result<()> {
    step("nightly toolchain", ensure_nightly)?;
    step("rust-src for nightly", ensure_rust_src)?;
    step("bpf-linker", ensure_bpf_linker)?;
    step("Debian packages", ensure_debian_packages)?;
    step("cargo-fuzz", ensure_cargo_fuzz)?;
    step("py-spy", ensure_py_spy)?;
    Ok(())
}

fn step(name: &str, f: impl FnOnce() -> Result<()>) -> Result<()> {
    f().with_context(|| format!("setup step '{name}' failed"))
}

fn ensure_nightly() -> Result<()> {
    if cmd::output(Command::new("rustc").args(["+nightly", "-vV"])).is_some() {
        return Ok(());
    }
    cmd::run(
        Command::new("rustup").args(["toolchain", "install", "nightly", "--profile", "minimal"]),
        "install the nightly toolchain (by hand: rustup toolchain install nightly)",
    )
}

fn ensure_rust_src() -> Result<()> {
    let installed = cmd::output(Command::new("rustup").args([
        "component",
        "list",
        "--installed",
        "--toolchain",
        "nightly",
    ]))
    .unwrap_or_default();
    if installed.lines().any(|l| l.starts_with("rust-src")) {
        return Ok(());
    }
    cmd::run(
        Command::new("rustup").args(["component", "add", "rust-src", "--toolchain", "nightly"]),
        "add rust-src (by hand: rustup component add rust-src --toolchain nightly)",
    )
}

fn cargo_home() -> PathBuf {
    env::var_os("CARGO_HOME")
        .map(PathBuf::from)
        .or_else(|| env::var_os("HOME").map(|h| PathBuf::from(h).join(".cargo")))
        .unwrap_or_else(|| PathBuf::from("/root/.cargo"))
}

/// The nightly toolchain's LLVM: (major version, path of its shared libLLVM).
fn nightly_llvm() -> Result<(String, PathBuf)> {
    let vv = cmd::output(Command::new("rustc").args(["+nightly", "-vV"]))
        .context("rustc +nightly -vV failed")?;
    let version = vv
        .lines()
        .find_map(|l| l.strip_prefix("LLVM version: "))
        .context("rustc +nightly -vV printed no LLVM version")?;
    let major = version.split('.').next().unwrap_or(version).to_owned();
    let sysroot = cmd::output(Command::new("rustc").args(["+nightly", "--print", "sysroot"]))
        .context("rustc +nightly --print sysroot failed")?;
    let lib_dir = Path::new(sysroot.trim()).join("lib");
    // The SONAME form (libLLVM.so.MAJOR.MINOR-rust-...) is what bpf-linker records as
    // its dependency; prefer it over the libLLVM-MAJOR-rust-....so alias.
    let mut candidates: Vec<PathBuf> = std::fs::read_dir(&lib_dir)
        .with_context(|| format!("reading {}", lib_dir.display()))?
        .filter_map(|e| e.ok())
        .map(|e| e.path())
        .filter(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with("libLLVM.so.") || n.starts_with("libLLVM-"))
        })
        .collect();
    candidates.sort_by_key(|p| {
        !p.file_name()
            .and_then(|n| n.to_str())
            .is_some_and(|n| n.starts_with("libLLVM.so."))
    });
    let lib = candidates
        .into_iter()
        .next()
        .with_context(|| format!("no libLLVM shared library in {}", lib_dir.display()))?;
    Ok((major, lib))
}

fn ensure_bpf_linker() -> Result<()> {
    let (major, libllvm) = nightly_llvm()?;
    let stamp_value = format!("bpf-linker {BPF_LINKER_VERSION} llvm {}", libllvm.display());
    let stamp = cargo_home().join("sframe-profiler-bpf-linker.stamp");
    let runs = cmd::output(Command::new("bpf-linker").arg("--version")).is_some();
    if runs && std::fs::read_to_string(&stamp).is_ok_and(|s| s.trim() == stamp_value) {
        return Ok(());
    }
    if runs && !stamp.exists() && env::var_os("SFRAME_REBUILD_BPF_LINKER").is_none() {
        // Installed by other means; trust it (set SFRAME_REBUILD_BPF_LINKER=1 to replace it).
        return Ok(());
    }
    // bpf-linker links against a shared libLLVM found under LLVM_PREFIX/lib. Debian 12 has
    // no matching LLVM, so point it at the nightly toolchain's own library through a
    // prefix of symlinks. The binary's RUNPATH is that prefix: it must stay in place.
    let file_name = libllvm
        .file_name()
        .context("libLLVM path has no file name")?
        .to_owned();
    let prefix = cargo_home().join("sframe-llvm-prefix").join(&file_name);
    let lib = prefix.join("lib");
    std::fs::create_dir_all(&lib).with_context(|| format!("creating {}", lib.display()))?;
    for name in [std::ffi::OsString::from("libLLVM.so"), file_name.clone()] {
        let link = lib.join(&name);
        let _ = std::fs::remove_file(&link);
        std::os::unix::fs::symlink(&libllvm, &link)
            .with_context(|| format!("symlinking {} -> {}", link.display(), libllvm.display()))?;
    }
    let feature = format!("llvm-{major}");
    let mut install = Command::new("cargo");
    install
        .args(["+nightly", "install", "bpf-linker", "--force"])
        .args(["--version", BPF_LINKER_VERSION, "--no-default-features"])
        .args(["--features", &feature])
        .env("LLVM_PREFIX", &prefix);
    if let Err(err) = cmd::run(&mut install, "build bpf-linker against the nightly libLLVM") {
        bail!(
            "{err:#}\nby hand: LLVM_PREFIX={} cargo +nightly install bpf-linker --version {BPF_LINKER_VERSION} --no-default-features --features {feature}",
            prefix.display()
        );
    }
    if cmd::output(Command::new("bpf-linker").arg("--version")).is_none() {
        bail!(
            "bpf-linker was installed but does not run; is {} on PATH?",
            cargo_home().join("bin").display()
        );
    }
    std::fs::write(&stamp, stamp_value).with_context(|| format!("writing {}", stamp.display()))?;
    Ok(())
}

fn has_binary(name: &str) -> bool {
    cmd::output(Command::new("sh").args(["-c", &format!("command -v {name}")])).is_some()
}

fn package_installed(pkg: &str) -> bool {
    cmd::output(Command::new("dpkg-query").args(["-W", "-f=${Status}", pkg]))
        .is_some_and(|s| s.contains("install ok installed"))
}

/// How long apt waits for another apt or dpkg to release its lock.
const LOCK_TIMEOUT: &str = "DPkg::Lock::Timeout=900";

fn ensure_debian_packages() -> Result<()> {
    install_packages(DEBIAN_PACKAGES)
}

/// What the VM matrix needs: qemu for the guests' architecture and a static busybox
/// for their initramfs; for arm64 guests also the Rust target, a cross compiler and
/// Debian's arm64 libraries (multiarch: `dpkg --add-architecture arm64`).
pub fn ensure_vm_packages(arch: crate::vm::Arch) -> Result<()> {
    match arch {
        crate::vm::Arch::X86_64 => step("Debian packages for the VM matrix", || {
            install_packages(&[
                ("qemu-system-x86", "qemu-system-x86_64"),
                ("busybox-static", "busybox"),
            ])
        }),
        crate::vm::Arch::Aarch64 => {
            step("rustup target aarch64-unknown-linux-gnu", || {
                let installed =
                    cmd::output(Command::new("rustup").args(["target", "list", "--installed"]))
                        .unwrap_or_default();
                if installed
                    .lines()
                    .any(|l| l.trim() == "aarch64-unknown-linux-gnu")
                {
                    return Ok(());
                }
                cmd::run(
                    Command::new("rustup").args(["target", "add", "aarch64-unknown-linux-gnu"]),
                    "add the aarch64 Rust target",
                )
            })?;
            step("dpkg architecture arm64", || {
                let foreign =
                    cmd::output(Command::new("dpkg").arg("--print-foreign-architectures"))
                        .unwrap_or_default();
                if foreign.lines().any(|l| l.trim() == "arm64") {
                    return Ok(());
                }
                cmd::run(
                    cmd::privileged("dpkg").args(["--add-architecture", "arm64"]),
                    "dpkg --add-architecture arm64",
                )?;
                cmd::run(
                    cmd::privileged("apt-get").args(["update", "-q", "-o", LOCK_TIMEOUT]),
                    "apt-get update (arm64 lists)",
                )
            })?;
            step("Debian packages for the arm64 VM matrix", || {
                install_packages(&[
                    ("qemu-system-arm", "qemu-system-aarch64"),
                    ("gcc-aarch64-linux-gnu", "aarch64-linux-gnu-gcc"),
                    ("g++-aarch64-linux-gnu", "aarch64-linux-gnu-g++"),
                    ("libc6:arm64", "/lib/ld-linux-aarch64.so.1"),
                    (
                        "libstdc++6:arm64",
                        "/usr/lib/aarch64-linux-gnu/libstdc++.so.6",
                    ),
                    ("busybox-static", "busybox"),
                ])
            })
        }
    }
}

fn install_packages(packages: &[(&str, &str)]) -> Result<()> {
    let missing: Vec<&str> = packages
        .iter()
        .filter(|(pkg, probe)| {
            let present = if probe.starts_with('/') {
                std::path::Path::new(probe).exists()
            } else {
                has_binary(probe)
            };
            !present || !package_installed(pkg)
        })
        .map(|(pkg, _)| *pkg)
        .collect();
    if missing.is_empty() {
        return Ok(());
    }
    let by_hand = format!("apt-get update && apt-get install -y {}", missing.join(" "));
    let mut update = cmd::privileged("apt-get");
    // Another apt (unattended upgrades on a fresh cloud host) may hold the lock: wait.
    update.args(["update", "-q", "-o", LOCK_TIMEOUT]);
    cmd::run(&mut update, "apt-get update").with_context(|| format!("by hand: {by_hand}"))?;
    let mut install = cmd::privileged("apt-get");
    install
        .args([
            "install",
            "-y",
            "-q",
            "--no-install-recommends",
            "-o",
            LOCK_TIMEOUT,
        ])
        .args(&missing)
        .env("DEBIAN_FRONTEND", "noninteractive");
    cmd::run(&mut install, "install Debian packages").with_context(|| format!("by hand: {by_hand}"))
}

/// cargo-fuzz (built with the stable toolchain; the fuzz targets themselves build on
/// nightly, which `ensure_nightly` and `ensure_rust_src` provide).
fn ensure_cargo_fuzz() -> Result<()> {
    if cmd::output(Command::new("cargo").args(["fuzz", "--version"])).is_some() {
        return Ok(());
    }
    cmd::run(
        Command::new("cargo").args(["install", "cargo-fuzz", "--locked"]),
        "install cargo-fuzz (by hand: cargo install cargo-fuzz --locked)",
    )
}

/// py-spy (the bench's baseline for Python sampling: section 9), from PyPI, under
/// `target/tools/py-spy` (never in the system's Python).
fn ensure_py_spy() -> Result<()> {
    let dir = cmd::workspace_root().join("target/tools/py-spy");
    if dir.join("bin/py-spy").exists() {
        return Ok(());
    }
    // A Python with pip: the one on PATH (the image's default is pyenv's), pyenv's own,
    // else the system's.
    let pyenv =
        cmd::output(Command::new("pyenv").args(["which", "python3"])).map(|p| p.trim().to_owned());
    let python = ["python3".to_owned()]
        .into_iter()
        .chain(pyenv)
        .chain(["/usr/bin/python3".to_owned()])
        .find(|p| cmd::output(Command::new(p).args(["-m", "pip", "--version"])).is_some())
        .context("no python3 with pip to install py-spy with")?;
    cmd::run(
        Command::new(&python)
            .args([
                "-m",
                "pip",
                "install",
                "--quiet",
                "--disable-pip-version-check",
            ])
            .args(["--target"])
            .arg(&dir)
            .arg("py-spy")
            .env("PIP_ROOT_USER_ACTION", "ignore"),
        "install py-spy from PyPI (by hand: python3 -m pip install --target target/tools/py-spy py-spy)",
    )
}
