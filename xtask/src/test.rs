//! `cargo xtask test`: everything CI checks, in order of cost, then the VM kernel matrices
//! (`vm-test`, x86-64 and arm64), then `bench --quick`
//! (the benchmark harness must run; its numbers are not asserted), then every fuzz target
//! for a bounded time (a crash fails the run).

use std::process::Command;

use anyhow::Result;
use clap::Args;

use crate::{cmd, setup};

#[derive(Args)]
pub struct TestArgs {
    /// Seconds each fuzz target runs after the tests (0: skip fuzzing).
    #[arg(long, default_value_t = DEFAULT_FUZZ_SECONDS)]
    fuzz_seconds: u64,
    /// Leave out the VM kernel matrix (`cargo xtask vm-test`); refused under CI.
    #[arg(long)]
    skip_vm: bool,
    /// Only this architecture's VM kernel matrix (default: x86-64 and arm64); refused
    /// under CI.
    #[arg(long, value_enum)]
    arch: Option<crate::vm::Arch>,
    /// Extra arguments for `cargo test` (e.g. a test name filter).
    #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
    cargo_test_args: Vec<String>,
}

/// Per fuzz target (four targets: two minutes of fuzzing in all).
const DEFAULT_FUZZ_SECONDS: u64 = 30;

/// The BPF target and the cfg aya-build passes, so clippy sees the same code.
const BPF_TARGET: &str = "bpfel-unknown-none";

pub fn test(args: TestArgs) -> Result<()> {
    if (args.skip_vm || args.arch.is_some()) && std::env::var_os("CI").is_some_and(|v| v == "true")
    {
        anyhow::bail!(
            "--skip-vm and --arch are refused under CI=true: both kernel matrices are part of \
             the checks"
        );
    }
    setup::setup()?;
    let root = cmd::workspace_root();
    let cargo = || {
        let mut c = Command::new("cargo");
        c.current_dir(&root);
        c
    };

    cmd::run(cargo().args(["fmt", "--all", "--check"]), "cargo fmt")?;
    cmd::run(
        cargo().args(["clippy", "--all-targets", "--", "-D", "warnings"]),
        "clippy (host crates)",
    )?;
    cmd::run(
        cargo()
            .args([
                "+nightly",
                "clippy",
                "--package",
                "sframe-ebpf",
                "--release",
            ])
            .args(["--target", BPF_TARGET, "-Z", "build-std=core"])
            .args(["--target-dir", "target/bpf-clippy", "--", "-D", "warnings"])
            .env(
                "CARGO_ENCODED_RUSTFLAGS",
                format!("--cfg=bpf_target_arch=\"{}\"", std::env::consts::ARCH),
            ),
        "clippy (BPF crate)",
    )?;
    cmd::run(
        cargo().arg("test").args(&args.cargo_test_args),
        "unit and BPF tests",
    )?;
    // The library alone (`default-features = false`): it builds on stable without the
    // profiler's dependencies, its documentation examples compile and run, and the
    // example unwinds its own stack completely.
    let library = ["-p", "sframe-user", "--no-default-features"];
    cmd::run(
        cargo()
            .arg("clippy")
            .args(library)
            .args(["--lib", "--examples", "--", "-D", "warnings"]),
        "clippy (the library without the profiler)",
    )?;
    cmd::run(
        cargo().arg("test").args(library).arg("--doc"),
        "doc tests (the library)",
    )?;
    // Its documentation (every public item has some: `missing_docs`) links only to
    // what exists, with and without the profiler.
    for features in [
        &library[..],
        &["-p", "sframe-user", "-p", "sframe-common"][..],
    ] {
        cmd::run(
            cargo()
                .arg("doc")
                .args(features)
                .arg("--no-deps")
                .env("RUSTDOCFLAGS", "-D warnings"),
            "cargo doc (broken links are errors)",
        )?;
    }
    cmd::run(
        cargo()
            .arg("run")
            .args(library)
            .args(["--example", "unwind_self"]),
        "example unwind_self (the library)",
    )?;
    if args.skip_vm {
        eprintln!("xtask: SKIPPED the VM kernel matrix (--skip-vm)");
    } else {
        // Both architectures: x86-64 (Debian's 6.1 and 6.12, then this machine's kernel)
        // and arm64 (Debian's arm64 6.1 and 6.12 under TCG, the profiler cross-built).
        for (arch, name) in [
            (crate::vm::Arch::X86_64, "x86-64"),
            (crate::vm::Arch::Aarch64, "arm64"),
        ]
        .into_iter()
        .filter(|(a, _)| args.arch.is_none_or(|only| only == *a))
        {
            let started = std::time::Instant::now();
            crate::vm::vm_test(crate::vm::VmTestArgs::for_arch(arch))?;
            eprintln!(
                "xtask: the {name} VM kernel matrix took {:.0} s",
                started.elapsed().as_secs_f64()
            );
        }
    }
    let started = std::time::Instant::now();
    crate::bench::quick_check()?;
    eprintln!(
        "xtask: bench --quick took {:.0} s",
        started.elapsed().as_secs_f64()
    );
    if args.fuzz_seconds > 0 {
        crate::fuzz::run_all(args.fuzz_seconds)?;
    }
    Ok(())
}
