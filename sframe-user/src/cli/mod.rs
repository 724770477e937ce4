//! Subcommands of the `sframe-user` binary.

mod elf_add;
pub mod profile;
pub mod tables;
