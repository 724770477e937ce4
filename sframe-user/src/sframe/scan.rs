//! The reader's hot loops: FDE and FRE decoding specialized for byte order, format
//! version and FRE start-address width, used by validation, iteration and lookup.
//!
//! Each function here does one bounds check per record (the record's bytes are taken
//! as one sub-slice, or one fixed-size array, and read at constant offsets) and applies
//! exactly the checks of the careful decoders in `read.rs`, but only says pass or fail:
//! on failure validation re-runs the careful decoder on that one FDE to name the check,
//! the index and the offset. Generic parameters: `BE` (big-endian section), `AW` (FRE
//! start-address width in bytes: 1, 2 or 4).

use super::header::{ABI_AMD64_LE, FDE_ATTR_SIZE_V3};
use super::read::Fde;
use crate::table::PcType;

/// Functions with more FREs than this get a search checkpoint every `CHECKPOINT_STEP`
/// FREs, so that a lookup scans at most this many FREs after a binary search.
pub const CHECKPOINT_STEP: u32 = 16;

/// A lookup shortcut into the FREs of a function with many FREs (see
/// [`CHECKPOINT_STEP`]): FRE `fre` of FDE `fde` (on-disk index) starts at `start` and is
/// encoded at `rel_offset` bytes after the start of the FRE sub-section.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Checkpoint {
    pub fde: u32,
    pub fre: u32,
    pub start: u32,
    pub rel_offset: u32,
}

#[inline(always)]
fn u16_of<const BE: bool>(b: [u8; 2]) -> u16 {
    if BE {
        u16::from_be_bytes(b)
    } else {
        u16::from_le_bytes(b)
    }
}

#[inline(always)]
fn u32_of<const BE: bool>(b: [u8; 4]) -> u32 {
    if BE {
        u32::from_be_bytes(b)
    } else {
        u32::from_le_bytes(b)
    }
}

#[inline(always)]
fn u64_of<const BE: bool>(b: [u8; 8]) -> u64 {
    if BE {
        u64::from_be_bytes(b)
    } else {
        u64::from_le_bytes(b)
    }
}

/// Takes `N` bytes at `off` (one bounds check).
#[inline(always)]
fn arr<const N: usize>(d: &[u8], off: usize) -> Option<&[u8; N]> {
    d.get(off..off.checked_add(N)?)?.try_into().ok()
}

/// Sub-array `[a, a + N)` of a fixed-size array: no runtime check once inlined.
#[inline(always)]
fn sub<const M: usize, const N: usize>(r: &[u8; M], a: usize) -> [u8; N] {
    let mut out = [0u8; N];
    out.copy_from_slice(&r[a..a + N]);
    out
}

/// What FDE decoding needs from the header, resolved once at open.
#[derive(Clone, Copy, Debug)]
pub struct FdeFormat {
    pub version: u8,
    pub pcrel: bool,
    pub aarch64: bool,
    pub abi: u8,
    pub fdes_start: usize,
    pub fres_start: usize,
    pub vaddr: u64,
}

/// Decodes and checks FDE `index` (on-disk order). `fre_area` is the section up to the
/// end of the FRE sub-section. `None` when any check of `Section::decode_fde` fails.
#[inline(always)]
pub fn fde(fmt: &FdeFormat, be: bool, data: &[u8], fre_area: &[u8], index: u32) -> Option<Fde> {
    match (fmt.version, be) {
        (3, false) => fde_v3::<false>(fmt, data, fre_area, index),
        (3, true) => fde_v3::<true>(fmt, data, fre_area, index),
        (_, false) => fde_v12::<false>(fmt, data, fre_area, index),
        (_, true) => fde_v12::<true>(fmt, data, fre_area, index),
    }
}

/// [`fde`] for a version (3, else 1 or 2) and byte order known at compile time.
#[inline(always)]
pub fn fde_g<const V3: bool, const BE: bool>(
    fmt: &FdeFormat,
    data: &[u8],
    fre_area: &[u8],
    index: u32,
) -> Option<Fde> {
    if V3 {
        fde_v3::<BE>(fmt, data, fre_area, index)
    } else {
        fde_v12::<BE>(fmt, data, fre_area, index)
    }
}

#[inline(always)]
fn fde_v3<const BE: bool>(
    fmt: &FdeFormat,
    data: &[u8],
    fre_area: &[u8],
    index: u32,
) -> Option<Fde> {
    let off = fmt
        .fdes_start
        .checked_add((index as usize).checked_mul(16)?)?;
    let r = arr::<16>(data, off)?;
    let raw_start = u64_of::<BE>(sub(r, 0)) as i64;
    let size = u32_of::<BE>(sub(r, 8));
    let fre_off = u32_of::<BE>(sub(r, 12));
    let attr = fmt.fres_start.checked_add(fre_off as usize)?;
    let a = arr::<FDE_ATTR_SIZE_V3>(fre_area, attr)?;
    let (info, info2, rep_size) = (a[2], a[3], a[4]);
    let rel_start = if fmt.pcrel {
        raw_start.checked_add(off as i64)?
    } else {
        raw_start
    };
    let fre_type = info & 0xf;
    let pauth = info & 0x20 != 0;
    let mask = info & 0x10 != 0;
    // All checks folded into one test (non-short-circuit `|`: no branch per check).
    let bad = (fre_type > 2)
        | (info & 0x40 != 0)
        | (pauth & !fmt.aarch64)
        | (info2 & 0xe0 != 0)
        | (info2 & 0x1f > 1)
        | (mask & (rep_size == 0));
    if bad {
        return None;
    }
    let flex = info2 & 0x1f == 1;
    let pc_type = if mask {
        PcType::Mask { rep_size }
    } else {
        PcType::Inc
    };
    Some(Fde {
        index,
        offset: off,
        rel_start,
        start: fmt.vaddr.wrapping_add(rel_start as u64),
        size,
        num_fres: u32::from(u16_of::<BE>([a[0], a[1]])),
        fre_type,
        pc_type,
        info,
        info2,
        rep_size,
        pauth_key_b: pauth,
        signal: info & 0x80 != 0,
        flex,
        fres_offset: attr + FDE_ATTR_SIZE_V3,
    })
}

#[inline(always)]
fn fde_v12<const BE: bool>(
    fmt: &FdeFormat,
    data: &[u8],
    fre_area: &[u8],
    index: u32,
) -> Option<Fde> {
    let v2 = fmt.version == 2;
    let fde_size = if v2 { 20 } else { 17 };
    let off = fmt
        .fdes_start
        .checked_add((index as usize).checked_mul(fde_size)?)?;
    let r = arr::<17>(data, off)?;
    let raw_start = i64::from(u32_of::<BE>(sub(r, 0)) as i32);
    let size = u32_of::<BE>(sub(r, 4));
    let fre_off = u32_of::<BE>(sub(r, 8));
    let num_fres = u32_of::<BE>(sub(r, 12));
    let info = r[16];
    let rep_size = if v2 { *data.get(off + 17)? } else { 0 };
    let fres_offset = fmt.fres_start.checked_add(fre_off as usize)?;
    if fres_offset > fre_area.len() {
        return None;
    }
    let rel_start = if fmt.pcrel {
        raw_start.checked_add(off as i64)?
    } else {
        raw_start
    };
    let fre_type = info & 0xf;
    let pauth = info & 0x20 != 0;
    let mask = info & 0x10 != 0;
    // v1 PCMASK FDEs carry no rep_size: AMD64's 16-byte PLT entries only.
    let bad = (fre_type > 2)
        | (info & 0xc0 != 0)
        | (pauth & !fmt.aarch64)
        | (mask & !v2 & (fmt.abi != ABI_AMD64_LE))
        | (mask & v2 & (rep_size == 0));
    if bad {
        return None;
    }
    let pc_type = match (mask, v2) {
        (false, _) => PcType::Inc,
        (true, false) => PcType::Mask { rep_size: 16 },
        (true, true) => PcType::Mask { rep_size },
    };
    Some(Fde {
        index,
        offset: off,
        rel_start,
        start: fmt.vaddr.wrapping_add(rel_start as u64),
        size,
        num_fres,
        fre_type,
        pc_type,
        info,
        info2: 0,
        rep_size,
        pauth_key_b: pauth,
        signal: false,
        flex: false,
        fres_offset,
    })
}

/// Function start (section-relative) and size of FDE `index`, for the binary search.
/// Only valid on a validated section (PC-relative starts were checked not to overflow).
#[inline(always)]
pub fn fde_start_size(fmt: &FdeFormat, be: bool, data: &[u8], index: u32) -> Option<(i64, u32)> {
    let (fde_size, v3) = match fmt.version {
        3 => (16, true),
        2 => (20, false),
        _ => (17, false),
    };
    let off = fmt
        .fdes_start
        .checked_add((index as usize).checked_mul(fde_size)?)?;
    let r = arr::<12>(data, off)?;
    let (raw, size) = match (v3, be) {
        (true, false) => (
            u64_of::<false>(sub(r, 0)) as i64,
            u32_of::<false>(sub(r, 8)),
        ),
        (true, true) => (u64_of::<true>(sub(r, 0)) as i64, u32_of::<true>(sub(r, 8))),
        (false, false) => (
            i64::from(u32_of::<false>(sub(r, 0)) as i32),
            u32_of::<false>(sub(r, 4)),
        ),
        (false, true) => (
            i64::from(u32_of::<true>(sub(r, 0)) as i32),
            u32_of::<true>(sub(r, 4)),
        ),
    };
    let start = if fmt.pcrel {
        raw.wrapping_add(off as i64)
    } else {
        raw
    };
    Some((start, size))
}

/// The per-function constants of the FRE checks.
#[derive(Clone, Copy, Debug)]
pub struct FreChecks {
    /// Function size: row starts must not exceed it.
    pub size: u32,
    /// Most data words a (non-FLEX) row may carry ([`super::header::Header::max_default_words`]).
    pub max_words: u32,
    /// The mangled-RA bit is allowed (AArch64).
    pub mangled_ok: bool,
    /// Zero-data-word rows are allowed (versions 2 and 3).
    pub empty_ok: bool,
}

/// Checks the `n` FREs of a non-FLEX function starting at `off`: in bounds of
/// `fre_area`, valid word-size code, starts strictly increasing and within the
/// function, reserved bits clear, data word count allowed. Appends a checkpoint every
/// [`CHECKPOINT_STEP`] FREs to `checkpoints` when `n` exceeds that step. Returns the
/// offset after the last FRE, `None` when a check fails.
#[inline(always)]
pub fn scan_fres(
    be: bool,
    fre_type: u8,
    fre_area: &[u8],
    off: usize,
    n: u32,
    c: &FreChecks,
    cp: Option<(u32, usize, &mut Vec<Checkpoint>)>,
) -> Option<usize> {
    match (be, fre_type, cp) {
        (false, 0, None) => scan::<false, 1>(fre_area, off, n, c, None),
        (false, 1, None) => scan::<false, 2>(fre_area, off, n, c, None),
        (false, _, None) => scan::<false, 4>(fre_area, off, n, c, None),
        (true, 0, None) => scan::<true, 1>(fre_area, off, n, c, None),
        (true, 1, None) => scan::<true, 2>(fre_area, off, n, c, None),
        (true, _, None) => scan::<true, 4>(fre_area, off, n, c, None),
        (be, t, Some(cp)) => scan_checkpoints(be, t, fre_area, off, n, c, cp),
    }
}

#[inline(never)]
fn scan_checkpoints(
    be: bool,
    fre_type: u8,
    area: &[u8],
    off: usize,
    n: u32,
    c: &FreChecks,
    cp: (u32, usize, &mut Vec<Checkpoint>),
) -> Option<usize> {
    match (be, fre_type) {
        (false, 0) => scan::<false, 1>(area, off, n, c, Some(cp)),
        (false, 1) => scan::<false, 2>(area, off, n, c, Some(cp)),
        (false, _) => scan::<false, 4>(area, off, n, c, Some(cp)),
        (true, 0) => scan::<true, 1>(area, off, n, c, Some(cp)),
        (true, 1) => scan::<true, 2>(area, off, n, c, Some(cp)),
        (true, _) => scan::<true, 4>(area, off, n, c, Some(cp)),
    }
}

#[inline(always)]
fn start_of<const BE: bool, const AW: usize>(h: &[u8]) -> Option<u32> {
    Some(match AW {
        1 => u32::from(*h.first()?),
        2 => u32::from(u16_of::<BE>(*arr::<2>(h, 0)?)),
        _ => u32_of::<BE>(*arr::<4>(h, 0)?),
    })
}

/// One FRE of the checks below: reads its header (bounds-checked: `None` when it is
/// outside the section), advances `off` past its data words (their bounds are
/// checked by the caller, once, on the last end) and returns whether a check fails.
#[inline(always)]
fn step<const BE: bool, const AW: usize>(
    area: &[u8],
    off: &mut usize,
    prev: &mut i64,
    c: &FreChecks,
) -> Option<(bool, u32)> {
    let h = area.get(*off..*off + AW + 1)?;
    let start = start_of::<BE, AW>(h)?;
    let info = *h.get(AW)?;
    let code = (info >> 5) & 3;
    let count = u32::from((info >> 1) & 0xf);
    let mangled_bad = if c.mangled_ok { 0 } else { 0x80 };
    // Non-short-circuit `|`: one flag, no branch per check.
    let bad = (code == 3)
        | (i64::from(start) <= *prev)
        | (start > c.size)
        | (info & mangled_bad != 0)
        | ((count == 0) & !c.empty_ok)
        | (count > c.max_words);
    *prev = i64::from(start);
    // At most 1 + 4 + 15 * 8 bytes past a position inside the section.
    *off += AW + 1 + ((count as usize) << code);
    Some((bad, start))
}

/// The FRE checks of one function. The loop only follows the chain of FRE lengths
/// (each header read is bounds-checked, so it stops within the section whatever `n`
/// says) and folds every check into one flag, tested once at the end.
#[inline(always)]
fn scan<const BE: bool, const AW: usize>(
    area: &[u8],
    mut off: usize,
    n: u32,
    c: &FreChecks,
    mut cp: Option<(u32, usize, &mut Vec<Checkpoint>)>,
) -> Option<usize> {
    let mut prev: i64 = -1;
    let mut bad = false;
    for j in 0..n {
        let at = off;
        let (b, start) = step::<BE, AW>(area, &mut off, &mut prev, c)?;
        bad |= b;
        if let Some((fde, base, v)) = cp.as_mut()
            && j % CHECKPOINT_STEP == 0
        {
            v.push(Checkpoint {
                fde: *fde,
                fre: j,
                start,
                rel_offset: u32::try_from(at - *base).ok()?,
            });
        }
    }
    // Ends increase, so the last one bounds them all.
    if bad || off > area.len() {
        return None;
    }
    Some(off)
}

/// The FRE checks of two functions at once (offset, count, checks and FRE type of
/// each): the two length chains are independent, so the CPU overlaps them. Returns
/// the end of each function's FREs, `None` when a check fails in either.
#[inline(always)]
pub fn scan_pair(
    be: bool,
    area: &[u8],
    a: (usize, u32, &FreChecks, u8),
    b: (usize, u32, &FreChecks, u8),
) -> Option<(usize, usize)> {
    if be {
        pair_dispatch::<true>(area, a, b)
    } else {
        pair_dispatch::<false>(area, a, b)
    }
}

#[inline(always)]
fn pair_dispatch<const BE: bool>(
    area: &[u8],
    a: (usize, u32, &FreChecks, u8),
    b: (usize, u32, &FreChecks, u8),
) -> Option<(usize, usize)> {
    let (oa, na, ca, ta) = a;
    let (ob, nb, cb, tb) = b;
    match (ta, tb) {
        (0, 0) => pair::<BE, 1, 1>(area, oa, na, ca, ob, nb, cb),
        (0, 1) => pair::<BE, 1, 2>(area, oa, na, ca, ob, nb, cb),
        (0, _) => pair::<BE, 1, 4>(area, oa, na, ca, ob, nb, cb),
        (1, 0) => pair::<BE, 2, 1>(area, oa, na, ca, ob, nb, cb),
        (1, 1) => pair::<BE, 2, 2>(area, oa, na, ca, ob, nb, cb),
        (1, _) => pair::<BE, 2, 4>(area, oa, na, ca, ob, nb, cb),
        (_, 0) => pair::<BE, 4, 1>(area, oa, na, ca, ob, nb, cb),
        (_, 1) => pair::<BE, 4, 2>(area, oa, na, ca, ob, nb, cb),
        (_, _) => pair::<BE, 4, 4>(area, oa, na, ca, ob, nb, cb),
    }
}

#[inline(always)]
fn pair<const BE: bool, const A1: usize, const A2: usize>(
    area: &[u8],
    mut oa: usize,
    na: u32,
    ca: &FreChecks,
    mut ob: usize,
    nb: u32,
    cb: &FreChecks,
) -> Option<(usize, usize)> {
    let (mut pa, mut pb) = (-1i64, -1i64);
    let mut bad = false;
    let both = na.min(nb);
    for _ in 0..both {
        bad |= step::<BE, A1>(area, &mut oa, &mut pa, ca)?.0;
        bad |= step::<BE, A2>(area, &mut ob, &mut pb, cb)?.0;
    }
    for _ in both..na {
        bad |= step::<BE, A1>(area, &mut oa, &mut pa, ca)?.0;
    }
    for _ in both..nb {
        bad |= step::<BE, A2>(area, &mut ob, &mut pb, cb)?.0;
    }
    if bad || oa > area.len() || ob > area.len() {
        return None;
    }
    Some((oa, ob))
}
