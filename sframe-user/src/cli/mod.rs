//! Subcommands of the `sframe-user` binary.

pub mod check_kernel;
pub mod command;
mod elf_add;
pub mod profile;
pub mod promql_flamegraph;
pub mod tables;
