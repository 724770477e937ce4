//! The in-memory unwind table of one object: functions and their rows, in the normalized
//! rule type. The SFrame reader, the `.eh_frame` deriver and the PLT synthesizer produce
//! it; the SFrame writer and the BPF map flattener consume it.

use sframe_common::UnwindRule;

/// Architecture of the object the rows describe.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Arch {
    Amd64,
    Aarch64 { big_endian: bool },
    S390x,
}

/// How a function's rows are matched against a PC (SFrame's FDE types).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum PcType {
    /// Row start offsets are offsets from the function start (SFRAME_FDE_TYPE_PCINC).
    Inc,
    /// Row start offsets are matched against `(pc - start) % rep_size`
    /// (SFRAME_FDE_TYPE_PCMASK: a block of identical PLT entries).
    Mask { rep_size: u8 },
}

/// One row: from `start_offset` (relative to the function start) to the next row's start
/// or the function end, the rule holds. `rule: None` is an explicit "no rule here" range
/// (CFI that no supported rule expresses).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Row {
    pub start_offset: u32,
    pub rule: Option<UnwindRule>,
}

/// A function: its absolute start address (virtual address in the object, before any
/// load bias), its size in bytes, and its rows sorted by `start_offset`.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Function {
    pub start: u64,
    pub size: u32,
    pub pc_type: PcType,
    pub rows: Vec<Row>,
}

impl Function {
    pub fn end(&self) -> u64 {
        self.start.saturating_add(u64::from(self.size))
    }
}

/// Where a table came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Source {
    SFrame { version: u8 },
    EhFrame,
    DebugFrame,
    Synthesized,
}

/// All functions of one object, sorted by start address, non-overlapping.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UnwindTable {
    pub arch: Arch,
    pub source: Source,
    pub functions: Vec<Function>,
}

impl UnwindTable {
    pub fn row_count(&self) -> usize {
        self.functions.iter().map(|f| f.rows.len()).sum()
    }
}
