//! Recognizes the few DWARF expression shapes that a normalized rule can express.
//!
//! Compilers and hand-written CFI use a handful of shapes: `DW_OP_bregN off` (a register
//! plus an offset), optionally followed by `DW_OP_deref` (DRAP: CFA = *(rbp-8); signal
//! frames: CFA = *(rsp+160)), and `DW_OP_call_frame_cfa` plus a constant. Anything else
//! (e.g. the PLT's `rsp+8 + ((rip&15) >= 11) << 3`) is not recognized.

use gimli::{EndianSlice, LittleEndian, Reader};

const DW_OP_DEREF: u8 = 0x06;
const DW_OP_CONSTU: u8 = 0x10;
const DW_OP_CONSTS: u8 = 0x11;
const DW_OP_MINUS: u8 = 0x1c;
const DW_OP_PLUS: u8 = 0x22;
const DW_OP_PLUS_UCONST: u8 = 0x23;
const DW_OP_LIT0: u8 = 0x30;
const DW_OP_LIT31: u8 = 0x4f;
const DW_OP_BREG0: u8 = 0x70;
const DW_OP_BREG31: u8 = 0x8f;
const DW_OP_BREGX: u8 = 0x92;
const DW_OP_NOP: u8 = 0x96;
const DW_OP_CALL_FRAME_CFA: u8 = 0x9c;

/// The base of a recognized expression.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum ExprBase {
    /// A DWARF register's value.
    Reg(u16),
    /// The CFA of the frame (only meaningful in register rules).
    Cfa,
}

/// `base + offset`, dereferenced once when `deref`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct SimpleExpr {
    pub base: ExprBase,
    pub offset: i64,
    pub deref: bool,
}

/// Parses `bytes` as `base [+ constant]* [deref]`; `None` for any other shape.
pub(crate) fn parse(bytes: &[u8]) -> Option<SimpleExpr> {
    let mut r = EndianSlice::new(bytes, LittleEndian);
    let (base, mut offset) = match r.read_u8().ok()? {
        op @ DW_OP_BREG0..=DW_OP_BREG31 => (
            ExprBase::Reg(u16::from(op - DW_OP_BREG0)),
            r.read_sleb128().ok()?,
        ),
        DW_OP_BREGX => {
            let reg = u16::try_from(r.read_uleb128().ok()?).ok()?;
            (ExprBase::Reg(reg), r.read_sleb128().ok()?)
        }
        DW_OP_CALL_FRAME_CFA => (ExprBase::Cfa, 0),
        _ => return None,
    };
    let mut deref = false;
    // A pending constant pushed by DW_OP_lit/consts/constu, waiting for plus/minus.
    let mut pending: Option<i64> = None;
    while !r.is_empty() {
        let op = r.read_u8().ok()?;
        if deref {
            // Nothing may follow the dereference.
            return None;
        }
        match op {
            DW_OP_NOP => {}
            DW_OP_PLUS_UCONST if pending.is_none() => {
                let k = i64::try_from(r.read_uleb128().ok()?).ok()?;
                offset = offset.checked_add(k)?;
            }
            DW_OP_LIT0..=DW_OP_LIT31 if pending.is_none() => {
                pending = Some(i64::from(op - DW_OP_LIT0));
            }
            DW_OP_CONSTS if pending.is_none() => pending = Some(r.read_sleb128().ok()?),
            DW_OP_CONSTU if pending.is_none() => {
                pending = Some(i64::try_from(r.read_uleb128().ok()?).ok()?);
            }
            DW_OP_PLUS => offset = offset.checked_add(pending.take()?)?,
            DW_OP_MINUS => offset = offset.checked_sub(pending.take()?)?,
            DW_OP_DEREF if pending.is_none() => deref = true,
            _ => return None,
        }
    }
    if pending.is_some() {
        return None;
    }
    Some(SimpleExpr {
        base,
        offset,
        deref,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn drap_cfa() {
        // DW_OP_breg6 -8; DW_OP_deref
        let e = parse(&[0x76, 0x78, 0x06]).unwrap();
        assert_eq!(
            e,
            SimpleExpr {
                base: ExprBase::Reg(6),
                offset: -8,
                deref: true
            }
        );
    }

    #[test]
    fn signal_frame_cfa() {
        // DW_OP_breg7 160; DW_OP_deref
        let e = parse(&[0x77, 0xa0, 0x01, 0x06]).unwrap();
        assert_eq!(e.base, ExprBase::Reg(7));
        assert_eq!(e.offset, 160);
        assert!(e.deref);
    }

    #[test]
    fn cfa_plus_const() {
        assert_eq!(
            parse(&[DW_OP_CALL_FRAME_CFA, 0x11, 0x70, DW_OP_PLUS]).unwrap(),
            SimpleExpr {
                base: ExprBase::Cfa,
                offset: -16,
                deref: false
            }
        );
    }

    #[test]
    fn plt_expression_is_rejected() {
        // DW_OP_breg7 8; DW_OP_breg16 0; DW_OP_lit15; DW_OP_and; DW_OP_lit11; DW_OP_ge;
        // DW_OP_lit3; DW_OP_shl; DW_OP_plus
        let plt = [
            0x77, 0x08, 0x80, 0x00, 0x3f, 0x1a, 0x3b, 0x2a, 0x33, 0x24, 0x22,
        ];
        assert_eq!(parse(&plt), None);
    }

    #[test]
    fn truncated_and_garbage() {
        assert_eq!(parse(&[]), None);
        assert_eq!(parse(&[0x77]), None);
        assert_eq!(parse(&[0x92, 0xff, 0xff, 0xff, 0xff, 0xff, 0x0f, 0]), None);
        assert_eq!(parse(&[0x77, 0x00, 0x06, 0x06]), None);
        assert_eq!(parse(&[0x77, 0x00, 0x30]), None);
    }
}
