//! Reading CPython 3.11–3.13 code objects out of another process.
//!
//! Given the address of a `PyCodeObject` in a live process, [`CodeInfo::read`]
//! fetches the function's qualified name (`co_qualname`), its file name
//! (`co_filename`), its first line (`co_firstlineno`) and its location table
//! (`co_linetable`); [`CodeInfo::line`] then maps an instruction offset to a
//! source line using the 3.11+ location table format (CPython's
//! `Objects/locations.md`).
//!
//! # Hostile input
//!
//! The target's memory is untrusted: any local user can forge its bytes. Every
//! pointer is checked (non-null, 8-byte aligned, no address overflow), every
//! length is bounded before it is used, reads are bounded
//! ([`MAX_STRING_BYTES`] characters per string, [`MAX_LINETABLE`] bytes of
//! location table), and decoding never loops more than a bounded number of
//! times. There are no pointer chains beyond one level (code object → string
//! or bytes object), so cycles cannot cause unbounded work. Forged data yields
//! a [`ReadError`] or a wrong-but-harmless answer, never a panic.
//!
//! Types cannot be checked (no symbol addresses for `PyUnicode_Type` and
//! friends), so plausibility checks stand in for them: a string must be a
//! *compact* string (code object names and file names always are) with a valid
//! kind and a length of at most [`MAX_STRING_LENGTH`] code points.
//!
//! # Layouts
//!
//! The offsets in [`CodeLayout::for_version`] were measured by compiling
//! `offsetof`/`sizeof` probes against each version's headers (x86-64; AArch64
//! is identical). The `state` bit field of `PyASCIIObject` has the same bit
//! positions in 3.11, 3.12 and 3.13: `interned` bits 0–1, `kind` bits 2–4,
//! `compact` bit 5, `ascii` bit 6 (bit 7 is `ready` in 3.11 and
//! `statically_allocated` in 3.12+). Free-threaded (`Py_GIL_DISABLED`) builds
//! have a different object header and are not supported.
//!
//! # Strings
//!
//! Names are decoded from the string's canonical representation: UCS1 as
//! Latin-1, UCS2 and UCS4 as code points (surrogates and out-of-range values
//! become U+FFFD; a byte above 0x7F in a string flagged ASCII becomes U+FFFD
//! as well). Control characters (`char::is_control`) are replaced by `?`.
//! The result is cut to at most [`MAX_STRING_BYTES`] bytes of UTF-8, at a
//! character boundary, without any marker.

use std::fmt;
use std::fs::File;
use std::os::unix::fs::FileExt;

/// Longest qualified name or file name returned, in bytes of UTF-8. Longer
/// strings are cut at the last character boundary that fits, silently.
pub const MAX_STRING_BYTES: usize = 1024;

/// Most bytes of a location table that are read. A longer table (its
/// `ob_size` is larger) is truncated to this bound; [`CodeInfo::line`]
/// returns `None` for offsets that the kept part does not cover.
pub const MAX_LINETABLE: usize = 64 * 1024;

/// Largest plausible string `length` field (in code points). A larger value
/// is taken as proof that the pointer is not a string and is an error.
pub const MAX_STRING_LENGTH: u64 = 1 << 20;

/// Largest offset + field size accepted in a [`CodeLayout`]; larger values
/// make [`CodeInfo::read`] fail with [`ReadError::BadLayout`].
const MAX_HEADER: usize = 4096;

/// Reads bytes of the target process's memory.
pub trait Memory {
    /// Fills `buf` with the bytes at `addr`. Returns false when any byte
    /// cannot be read (the contents of `buf` are then unspecified).
    fn read(&self, addr: u64, buf: &mut [u8]) -> bool;
}

/// Reads `/proc/PID/mem` with `pread` (`FileExt::read_exact_at`); the file is
/// opened once, at [`ProcMem::open`].
#[derive(Debug)]
pub struct ProcMem {
    file: File,
}

impl ProcMem {
    /// Opens `/proc/<pid>/mem` for reading. Needs ptrace access to `pid`.
    pub fn open(pid: u32) -> std::io::Result<Self> {
        let file = File::open(format!("/proc/{pid}/mem"))?;
        Ok(Self { file })
    }
}

impl Memory for ProcMem {
    fn read(&self, addr: u64, buf: &mut [u8]) -> bool {
        if buf.is_empty() {
            return true;
        }
        // pread's offset is signed; addresses above i64::MAX are not user
        // space anyway.
        if addr > i64::MAX as u64 {
            return false;
        }
        self.file.read_exact_at(buf, addr).is_ok()
    }
}

/// Layout of code and string objects for one CPython minor version (all
/// offsets in bytes).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CodeLayout {
    /// `offsetof(PyCodeObject, co_filename)`.
    pub co_filename: u32,
    /// `offsetof(PyCodeObject, co_name)` (not used by [`CodeInfo::read`],
    /// which reports the qualified name).
    pub co_name: u32,
    /// `offsetof(PyCodeObject, co_qualname)`.
    pub co_qualname: u32,
    /// `offsetof(PyCodeObject, co_linetable)`.
    pub co_linetable: u32,
    /// `offsetof(PyCodeObject, co_firstlineno)` (a C `int`).
    pub co_firstlineno: u32,
    /// `offsetof(PyCodeObject, co_code_adaptive)`: where the instructions
    /// start; offsets given to [`CodeInfo::line`] count 2-byte code units from
    /// here.
    pub co_code_adaptive: u32,
    /// sizeof(PyASCIIObject): where a compact ASCII string's characters start.
    pub ascii_size: u32,
    /// sizeof(PyCompactUnicodeObject): where a compact non-ASCII string's characters start.
    pub compact_size: u32,
    /// offsetof(PyASCIIObject, length): the length in code points (`Py_ssize_t`).
    pub str_length: u32,
    /// offsetof(PyASCIIObject, state): the 32-bit flags word.
    pub str_state: u32,
    /// offsetof(PyBytesObject, ob_sval): where a bytes object's data start.
    pub bytes_sval: u32,
    /// offsetof(PyVarObject, ob_size): a bytes object's length (`Py_ssize_t`).
    pub var_size: u32,
    /// The format of the line table (`co_linetable`, or `co_lnotab` before 3.10).
    pub lines: LineTable,
}

/// The line table formats of CPython versions.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LineTable {
    /// 3.11+'s location table (Objects/locations.md); offsets in code units.
    Locations,
    /// 3.10's `co_linetable` (PEP 626): (bytecode bytes, line delta) pairs; offsets in
    /// code units.
    Pairs,
    /// 3.6–3.9's `co_lnotab`: (bytecode bytes, line delta) pairs, a line delta applying
    /// from its entry's end; offsets in bytes (the frames' `f_lasti`).
    Lnotab,
}

impl CodeLayout {
    /// Layouts for (3, 7) to (3, 13) on 64-bit targets; None otherwise. Before 3.11
    /// there is no `co_qualname`: `co_name` stands in (a method shows as `method`, not
    /// `Class.method`).
    pub fn for_version(major: u8, minor: u8) -> Option<Self> {
        let v312 = Self {
            co_filename: 112,
            co_name: 120,
            co_qualname: 128,
            co_linetable: 136,
            co_firstlineno: 68,
            co_code_adaptive: 192,
            ascii_size: 40,
            compact_size: 56,
            str_length: 16,
            str_state: 32,
            bytes_sval: 32,
            var_size: 16,
            lines: LineTable::Locations,
        };
        // No adaptive instructions before 3.11: the frame's `f_lasti` counts from
        // `co_code`'s first.
        let v310 = Self {
            co_filename: 104,
            co_name: 112,
            co_qualname: 112,
            co_linetable: 120,
            co_firstlineno: 40,
            co_code_adaptive: 0,
            ascii_size: 48,
            compact_size: 72,
            lines: LineTable::Pairs,
            ..v312
        };
        match (major, minor) {
            (3, 7) => Some(Self {
                co_filename: 96,
                co_name: 104,
                co_qualname: 104,
                co_linetable: 112,
                co_firstlineno: 36,
                lines: LineTable::Lnotab,
                ..v310
            }),
            (3, 8 | 9) => Some(Self {
                lines: LineTable::Lnotab,
                ..v310
            }),
            (3, 10) => Some(v310),
            (3, 11) => Some(Self {
                co_firstlineno: 72,
                co_code_adaptive: 184,
                ascii_size: 48,
                compact_size: 72,
                ..v312
            }),
            (3, 12) => Some(v312),
            (3, 13) => Some(Self {
                co_code_adaptive: 200,
                ..v312
            }),
            _ => None,
        }
    }

    /// Bytes of the code object header that must be read to reach every
    /// field used; None when the layout is implausible.
    fn code_header_len(&self) -> Option<usize> {
        let ends = [
            end_of(self.co_filename, 8)?,
            end_of(self.co_qualname, 8)?,
            end_of(self.co_linetable, 8)?,
            end_of(self.co_firstlineno, 4)?,
        ];
        let len = ends.into_iter().max()?;
        (len <= MAX_HEADER).then_some(len)
    }

    /// Bytes of a string header that must be read; None when implausible.
    fn str_header_len(&self) -> Option<usize> {
        let len = end_of(self.str_length, 8)?.max(end_of(self.str_state, 4)?);
        let ok = len <= MAX_HEADER
            && (self.ascii_size as usize) <= MAX_HEADER
            && (self.compact_size as usize) <= MAX_HEADER;
        ok.then_some(len)
    }

    /// Bytes of a bytes-object header that must be read; None when
    /// implausible.
    fn bytes_header_len(&self) -> Option<usize> {
        let len = end_of(self.var_size, 8)?;
        let ok = len <= MAX_HEADER && (self.bytes_sval as usize) <= MAX_HEADER;
        ok.then_some(len)
    }
}

/// `offset + size` as usize, None on overflow.
fn end_of(offset: u32, size: usize) -> Option<usize> {
    usize::try_from(offset).ok()?.checked_add(size)
}

/// Why a code object could not be read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ReadError {
    /// The [`CodeLayout`] has offsets beyond any plausible object size.
    BadLayout,
    /// A pointer is null, misaligned, or the object would wrap the address
    /// space. `what` names the object ("code object", "co_qualname", ...).
    BadPointer {
        /// Which object the pointer was for.
        what: &'static str,
        /// The pointer value.
        addr: u64,
    },
    /// Memory of the object could not be read.
    Unreadable {
        /// Which object was being read.
        what: &'static str,
        /// Address of the failed read.
        addr: u64,
    },
    /// The string is not a compact string (or claims ASCII with a kind other
    /// than UCS1), so it is not a code object's name.
    NotCompact {
        /// Which string.
        what: &'static str,
    },
    /// The string's kind is not 1, 2 or 4 bytes per character.
    BadKind {
        /// Which string.
        what: &'static str,
        /// The kind found.
        kind: u32,
    },
    /// A length field is negative or implausibly large.
    BadLength {
        /// Which object.
        what: &'static str,
        /// The length found (as signed `Py_ssize_t`).
        length: i64,
    },
    /// `co_firstlineno` is negative.
    NegativeFirstLine(i32),
}

impl fmt::Display for ReadError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::BadLayout => write!(f, "implausible code object layout"),
            Self::BadPointer { what, addr } => write!(f, "{what}: bad pointer {addr:#x}"),
            Self::Unreadable { what, addr } => write!(f, "{what}: cannot read memory at {addr:#x}"),
            Self::NotCompact { what } => write!(f, "{what}: not a compact string"),
            Self::BadKind { what, kind } => write!(f, "{what}: bad string kind {kind}"),
            Self::BadLength { what, length } => write!(f, "{what}: implausible length {length}"),
            Self::NegativeFirstLine(n) => write!(f, "negative co_firstlineno {n}"),
        }
    }
}

impl std::error::Error for ReadError {}

/// What was read from one code object.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CodeInfo {
    /// `co_qualname`, sanitized and cut to [`MAX_STRING_BYTES`].
    pub qualname: String,
    /// `co_filename`, sanitized and cut to [`MAX_STRING_BYTES`].
    pub filename: String,
    /// `co_firstlineno`.
    pub first_line: u32,
    /// The raw location table (co_linetable bytes), at most MAX_LINETABLE bytes.
    linetable: Vec<u8>,
    /// The table's format.
    lines: LineTable,
    /// What identifies the object among those its address may hold over time: the
    /// header's name, file and location-table pointers and first line.
    identity: Identity,
}

/// The fields of a code object's header that tell one code object from another at the
/// same address (after the first was freed).
type Identity = [u64; 4];

fn identity(header: &[u8], layout: &CodeLayout) -> Option<Identity> {
    Some([
        field_u64(header, layout.co_qualname)?,
        field_u64(header, layout.co_filename)?,
        field_u64(header, layout.co_linetable)?,
        u64::from(field_u32(header, layout.co_firstlineno)?),
    ])
}

impl CodeInfo {
    /// Reads the code object at `addr` with the given layout.
    ///
    /// At most a few header reads plus [`MAX_STRING_BYTES`] × 4 bytes per
    /// string and [`MAX_LINETABLE`] bytes of location table are read.
    pub fn read(mem: &impl Memory, layout: &CodeLayout, addr: u64) -> Result<Self, ReadError> {
        let what = "code object";
        let len = layout.code_header_len().ok_or(ReadError::BadLayout)?;
        let header = read_vec(mem, what, addr, len)?;
        let ptr = |off: u32| field_u64(&header, off).ok_or(ReadError::BadLayout);
        let first = field_u32(&header, layout.co_firstlineno).ok_or(ReadError::BadLayout)?;
        let first = i32::from_ne_bytes(first.to_ne_bytes());
        let first_line = u32::try_from(first).map_err(|_| ReadError::NegativeFirstLine(first))?;
        let qualname = read_string(mem, layout, "co_qualname", ptr(layout.co_qualname)?)?;
        let filename = read_string(mem, layout, "co_filename", ptr(layout.co_filename)?)?;
        let linetable = read_bytes(mem, layout, "co_linetable", ptr(layout.co_linetable)?)?;
        Ok(Self {
            qualname,
            filename,
            first_line,
            linetable,
            lines: layout.lines,
            identity: identity(&header, layout).ok_or(ReadError::BadLayout)?,
        })
    }

    /// Whether the code object at `addr` is still the one this was read from (one read
    /// of its header); None when the header cannot be read (the process gone).
    pub fn still_at(&self, mem: &impl Memory, layout: &CodeLayout, addr: u64) -> Option<bool> {
        let len = layout.code_header_len()?;
        let header = read_vec(mem, "code object", addr, len).ok()?;
        Some(identity(&header, layout)? == self.identity)
    }

    /// The source line of the instruction at `offset` code units (2-byte
    /// units) from co_code_adaptive's start, per the 3.11+ location table
    /// format (CPython's Objects/locations.md); None when the table says no
    /// location, the offset is past it, or the table is malformed before
    /// reaching it.
    /// Before 3.11, `offset` counts from `co_code`'s first: code units in 3.10, bytes
    /// before (see [`LineTable`]).
    pub fn line(&self, offset: u32) -> Option<u32> {
        let first = i64::from(self.first_line);
        match self.lines {
            LineTable::Locations => line_for_offset(&self.linetable, first, offset),
            LineTable::Pairs => line_from_pairs(&self.linetable, first, offset),
            LineTable::Lnotab => line_from_lnotab(&self.linetable, first, offset),
        }
    }
}

/// Checks that an object pointer is plausible: non-null, 8-byte aligned, and
/// `addr + len` does not wrap.
fn check_ptr(what: &'static str, addr: u64, len: usize) -> Result<(), ReadError> {
    let len = u64::try_from(len).map_err(|_| ReadError::BadPointer { what, addr })?;
    if addr == 0 || !addr.is_multiple_of(8) || addr.checked_add(len).is_none() {
        return Err(ReadError::BadPointer { what, addr });
    }
    Ok(())
}

/// Reads `len` bytes (bounded by the callers) at `addr`.
fn read_vec(
    mem: &impl Memory,
    what: &'static str,
    addr: u64,
    len: usize,
) -> Result<Vec<u8>, ReadError> {
    check_ptr(what, addr, len)?;
    let mut buf = vec![0u8; len];
    if mem.read(addr, &mut buf) {
        Ok(buf)
    } else {
        Err(ReadError::Unreadable { what, addr })
    }
}

fn field_u64(buf: &[u8], off: u32) -> Option<u64> {
    let start = usize::try_from(off).ok()?;
    let bytes = buf.get(start..start.checked_add(8)?)?;
    Some(u64::from_ne_bytes(bytes.try_into().ok()?))
}

fn field_u32(buf: &[u8], off: u32) -> Option<u32> {
    let start = usize::try_from(off).ok()?;
    let bytes = buf.get(start..start.checked_add(4)?)?;
    Some(u32::from_ne_bytes(bytes.try_into().ok()?))
}

/// `base + off` for a field or data inside an object whose pointer already
/// passed [`check_ptr`].
fn offset_addr(what: &'static str, base: u64, off: u32) -> Result<u64, ReadError> {
    base.checked_add(u64::from(off))
        .ok_or(ReadError::BadPointer { what, addr: base })
}

/// `PyASCIIObject.state` bits, identical in 3.11, 3.12 and 3.13.
const STATE_KIND_SHIFT: u32 = 2;
const STATE_KIND_MASK: u32 = 0b111;
const STATE_COMPACT: u32 = 1 << 5;
const STATE_ASCII: u32 = 1 << 6;

/// Reads a compact `str` object at `addr`.
fn read_string(
    mem: &impl Memory,
    layout: &CodeLayout,
    what: &'static str,
    addr: u64,
) -> Result<String, ReadError> {
    let hlen = layout.str_header_len().ok_or(ReadError::BadLayout)?;
    let header = read_vec(mem, what, addr, hlen)?;
    let length = field_u64(&header, layout.str_length).ok_or(ReadError::BadLayout)?;
    let state = field_u32(&header, layout.str_state).ok_or(ReadError::BadLayout)?;
    if length > MAX_STRING_LENGTH {
        return Err(ReadError::BadLength {
            what,
            length: i64::from_ne_bytes(length.to_ne_bytes()),
        });
    }
    if state & STATE_COMPACT == 0 {
        return Err(ReadError::NotCompact { what });
    }
    let kind = (state >> STATE_KIND_SHIFT) & STATE_KIND_MASK;
    let ascii = state & STATE_ASCII != 0;
    let width: usize = match kind {
        1 => 1,
        2 => 2,
        4 => 4,
        _ => return Err(ReadError::BadKind { what, kind }),
    };
    if ascii && width != 1 {
        return Err(ReadError::NotCompact { what });
    }
    let data_off = if ascii {
        layout.ascii_size
    } else {
        layout.compact_size
    };
    let data = offset_addr(what, addr, data_off)?;
    // Every character yields at least one byte of UTF-8, so more than
    // MAX_STRING_BYTES characters are never needed. `length` ≤ 2^20 here.
    let chars = usize::try_from(length)
        .unwrap_or(MAX_STRING_BYTES)
        .min(MAX_STRING_BYTES);
    let nbytes = chars.saturating_mul(width);
    let mut raw = vec![0u8; nbytes];
    if data.checked_add(nbytes as u64).is_none() || !mem.read(data, &mut raw) {
        return Err(ReadError::Unreadable { what, addr: data });
    }
    Ok(decode_chars(&raw, width, ascii))
}

/// Decodes a PEP 393 character buffer of `width` bytes per character
/// (native endian), sanitizing control characters and cutting the result at
/// [`MAX_STRING_BYTES`]. An incomplete trailing character is ignored.
fn decode_chars(raw: &[u8], width: usize, ascii: bool) -> String {
    let mut out = String::with_capacity(raw.len().min(MAX_STRING_BYTES));
    let width = width.max(1);
    for unit in raw.chunks_exact(width) {
        let c = match *unit {
            [b] if ascii => {
                if b.is_ascii() {
                    char::from(b)
                } else {
                    char::REPLACEMENT_CHARACTER
                }
            }
            [b] => char::from(b),
            [a, b] => char::from_u32(u32::from(u16::from_ne_bytes([a, b])))
                .unwrap_or(char::REPLACEMENT_CHARACTER),
            [a, b, c, d] => char::from_u32(u32::from_ne_bytes([a, b, c, d]))
                .unwrap_or(char::REPLACEMENT_CHARACTER),
            _ => char::REPLACEMENT_CHARACTER,
        };
        let c = if c.is_control() { '?' } else { c };
        if out.len().saturating_add(c.len_utf8()) > MAX_STRING_BYTES {
            break;
        }
        out.push(c);
    }
    out
}

/// Reads a `bytes` object's data at `addr`, truncated to [`MAX_LINETABLE`].
fn read_bytes(
    mem: &impl Memory,
    layout: &CodeLayout,
    what: &'static str,
    addr: u64,
) -> Result<Vec<u8>, ReadError> {
    let hlen = layout.bytes_header_len().ok_or(ReadError::BadLayout)?;
    let header = read_vec(mem, what, addr, hlen)?;
    let size = field_u64(&header, layout.var_size).ok_or(ReadError::BadLayout)?;
    let size = i64::from_ne_bytes(size.to_ne_bytes());
    let Ok(size) = u64::try_from(size) else {
        return Err(ReadError::BadLength { what, length: size });
    };
    let len = usize::try_from(size)
        .unwrap_or(MAX_LINETABLE)
        .min(MAX_LINETABLE);
    let data = offset_addr(what, addr, layout.bytes_sval)?;
    let mut buf = vec![0u8; len];
    if data.checked_add(len as u64).is_none() || !mem.read(data, &mut buf) {
        return Err(ReadError::Unreadable { what, addr: data });
    }
    Ok(buf)
}

/// Location table codes (Objects/locations.md).
const LOC_NONE: u8 = 15;
const LOC_LONG: u8 = 14;
const LOC_NO_COLUMNS: u8 = 13;
const LOC_ONE_LINE0: u8 = 10;
const LOC_ONE_LINE2: u8 = 12;

/// Most 6-bit chunks accepted in one varint (60 bits); more is malformed.
const MAX_VARINT_CHUNKS: u32 = 10;

/// Reads an unsigned varint starting at `*pos`: 6-bit little-endian chunks,
/// 0x40 = more follow. Stops (None) at the end of the table, at a byte with
/// bit 7 set (the start of the next entry), or after [`MAX_VARINT_CHUNKS`].
fn read_varint(table: &[u8], pos: &mut usize) -> Option<u64> {
    let mut value: u64 = 0;
    for chunk in 0..MAX_VARINT_CHUNKS {
        let b = *table.get(*pos)?;
        if b & 0x80 != 0 {
            return None;
        }
        *pos = pos.checked_add(1)?;
        value |= u64::from(b & 0x3f) << (6 * chunk);
        if b & 0x40 == 0 {
            return Some(value);
        }
    }
    None
}

/// Reads a signed varint: `v & 1` is the sign, `v >> 1` the magnitude.
fn read_svarint(table: &[u8], pos: &mut usize) -> Option<i64> {
    let v = read_varint(table, pos)?;
    // v < 2^60, so the magnitude fits in i64.
    let magnitude = i64::try_from(v >> 1).ok()?;
    Some(if v & 1 != 0 { -magnitude } else { magnitude })
}

/// Walks a 3.11+ location table to the entry covering code unit `target`.
///
/// Mirrors CPython's `advance()` in Objects/codeobject.c: each entry starts
/// at a byte with bit 7 set; the line changes by the entry's delta (also for
/// entries whose location is given as "none", whose delta is 0); following
/// bytes without bit 7 belong to the entry. Bytes before the first entry
/// start are skipped. Every step consumes at least one byte, so the walk is
/// bounded by the table length.
fn line_for_offset(table: &[u8], first_line: i64, target: u32) -> Option<u32> {
    line_for_offset_311(table, first_line, target)
}

/// The line of the instruction `target` code units from the first, per 3.10's
/// `co_linetable` (Objects/lnotab_notes.txt of 3.10): byte pairs (bytecode bytes the
/// entry spans, unsigned; line delta, signed, -128 for no line), the line deltas of
/// empty entries counting too. None when the table gives no line or ends before it.
fn line_from_pairs(table: &[u8], first_line: i64, target: u32) -> Option<u32> {
    let target = u64::from(target) * 2;
    let mut line = first_line;
    let mut end: u64 = 0;
    for pair in table.chunks_exact(2) {
        let (&[span, delta], start) = (pair, end) else {
            return None;
        };
        end += u64::from(span);
        let delta = i8::from_ne_bytes([delta]);
        let here = if delta == -128 {
            None
        } else {
            line += i64::from(delta);
            Some(line)
        };
        if start < end && target < end {
            return here.and_then(|l| u32::try_from(l).ok());
        }
    }
    None
}

/// The line of the instruction at byte `target`, per `co_lnotab` (3.6–3.9's
/// `PyCode_Addr2Line`): byte pairs (bytecode bytes, signed line delta), each line delta
/// applying from the end of its entry's bytes (past the code: its last line). None for
/// a line below 1.
fn line_from_lnotab(table: &[u8], first_line: i64, target: u32) -> Option<u32> {
    let target = u64::from(target);
    let mut line = first_line;
    let mut addr: u64 = 0;
    for pair in table.chunks_exact(2) {
        let &[span, delta] = pair else {
            return None;
        };
        addr += u64::from(span);
        if addr > target {
            break;
        }
        line += i64::from(i8::from_ne_bytes([delta]));
    }
    u32::try_from(line).ok().filter(|&l| l > 0)
}

fn line_for_offset_311(table: &[u8], first_line: i64, target: u32) -> Option<u32> {
    let target = u64::from(target);
    let mut line = first_line;
    let mut start: u64 = 0;
    let mut pos: usize = 0;
    while let Some(&first) = table.get(pos) {
        pos = pos.checked_add(1)?;
        if first & 0x80 == 0 {
            continue; // not an entry start: garbage or a previous entry's tail
        }
        let code = (first >> 3) & 15;
        let end = start.checked_add(u64::from(first & 7) + 1)?;
        let delta = match code {
            LOC_NONE => 0,
            LOC_LONG | LOC_NO_COLUMNS => read_svarint(table, &mut pos)?,
            LOC_ONE_LINE0..=LOC_ONE_LINE2 => i64::from(code - LOC_ONE_LINE0),
            _ => 0, // short forms: same line
        };
        line = line.saturating_add(delta);
        if target < end {
            if code == LOC_NONE {
                return None;
            }
            return u32::try_from(line).ok();
        }
        start = end;
        // Column data and the rest of a long form entry are skipped by the
        // bit-7 test at the top of the loop.
    }
    None
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::indexing_slicing)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    // ---------- location table ----------

    /// Encodes an unsigned varint.
    fn varint(mut v: u64, out: &mut Vec<u8>) {
        loop {
            let chunk = (v & 0x3f) as u8;
            v >>= 6;
            if v == 0 {
                out.push(chunk);
                return;
            }
            out.push(chunk | 0x40);
        }
    }

    fn svarint(v: i64, out: &mut Vec<u8>) {
        let u = if v < 0 {
            ((-v as u64) << 1) | 1
        } else {
            (v as u64) << 1
        };
        varint(u, out);
    }

    fn head(code: u8, len: u8) -> u8 {
        assert!((1..=8).contains(&len));
        0x80 | (code << 3) | (len - 1)
    }

    fn info(table: Vec<u8>, first_line: u32) -> CodeInfo {
        CodeInfo {
            qualname: String::new(),
            filename: String::new(),
            first_line,
            linetable: table,
            lines: LineTable::Locations,
            identity: [0; 4],
        }
    }

    #[test]
    fn varints() {
        for v in [0u64, 1, 31, 32, 63, 64, 4095, 4096, 1 << 40, (1 << 60) - 1] {
            let mut b = Vec::new();
            varint(v, &mut b);
            let mut pos = 0;
            assert_eq!(read_varint(&b, &mut pos), Some(v), "{v}");
            assert_eq!(pos, b.len());
        }
        for v in [0i64, 1, -1, 31, -32, 1000, -1000, 1 << 40, -(1 << 40)] {
            let mut b = Vec::new();
            svarint(v, &mut b);
            let mut pos = 0;
            assert_eq!(read_svarint(&b, &mut pos), Some(v), "{v}");
        }
        // Truncated, hits the next entry, too long.
        let mut pos = 0;
        assert_eq!(read_varint(&[0x41], &mut pos), None);
        let mut pos = 0;
        assert_eq!(read_varint(&[0x41, 0x80], &mut pos), None);
        let mut pos = 0;
        assert_eq!(read_varint(&[0x7f; 20], &mut pos), None);
        let mut pos = 0;
        assert_eq!(read_varint(&[], &mut pos), None);
    }

    #[test]
    fn all_entry_kinds() {
        let mut t = Vec::new();
        // [0,2): short form (code 3), line 10
        t.extend([head(3, 2), 0x12]);
        // [2,5): one-line form, delta 1 → 11
        t.extend([head(11, 3), 4, 9]);
        // [5,6): one-line form, delta 2 → 13
        t.extend([head(12, 1), 0, 1]);
        // [6,7): one-line form, delta 0 → 13
        t.extend([head(10, 1), 2, 3]);
        // [7,15): no location
        t.push(head(15, 8));
        // [15,16): no columns, delta +100 → 113 (multi-chunk varint)
        t.push(head(13, 1));
        svarint(100, &mut t);
        // [16,20): long form, delta -50 → 63, end line/cols
        t.push(head(14, 4));
        svarint(-50, &mut t);
        varint(3, &mut t);
        varint(200, &mut t);
        varint(7000, &mut t);
        // [20,21): short form code 9, still 63
        t.extend([head(9, 1), 0x7f]);
        // [21,22): no location keeps the running line: then +1 → 64
        t.push(head(15, 1));
        t.extend([head(11, 1), 0, 0]);
        let ci = info(t, 10);
        let want: Vec<Option<u32>> = [
            [Some(10); 2].as_slice(),
            &[Some(11); 3],
            &[Some(13)],
            &[Some(13)],
            &[None; 8],
            &[Some(113)],
            &[Some(63); 4],
            &[Some(63)],
            &[None],
            &[Some(64)],
        ]
        .concat();
        for (off, w) in want.iter().enumerate() {
            assert_eq!(ci.line(off as u32), *w, "offset {off}");
        }
        assert_eq!(ci.line(want.len() as u32), None);
        assert_eq!(ci.line(u32::MAX), None);
    }

    #[test]
    fn negative_and_zero_lines() {
        // Going below zero gives None; line 0 is a real line (module RESUME).
        let mut t = vec![head(13, 1)];
        svarint(-1, &mut t);
        t.push(head(13, 1));
        svarint(-5, &mut t);
        t.push(head(13, 1));
        svarint(10, &mut t);
        let ci = info(t, 1);
        assert_eq!(ci.line(0), Some(0));
        assert_eq!(ci.line(1), None);
        assert_eq!(ci.line(2), Some(5));
    }

    #[test]
    fn truncated_tables() {
        let mut full = vec![head(5, 1), 0x00, head(13, 2)];
        svarint(1000, &mut full);
        full.push(head(14, 1));
        svarint(-3, &mut full);
        varint(0, &mut full);
        varint(1, &mut full);
        varint(2, &mut full);
        let ci = info(full.clone(), 7);
        assert_eq!(ci.line(0), Some(7));
        assert_eq!(ci.line(2), Some(1007));
        assert_eq!(ci.line(3), Some(1004));
        for cut in 0..full.len() {
            let ci = info(full[..cut].to_vec(), 7);
            for off in 0..6 {
                let _ = ci.line(off); // never panics
            }
        }
        // Cut inside the no-column varint: its offsets and later are None.
        let ci = info(full[..4].to_vec(), 7);
        assert_eq!(ci.line(0), Some(7));
        assert_eq!(ci.line(1), None);
        // Empty table.
        assert_eq!(info(Vec::new(), 1).line(0), None);
        // Leading garbage without bit 7 is skipped.
        let ci = info(vec![0x01, 0x7f, head(10, 1), 0, 0], 4);
        assert_eq!(ci.line(0), Some(4));
    }

    /// xorshift, to make deterministic garbage without external crates.
    fn rng(state: &mut u64) -> u64 {
        *state ^= *state << 13;
        *state ^= *state >> 7;
        *state ^= *state << 17;
        *state
    }

    #[test]
    fn garbage_never_panics() {
        let mut s = 0x1234_5678_9abc_def1u64;
        for round in 0..2000 {
            let len = (rng(&mut s) % 300) as usize;
            let t: Vec<u8> = (0..len).map(|_| rng(&mut s) as u8).collect();
            let first = if round % 2 == 0 {
                u32::MAX
            } else {
                (rng(&mut s) % 1000) as u32
            };
            let ci = info(t, first);
            for off in [0, 1, 7, 50, 500, 5000, u32::MAX] {
                let _ = ci.line(off);
            }
        }
        // Many huge deltas in a row saturate instead of overflowing.
        let mut t = Vec::new();
        for _ in 0..5000 {
            t.push(head(13, 1));
            svarint((1 << 59) - 1, &mut t);
        }
        let ci = info(t, u32::MAX);
        assert_eq!(ci.line(4999), None);
        // A maximal table of maximal entries: offsets up to 8 * 64Ki.
        let ci = info(vec![head(0, 8); MAX_LINETABLE], 1);
        assert_eq!(ci.line(8 * MAX_LINETABLE as u32 - 1), Some(1));
        assert_eq!(ci.line(8 * MAX_LINETABLE as u32), None);
    }

    // ---------- strings ----------

    #[test]
    fn decode_kinds() {
        assert_eq!(decode_chars(b"Outer.inner", 1, true), "Outer.inner");
        assert_eq!(decode_chars(&[b'a', 0xe9, 0xdf], 1, false), "aéß");
        assert_eq!(decode_chars(&[b'a', 0xe9], 1, true), "a\u{fffd}");
        let ucs2: Vec<u8> = "日本x".encode_utf16().flat_map(u16::to_ne_bytes).collect();
        assert_eq!(decode_chars(&ucs2, 2, false), "日本x");
        let lone = 0xd800u16.to_ne_bytes();
        assert_eq!(decode_chars(&lone, 2, false), "\u{fffd}");
        let ucs4: Vec<u8> = "𠀀ü"
            .chars()
            .flat_map(|c| (c as u32).to_ne_bytes())
            .collect();
        assert_eq!(decode_chars(&ucs4, 4, false), "𠀀ü");
        let bad: Vec<u8> = [0x110000u32, 0xdfff, u32::MAX]
            .iter()
            .flat_map(|c| c.to_ne_bytes())
            .collect();
        assert_eq!(decode_chars(&bad, 4, false), "\u{fffd}\u{fffd}\u{fffd}");
        // Control characters, C0, DEL and C1.
        assert_eq!(decode_chars(b"a\nb\x1b[0m\x7f", 1, true), "a?b?[0m?");
        assert_eq!(decode_chars(&[0x85, 0x9b], 1, false), "??");
        // Trailing partial character is ignored.
        assert_eq!(decode_chars(&[b'a', 0, 0], 2, false), "a");
        // Cut at a character boundary.
        let long = vec![0xe9u8; MAX_STRING_BYTES]; // é is 2 bytes of UTF-8
        let s = decode_chars(&long, 1, false);
        assert_eq!(s.len(), MAX_STRING_BYTES);
        let odd: Vec<u8> = std::iter::once(b'x').chain(long.iter().copied()).collect();
        let s = decode_chars(&odd, 1, false);
        assert_eq!(s.len(), MAX_STRING_BYTES - 1);
        assert!(s.ends_with('é'));
    }

    // ---------- forged memory ----------

    /// Sparse fake address space.
    #[derive(Default)]
    struct FakeMem {
        regions: BTreeMap<u64, Vec<u8>>,
        reads: std::cell::Cell<usize>,
        bytes: std::cell::Cell<usize>,
    }

    impl FakeMem {
        fn put(&mut self, addr: u64, data: Vec<u8>) {
            self.regions.insert(addr, data);
        }
        fn region(&mut self, addr: u64) -> &mut Vec<u8> {
            self.regions.get_mut(&addr).unwrap()
        }
    }

    impl Memory for FakeMem {
        fn read(&self, addr: u64, buf: &mut [u8]) -> bool {
            self.reads.set(self.reads.get() + 1);
            self.bytes.set(self.bytes.get() + buf.len());
            let Some((&base, data)) = self.regions.range(..=addr).next_back() else {
                return false;
            };
            let start = (addr - base) as usize;
            match data.get(start..start + buf.len()) {
                Some(src) => {
                    buf.copy_from_slice(src);
                    true
                }
                None => false,
            }
        }
    }

    const CODE: u64 = 0x10_0000;
    const QUAL: u64 = 0x20_0000;
    const FILE: u64 = 0x30_0000;
    const TABLE: u64 = 0x40_0000;

    fn put_u64(buf: &mut [u8], off: u32, v: u64) {
        buf[off as usize..off as usize + 8].copy_from_slice(&v.to_ne_bytes());
    }
    fn put_u32(buf: &mut [u8], off: u32, v: u32) {
        buf[off as usize..off as usize + 4].copy_from_slice(&v.to_ne_bytes());
    }

    fn string_obj(l: &CodeLayout, s: &str) -> Vec<u8> {
        let max = s.chars().map(|c| c as u32).max().unwrap_or(0);
        let (kind, ascii) = match max {
            0..=0x7f => (1, true),
            0x80..=0xff => (1, false),
            0x100..=0xffff => (2, false),
            _ => (4, false),
        };
        let off = if ascii { l.ascii_size } else { l.compact_size };
        let mut o = vec![0u8; off as usize];
        for c in s.chars() {
            let c = c as u32;
            match kind {
                1 => o.push(c as u8),
                2 => o.extend((c as u16).to_ne_bytes()),
                _ => o.extend(c.to_ne_bytes()),
            }
        }
        o.extend([0; 4]);
        put_u64(&mut o, l.str_length, s.chars().count() as u64);
        let state = (kind << 2) | (1 << 5) | (u32::from(ascii) << 6) | 1;
        put_u32(&mut o, l.str_state, state);
        o
    }

    fn bytes_obj(l: &CodeLayout, b: &[u8]) -> Vec<u8> {
        let mut o = vec![0u8; l.bytes_sval as usize];
        o.extend_from_slice(b);
        o.push(0);
        put_u64(&mut o, l.var_size, b.len() as u64);
        o
    }

    fn forge(l: &CodeLayout, qual: &str, file: &str, table: &[u8]) -> FakeMem {
        let mut code = vec![0u8; l.co_code_adaptive as usize + 16];
        put_u64(&mut code, l.co_qualname, QUAL);
        put_u64(&mut code, l.co_filename, FILE);
        put_u64(&mut code, l.co_linetable, TABLE);
        put_u32(&mut code, l.co_firstlineno, 42);
        let mut m = FakeMem::default();
        m.put(CODE, code);
        m.put(QUAL, string_obj(l, qual));
        m.put(FILE, string_obj(l, file));
        m.put(TABLE, bytes_obj(l, table));
        m
    }

    fn layouts() -> Vec<CodeLayout> {
        [(3, 11), (3, 12), (3, 13)]
            .iter()
            .map(|&(a, b)| CodeLayout::for_version(a, b).unwrap())
            .collect()
    }

    #[test]
    fn versions() {
        assert!(CodeLayout::for_version(3, 6).is_none());
        assert!(CodeLayout::for_version(3, 14).is_none());
        assert!(CodeLayout::for_version(2, 11).is_none());
        let l = layouts();
        assert_eq!(
            (l[0].co_firstlineno, l[0].co_code_adaptive, l[0].ascii_size),
            (72, 184, 48)
        );
        assert_eq!(
            (
                l[1].co_firstlineno,
                l[1].co_code_adaptive,
                l[1].compact_size
            ),
            (68, 192, 56)
        );
        assert_eq!(
            l[2],
            CodeLayout {
                co_code_adaptive: 200,
                ..l[1]
            }
        );
    }

    #[test]
    fn a_code_object_is_told_from_another_at_its_address() {
        for l in layouts() {
            let table = [head(10, 2), 0, 5];
            let mut m = forge(&l, "transient", "<string>", &table);
            let ci = CodeInfo::read(&m, &l, CODE).unwrap();
            assert_eq!(ci.still_at(&m, &l, CODE), Some(true));
            // Freed, and another code object made at the same address: other strings.
            m.put(0x50_0000, string_obj(&l, "lasting"));
            put_u64(m.region(CODE), l.co_qualname, 0x50_0000);
            assert_eq!(ci.still_at(&m, &l, CODE), Some(false));
            let other = CodeInfo::read(&m, &l, CODE).unwrap();
            assert_eq!(other.qualname, "lasting");
            // Same strings, another first line.
            let mut m = forge(&l, "transient", "<string>", &table);
            put_u32(m.region(CODE), l.co_firstlineno, 7);
            assert_eq!(ci.still_at(&m, &l, CODE), Some(false));
            // Gone.
            assert_eq!(ci.still_at(&FakeMem::default(), &l, CODE), None);
        }
    }

    #[test]
    fn forged_good_objects() {
        for l in layouts() {
            let table = [head(10, 2), 0, 5, head(13, 1), 8];
            for (q, f) in [
                ("Outer.inner", "/tmp/a.py"),
                ("größe", "/tmp/ñ.py"),
                ("日本.<locals>.f", "/tmp/日本.py"),
                ("𠀀", "/tmp/𠀀/x.py"),
            ] {
                let m = forge(&l, q, f, &table);
                let ci = CodeInfo::read(&m, &l, CODE).unwrap();
                assert_eq!(ci.qualname, q);
                assert_eq!(ci.filename, f);
                assert_eq!(ci.first_line, 42);
                assert_eq!(ci.line(1), Some(42));
                assert_eq!(ci.line(2), Some(46));
                assert_eq!(ci.line(3), None);
            }
        }
    }

    #[test]
    fn forged_bad_objects() {
        let l = CodeLayout::for_version(3, 12).unwrap();
        let good = || forge(&l, "f", "x.py", &[head(0, 1), 0]);
        let err = |m: &FakeMem| CodeInfo::read(m, &l, CODE).unwrap_err();

        // Code object unreadable, null, misaligned, wrapping.
        let m = good();
        assert!(matches!(
            CodeInfo::read(&m, &l, 0x99_0000),
            Err(ReadError::Unreadable { .. })
        ));
        assert!(matches!(
            CodeInfo::read(&m, &l, 0),
            Err(ReadError::BadPointer { .. })
        ));
        assert!(matches!(
            CodeInfo::read(&m, &l, CODE + 1),
            Err(ReadError::BadPointer { .. })
        ));
        assert!(matches!(
            CodeInfo::read(&m, &l, u64::MAX - 7),
            Err(ReadError::BadPointer { .. })
        ));
        // Code object truncated (header crosses into unmapped memory).
        let mut m = good();
        m.region(CODE).truncate(100);
        assert!(matches!(
            err(&m),
            ReadError::Unreadable {
                what: "code object",
                ..
            }
        ));

        // Null / dangling / wrapping / self-referential name pointers.
        for (p, want_unreadable) in [(0u64, false), (0x77_0000, true), (!7u64, false), (3, false)] {
            let mut m = good();
            put_u64(m.region(CODE), l.co_qualname, p);
            let e = err(&m);
            assert_eq!(
                matches!(e, ReadError::Unreadable { .. }),
                want_unreadable,
                "{p:#x}: {e}"
            );
        }
        // co_qualname pointing at the code object itself (a "cycle"): its
        // fields are garbage as a string, which must be an error or a
        // harmless string.
        let mut m = good();
        put_u64(m.region(CODE), l.co_qualname, CODE);
        let _ = CodeInfo::read(&m, &l, CODE);
        // Linetable pointing at the code object: read as bytes, bounded.
        let mut m = good();
        put_u64(m.region(CODE), l.co_linetable, CODE);
        let _ = CodeInfo::read(&m, &l, CODE);

        // Huge and negative string lengths.
        for len in [u64::MAX, MAX_STRING_LENGTH + 1, 1 << 62] {
            let mut m = good();
            put_u64(m.region(QUAL), l.str_length, len);
            assert!(matches!(
                err(&m),
                ReadError::BadLength {
                    what: "co_qualname",
                    ..
                }
            ));
        }
        // Plausible length larger than the object: read fails, bounded.
        let mut m = good();
        put_u64(m.region(FILE), l.str_length, MAX_STRING_LENGTH);
        m.bytes.set(0);
        assert!(matches!(
            err(&m),
            ReadError::Unreadable {
                what: "co_filename",
                ..
            }
        ));
        assert!(m.bytes.get() < 4096 + 2 * MAX_STRING_BYTES * 4);
        // Bogus kinds, not compact, ascii with wide kind.
        for state in [
            0u32,
            3 << 2 | 1 << 5,
            7 << 2 | 1 << 5,
            1 << 2,
            2 << 2 | 1 << 5 | 1 << 6,
        ] {
            let mut m = good();
            put_u32(m.region(QUAL), l.str_state, state);
            let e = err(&m);
            assert!(
                matches!(e, ReadError::BadKind { .. } | ReadError::NotCompact { .. }),
                "{state:#x}: {e}"
            );
        }
        // Non-ASCII data in an "ASCII" string is replaced, not trusted.
        let mut m = good();
        m.region(QUAL)[l.ascii_size as usize] = 0xff;
        assert_eq!(CodeInfo::read(&m, &l, CODE).unwrap().qualname, "\u{fffd}");
        // Long string is cut.
        let mut m = good();
        m.put(QUAL, string_obj(&l, &"é".repeat(5000)));
        let ci = CodeInfo::read(&m, &l, CODE).unwrap();
        assert_eq!(ci.qualname.len(), MAX_STRING_BYTES);

        // Linetable: negative size is an error, huge size is truncated (and
        // here unreadable, since the object is small).
        let mut m = good();
        put_u64(m.region(TABLE), l.var_size, u64::MAX);
        assert!(matches!(
            err(&m),
            ReadError::BadLength {
                what: "co_linetable",
                ..
            }
        ));
        let mut m = good();
        put_u64(m.region(TABLE), l.var_size, 1 << 40);
        m.bytes.set(0);
        assert!(matches!(
            err(&m),
            ReadError::Unreadable {
                what: "co_linetable",
                ..
            }
        ));
        assert!(m.bytes.get() <= MAX_LINETABLE + 3 * 4096 + 2 * MAX_STRING_BYTES);
        // Huge size with enough memory behind it: truncated to the bound.
        let mut m = good();
        let mut big = bytes_obj(&l, &vec![head(0, 8); MAX_LINETABLE + 100]);
        put_u64(&mut big, l.var_size, 1 << 40);
        m.put(TABLE, big);
        let ci = CodeInfo::read(&m, &l, CODE).unwrap();
        assert_eq!(ci.linetable.len(), MAX_LINETABLE);
        assert_eq!(ci.line(8 * MAX_LINETABLE as u32 - 1), Some(42));
        assert_eq!(ci.line(8 * MAX_LINETABLE as u32), None);

        // Negative first line.
        let mut m = good();
        put_u32(m.region(CODE), l.co_firstlineno, (-5i32) as u32);
        assert_eq!(err(&m), ReadError::NegativeFirstLine(-5));

        // Absurd layouts are rejected, not used to index or allocate.
        let m = good();
        for bad in [
            CodeLayout {
                co_filename: u32::MAX,
                ..l
            },
            CodeLayout {
                co_firstlineno: 1 << 20,
                ..l
            },
            CodeLayout {
                str_state: u32::MAX - 1,
                ..l
            },
            CodeLayout {
                compact_size: u32::MAX,
                ..l
            },
            CodeLayout {
                bytes_sval: 1 << 30,
                ..l
            },
        ] {
            assert!(CodeInfo::read(&m, &bad, CODE).is_err());
        }
        // Errors display.
        assert!(
            err(&{
                let mut m = good();
                put_u64(m.region(CODE), l.co_filename, 0);
                m
            })
            .to_string()
            .contains("co_filename")
        );
    }

    #[test]
    fn random_memory_never_panics() {
        let l = CodeLayout::for_version(3, 11).unwrap();
        let mut s = 0xdead_beef_cafe_f00du64;
        for _ in 0..300 {
            let mut m = forge(&l, "f", "x.py", &[head(0, 1), 0]);
            // Scribble over random bytes of every object, including pointers.
            for base in [CODE, QUAL, FILE, TABLE] {
                let r = m.region(base);
                for _ in 0..8 {
                    let i = (rng(&mut s) as usize) % r.len();
                    r[i] = rng(&mut s) as u8;
                }
            }
            // Sometimes point fields at each other.
            if rng(&mut s).is_multiple_of(2) {
                let targets = [CODE, QUAL, FILE, TABLE];
                let t = targets[(rng(&mut s) % 4) as usize];
                let f = [l.co_qualname, l.co_filename, l.co_linetable][(rng(&mut s) % 3) as usize];
                put_u64(m.region(CODE), f, t);
            }
            m.bytes.set(0);
            if let Ok(ci) = CodeInfo::read(&m, &l, CODE) {
                for off in [0, 1, 2, 1000] {
                    let _ = ci.line(off);
                }
            }
            assert!(m.bytes.get() <= MAX_LINETABLE + 8192);
            assert!(m.reads.get() < 100_000);
        }
    }

    #[test]
    fn proc_mem_self() {
        let data: Vec<u8> = (0..=255u8).collect();
        let m = ProcMem::open(std::process::id()).unwrap();
        let mut buf = [0u8; 16];
        assert!(m.read(data.as_ptr() as u64 + 100, &mut buf));
        assert_eq!(buf[0], 100);
        assert!(!m.read(8, &mut buf));
        assert!(!m.read(u64::MAX - 3, &mut buf));
        assert!(m.read(0, &mut []));
    }

    // ---------- real CPython ----------

    const SCRIPT: &str = r#"
import sys, time

class Outer:
    def inner(self, n):
        total = 0
        for i in range(n):
            if i % 3 == 0:
                total += i
            else:
                total -= 1
        try:
            x = 1 / (n - n)
        except ZeroDivisionError:
            x = 0
        with open(__file__) as f:
            first = f.readline()
        long_expression_value = (total + 1) * 2 + len(first) + x + 1000000000000000000000 + 2000000000000000000000 + 30000 + total
        spread = (
            total
            +
            1
        )
        while total > 0:
            total -= 7
        return total + long_expression_value + spread

def größe():
    def nested日本():
        return [i * 2 for i in range(3)]
    return nested日本()[1] + 2

SRC = "def \U00020000(a):\n    b = a + 1\n" + "\n" * 100 + "    return b * 2\n\nclass K:\n    def m(self):\n        return 1\n"
mod = compile(SRC, "/tmp/модуль_日本_\U00020000.py", "exec")
ns = {}
exec(mod, ns)

for _ in range(3000):
    Outer().inner(10)
    größe()
    ns["\U00020000"](3)

def walk(code, out):
    out.append(code)
    for c in code.co_consts:
        if isinstance(c, type(code)):
            walk(c, out)

codes = []
walk(sys._getframe().f_code, codes)
walk(mod, codes)
h = lambda s: s.encode("utf-8", "surrogatepass").hex()
def lines(c):
    if hasattr(c, "co_positions"):
        return [p[0] for p in c.co_positions()]
    out = [None] * (len(c.co_code) // 2)
    if hasattr(c, "co_lines"):
        # 3.10: ranges of bytecode bytes.
        for start, end, line in c.co_lines():
            for i in range(start // 2, end // 2):
                out[i] = line
        return out
    # 3.7-3.9: where each line starts.
    import dis
    starts = dict(dis.findlinestarts(c))
    line = c.co_firstlineno
    for i in range(len(out)):
        line = starts.get(2 * i, line)
        out[i] = line
    return out
for c in codes:
    name = getattr(c, "co_qualname", c.co_name)
    print("CODE", id(c), c.co_firstlineno, h(name), h(c.co_filename), len(c.co_code) // 2)
    for i, line in enumerate(lines(c)):
        print("POS", i, line)
print("READY", flush=True)
time.sleep(300)
"#;

    fn pyenv_root() -> Option<std::path::PathBuf> {
        if let Some(r) = std::env::var_os("PYENV_ROOT") {
            return Some(r.into());
        }
        if let Ok(o) = std::process::Command::new("pyenv").arg("root").output()
            && o.status.success()
        {
            let s = String::from_utf8_lossy(&o.stdout).trim().to_string();
            if !s.is_empty() {
                return Some(s.into());
            }
        }
        std::env::var_os("HOME").map(|h| std::path::PathBuf::from(h).join(".pyenv"))
    }

    fn unhex(s: &str) -> String {
        let b: Vec<u8> = (0..s.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
            .collect();
        String::from_utf8(b).unwrap()
    }

    struct KillOnDrop(std::process::Child);
    impl Drop for KillOnDrop {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }

    /// Returns (code objects checked, positions checked).
    /// With `no_ranges`, columns are dropped (`PYTHONNODEBUGRANGES`), so the
    /// table uses the no-column form (code 13).
    fn check_interpreter(
        python: &std::path::Path,
        minor: u8,
        script: &std::path::Path,
        no_ranges: bool,
    ) -> (usize, usize) {
        use std::io::BufRead;
        let mut cmd = std::process::Command::new(python);
        if no_ranges {
            cmd.env("PYTHONNODEBUGRANGES", "1");
        }
        let child = cmd
            .arg(script)
            .env("PYTHONIOENCODING", "utf-8")
            .env("PYTHONDONTWRITEBYTECODE", "1")
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::inherit())
            .spawn()
            .unwrap();
        let mut child = KillOnDrop(child);
        let pid = child.0.id();
        let out = child.0.stdout.take().unwrap();
        let layout = CodeLayout::for_version(3, minor).unwrap();
        let mut lines = Vec::new();
        for line in std::io::BufReader::new(out).lines() {
            let line = line.unwrap();
            if line == "READY" {
                break;
            }
            lines.push(line);
        }
        assert!(!lines.is_empty(), "{}: no output", python.display());
        let mem = ProcMem::open(pid).unwrap();
        let (mut ncode, mut npos) = (0, 0);
        let mut cur: Option<(CodeInfo, u32)> = None;
        let mut seen = std::collections::BTreeSet::new();
        for line in &lines {
            let f: Vec<&str> = line.split(' ').collect();
            match f[0] {
                "CODE" => {
                    let addr: u64 = f[1].parse().unwrap();
                    let ci = CodeInfo::read(&mem, &layout, addr)
                        .unwrap_or_else(|e| panic!("3.{minor} {line}: {e}"));
                    let qual = unhex(f[3]);
                    assert_eq!(ci.qualname, qual, "3.{minor}");
                    assert_eq!(ci.filename, unhex(f[4]), "3.{minor}");
                    assert_eq!(ci.first_line.to_string(), f[2], "3.{minor} {qual}");
                    let units: u32 = f[5].parse().unwrap();
                    // (co_lnotab gives the last line past the code.)
                    if minor >= 10 {
                        assert_eq!(ci.line(units), None, "3.{minor} {qual}: past the end");
                    }
                    seen.insert(qual);
                    ncode += 1;
                    cur = Some((ci, units));
                }
                "POS" => {
                    let (ci, units) = cur.as_ref().unwrap();
                    let off: u32 = f[1].parse().unwrap();
                    assert!(off < *units);
                    // Before 3.10 a frame's offset counts bytes.
                    let off = if minor < 10 { off * 2 } else { off };
                    let want = if f[2] == "None" {
                        None
                    } else {
                        Some(f[2].parse().unwrap())
                    };
                    assert_eq!(ci.line(off), want, "3.{minor} {} offset {off}", ci.qualname);
                    npos += 1;
                }
                _ => panic!("unexpected line {line}"),
            }
        }
        let expected: &[&str] = if minor <= 10 {
            &["<module>", "inner", "größe", "nested日本", "\u{20000}", "m"]
        } else {
            &[
                "<module>",
                "Outer.inner",
                "größe",
                "größe.<locals>.nested日本",
                "\u{20000}",
                "K.m",
            ]
        };
        for &q in expected {
            assert!(seen.contains(q), "3.{minor}: {q} not seen in {seen:?}");
        }
        (ncode, npos)
    }

    #[test]
    fn real_cpython() {
        let Some(root) = pyenv_root() else {
            eprintln!("no pyenv; skipping");
            return;
        };
        let Ok(dir) = std::fs::read_dir(root.join("versions")) else {
            eprintln!("no pyenv versions in {}; skipping", root.display());
            return;
        };
        let names: Vec<String> = dir
            .filter_map(|e| e.ok()?.file_name().into_string().ok())
            .collect();
        let tmp = std::env::temp_dir().join(format!("pycode-test-{}", std::process::id()));
        std::fs::create_dir_all(&tmp).unwrap();
        let script = tmp.join("prof_target.py");
        std::fs::write(&script, SCRIPT).unwrap();
        for minor in [7u8, 8, 9, 10, 11, 12, 13] {
            let prefix = format!("3.{minor}.");
            let mut found: Vec<&String> = names
                .iter()
                .filter(|n| {
                    n.starts_with(&prefix) && n[prefix.len()..].chars().all(|c| c.is_ascii_digit())
                })
                .collect();
            found.sort();
            let v = found
                .last()
                .unwrap_or_else(|| panic!("no pyenv 3.{minor}.x"));
            let python = root.join("versions").join(v).join("bin").join("python3");
            // 3.10 has no column ranges to leave out.
            let modes: &[bool] = if minor > 10 { &[false, true] } else { &[false] };
            for &no_ranges in modes {
                let (c, p) = check_interpreter(&python, minor, &script, no_ranges);
                eprintln!("{v} (no_ranges={no_ranges}): {c} code objects, {p} positions match");
                assert!(c >= 8 && p > 100);
            }
        }
        let _ = std::fs::remove_dir_all(&tmp);
    }
}
