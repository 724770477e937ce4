//! Subcommands of the `sframe-user` binary.

pub mod check_kernel;
mod elf_add;
pub mod profile;
pub mod tables;
