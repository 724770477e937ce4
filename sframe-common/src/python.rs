//! CPython frames: what user space tells the kernel side of a Python process (where its
//! runtime state is, the offsets of the structs the walk reads), and how the kernel
//! side records each interpreter frame in a user stack.
//!
//! The kernel side finds the sampled thread's `PyThreadState` in the interpreter's
//! thread list (by `native_thread_id`), then follows its frame chain
//! (`_PyInterpreterFrame::previous`), recording per frame the code object's address
//! and the instruction offset. The words follow the native frames of the same
//! [`UserStack`](crate::stack::UserStack), innermost first; user space names them and
//! puts each invocation's frames in place of its `_PyEval_EvalFrameDefault` frame.

/// An offset [`PyProcess`] does not use (a field the version lacks).
pub const NO_OFFSET: u32 = u32::MAX;

/// Interpreter frames one sample records at most (the native frames come first; both
/// share the stack's [`MAX_FRAMES`](crate::budget::MAX_FRAMES)).
pub const MAX_PY_FRAMES: u32 = 128;
/// Thread states the kernel side looks through for the sampled thread's.
pub const MAX_PY_THREADS: u32 = 64;

/// Bytes of an interpreter frame (3.11+) the kernel side reads at once: every field it
/// reads (`previous`, the code, the instruction pointer, the owner, `is_entry`) must lie
/// in them (the furthest is 3.12's and 3.13's `owner`, at 70). No more is read: a frame
/// can be as short as its header, at the end of a mapping.
pub const FRAME_HEADER: u32 = 72;
/// The same for a frame object (3.7–3.10, [`PY_FLAG_LASTI`]): the furthest field is
/// 3.7–3.9's `f_lasti`, at 104 (a frame object is over 300 bytes).
pub const FRAME_OBJECT_HEADER: u32 = 112;

impl PyProcess {
    /// The bytes of a frame the walk reads at once ([`FRAME_HEADER`] or
    /// [`FRAME_OBJECT_HEADER`]).
    pub const fn frame_header(&self) -> u32 {
        if self.flags & PY_FLAG_LASTI != 0 {
            FRAME_OBJECT_HEADER
        } else {
            FRAME_HEADER
        }
    }

    /// Whether every frame field the walk reads lies in the first
    /// [`PyProcess::frame_header`] bytes (8-byte fields 8-aligned).
    pub const fn fits_header(&self) -> bool {
        const fn word(o: u32, header: u32) -> bool {
            o.is_multiple_of(8) && o <= header - 8
        }
        const fn byte(o: u32, header: u32) -> bool {
            o < header
        }
        const fn int(o: u32, header: u32) -> bool {
            o.is_multiple_of(4) && o <= header - 4
        }
        let h = self.frame_header();
        word(self.frame_previous, h)
            && word(self.frame_code, h)
            && if self.flags & PY_FLAG_LASTI != 0 {
                int(self.frame_instr, h)
            } else {
                word(self.frame_instr, h)
            }
            && (self.frame_owner == NO_OFFSET || byte(self.frame_owner, h))
            && (self.frame_is_entry == NO_OFFSET || byte(self.frame_is_entry, h))
    }
}

/// [`PyProcess::flags`]: `frame_instr` is a C `int` counting from the first instruction
/// (`PyFrameObject::f_lasti`: code units in 3.10, bytes in 3.7–3.9; recorded as it is),
/// not a pointer to the instruction.
pub const PY_FLAG_LASTI: u32 = 1;
/// [`PyProcess::flags`]: each frame is its own invocation of the evaluation loop (3.10:
/// `_PyEval_EvalFrameDefault` runs one frame object).
pub const PY_FLAG_EVERY_ENTRY: u32 = 2;

/// Python processes the kernel side knows at once.
pub const MAX_PY_PROCESSES: u32 = 1024;
/// Threads whose thread state the kernel side remembers.
pub const MAX_PY_THREAD_CACHE: u32 = 8192;

/// `_PyInterpreterFrame::owner` of the frame `_PyEval_EvalFrameDefault` puts on the C
/// stack at entry (3.12+, `FRAME_OWNED_BY_CSTACK`): no Python function; the frame
/// before it in the chain is the first of that invocation.
pub const OWNED_BY_CSTACK: u8 = 3;

/// Where a Python process's runtime is and the offsets the walk reads (bytes), for its
/// CPython minor version. Set by user space per process (tgid → this).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PyProcess {
    /// Address of `_PyRuntime` in the process.
    pub runtime: u64,
    /// `_PyRuntimeState::interpreters.head`.
    pub interpreters_head: u32,
    /// `PyInterpreterState::threads.head`.
    pub threads_head: u32,
    /// `PyThreadState::next`.
    pub thread_next: u32,
    /// `PyThreadState::native_thread_id`; with `pthread_tid`, `PyThreadState::thread_id`
    /// (3.10: the thread's `pthread_t`).
    pub thread_native_id: u32,
    /// The thread id's offset in the C library's thread descriptor (glibc's `struct
    /// pthread`, whose address a `pthread_t` is): the walk reads the id there when the
    /// thread state holds only the `pthread_t` (3.10); [`NO_OFFSET`] otherwise.
    pub pthread_tid: u32,
    /// [`PY_FLAG_LASTI`], [`PY_FLAG_EVERY_ENTRY`].
    pub flags: u32,
    /// `PyThreadState::cframe` (3.11, 3.12) or `current_frame` (3.13).
    pub thread_frame: u32,
    /// `_PyCFrame::current_frame` (3.11, 3.12); [`NO_OFFSET`] when `thread_frame` is the
    /// frame pointer itself.
    pub cframe_current: u32,
    /// `_PyInterpreterFrame::previous`.
    pub frame_previous: u32,
    /// `_PyInterpreterFrame::f_code` / `f_executable`.
    pub frame_code: u32,
    /// `_PyInterpreterFrame::prev_instr` / `instr_ptr`.
    pub frame_instr: u32,
    /// `_PyInterpreterFrame::owner` (a byte); [`NO_OFFSET`] in 3.10.
    pub frame_owner: u32,
    /// `_PyInterpreterFrame::is_entry` (a byte, 3.11); [`NO_OFFSET`] in 3.12+.
    pub frame_is_entry: u32,
    /// `PyCodeObject::co_code_adaptive`: where the instructions start.
    pub code_instructions: u32,
    /// The process's PID namespace (its nsfs device, kernel encoding, and inode) when it
    /// is not the initial one: CPython records each thread's id as its own namespace
    /// shows it (`gettid()`), so the walk compares that one. 0: the initial namespace.
    pub pidns_dev: u64,
    /// See `pidns_dev`.
    pub pidns_ino: u64,
}

const _: () = assert!(core::mem::size_of::<PyProcess>() == 80);

#[cfg(feature = "user")]
// SAFETY: repr(C), integers only, no implicit padding (size asserted above).
unsafe impl aya::Pod for PyProcess {}

/// Set in a [`thread_key`]'s value of the thread-state cache when the thread's search
/// found no thread state (a thread that never ran Python: a native thread of a Python
/// process); the value's other bits are the head of the thread list then. The thread is
/// searched again once the head changed (CPython adds each new thread state at the head:
/// a thread that starts running Python gets one there).
pub const PY_NO_THREAD_STATE: u64 = 1 << 63;

/// Key of the thread-state cache: process and thread.
#[inline(always)]
pub const fn thread_key(tgid: u32, tid: u32) -> u64 {
    ((tgid as u64) << 32) | tid as u64
}

/// Set in every interpreter frame's word (with [`FRAME_EXACT`](crate::stack::FRAME_EXACT),
/// so the word is looked up as it is); no native frame word has it.
pub const PY_FRAME: u64 = 1 << 62;
/// Bits of the code object's address in a frame word (user addresses of 48 bits).
pub const PY_CODE_MASK: u64 = (1 << 48) - 8;
/// Set in the word of the first frame of a `_PyEval_EvalFrameDefault` invocation (code
/// objects are 8-byte aligned: the low bits are free).
pub const PY_ENTRY: u64 = 1;
/// Bits of a frame word user space sets once it has read the code object (the kernel
/// side leaves them 0): which of the contents seen at the code object's address names
/// the frame, 1 to [`PY_MAX_VERSION`] (an address freed and reused by another code
/// object names the stacks read before the reuse by the earlier one); 0: not bound.
pub const PY_VERSION_MASK: u64 = 0b110;
/// The largest version [`with_version`] stores.
pub const PY_MAX_VERSION: u8 = 3;
/// Position of the instruction offset (in 2-byte code units) in a frame word.
pub const PY_OFFSET_SHIFT: u32 = 48;
/// The largest instruction offset a word holds; longer offsets are stored as this.
pub const PY_OFFSET_MAX: u64 = (1 << 14) - 1;

/// The word of an interpreter frame: code object `code`, instruction `offset` code
/// units from the first, `entry` when it starts an invocation of the evaluation loop.
#[inline(always)]
pub const fn frame_word(code: u64, offset: u64, entry: bool) -> u64 {
    let offset = if offset > PY_OFFSET_MAX {
        PY_OFFSET_MAX
    } else {
        offset
    };
    crate::stack::FRAME_EXACT
        | PY_FRAME
        | (offset << PY_OFFSET_SHIFT)
        | (code & PY_CODE_MASK)
        | if entry { PY_ENTRY } else { 0 }
}

/// Whether a user stack word (or the address user space looks up for it) is an
/// interpreter frame's.
#[inline(always)]
pub const fn is_frame(word: u64) -> bool {
    word & PY_FRAME != 0
}

/// The code object's address of an interpreter frame's word.
#[inline(always)]
pub const fn code(word: u64) -> u64 {
    word & PY_CODE_MASK
}

/// The instruction offset (code units) of an interpreter frame's word.
#[inline(always)]
pub const fn offset(word: u64) -> u32 {
    ((word >> PY_OFFSET_SHIFT) & PY_OFFSET_MAX) as u32
}

/// The version user space bound an interpreter frame's word to (0: none).
#[inline(always)]
pub const fn version(word: u64) -> u8 {
    ((word & PY_VERSION_MASK) >> 1) as u8
}

/// `word` bound to `version` (1 to [`PY_MAX_VERSION`]; others leave it unbound).
#[inline(always)]
pub const fn with_version(word: u64, version: u8) -> u64 {
    let v = if version > PY_MAX_VERSION {
        0
    } else {
        version as u64
    };
    (word & !PY_VERSION_MASK) | (v << 1)
}

/// The word that ends a stack's interpreter frames when the walk could not read the rest
/// of the chain (a frame's memory unreadable, or more than [`MAX_PY_FRAMES`] frames): no
/// code object (address 0), an invocation's first frame (so user space shows it in place
/// of the evaluation-loop frame whose Python frames are missing). Such a stack's outcome
/// is [`WalkOutcome::PythonUnread`](crate::outcome::WalkOutcome::PythonUnread) when its
/// native walk was complete.
pub const PY_UNREAD: u64 = crate::stack::FRAME_EXACT | PY_FRAME | PY_ENTRY;

/// Whether a user stack word is [`PY_UNREAD`] (whatever version bits user space set).
#[inline(always)]
pub const fn is_unread(word: u64) -> bool {
    is_frame(word) && code(word) == 0
}

/// Whether an interpreter frame's word starts an invocation of the evaluation loop.
#[inline(always)]
pub const fn is_entry(word: u64) -> bool {
    word & PY_ENTRY != 0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_unread_marker_is_a_frame_word_of_no_code_object() {
        assert!(is_frame(PY_UNREAD) && is_entry(PY_UNREAD) && is_unread(PY_UNREAD));
        assert!(is_unread(with_version(PY_UNREAD, 2)));
        assert!(!is_unread(frame_word(0x7f12_3456_7890, 0, true)));
        // A native word is never the marker, whatever its low bits.
        assert!(!is_unread(crate::stack::FRAME_EXACT | 0x1234));
        use crate::outcome::WalkOutcome as O;
        assert_eq!(
            O::with_python(O::Complete as u32, true),
            O::PythonUnread as u32
        );
        assert_eq!(
            O::with_python(O::ZeroReturnAddress as u32, true),
            O::PythonUnread as u32
        );
        assert_eq!(
            O::with_python(O::Complete as u32, false),
            O::Complete as u32
        );
        assert_eq!(O::with_python(O::NoRule as u32, true), O::NoRule as u32);
        assert!(!O::PythonUnread.is_complete());
    }

    #[test]
    fn frame_words_round_trip_and_are_never_native() {
        let w = frame_word(0x7f12_3456_7890, 37, true);
        assert!(is_frame(w));
        assert_eq!(code(w), 0x7f12_3456_7890);
        assert_eq!(offset(w), 37);
        assert!(is_entry(w));
        let w = frame_word(0x5555_0000_1238, PY_OFFSET_MAX + 100, false);
        assert_eq!(offset(w), PY_OFFSET_MAX as u32);
        assert!(!is_entry(w));
        // The symbolizer's lookup address of the word keeps the flag.
        assert!(is_frame(crate::stack::lookup_address(3, w)));
        assert!(!is_frame(0x7fff_ffff_f000));
    }

    #[test]
    fn versions_change_neither_the_code_nor_the_offset_nor_the_entry_bit() {
        let w = frame_word(0x7f12_3456_7890, 37, true);
        assert_eq!(version(w), 0);
        for v in 1..=PY_MAX_VERSION {
            let b = with_version(w, v);
            assert_eq!(version(b), v);
            assert_eq!(code(b), code(w));
            assert_eq!(offset(b), offset(w));
            assert!(is_entry(b) && is_frame(b));
            assert_eq!(with_version(b, 0), w);
        }
        assert_eq!(version(with_version(w, PY_MAX_VERSION + 1)), 0);
    }
}
