//! Unwinding a stack on the host: from ELF objects, the interrupted registers and a copy
//! of the stack's bytes to the stack's frames.
//!
//! The tables are the profiler's (each object's `.sframe`, or rows derived from its
//! CFI, [`crate::objtable`]), laid out as in the kernel ([`crate::flatten`]), and the
//! frame step is the kernel walker's own (`sframe_common::step`): what this returns for a
//! stack is what the eBPF program would count for it.
//!
//! ```no_run
//! use sframe_user::unwinder::{Registers, Stack, Unwinder};
//!
//! let elf = std::fs::read("/usr/bin/some-program")?;
//! let mut unwinder = Unwinder::new();
//! // Mapped at 0x5555_5555_4000 from file offset 0 (a line of /proc/PID/maps).
//! unwinder.add_mapping(&elf, 0x5555_5555_4000, 0x5555_5557_0000, 0)?;
//! # let (pc, sp, fp) = (0, 0, 0);
//! # let stack_bytes = vec![0u8; 4096];
//! let unwound = unwinder.unwind(&Registers::new(pc, sp, fp), &Stack::new(sp, &stack_bytes));
//! for frame in &unwound.frames {
//!     println!("{:#x} (look up {:#x})", frame.pc, frame.lookup_address());
//! }
//! println!("{:?}", unwound.outcome);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

#![deny(missing_docs)]

pub use sframe_common::WalkOutcome;
use sframe_common::{
    budget::{MAX_FRAMES, MAX_MAPPINGS},
    layout::{MappingEntry, addr_bits},
    stack::{FRAME_EXACT, frame_pc},
    step::{Regs, TOP_REGS, WalkState, walk_step},
};

use crate::{
    flatten::{FlattenError, HostTables, RuleDict, flatten},
    objtable::{ObjTableError, ObjTableOptions, table_for_elf},
    segments,
    table::{Arch, Source},
};

/// Why an object could not be added.
#[derive(Debug, thiserror::Error)]
pub enum UnwinderError {
    /// No table could be built (not an ELF file, or no usable unwind information).
    #[error("no unwind table")]
    Table(#[from] ObjTableError),
    /// The table does not fit the kernel layout (too many rows or rules).
    #[error("the table does not fit the kernel layout")]
    Flatten(#[from] FlattenError),
    /// The object's architecture is not the one of the objects added before, or not one
    /// the unwinder walks (AMD64, little-endian AArch64).
    #[error("{object:?} code cannot be unwound with {unwinder:?} objects")]
    Architecture {
        /// The new object's.
        object: Arch,
        /// The objects' added before, if any.
        unwinder: Option<Arch>,
    },
    /// The file offset is in no `PT_LOAD` segment of the object.
    #[error("file offset {0:#x} is in no loadable segment")]
    NoSegment(u64),
    /// The range is empty or overlaps a mapping added before.
    #[error("[{start:#x}, {end:#x}) is empty or overlaps another mapping")]
    Overlap {
        /// Start of the rejected mapping.
        start: u64,
        /// End of the rejected mapping.
        end: u64,
    },
    /// The walker searches at most this many mappings.
    #[error("more than {MAX_MAPPINGS} mappings")]
    TooManyMappings,
}

/// Identifies an object added to an [`Unwinder`] (in the order they were added, from 0).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ObjectId(pub u32);

/// What the unwinder knows of one added object.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ObjectSummary {
    /// Where its table came from.
    pub source: Source,
    /// Rows of its table.
    pub rows: usize,
    /// Rows whose rule the walker cannot apply (it falls back to frame pointers there).
    pub unencodable_rows: u64,
}

/// The registers of the interrupted frame.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Registers {
    /// Program counter.
    pub pc: u64,
    /// Stack pointer.
    pub sp: u64,
    /// Frame pointer (rbp, x29).
    pub fp: u64,
    /// Every register by DWARF number, as far as known (0 otherwise): rules of the top
    /// frame may name any of them. On AArch64 the link register (x30, DWARF 30) is needed
    /// for a sample in a leaf function before it saved it.
    pub dwarf: [u64; TOP_REGS],
}

impl Registers {
    /// PC, SP and FP, other registers unknown.
    pub fn new(pc: u64, sp: u64, fp: u64) -> Self {
        Self {
            pc,
            sp,
            fp,
            dwarf: [0; TOP_REGS],
        }
    }

    /// With DWARF register `number` set to `value` (ignored past the registers the
    /// walker keeps).
    pub fn with(mut self, number: u16, value: u64) -> Self {
        if let Some(r) = self.dwarf.get_mut(usize::from(number)) {
            *r = value;
        }
        self
    }
}

/// A copy of stack memory: `bytes[0]` was at address `base` (usually the SP).
#[derive(Clone, Copy, Debug)]
pub struct Stack<'a> {
    /// Address of `bytes[0]`.
    pub base: u64,
    /// The copied bytes.
    pub bytes: &'a [u8],
}

impl<'a> Stack<'a> {
    /// `bytes` copied from address `base`.
    pub fn new(base: u64, bytes: &'a [u8]) -> Self {
        Self { base, bytes }
    }

    fn word(&self, addr: u64, big_endian: bool) -> Option<u64> {
        let off = usize::try_from(addr.checked_sub(self.base)?).ok()?;
        let bytes: [u8; 8] = self.bytes.get(off..off.checked_add(8)?)?.try_into().ok()?;
        Some(if big_endian {
            u64::from_be_bytes(bytes)
        } else {
            u64::from_le_bytes(bytes)
        })
    }
}

/// How a frame's PC was found.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum FrameKind {
    /// The interrupted PC (the innermost frame).
    Interrupted,
    /// A return address: the call is the instruction before it.
    ReturnAddress,
    /// An exact PC restored from a signal frame (the interrupted PC of the code the
    /// signal arrived in).
    Signal,
}

/// One frame, innermost first.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Frame {
    /// The PC (return addresses as found on the stack, pointer-authentication bits cut).
    pub pc: u64,
    /// How it was found.
    pub kind: FrameKind,
    /// The object whose mapping holds `pc`, and `pc`'s object virtual address.
    pub object: Option<(ObjectId, u64)>,
}

impl Frame {
    /// The address to symbolize: the call instruction's for a return address (`pc − 1`,
    /// the call may be a function's last instruction), else `pc`.
    ///
    /// ```
    /// use sframe_user::unwinder::{Frame, FrameKind};
    ///
    /// let f = |kind| Frame { pc: 0x1000, kind, object: None };
    /// assert_eq!(f(FrameKind::ReturnAddress).lookup_address(), 0xfff);
    /// assert_eq!(f(FrameKind::Signal).lookup_address(), 0x1000);
    /// assert_eq!(f(FrameKind::Interrupted).lookup_address(), 0x1000);
    /// ```
    pub fn lookup_address(&self) -> u64 {
        match self.kind {
            FrameKind::ReturnAddress => self.pc.wrapping_sub(1),
            FrameKind::Interrupted | FrameKind::Signal => self.pc,
        }
    }
}

/// The result of one unwind.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Unwound {
    /// Frames, innermost first (at most `MAX_FRAMES`).
    pub frames: Vec<Frame>,
    /// Why the walk ended: [`WalkOutcome::Complete`] when it reached the outermost frame.
    pub outcome: WalkOutcome,
    /// Frames unwound with a table rule.
    pub frames_from_table: u32,
    /// Frames unwound by following frame pointers (code without a table).
    pub frames_from_fp: u32,
}

/// Unwinds stacks of one address space from the tables of its objects.
#[derive(Debug, Default)]
pub struct Unwinder {
    arch: Option<Arch>,
    tables: HostTables,
    dict: RuleDict,
    /// What was built for each object, by [`ObjectId`]; `tables.mappings` is sorted by
    /// start.
    objects: Vec<ObjectSummary>,
    options: ObjTableOptions,
}

impl Unwinder {
    /// An unwinder with no objects, building tables with the default options.
    pub fn new() -> Self {
        Self::default()
    }

    /// An unwinder building tables with `options` (e.g. where separate debug files are).
    pub fn with_options(options: ObjTableOptions) -> Self {
        Self {
            options,
            ..Self::default()
        }
    }

    /// Adds the ELF image `elf`, mapped executable at `[start, end)` from file offset
    /// `file_offset` (the fields of a `/proc/PID/maps` line). Builds its table.
    pub fn add_mapping(
        &mut self,
        elf: &[u8],
        start: u64,
        end: u64,
        file_offset: u64,
    ) -> Result<ObjectId, UnwinderError> {
        let bias = segments::mapping_bias(&segments::segments(elf), start, file_offset)
            .ok_or(UnwinderError::NoSegment(file_offset))?;
        self.add_object(elf, start, end, bias)
    }

    /// Adds the ELF image `elf` whose code at object virtual address `v` runs at
    /// `v + bias`, for PCs in `[start, end)`. Builds its table.
    pub fn add_object(
        &mut self,
        elf: &[u8],
        start: u64,
        end: u64,
        bias: u64,
    ) -> Result<ObjectId, UnwinderError> {
        if start >= end
            || self
                .tables
                .mappings
                .iter()
                .any(|m| m.start < end && start < m.end)
        {
            return Err(UnwinderError::Overlap { start, end });
        }
        if self.tables.mappings.len() >= MAX_MAPPINGS {
            return Err(UnwinderError::TooManyMappings);
        }
        let table = table_for_elf(elf, &self.options)?;
        let arch = table.table.arch;
        let walkable = matches!(arch, Arch::Amd64 | Arch::Aarch64 { big_endian: false });
        if !walkable || self.arch.is_some_and(|a| a != arch) {
            return Err(UnwinderError::Architecture {
                object: arch,
                unwinder: self.arch,
            });
        }
        let flat = flatten(&table.table, &mut self.dict)?;
        self.arch = Some(arch);
        let id = self.tables.add_object(&flat);
        self.tables.rules = self.dict.rules().to_vec();
        let at = self.tables.mappings.partition_point(|m| m.start < start);
        self.tables.mappings.insert(
            at,
            MappingEntry {
                start,
                end,
                bias,
                object: id,
                flags: 0,
            },
        );
        let max_end = self
            .tables
            .mappings
            .iter()
            .map(|m| m.end)
            .max()
            .unwrap_or(0);
        self.tables.addr_bits = addr_bits(matches!(arch, Arch::Aarch64 { .. }), max_end);
        self.objects.push(ObjectSummary {
            source: table.source,
            rows: table.table.row_count(),
            unencodable_rows: flat.unencodable_rows,
        });
        Ok(ObjectId(id))
    }

    /// What was built for an object.
    pub fn object(&self, id: ObjectId) -> Option<&ObjectSummary> {
        self.objects.get(id.0 as usize)
    }

    /// Unwinds the stack of a thread interrupted with `regs`, reading stack words from
    /// `stack` only (a word outside it ends the walk with [`WalkOutcome::ReadFault`]).
    /// Bounded: at most `MAX_FRAMES` frames, each a fixed number of lookup steps.
    pub fn unwind(&self, regs: &Registers, stack: &Stack<'_>) -> Unwound {
        let big_endian = matches!(self.arch, Some(Arch::Aarch64 { big_endian: true }));
        let mut st = Box::<WalkState>::default();
        st.top = regs.dwarf;
        st.start(Regs {
            pc: regs.pc,
            sp: regs.sp,
            fp: regs.fp,
        });
        let mut read = |addr: u64| stack.word(addr, big_endian);
        let mut frames = Vec::new();
        let mut going = true;
        while going && frames.len() < MAX_FRAMES {
            let recorded = st.stack.len;
            going = walk_step(&mut st, &mut &self.tables, &mut read);
            if st.stack.len == recorded {
                break;
            }
            let Some(&word) = st.stack.frames.get(recorded as usize % MAX_FRAMES) else {
                break;
            };
            let pc = frame_pc(word);
            let kind = match (frames.is_empty(), word & FRAME_EXACT != 0) {
                (true, _) => FrameKind::Interrupted,
                (false, true) => FrameKind::Signal,
                (false, false) => FrameKind::ReturnAddress,
            };
            frames.push(Frame {
                pc,
                kind,
                object: self.object_at(pc),
            });
        }
        Unwound {
            frames,
            outcome: WalkOutcome::try_from(st.outcome).unwrap_or(WalkOutcome::Truncated),
            frames_from_table: st.frames_from_table,
            frames_from_fp: st.frames_from_fp,
        }
    }

    fn object_at(&self, pc: u64) -> Option<(ObjectId, u64)> {
        let m = self
            .tables
            .mappings
            .iter()
            .find(|m| m.start <= pc && pc < m.end)?;
        Some((ObjectId(m.object), pc.wrapping_sub(m.bias)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn objects_that_cannot_be_walked_are_refused_with_the_reason() {
        let mut u = Unwinder::new();
        assert!(matches!(
            u.add_object(b"not an ELF file", 0x1000, 0x2000, 0),
            Err(UnwinderError::Table(_))
        ));
        assert!(matches!(
            u.add_object(b"", 0x2000, 0x1000, 0),
            Err(UnwinderError::Overlap { .. })
        ));
        let exe = std::fs::read(std::env::current_exe().unwrap()).unwrap();
        let id = u.add_object(&exe, 0x10_0000, 0x20_0000, 0).unwrap();
        assert_eq!(id, ObjectId(0));
        assert!(u.object(id).unwrap().rows > 0);
        assert!(matches!(
            u.add_object(&exe, 0x1f_0000, 0x30_0000, 0),
            Err(UnwinderError::Overlap { .. })
        ));
        assert!(matches!(
            u.add_mapping(&exe, 0x40_0000, 0x50_0000, 1 << 40),
            Err(UnwinderError::NoSegment(_))
        ));
    }

    #[test]
    fn a_stack_outside_every_mapping_ends_at_once() {
        let u = Unwinder::new();
        let bytes = [0u8; 64];
        let unwound = u.unwind(
            &Registers::new(0x1234, 0x8000, 0),
            &Stack::new(0x8000, &bytes),
        );
        assert_eq!(unwound.outcome, WalkOutcome::NoMapping);
        assert_eq!(unwound.frames.len(), 1);
        assert_eq!(unwound.frames[0].kind, FrameKind::Interrupted);
        assert_eq!(unwound.frames[0].object, None);
    }

    #[test]
    fn stack_words_are_read_only_from_the_copy() {
        let bytes: Vec<u8> = (0u8..16).collect();
        let s = Stack::new(0x1000, &bytes);
        assert_eq!(s.word(0x1000, false), Some(0x0706_0504_0302_0100));
        assert_eq!(s.word(0x1008, true), Some(0x0809_0a0b_0c0d_0e0f));
        assert_eq!(s.word(0x1009, false), None);
        assert_eq!(s.word(0xfff, false), None);
        assert_eq!(s.word(u64::MAX - 3, false), None);
    }
}
