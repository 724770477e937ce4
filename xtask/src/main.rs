//! `cargo xtask`: the project's task runner.
//!
//! - `setup`: provision what a fresh machine lacks (nightly rust-src, bpf-linker built
//!   against the nightly toolchain's own LLVM, Debian packages the tests use).
//! - `run -- ARGS`: setup, build, run `sframe-user ARGS` (through `sudo -E` unless root).
//! - `test`: setup, then everything CI checks, `bench --quick --strict`, then every fuzz
//!   target for a bounded time.
//! - `fuzz [--seconds N] [--target NAME]`: seed corpora and longer fuzzing runs.
//! - `bench [--quick] [--strict]`: BPF cost, kernel memory, table build and upload time,
//!   time to the first complete stack, overhead on the workload and accuracy against
//!   baselines, the profiler's own cost when profiling the whole machine; writes
//!   `BENCHMARKS.md`.
//! - `build [--arch A]`: the release sframe-user, cross-compiled for aarch64 on request.
//! - `vm-test [--arch A] [--kernel K]`: the kernel matrix (Debian's 6.1 and 6.12 under
//!   qemu, and the host's kernel): the profiler's end-to-end tests in each.
//! - `soak [--minutes N]`: whole-system profiling under churn; RSS and kernel table
//!   memory must stay flat.

mod bench;
mod cmd;
mod fleet;
mod fuzz;
mod run;
mod setup;
mod test;
mod vm;

use anyhow::Result;
use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(name = "cargo xtask", about = "Tasks of the sframe profiler workspace")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Install what this machine lacks to build and test (idempotent, fast when done).
    Setup,
    /// Build and run sframe-user with the given arguments (as root).
    Run(run::RunArgs),
    /// Run every check CI runs: fmt, clippy (host and BPF crates), all tests, bench --quick.
    Test(test::TestArgs),
    /// Build the seed corpora and run the cargo-fuzz targets (nightly) for a while.
    Fuzz(fuzz::FuzzArgs),
    /// Measure against baselines in one run (as root) and write BENCHMARKS.md.
    Bench(bench::BenchArgs),
    /// Whole-system profiling under process churn for minutes: RSS and kernel table
    /// memory must stay flat (not part of `test`).
    Soak(fleet::SoakArgs),
    /// Load this machine as a busy host would be (compile churn, no-frame-pointer
    /// spinners, python3, one CPU hog per CPU) for a while, e.g. beside `cargo xtask test`.
    Stress(bench::StressArgs),
    /// Build the release sframe-user, for another architecture with --arch aarch64.
    Build(vm::BuildArgs),
    /// The kernel matrix: boot Debian's kernels (6.1, 6.12) under qemu and run the
    /// profiler's end-to-end tests in each, and on this machine's kernel.
    VmTest(vm::VmTestArgs),
    /// The tests one kernel of the matrix runs (started inside the guest).
    #[command(hide = true)]
    VmGuest(vm::guest::GuestArgs),
}

fn main() -> Result<()> {
    match Cli::parse().command {
        Command::Setup => setup::setup(),
        Command::Run(args) => run::run(args),
        Command::Test(args) => test::test(args),
        Command::Fuzz(args) => fuzz::fuzz(args),
        Command::Bench(args) => bench::bench(args),
        Command::Soak(args) => fleet::soak(args),
        Command::Stress(args) => bench::stress(args),
        Command::VmTest(args) => vm::vm_test(args),
        Command::Build(args) => vm::build(args),
        Command::VmGuest(args) => vm::guest::guest(args),
    }
}
