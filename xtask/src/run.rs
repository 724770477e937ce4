//! `cargo xtask run -- ARGS`.

use anyhow::{Result, bail};
use clap::Args;

use crate::{cmd, setup};

#[derive(Args)]
pub struct RunArgs {
    /// Build in debug mode instead of release.
    #[arg(long)]
    debug: bool,
    /// Arguments passed to sframe-user.
    #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
    args: Vec<String>,
}

pub fn run(args: RunArgs) -> Result<()> {
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
