//! SFrame (`.sframe`) support: a zero-copy, validating reader for versions 1, 2 and 3,
//! lookups with GNU libsframe's `sframe_find_fre` semantics, a writer for versions 2
//! (PC-relative) and 3, and an `objdump --sframe`-compatible dumper.
//!
//! Reference: binutils' `libsframe/doc/sframe-spec.texi` and `include/sframe.h`.
//! The reader converts sections into the shared [`crate::table::UnwindTable`] with
//! the normalized [`sframe_common::UnwindRule`]; the writer consumes that table.

mod convert;
pub mod dump;
pub mod error;
pub mod header;
pub mod lookup;
pub mod read;
mod scan;
pub mod write;

#[cfg(test)]
mod tests;

pub use convert::{
    Comparison, Disagreement, StorableSection, compare_tables, section_stores_rule, write_storable,
};
pub use dump::{dump, dump_to_string};
pub use error::{FlexProblem, SFrameError, Subsection, WriteError};
pub use header::{Abi, Endian, Header};
pub use lookup::{FoundRule, lookup_line};
pub use read::{Fde, FdeIter, Fre, FreIter, MAX_FUNCTIONS, MAX_SECTION_ROWS, Section};
pub use write::{WriteOptions, WriteStats, WriteVersion, stores_rule, write_section};
