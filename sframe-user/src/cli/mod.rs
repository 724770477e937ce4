//! Subcommands of the `sframe-user` binary.

pub mod profile;
