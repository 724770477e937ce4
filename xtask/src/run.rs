//! `cargo xtask run -- ARGS`.

use anyhow::{Result, bail};
use clap::Args;

use crate::{cmd, setup};

#[derive(Args)]
pub struct RunArgs {
    /// Build in debug mode instead of release.
    #[arg(long)]
    debug: bool,
    /// The architecture to build and run for: only this machine's own can run here
    /// (another is built with `cargo xtask build --arch`, tested with `vm-test --arch`).
    #[arg(long, value_enum)]
    arch: Option<crate::vm::Arch>,
    /// Arguments passed to sframe-user.
    #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
    args: Vec<String>,
}

pub fn run(args: RunArgs) -> Result<()> {
    if let Some(arch) = args.arch
        && arch != crate::vm::Arch::host()
    {
        bail!(
            "a {arch:?} sframe-user cannot run on this {:?} machine: build it with `cargo xtask \
             build --arch {arch:?}` and run target/…/release/sframe-user on such a host, or \
             run the profiler's tests in emulated kernels of that architecture with `cargo \
             xtask vm-test --arch {arch:?}`",
            crate::vm::Arch::host()
        );
    }
    setup::setup()?;
    let bin = cmd::build_sframe_user_bin("sframe-user", args.debug)?;
    let mut run = cmd::privileged(&bin.to_string_lossy());
    run.args(&args.args);
    let status = run.status()?;
    if !status.success() {
        // sframe-user printed its own error; pass its exit code on.
        match status.code() {
            Some(code) => std::process::exit(code),
            None => bail!("sframe-user was killed ({status})"),
        }
    }
    Ok(())
}
