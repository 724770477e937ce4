//! `sframe-user`: the profiler's command line.
//!
//! Without a subcommand it profiles the processes given with `--pid`; the subcommands
//! inspect unwind tables of files.

mod cli;

use clap::{Parser, Subcommand};

/// Samples and unwinds user stacks of running processes with an eBPF perf-event program.
#[derive(Parser, Debug)]
#[command(
    name = "sframe-user",
    version,
    about,
    args_conflicts_with_subcommands = true
)]
struct Cli {
    #[command(subcommand)]
    command: Option<Command>,
    #[command(flatten)]
    profile: cli::profile::ProfileArgs,
}

#[derive(Subcommand, Debug)]
enum Command {
    #[command(flatten)]
    Tables(cli::tables::TablesCommand),
}

#[tokio::main]
async fn main() {
    sframe_user::privileges::init_logging();
    let cli = Cli::parse();
    let result = match cli.command {
        None => cli::profile::run(cli.profile).await,
        Some(Command::Tables(cmd)) => std::process::exit(cli::tables::run(cmd)),
    };
    if let Err(err) = result {
        eprintln!("sframe-user: error: {err:#}");
        std::process::exit(1);
    }
}
