//! `sframe-user`: the profiler's command line.
//!
//! Without a subcommand it profiles: the whole system by default, or the processes of
//! `--pid`, `--cgroup` or a command given after `--`; the subcommands inspect unwind
//! tables of files and check what the kernel supports.

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
    /// Load every BPF program into the running kernel (without attaching it) and print
    /// the verifier's instruction count for each; exit 1 if any is rejected.
    CheckKernel,
    /// Rebuild a flame graph of a window from the stack series a Prometheus server
    /// holds (queried over its HTTP API), as SVG or folded stacks.
    PromqlFlamegraph(cli::promql_flamegraph::PromqlFlamegraphArgs),
}

/// Heap bytes counted per thread: the symbolizers' state is bounded in bytes with it
/// (`sframe_user::heap`).
#[global_allocator]
static HEAP: sframe_user::heap::Counting = sframe_user::heap::Counting;

fn main() {
    sframe_user::objects::single_heap_arena();
    sframe_user::privileges::init_logging();
    let cli = Cli::parse();
    // With --drop-privileges everything runs on this one thread (capabilities are per
    // thread and must be dropped before any other starts); otherwise tokio's workers
    // serve the metrics beside the profiler's loop.
    let runtime = if cli.command.is_none() && cli.profile.drop_privileges {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
    } else {
        tokio::runtime::Builder::new_multi_thread()
            .enable_all()
            .build()
    };
    let runtime = match runtime {
        Ok(r) => r,
        Err(err) => {
            eprintln!("sframe-user: error: starting the async runtime: {err}");
            std::process::exit(1);
        }
    };
    let result = runtime.block_on(async {
        match cli.command {
            None => cli::profile::run(cli.profile).await,
            Some(Command::Tables(cmd)) => std::process::exit(cli::tables::run(cmd)),
            Some(Command::CheckKernel) => std::process::exit(cli::check_kernel::run()),
            Some(Command::PromqlFlamegraph(args)) => cli::promql_flamegraph::run(args).await,
        }
    });
    if let Err(err) = result {
        eprintln!("sframe-user: error: {err:#}");
        std::process::exit(1);
    }
}
