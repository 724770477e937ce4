//! Text dump in the form of binutils 2.46 `objdump --sframe=.sframe`
//! (libsframe's `sframe-dump.c`), so the two can be diffed line by line.
//!
//! Differences: binutils 2.46 prints "No further information can be displayed" for
//! version 1 sections; this dumper prints their functions in the same table format
//! (binutils 2.40 did, with `u` instead of `f` for the fixed AMD64 RA and without the
//! "CFA fixed RA offset" header line). The ELF file-name line objdump prints first is
//! the caller's business.

use core::fmt::{self, Write};

use super::header::{Abi, F_FDE_FUNC_START_PCREL, F_FDE_SORTED, F_FRAME_POINTER};
use super::read::{Fde, Fre, Section};
use crate::table::PcType;

/// Write the dump of `section` to `out`, starting with
/// `Contents of the SFrame section .sframe:`.
pub fn dump(section: &Section<'_>, out: &mut impl Write) -> fmt::Result {
    let h = section.header();
    out.write_str("Contents of the SFrame section .sframe:")?;
    write!(
        out,
        "\n  Header :\n\n    Version: SFRAME_VERSION_{}\n",
        h.version
    )?;
    let mut flags = h.flags;
    let mut prefix = "Flags: ";
    if flags == 0 {
        writeln!(out, "{prefix:>11}NONE")?;
    }
    let names: [(u8, &str); 3] = [
        (F_FDE_SORTED, "SFRAME_F_FDE_SORTED"),
        (F_FRAME_POINTER, "SFRAME_F_FRAME_POINTER"),
        (F_FDE_FUNC_START_PCREL, "SFRAME_F_FDE_FUNC_START_PCREL"),
    ];
    for (bit, name) in names {
        if flags & bit != 0 {
            flags &= !bit;
            writeln!(
                out,
                "{prefix:>11}{name}{}",
                if flags != 0 { "," } else { "" }
            )?;
            prefix = " ";
        }
    }
    if flags != 0 {
        writeln!(out, "{prefix:>11}{flags}")?;
    }
    if h.cfa_fixed_fp_offset != 0 {
        writeln!(out, "    CFA fixed FP offset: {}", h.cfa_fixed_fp_offset)?;
    }
    if h.cfa_fixed_ra_offset != 0 {
        writeln!(out, "    CFA fixed RA offset: {}", h.cfa_fixed_ra_offset)?;
    }
    writeln!(out, "    Num FDEs: {}", h.num_fdes as i32)?;
    writeln!(out, "    Num FREs: {}", h.num_fres as i32)?;
    out.write_str("\n  Function Index :\n")?;
    for fde in section.functions() {
        dump_function(section, &fde, out)?;
        out.write_str("\n")?;
    }
    Ok(())
}

/// The dump as a `String`.
pub fn dump_to_string(section: &Section<'_>) -> String {
    let mut s = String::new();
    // Writing to a String cannot fail.
    let _ = dump(section, &mut s);
    s
}

fn dump_function(section: &Section<'_>, fde: &Fde, out: &mut impl Write) -> fmt::Result {
    let abi = section.abi();
    write!(
        out,
        "\n    func idx [{}]: pc = {:#x}, size = {} bytes",
        fde.index, fde.start, fde.size as i32
    )?;
    let attrs = format!(
        "{}{}",
        if fde.signal { "S" } else { "" },
        if fde.flex { "F" } else { "" }
    );
    if !attrs.is_empty() {
        write!(out, ", attr = \"{attrs}\"")?;
    }
    if abi.is_aarch64() && fde.pauth_key_b {
        out.write_str(", pauth = B key")?;
    }
    let mask = matches!(fde.pc_type, PcType::Mask { .. });
    write!(
        out,
        "\n    {:<7}{:<8} {:<10}{:<10}{:<13}",
        "STARTPC",
        if mask { "[m]" } else { "   " },
        "CFA",
        "FP",
        "RA"
    )?;
    for fre in section.rows(fde) {
        let pc = if mask {
            u64::from(fre.start_offset)
        } else {
            fde.start.wrapping_add(u64::from(fre.start_offset))
        };
        write!(out, "\n    {pc:016x}")?;
        if fre.count() == 0 {
            out.write_str("  RA undefined")?;
            continue;
        }
        let (cfa, fp, ra) = if fde.flex {
            flex_columns(section, &fre)
        } else {
            simple_columns(section, &fre)
        };
        let ra = format!("{ra}{}", if fre.mangled_ra() { "[s]" } else { "   " });
        write!(out, "  {cfa:<10}{fp:<10}{ra:<13}")?;
    }
    Ok(())
}

fn cfa_offset(section: &Section<'_>, raw: i32) -> i32 {
    if section.abi() == Abi::S390xBigEndian {
        raw.wrapping_mul(8).wrapping_add(160)
    } else {
        raw
    }
}

fn simple_columns(section: &Section<'_>, fre: &Fre<'_>) -> (String, String, String) {
    let h = section.header();
    let s390x_regs = h.abi == Abi::S390xBigEndian && h.version == 2;
    let cfa = format!(
        "{}+{}",
        if fre.base_is_sp() { "sp" } else { "fp" },
        cfa_offset(section, fre.iword(0).unwrap_or(0))
    );
    let fp_idx = if h.cfa_fixed_ra_offset != 0 { 1 } else { 2 };
    let fp_val = if h.cfa_fixed_fp_offset != 0 {
        Some(i32::from(h.cfa_fixed_fp_offset))
    } else {
        fre.iword(fp_idx)
    };
    let reg_or_slot = |v: i32| {
        if s390x_regs && v & 1 != 0 {
            format!("r{}", v >> 1)
        } else {
            format!("c{v:+}")
        }
    };
    let fp = fp_val.map_or_else(|| "u".to_string(), reg_or_slot);
    let ra = if h.cfa_fixed_ra_offset != 0 {
        "f".to_string()
    } else {
        match fre.iword(1) {
            Some(0) => "U".to_string(),
            Some(v) => reg_or_slot(v),
            None => "u".to_string(),
        }
    };
    (cfa, fp, ra)
}

fn disp(section: &Section<'_>, ctrl: u32, offset: i32) -> String {
    disp_for(section.abi(), ctrl, offset)
}

/// A FLEX rule's text: its control word (bit 0: names a register, bit 1: dereference,
/// bits 3..: the register) and offset.
fn disp_for(abi: Abi, ctrl: u32, offset: i32) -> String {
    let (sp, fp) = abi.sp_fp_dwarf();
    let name = if ctrl & 1 != 0 {
        let reg = ctrl >> 3;
        if reg == u32::from(sp) {
            "sp".to_string()
        } else if reg == u32::from(fp) {
            "fp".to_string()
        } else {
            format!("r{reg}")
        }
    } else {
        "c".to_string()
    };
    // As binutils' sframe_format_fre_disp: the parenthesized (dereferenced) form only
    // for a rule that names a register; a CFA-based value is `c%+d` with or without
    // the dereference bit.
    if ctrl & 1 != 0 && ctrl & 2 != 0 {
        format!("({name}{offset:+})")
    } else {
        format!("{name}{offset:+}")
    }
}

fn flex_columns(section: &Section<'_>, fre: &Fre<'_>) -> (String, String, String) {
    let h = section.header();
    let cfa = disp(
        section,
        fre.uword(0).unwrap_or(0),
        cfa_offset(section, fre.iword(1).unwrap_or(0)),
    );
    let ra_ctrl = fre.uword(2);
    let ra = match ra_ctrl {
        None if h.cfa_fixed_ra_offset != 0 => "f".to_string(),
        None => "u".to_string(),
        Some(0) => "U".to_string(),
        Some(c) => match fre.iword(3) {
            Some(off) => disp(section, c, off),
            None if h.cfa_fixed_ra_offset != 0 => {
                disp(section, c, i32::from(h.cfa_fixed_ra_offset))
            }
            None => disp(section, c, 0),
        },
    };
    let fp_idx = if ra_ctrl == Some(0) { 3 } else { 4 };
    let fp = match (fre.uword(fp_idx), fre.iword(fp_idx + 1)) {
        (Some(c), Some(off)) => disp(section, c, off),
        _ => "u".to_string(),
    };
    (cfa, fp, ra)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// objdump 2.46/2.47 (`sframe_format_fre_disp`): parentheses only for a
    /// dereferenced register; a CFA-based rule is `c%+d` with or without dereference.
    #[test]
    fn flex_rules_print_as_objdump_does() {
        let reg = |r: u32| (r << 3) | 1;
        let abi = Abi::Amd64LittleEndian;
        // Register-based, without and with dereference.
        assert_eq!(disp_for(abi, reg(10), 8), "r10+8");
        assert_eq!(disp_for(abi, reg(10) | 2, 8), "(r10+8)");
        assert_eq!(disp_for(abi, reg(6) | 2, -8), "(fp-8)");
        assert_eq!(disp_for(abi, reg(7), 16), "sp+16");
        // CFA-based, without and with dereference: the same text.
        assert_eq!(disp_for(abi, 0, -16), "c-16");
        assert_eq!(disp_for(abi, 2, -16), "c-16");
        assert_eq!(disp_for(abi, 2, 16), "c+16");
        assert_eq!(disp_for(Abi::Aarch64LittleEndian, reg(29) | 2, 0), "(fp+0)");
    }
}
