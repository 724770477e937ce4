//! DWARF register numbers, one table per architecture. The CFI deriver, the SFrame
//! reader and writer, the kernel rule encoder and the kernel's capture of the
//! interrupted registers all take them from here.

/// The DWARF numbers of the registers the unwinder names, for one architecture.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct DwarfRegs {
    /// Stack pointer.
    pub sp: u16,
    /// Frame pointer.
    pub fp: u16,
    /// Where the return address is (AMD64: the RIP column; AArch64: x30, the link
    /// register; s390x: r14).
    pub ra: u16,
    /// Registers numbered `0..count` that the kernel captures for the top frame.
    pub count: u16,
}

impl DwarfRegs {
    /// `(sp, fp)`.
    pub const fn sp_fp(&self) -> (u16, u16) {
        (self.sp, self.fp)
    }
}

/// AMD64 (System V psABI): rax rdx rcx rbx rsi rdi rbp rsp r8..r15, then RIP (16).
pub const AMD64: DwarfRegs = DwarfRegs {
    sp: 7,
    fp: 6,
    ra: 16,
    count: 17,
};

/// AArch64 (AAPCS64 DWARF): x0..x30, then SP (31).
pub const AARCH64: DwarfRegs = DwarfRegs {
    sp: 31,
    fp: 29,
    ra: 30,
    count: 32,
};

/// s390x (ELF ABI): r0..r15; read by the SFrame reader only, not profiled.
pub const S390X: DwarfRegs = DwarfRegs {
    sp: 15,
    fp: 11,
    ra: 14,
    count: 16,
};

const _: () = assert!(AMD64.count as usize <= crate::step::TOP_REGS);
const _: () = assert!(AARCH64.count as usize <= crate::step::TOP_REGS);
const _: () = assert!(AMD64.sp < AMD64.count && AARCH64.sp < AARCH64.count);
