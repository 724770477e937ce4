//! How much of an object's executable code the table gives a rule: the bytes of its
//! `SHF_EXECINSTR` sections, less the alignment padding between functions (which is
//! never executed), against the bytes covered by rows with a rule.

use super::cfi::SectionData;
use super::stats::row_spans;
use crate::table::{Arch, Function, UnwindTable};

/// Largest run checked for padding at the end of a gap between functions (padding is
/// what aligns the next function: at most a page).
const MAX_PADDING: usize = 4096;

/// Scanned code dropped from memory in steps of this many bytes.
const RELEASE_STEP: u64 = 1 << 20;

/// What [`scan`] measured of an object's executable code.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct ExecCoverage {
    /// Bytes of the executable sections.
    pub bytes: u64,
    /// Alignment padding ending the gaps between (and around) functions.
    pub padding: u64,
    /// Bytes covered by a row with a rule.
    pub with_rule: u64,
}

/// One pass over the object's executable sections: marks each function followed, up to
/// the next function in the same section, only by alignment padding (the whole gap,
/// at most [`MAX_PADDING`] bytes; the gap at a section's end is never marked, code
/// without unwind info may follow there and must keep "no rule"), and counts the
/// padding and the bytes with a rule. Allocates nothing: functions are sorted and
/// disjoint, and so are their row spans.
pub(crate) fn scan(table: &mut UnwindTable, exec: &[SectionData<'_>]) -> ExecCoverage {
    let arch = table.arch;
    let mut out = ExecCoverage {
        bytes: exec.iter().map(|s| s.data.len() as u64).sum(),
        ..ExecCoverage::default()
    };
    for s in exec {
        let (a, b) = (s.address, s.address.saturating_add(s.data.len() as u64));
        let gap = |lo: u64, hi: u64| {
            let at = |x: u64| (x - a) as usize;
            (lo < hi).then(|| s.data.get(at(lo)..at(hi))).flatten()
        };
        let first = table.functions().partition_point(|f| f.end() <= a);
        let mut cursor = a;
        // Code scanned so far is dropped from memory every `RELEASE_STEP` bytes (when
        // the bytes are a file mapping being derived; see `mapped::release_read`).
        let mut released = a;
        let mut prev = None;
        let mut i = first;
        while let Some(&f) = table.functions().get(i).filter(|f| f.start < b) {
            if let Some(bytes) = gap(cursor, f.start.min(b)) {
                let padding = trailing_padding(arch, bytes);
                out.padding += padding as u64;
                if let Some(p) = prev
                    && padding == bytes.len()
                {
                    table.mark_padding_after(p);
                }
            }
            cursor = cursor.max(f.end().min(b));
            prev = Some(i);
            out.with_rule += ruled_bytes(table, &f, a, b);
            i += 1;
            if cursor - released >= RELEASE_STEP {
                if let Some(done) = gap(released, cursor) {
                    crate::mapped::release_read(done);
                }
                released = cursor;
            }
        }
        out.padding += gap(cursor, b).map_or(0, |g| trailing_padding(arch, g) as u64);
        if let Some(done) = gap(released, b) {
            crate::mapped::release_read(done);
        }
    }
    out
}

/// Bytes of `f` inside `[a, b)` that a row with a rule covers.
fn ruled_bytes(table: &UnwindTable, f: &Function, a: u64, b: u64) -> u64 {
    let clip = |lo: u64, hi: u64| hi.min(b).saturating_sub(lo.max(a));
    row_spans(f, table.rows(f))
        .filter(|s| s.row.rule.is_some())
        .map(|s| {
            s.ranges()
                .map(|(lo, hi)| clip(f.start + lo, f.start + hi))
                .sum::<u64>()
        })
        .sum()
}

/// The length of the longest suffix of `gap` (up to [`MAX_PADDING`]) made only of
/// padding instructions: x86-64 NOPs of every length the assemblers emit (`nop`,
/// `xchg %ax,%ax`, `nopl`/`nopw` with prefixes), `int3` and zero bytes; AArch64 `nop`
/// words and zero words.
pub(crate) fn trailing_padding(arch: Arch, gap: &[u8]) -> usize {
    let tail = gap
        .get(gap.len().saturating_sub(MAX_PADDING)..)
        .unwrap_or_default();
    match arch {
        Arch::Amd64 => x86_trailing_padding(tail),
        Arch::Aarch64 { big_endian } => aarch64_padding(tail, big_endian),
        Arch::S390x => 0,
    }
}

/// Trailing AArch64 `nop` (0xd503201f) and zero words.
fn aarch64_padding(gap: &[u8], big_endian: bool) -> usize {
    gap.rchunks_exact(4)
        .filter_map(|w| <[u8; 4]>::try_from(w).ok())
        .take_while(|&w| {
            let v = if big_endian {
                u32::from_be_bytes(w)
            } else {
                u32::from_le_bytes(w)
            };
            v == 0xd503_201f || v == 0
        })
        .count()
        * 4
}

/// The longest suffix of `gap` (at most [`MAX_PADDING`] bytes) that decodes as x86-64
/// padding instructions. From the end: the suffix from `i` is padding when the
/// instruction at `i` is, and so is the suffix after it (linear time).
fn x86_trailing_padding(gap: &[u8]) -> usize {
    let n = gap.len().min(MAX_PADDING);
    let gap = gap.get(gap.len() - n..).unwrap_or_default();
    // ok[i]: the suffix from `i` is padding (the empty suffix at `n` is).
    let mut ok = [false; MAX_PADDING + 1];
    let mut start = n;
    for i in (0..n).rev() {
        let Some(len) = gap.get(i..).and_then(x86_padding_len) else {
            continue;
        };
        if i + len == n || ok.get(i + len).copied().unwrap_or(false) {
            if let Some(o) = ok.get_mut(i) {
                *o = true;
            }
            start = i;
        }
    }
    n - start
}

/// The length of the padding instruction at the start of `b`, if it is one.
fn x86_padding_len(b: &[u8]) -> Option<usize> {
    match *b.first()? {
        0x90 | 0xcc | 0x00 => return Some(1),
        _ => {}
    }
    // Operand-size and CS-segment prefixes, as in `data16 cs nopw 0x0(%rax,%rax,1)`.
    let prefixes = b
        .iter()
        .take(14)
        .take_while(|&&c| c == 0x66 || c == 0x2e)
        .count();
    let rest = b.get(prefixes..)?;
    match rest {
        [0x90, ..] if prefixes > 0 => Some(prefixes + 1),
        [0x0f, 0x1f, modrm, ..] => {
            let (md, rm) = (modrm >> 6, modrm & 7);
            if md == 3 || (modrm >> 3) & 7 != 0 {
                return None;
            }
            let sib = usize::from(rm == 4);
            let base5 = rm == 4 && rest.get(3).is_some_and(|s| s & 7 == 5);
            let disp = match md {
                0 if rm == 5 || base5 => 4,
                1 => 1,
                2 => 4,
                _ => 0,
            };
            let len = prefixes + 3 + sib + disp;
            (len <= b.len()).then_some(len)
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn x86_nops_of_every_length_are_padding() {
        let nops: [&[u8]; 11] = [
            &[0x90],
            &[0x66, 0x90],
            &[0x0f, 0x1f, 0x00],
            &[0x0f, 0x1f, 0x40, 0x00],
            &[0x0f, 0x1f, 0x44, 0x00, 0x00],
            &[0x66, 0x0f, 0x1f, 0x44, 0x00, 0x00],
            &[0x0f, 0x1f, 0x80, 0, 0, 0, 0],
            &[0x0f, 0x1f, 0x84, 0x00, 0, 0, 0, 0],
            &[0x66, 0x0f, 0x1f, 0x84, 0x00, 0, 0, 0, 0],
            &[0x66, 0x2e, 0x0f, 0x1f, 0x84, 0x00, 0, 0, 0, 0],
            &[0x66, 0x66, 0x2e, 0x0f, 0x1f, 0x84, 0x00, 0, 0, 0, 0],
        ];
        for n in nops {
            assert_eq!(x86_padding_len(n), Some(n.len()), "{n:x?}");
        }
        // ret, then a 10-byte nopw and int3s: everything after the ret.
        let gap = [
            0xc3, 0x66, 0x2e, 0x0f, 0x1f, 0x84, 0x00, 0, 0, 0, 0, 0xcc, 0xcc,
        ];
        assert_eq!(trailing_padding(Arch::Amd64, &gap), gap.len() - 1);
        // Code is not padding: mov %rdi,%rax; ret.
        assert_eq!(trailing_padding(Arch::Amd64, &[0x48, 0x89, 0xf8, 0xc3]), 0);
        let a64 = [0xc0, 0x03, 0x5f, 0xd6, 0x1f, 0x20, 0x03, 0xd5, 0, 0, 0, 0];
        let arch = Arch::Aarch64 { big_endian: false };
        assert_eq!(trailing_padding(arch, &a64), 8);
    }

    #[test]
    fn coverage_counts_rows_with_rules_and_padding_in_gaps() {
        use crate::table::{FunctionRows, PcType, Row, Source};
        use sframe_common::{CfaRule, RegRule, RuleFlags, UnwindRule};
        let rule = Some(UnwindRule {
            cfa: CfaRule::sp(8),
            ra: RegRule::AtCfa(-8),
            fp: RegRule::Unchanged,
            flags: RuleFlags::default(),
        });
        let row = |start_offset, rule| Row { start_offset, rule };
        // [0x1000, 0x1010): 12 bytes with a rule, 4 without; gap of 8 padding bytes;
        // [0x1018, 0x1020) with a rule; then 8 bytes of code no FDE covers.
        let t = UnwindTable::from_functions(
            Arch::Amd64,
            Source::EhFrame,
            [
                FunctionRows {
                    start: 0x1000,
                    size: 16,
                    pc_type: PcType::Inc,
                    rows: vec![row(0, rule), row(12, None)],
                },
                FunctionRows {
                    start: 0x1018,
                    size: 8,
                    pc_type: PcType::Inc,
                    rows: vec![row(0, rule)],
                },
            ],
        );
        let mut code = vec![0x90u8; 0x28];
        code[0x10..0x18].copy_from_slice(&[0x0f, 0x1f, 0x84, 0, 0, 0, 0, 0]);
        code[0x20..0x28].copy_from_slice(&[0x48, 0x89, 0xf8, 0x48, 0x89, 0xf8, 0xc3, 0xc3]);
        let mut t = t;
        let got = scan(
            &mut t,
            &[SectionData {
                data: &code,
                address: 0x1000,
            }],
        );
        assert_eq!(
            got,
            ExecCoverage {
                bytes: 0x28,
                padding: 8,
                with_rule: 12 + 8,
            }
        );
        // Only the first function is followed by padding up to the next function; the
        // second by code without rows, at the section's end.
        let marks: Vec<bool> = t.functions().iter().map(|f| f.padding_after()).collect();
        assert_eq!(marks, [true, false]);
        // A gap with code in it is not padding.
        code[0x12] = 0xc3;
        let mut t3 = UnwindTable::from_functions(t.arch, t.source, t.to_function_rows());
        let got = scan(
            &mut t3,
            &[SectionData {
                data: &code,
                address: 0x1000,
            }],
        );
        assert_eq!(got.padding, 5, "the nopl's tail after the ret only");
        assert!(t3.functions().iter().all(|f| !f.padding_after()));
        assert!(t3.functions().iter().all(|f| !f.padding_after()));
    }
}
