//! SFrame sections built byte by byte from the binutils spec (`sframe-spec.texi`,
//! `include/sframe.h`), independently of the crate's writer: for what the writer cannot
//! produce (s390x register encodings, fixed FP offsets, hand-picked FLEX words, v1/v2
//! layouts, byte orders) and for malformed records at known offsets. Also a minimal ELF
//! file around a section, for the command line.

pub const ABI_AARCH64_BE: u8 = 1;
pub const ABI_AARCH64_LE: u8 = 2;
pub const ABI_AMD64: u8 = 3;
pub const ABI_S390X: u8 = 4;

pub const F_SORTED: u8 = 0x1;
pub const F_FRAME_POINTER: u8 = 0x2;
pub const F_PCREL: u8 = 0x4;

/// FDE info bits (besides the FRE type in bits 0..3).
pub const INFO_PCMASK: u8 = 0x10;
pub const INFO_PAUTH_KEY_B: u8 = 0x20;
pub const INFO_SIGNAL: u8 = 0x80;
/// v3 info2: the FLEX FDE type.
pub const INFO2_FLEX: u8 = 1;

/// FRE info bits (besides the word count and size).
pub const FRE_BASE_SP: u8 = 0x1;
pub const FRE_MANGLED_RA: u8 = 0x80;

/// Marks a data word as an unsigned FLEX control word (it is stored without the mark):
/// the word size is chosen so that control words fit unsigned, offsets signed.
pub const CTL: i64 = 1 << 40;

fn is_ctl(w: i64) -> bool {
    (CTL..CTL + (1 << 32)).contains(&w)
}

/// A FLEX control word: DWARF register `reg` (reg_p = 1), dereference or not.
pub fn ctl_reg(reg: u32, deref: bool) -> i64 {
    CTL | i64::from((reg << 3) | (u32::from(deref) << 1) | 1)
}

/// A FLEX control word for a CFA-based rule (reg_p = 0): `*(CFA + off)` when `deref`.
/// (`ctl_cfa(false)` is 0: the padding word.)
pub fn ctl_cfa(deref: bool) -> i64 {
    CTL | i64::from(u32::from(deref) << 1)
}

/// A raw control word (reserved bits and all).
pub fn ctl_raw(word: u32) -> i64 {
    CTL | i64::from(word)
}

/// One FRE: start offset, info bits (`FRE_BASE_SP`, `FRE_MANGLED_RA`; count and word
/// size are filled in), data words.
#[derive(Clone, Debug)]
pub struct Fre {
    pub start: u32,
    pub info: u8,
    pub words: Vec<i64>,
    /// Word size in bytes (1, 2, 4); `None`: the smallest that holds every word.
    pub word_size: Option<usize>,
}

impl Fre {
    pub fn sp(start: u32, words: &[i64]) -> Self {
        Fre {
            start,
            info: FRE_BASE_SP,
            words: words.to_vec(),
            word_size: None,
        }
    }
    pub fn fp(start: u32, words: &[i64]) -> Self {
        Fre {
            start,
            info: 0,
            words: words.to_vec(),
            word_size: None,
        }
    }
    pub fn mangled(mut self) -> Self {
        self.info |= FRE_MANGLED_RA;
        self
    }
    pub fn size(mut self, bytes: usize) -> Self {
        self.word_size = Some(bytes);
        self
    }
}

/// One function: absolute start address, size, FDE info bits (`INFO_*`, the FRE type
/// is `fre_type`), v3 info2, rep_size, rows.
#[derive(Clone, Debug)]
pub struct Func {
    pub start: u64,
    pub size: u32,
    pub fre_type: u8,
    pub info: u8,
    pub info2: u8,
    pub rep_size: u8,
    pub fres: Vec<Fre>,
}

impl Func {
    pub fn new(start: u64, size: u32, fres: Vec<Fre>) -> Self {
        let fre_type = if size < 0x100 {
            0
        } else if size < 0x1_0000 {
            1
        } else {
            2
        };
        Func {
            start,
            size,
            fre_type,
            info: 0,
            info2: 0,
            rep_size: 0,
            fres,
        }
    }
    pub fn flex(mut self) -> Self {
        self.info2 |= INFO2_FLEX;
        self
    }
    pub fn info(mut self, bits: u8) -> Self {
        self.info |= bits;
        self
    }
}

/// A section: header fields and functions (FDEs in the given order).
#[derive(Clone, Debug)]
pub struct Spec {
    pub version: u8,
    pub flags: u8,
    pub abi: u8,
    pub fixed_fp: i8,
    pub fixed_ra: i8,
    pub vaddr: u64,
    pub funcs: Vec<Func>,
}

impl Spec {
    /// Sorted, PC-relative (v2/v3) or sorted (v1), no fixed offsets except AMD64's RA -8.
    pub fn new(version: u8, abi: u8, vaddr: u64, funcs: Vec<Func>) -> Self {
        Spec {
            version,
            flags: if version == 1 {
                F_SORTED
            } else {
                F_SORTED | F_PCREL
            },
            abi,
            fixed_fp: 0,
            fixed_ra: if abi == ABI_AMD64 { -8 } else { 0 },
            vaddr,
            funcs,
        }
    }
    pub fn big_endian(&self) -> bool {
        matches!(self.abi, ABI_AARCH64_BE | ABI_S390X)
    }
}

/// The bytes of a section and where its records are.
#[derive(Clone, Debug)]
pub struct Built {
    pub bytes: Vec<u8>,
    pub be: bool,
    /// Offset of each FDE (v3: FDE index entry).
    pub fde: Vec<usize>,
    /// Offset of each function's FRE data: the v3 attribute record, else the first FRE.
    pub data: Vec<usize>,
    /// Offset of each FRE, per function.
    pub fre: Vec<Vec<usize>>,
    /// Start of the FRE sub-section.
    pub fres_start: usize,
}

impl Built {
    pub fn put(&mut self, off: usize, width: usize, v: u64) {
        let b = v.to_be_bytes();
        let src = &b[8 - width..];
        for i in 0..width {
            self.bytes[off + i] = if self.be { src[i] } else { src[width - 1 - i] };
        }
    }
    pub fn get(&self, off: usize, width: usize) -> u64 {
        let mut v = 0u64;
        for i in 0..width {
            let byte = if self.be {
                self.bytes[off + i]
            } else {
                self.bytes[off + width - 1 - i]
            };
            v = (v << 8) | u64::from(byte);
        }
        v
    }
}

fn push(out: &mut Vec<u8>, be: bool, width: usize, v: u64) {
    let b = v.to_be_bytes();
    let src = &b[8 - width..];
    if be {
        out.extend_from_slice(src);
    } else {
        out.extend(src.iter().rev());
    }
}

fn word_size_for(words: &[i64]) -> usize {
    let fits = |bits: u32| {
        words.iter().all(|&w| {
            if is_ctl(w) {
                w - CTL < (1i64 << bits)
            } else {
                w >= -(1i64 << (bits - 1)) && w < (1i64 << (bits - 1))
            }
        })
    };
    [(1usize, 8u32), (2, 16), (4, 32)]
        .into_iter()
        .find(|&(_, b)| fits(b))
        .map_or(4, |(s, _)| s)
}

/// Lays `spec` out as the spec describes: header (28 bytes, no auxiliary header), the
/// FDEs at `sfh_fdeoff` 0, the FRE sub-section after them (v3: each function's 5-byte
/// attribute record, then its FREs).
pub fn build(spec: &Spec) -> Built {
    let be = spec.big_endian();
    let v = spec.version;
    let fde_size = match v {
        1 => 17,
        2 => 20,
        _ => 16,
    };
    let n = spec.funcs.len();
    let fres_start = 28 + n * fde_size;
    let mut fres: Vec<u8> = Vec::new();
    let mut data = Vec::new();
    let mut fre_offs = Vec::new();
    let mut num_fres = 0u32;
    for f in &spec.funcs {
        data.push(fres_start + fres.len());
        let info = f.info | f.fre_type;
        if v == 3 {
            push(&mut fres, be, 2, f.fres.len() as u64);
            fres.extend_from_slice(&[info, f.info2, f.rep_size]);
        }
        let mut offs = Vec::new();
        for r in &f.fres {
            offs.push(fres_start + fres.len());
            let aw = [1usize, 2, 4][usize::from(f.fre_type.min(2))];
            push(&mut fres, be, aw, u64::from(r.start));
            let ws = r.word_size.unwrap_or_else(|| word_size_for(&r.words));
            let code = match ws {
                1 => 0u8,
                2 => 1,
                _ => 2,
            };
            fres.push((r.info & 0x81) | ((r.words.len() as u8 & 0xf) << 1) | (code << 5));
            for &w in &r.words {
                let w = if is_ctl(w) { w - CTL } else { w };
                push(&mut fres, be, ws, w as u64);
            }
            num_fres += 1;
        }
        fre_offs.push(offs);
    }
    let mut out = Vec::new();
    push(&mut out, be, 2, 0xdee2);
    out.extend_from_slice(&[
        v,
        spec.flags,
        spec.abi,
        spec.fixed_fp as u8,
        spec.fixed_ra as u8,
        0,
    ]);
    push(&mut out, be, 4, n as u64);
    push(&mut out, be, 4, u64::from(num_fres));
    push(&mut out, be, 4, fres.len() as u64);
    push(&mut out, be, 4, 0);
    push(&mut out, be, 4, (n * fde_size) as u64);
    let mut fde = Vec::new();
    for (k, f) in spec.funcs.iter().enumerate() {
        let off = 28 + k * fde_size;
        fde.push(off);
        let base = if spec.flags & F_PCREL != 0 {
            spec.vaddr.wrapping_add(off as u64)
        } else {
            spec.vaddr
        };
        let rel = f.start.wrapping_sub(base);
        let fre_off = (data[k] - fres_start) as u64;
        if v == 3 {
            push(&mut out, be, 8, rel);
            push(&mut out, be, 4, u64::from(f.size));
            push(&mut out, be, 4, fre_off);
        } else {
            push(&mut out, be, 4, rel & 0xffff_ffff);
            push(&mut out, be, 4, u64::from(f.size));
            push(&mut out, be, 4, fre_off);
            push(&mut out, be, 4, f.fres.len() as u64);
            out.push(f.info | f.fre_type);
            if v == 2 {
                out.extend_from_slice(&[f.rep_size, 0, 0]);
            }
        }
    }
    assert_eq!(out.len(), fres_start);
    out.extend_from_slice(&fres);
    Built {
        bytes: out,
        be,
        fde,
        data,
        fre: fre_offs,
        fres_start,
    }
}

/// A minimal ELF64 file (no program headers) whose only contents are a `.sframe`
/// section (`SHT_PROGBITS`, `SHF_ALLOC`) at `addr`, for machine `machine` (an `EM_*`).
pub fn elf_with_sframe(section: &[u8], addr: u64, machine: u16, big_endian: bool) -> Vec<u8> {
    let be = big_endian;
    let shstrtab = b"\0.shstrtab\0.sframe\0";
    let shstr_off = 64usize;
    let sframe_off = (shstr_off + shstrtab.len()).next_multiple_of(8);
    let sh_off = (sframe_off + section.len()).next_multiple_of(8);
    let mut out = Vec::new();
    out.extend_from_slice(&[0x7f, b'E', b'L', b'F', 2, if be { 2 } else { 1 }, 1, 0]);
    out.extend_from_slice(&[0; 8]);
    push(&mut out, be, 2, 2); // ET_EXEC
    push(&mut out, be, 2, u64::from(machine));
    push(&mut out, be, 4, 1); // EV_CURRENT
    push(&mut out, be, 8, 0); // e_entry
    push(&mut out, be, 8, 0); // e_phoff
    push(&mut out, be, 8, sh_off as u64);
    push(&mut out, be, 4, 0); // e_flags
    push(&mut out, be, 2, 64); // e_ehsize
    push(&mut out, be, 2, 56); // e_phentsize
    push(&mut out, be, 2, 0); // e_phnum
    push(&mut out, be, 2, 64); // e_shentsize
    push(&mut out, be, 2, 3); // e_shnum
    push(&mut out, be, 2, 2); // e_shstrndx
    out.extend_from_slice(shstrtab);
    out.resize(sframe_off, 0);
    out.extend_from_slice(section);
    out.resize(sh_off, 0);
    let mut sh = |name: u32, ty: u32, flags: u64, addr: u64, off: usize, size: usize, al: u64| {
        push(&mut out, be, 4, u64::from(name));
        push(&mut out, be, 4, u64::from(ty));
        push(&mut out, be, 8, flags);
        push(&mut out, be, 8, addr);
        push(&mut out, be, 8, off as u64);
        push(&mut out, be, 8, size as u64);
        push(&mut out, be, 4, 0); // sh_link
        push(&mut out, be, 4, 0); // sh_info
        push(&mut out, be, 8, al);
        push(&mut out, be, 8, 0); // sh_entsize
    };
    sh(0, 0, 0, 0, 0, 0, 0);
    sh(11, 1, 2, addr, sframe_off, section.len(), 8); // .sframe: PROGBITS, ALLOC
    sh(1, 3, 0, 0, shstr_off, shstrtab.len(), 1); // .shstrtab: STRTAB
    out
}

/// Whitespace-normalized lines of a dump (objdump pads its columns with spaces).
pub fn norm_lines(text: &str) -> Vec<String> {
    text.lines()
        .map(|l| l.split_whitespace().collect::<Vec<_>>().join(" "))
        .filter(|l| !l.is_empty())
        .collect()
}

// ---------------------------------------------------------------------------------------
// Sample sections, shared by the hand-built, differential, fuzz-body and CLI tests.

/// Section address of the samples; functions start at 0x1000.
pub const SAMPLE_VADDR: u64 = 0x2000;

/// s390x (big-endian) v2, SORTED | PCREL. CFA offsets are stored as `(off - 160) / 8`;
/// an odd RA/FP word `2N + 1` means "saved in register N"; RA word 0 is padding.
pub fn s390x_v2() -> Spec {
    Spec::new(
        2,
        ABI_S390X,
        SAMPLE_VADDR,
        vec![
            Func::new(
                0x1000,
                0x40,
                vec![
                    Fre::sp(0, &[0]),             // CFA sp+160
                    Fre::sp(6, &[20, -48, -72]),  // sp+320, RA c-48, FP c-72
                    Fre::fp(0x10, &[20, 49, 51]), // fp+320, RA in r24, FP in r25
                    Fre::sp(0x20, &[20, 0, -80]), // RA padding, FP c-80
                    Fre::sp(0x30, &[]),           // RA undefined
                ],
            ),
            Func::new(
                0x1100,
                0x200,
                vec![
                    Fre::sp(0, &[-1]),                 // sp+152
                    Fre::sp(0x104, &[1000, 1, -4000]), // sp+8160, RA in r0, FP c-4000
                ],
            ),
        ],
    )
}

/// The rows of [`s390x_v2`] as SFrame v3 writes them (binutils 2.46): a register-saved
/// RA/FP needs the FLEX FDE type; CFA offsets keep the s390x encoding in FLEX rows too.
pub fn s390x_v3() -> Spec {
    let sp = ctl_reg(15, false);
    let fp = ctl_reg(11, false);
    let at = ctl_cfa(true);
    Spec::new(
        3,
        ABI_S390X,
        SAMPLE_VADDR,
        vec![
            Func::new(
                0x1000,
                0x40,
                vec![
                    Fre::sp(0, &[sp, 0]),
                    Fre::sp(6, &[sp, 20, at, -48, at, -72]),
                    Fre::fp(
                        0x10,
                        &[fp, 20, ctl_reg(24, false), 0, ctl_reg(25, false), 0],
                    ),
                    Fre::sp(0x20, &[sp, 20, 0, at, -80]),
                    Fre::sp(0x30, &[]),
                ],
            )
            .flex(),
            Func::new(
                0x1100,
                0x200,
                vec![
                    Fre::sp(0, &[sp, -1]),
                    Fre::sp(0x104, &[sp, 1000, ctl_reg(0, false), 0, at, -4000]),
                ],
            )
            .flex(),
        ],
    )
}

/// AMD64 v3 with one FLEX function covering each control-word form, then a DEFAULT one.
pub fn amd64_flex() -> Spec {
    let (rsp, rbp, r10, rbx) = (7, 6, 10, 3);
    Spec::new(
        3,
        ABI_AMD64,
        SAMPLE_VADDR,
        vec![
            Func::new(
                0x1000,
                0x40,
                vec![
                    // CFA = rsp + 8; RA and FP: no words (fixed RA slot, FP unchanged).
                    Fre::sp(0, &[ctl_reg(rsp, false), 8]),
                    // CFA = r10 + 0; RA padding (the fixed slot); FP = *(rbp + 0).
                    Fre::sp(4, &[ctl_reg(r10, false), 0, 0, ctl_reg(rbp, true), 0]),
                    // CFA = *(rbp - 8) (DRAP); RA padding; FP = *(rbp + 0). (The
                    // FRE's CFA base bit is not used by FLEX rows; the writer sets it
                    // from the base register, gas 2.46 leaves it 0.)
                    Fre::fp(8, &[ctl_reg(rbp, true), -8, 0, ctl_reg(rbp, true), 0]),
                    // RA in rbx.
                    Fre::sp(0xc, &[ctl_reg(rsp, false), 16, ctl_reg(rbx, false), 0]),
                    // RA = *(rbp + 8).
                    Fre::sp(0x10, &[ctl_reg(rsp, false), 16, ctl_reg(rbp, true), 8]),
                    // RA = *(CFA - 16), FP = *(CFA - 24).
                    Fre::sp(
                        0x14,
                        &[
                            ctl_reg(rsp, false),
                            24,
                            ctl_cfa(true),
                            -16,
                            ctl_cfa(true),
                            -24,
                        ],
                    ),
                    // 2-byte words.
                    Fre::sp(0x18, &[ctl_reg(rsp, false), 4000]),
                    // RA undefined.
                    Fre::sp(0x1c, &[]),
                ],
            )
            .flex(),
            Func::new(0x1040, 0x10, vec![Fre::sp(0, &[8]), Fre::fp(1, &[16, -16])]),
        ],
    )
}

/// AArch64 (either byte order) v3: a FLEX function with pointer authentication (key B
/// when `key_b`), and a DEFAULT one with signed and unsigned rows.
pub fn aarch64_v3(big_endian: bool, key_b: bool) -> Spec {
    let (sp, fp, lr) = (31, 29, 30);
    let key = if key_b { INFO_PAUTH_KEY_B } else { 0 };
    Spec::new(
        3,
        if big_endian {
            ABI_AARCH64_BE
        } else {
            ABI_AARCH64_LE
        },
        SAMPLE_VADDR,
        vec![
            Func::new(
                0x1000,
                0x20,
                vec![
                    // RA padding (RA unchanged), FP = *(CFA - 16).
                    Fre::sp(0, &[ctl_reg(sp, false), 16, 0, ctl_cfa(true), -16]).mangled(),
                    // CFA = fp + 16, RA = *(CFA - 8), FP = *(CFA - 16).
                    Fre::fp(
                        4,
                        &[
                            ctl_reg(fp, false),
                            16,
                            ctl_cfa(true),
                            -8,
                            ctl_cfa(true),
                            -16,
                        ],
                    )
                    .mangled(),
                    // RA in x30 (after the epilogue restored it), not signed any more.
                    Fre::sp(8, &[ctl_reg(sp, false), 0, ctl_reg(lr, false), 0]),
                ],
            )
            .flex()
            .info(key),
            Func::new(
                0x1020,
                0x20,
                vec![
                    Fre::sp(0, &[0]),
                    Fre::sp(4, &[16, -8, -16]).mangled(),
                    Fre::fp(8, &[16, -8, -16]).mangled(),
                    Fre::sp(0xc, &[0]),
                ],
            )
            .info(key),
        ],
    )
}

/// AMD64 v3: a signal trampoline (DEFAULT), a FLEX signal frame, an ordinary function.
pub fn amd64_signal() -> Spec {
    Spec::new(
        3,
        ABI_AMD64,
        SAMPLE_VADDR,
        vec![
            Func::new(
                0x1000,
                0x10,
                vec![Fre::sp(0, &[160]), Fre::fp(8, &[16, -16])],
            )
            .info(INFO_SIGNAL),
            Func::new(0x1010, 0x10, vec![Fre::sp(0, &[ctl_reg(7, true), 160])])
                .flex()
                .info(INFO_SIGNAL),
            Func::new(0x1020, 0x10, vec![Fre::sp(0, &[8])]),
        ],
    )
}

/// AMD64 v3 with a fixed FP offset of -16 in the header (and the usual fixed RA -8).
pub fn amd64_fixed_fp() -> Spec {
    let mut s = Spec::new(
        3,
        ABI_AMD64,
        SAMPLE_VADDR,
        vec![
            Func::new(
                0x1000,
                0x20,
                vec![Fre::sp(0, &[8]), Fre::fp(1, &[16]), Fre::sp(0x10, &[])],
            ),
            Func::new(0x1020, 0x10, vec![Fre::sp(0, &[ctl_reg(10, false), 0])]).flex(),
        ],
    );
    s.fixed_fp = -16;
    s
}

/// Every sample, named.
pub fn samples() -> Vec<(&'static str, Spec)> {
    vec![
        ("s390x-v2", s390x_v2()),
        ("s390x-v3", s390x_v3()),
        ("amd64-flex", amd64_flex()),
        ("aarch64le-v3-keyb", aarch64_v3(false, true)),
        ("aarch64be-v3-keyb", aarch64_v3(true, true)),
        ("aarch64be-v3-keya", aarch64_v3(true, false)),
        ("amd64-signal", amd64_signal()),
        ("amd64-fixed-fp", amd64_fixed_fp()),
    ]
}
