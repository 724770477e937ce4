//! CPython 3.11–3.13 frames, read from the interpreter without flags (see
//! `sframe_common::python` for the kernel side's part).
//!
//! - [`Finder`] recognises a CPython build among a process's mappings (`libpython3.X.so`
//!   or a `python3.X` executable that defines `_PyRuntime` and `Py_Version`), on a worker
//!   thread of its own (the file is a user's: reading it may block), and remembers what
//!   it found per file: the version, `_PyRuntime`'s address in the file, and the offsets
//!   the kernel side's walk reads — from 3.13's `_Py_DebugOffsets` (the first field of
//!   `_PyRuntime`, read from the file's initialised data), for 3.11 and 3.12 from tables
//!   measured against each version's headers.
//! - [`PyNamer`] names a recorded frame (code object address, instruction offset) from
//!   the live process's memory ([`code::CodeInfo`]), cached per code object.
//! - [`merge`] puts each invocation's Python frames in place of its
//!   `_PyEval_EvalFrameDefault` frame on the native stack.

pub mod code;

use std::{
    collections::{HashMap, HashSet},
    sync::{
        Arc, Mutex,
        mpsc::{Receiver, SyncSender, TrySendError, sync_channel},
    },
};

use object::{Object as _, ObjectSegment as _, ObjectSymbol as _};
use sframe_common::python::{NO_OFFSET, PyProcess};

use crate::{
    procfs::Mapping,
    symbolize::{Frame, SourceLocation},
};

/// The object name of Python frames in the outputs.
pub const PYTHON_OBJECT: &str = "[python]";

/// The name of the frame that stands for the interpreter frames a walk could not read
/// ([`sframe_common::python::PY_UNREAD`]), in place of the evaluation loop's frame
/// whose Python frames are missing.
pub const UNREAD_FRAME: &str = "[unread Python frames]";

/// The frame of [`sframe_common::python::PY_UNREAD`].
pub fn unread_frame() -> Frame {
    Frame {
        name: Some(UNREAD_FRAME.to_owned()),
        object: PYTHON_OBJECT.to_owned(),
        file_offset: 0,
        build_id: None,
        location: None,
        inlined: Vec::new(),
        reason: Some(
            "the thread's interpreter frames could not all be read at the sample (a frame's \
             memory unreadable, or more frames than the walk reads)"
                .to_owned(),
        ),
    }
}

/// The native function an invocation of the evaluation loop runs in.
pub const EVAL_FUNCTION: &str = "_PyEval_EvalFrameDefault";

/// Files the finder reads at once (queued); more wait for a later load of their process.
const QUEUE: usize = 64;
/// Files whose answer is remembered (then forgotten all at once).
const MAX_FILES: usize = 4096;
/// Code objects remembered per process (then forgotten all at once).
const MAX_CODES: usize = 16_384;
/// Offsets the walk reads past a struct's start at most (a larger one from a file's
/// `_Py_DebugOffsets` is refused).
const MAX_STRUCT_OFFSET: u64 = 1 << 16;

/// A CPython build: what the walk needs to know of it, from its file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PyBuild {
    /// (major, minor).
    pub version: (u8, u8),
    /// `_PyRuntime`'s virtual address in the file.
    runtime_vaddr: u64,
    /// The virtual address of file offset 0 (the first loadable segment's, page-aligned).
    base_vaddr: u64,
    /// The kernel side's offsets (`runtime` left 0: per process).
    offsets: PyProcess,
    layout: code::CodeLayout,
}

impl PyBuild {
    /// The kernel side's entry for a process that maps this build's file at `start`
    /// from file offset `offset` (its first mapping of the file).
    /// `pidns`: the process's PID namespace (nsfs device as the kernel encodes it,
    /// inode) when it is not the profiler's.
    pub fn process_entry(
        &self,
        start: u64,
        offset: u64,
        pidns: Option<(u64, u64)>,
    ) -> Option<PyProcess> {
        let bias = start.checked_sub(offset)?.wrapping_sub(self.base_vaddr);
        let (pidns_dev, pidns_ino) = pidns.unwrap_or((0, 0));
        Some(PyProcess {
            runtime: bias.wrapping_add(self.runtime_vaddr),
            pidns_dev,
            pidns_ino,
            ..self.offsets
        })
    }
}

/// The PID namespace of process `pid` (nsfs device in the kernel's encoding, inode)
/// when it is not the profiler's own; `None` when it is, or cannot be read.
pub fn pid_namespace(pid: u32) -> Option<(u64, u64)> {
    use std::os::unix::fs::MetadataExt as _;
    let theirs = std::fs::metadata(format!("/proc/{pid}/ns/pid")).ok()?;
    let ours = std::fs::metadata("/proc/self/ns/pid").ok()?;
    if (theirs.dev(), theirs.ino()) == (ours.dev(), ours.ino()) {
        return None;
    }
    // stat's device number (glibc's encoding) as the kernel's dev_t (major << 20 |
    // minor), which `bpf_get_ns_current_pid_tgid` compares.
    let d = theirs.dev();
    let major = ((d >> 8) & 0xfff) | ((d >> 32) & !0xfff);
    let minor = (d & 0xff) | ((d >> 12) & !0xff);
    Some(((major << 20) | minor, theirs.ino()))
}

/// Whether a process mapping `maps` may run CPython (an executable mapping of a file named
/// like a CPython build).
pub fn has_candidate(maps: &[Mapping]) -> bool {
    maps.iter().any(|m| m.executable && is_candidate(m))
}

/// Whether `m` may be a CPython build's file, by its name.
fn is_candidate(m: &Mapping) -> bool {
    if !m.is_file() {
        return false;
    }
    let name = m.path.rsplit('/').next().unwrap_or_default();
    name.starts_with("libpython3.") || name.starts_with("python3")
}

/// Offsets of the kernel side's walk for 3.7 to 3.12 (x86-64 and AArch64 alike),
/// measured with `offsetof` against each version's `pycore_*.h` headers.
fn offsets_for(version: (u8, u8)) -> Option<PyProcess> {
    let common = PyProcess {
        runtime: 0,
        pidns_dev: 0,
        pidns_ino: 0,
        interpreters_head: 40,
        threads_head: 0,
        thread_next: 8,
        thread_native_id: 0,
        pthread_tid: NO_OFFSET,
        flags: 0,
        thread_frame: 56,
        cframe_current: 0,
        frame_previous: 0,
        frame_code: 0,
        frame_instr: 56,
        frame_owner: 0,
        frame_is_entry: NO_OFFSET,
        code_instructions: 0,
    };
    match version {
        // Frame objects: `PyThreadState::frame`, `PyFrameObject::f_back`, `f_code`,
        // `f_lasti`; the thread by its `thread_id` (`pthread_t`; `pthread_tid` is the C
        // library's, set per process).
        (3, 7..=10) => Some(PyProcess {
            interpreters_head: if version.1 == 7 { 24 } else { 32 },
            threads_head: 8,
            thread_native_id: 176,
            thread_frame: 24,
            cframe_current: NO_OFFSET,
            frame_previous: 24,
            frame_code: 32,
            frame_instr: if version.1 == 10 { 96 } else { 104 },
            frame_owner: NO_OFFSET,
            flags: sframe_common::python::PY_FLAG_LASTI
                | sframe_common::python::PY_FLAG_EVERY_ENTRY,
            ..common
        }),
        (3, 11) => Some(PyProcess {
            threads_head: 16,
            thread_native_id: 160,
            cframe_current: 8,
            frame_previous: 48,
            frame_code: 32,
            frame_owner: 69,
            frame_is_entry: 68,
            code_instructions: 184,
            ..common
        }),
        (3, 12) => Some(PyProcess {
            threads_head: 72,
            thread_native_id: 144,
            cframe_current: 0,
            frame_previous: 8,
            frame_code: 0,
            frame_owner: 70,
            code_instructions: 192,
            ..common
        }),
        _ => None,
    }
}

/// 3.13's offsets from its `_Py_DebugOffsets` (the bytes of `_PyRuntime` in the file).
fn offsets_from_debug(bytes: &[u8]) -> Result<PyProcess, String> {
    let word = |i: usize| -> Result<u64, String> {
        let b = bytes
            .get(i * 8..i * 8 + 8)
            .ok_or("_Py_DebugOffsets cut short")?;
        let mut a = [0u8; 8];
        a.copy_from_slice(b);
        Ok(u64::from_le_bytes(a))
    };
    if bytes.get(..8) != Some(b"xdebugpy".as_slice()) {
        return Err("no _Py_DebugOffsets cookie at _PyRuntime".into());
    }
    if word(2)? != 0 {
        return Err("a free-threaded build (not supported)".into());
    }
    // Words: cookie, version, free_threaded, runtime_state{size, finalizing,
    // interpreters_head}, interpreter_state{size, id, next, threads_head, 9 more},
    // thread_state{size, prev, next, interp, current_frame, thread_id,
    // native_thread_id, datastack_chunk, status}, interpreter_frame{size, previous,
    // executable, instr_ptr, localsplus, owner}, code_object{size, filename, name,
    // qualname, linetable, firstlineno, argcount, localsplusnames, localspluskinds,
    // co_code_adaptive}.
    let off = |i: usize| -> Result<u32, String> {
        let v = word(i)?;
        if v >= MAX_STRUCT_OFFSET {
            return Err(format!("_Py_DebugOffsets word {i} out of bounds: {v}"));
        }
        Ok(v as u32)
    };
    let rt = 3;
    let interp = rt + 3;
    let thread = interp + 13;
    let frame = thread + 9;
    let code = frame + 6;
    Ok(PyProcess {
        runtime: 0,
        pidns_dev: 0,
        pidns_ino: 0,
        interpreters_head: off(rt + 2)?,
        threads_head: off(interp + 3)?,
        thread_next: off(thread + 2)?,
        thread_native_id: off(thread + 6)?,
        pthread_tid: NO_OFFSET,
        flags: 0,
        thread_frame: off(thread + 4)?,
        cframe_current: NO_OFFSET,
        frame_previous: off(frame + 1)?,
        frame_code: off(frame + 2)?,
        frame_instr: off(frame + 3)?,
        frame_owner: off(frame + 5)?,
        frame_is_entry: NO_OFFSET,
        code_instructions: off(code + 9)?,
    })
}

/// The bytes of `size` at virtual address `vaddr` of `file`, from its segments.
fn bytes_at<'d>(file: &object::File<'d>, vaddr: u64, size: u64) -> Option<&'d [u8]> {
    file.segments()
        .find_map(|s| s.data_range(vaddr, size).ok().flatten())
}

/// Reads what the walk needs of a CPython build from its file's bytes.
pub fn inspect(data: &[u8]) -> Result<PyBuild, String> {
    let file = object::File::parse(data).map_err(|e| format!("not an object file: {e}"))?;
    let mut runtime = None;
    let mut version = None;
    // Before 3.11 (no `Py_Version`), the newest of these functions the file defines
    // tells its version: `Py_IsNone` is new in 3.10, `PyFrame_GetBack` in 3.9,
    // `PyCode_NewWithPosOnlyArgs` in 3.8, `PyContext_New` in 3.7.
    let mut minor = 0u8;
    for sym in file.dynamic_symbols().chain(file.symbols()) {
        match sym.name() {
            Ok("_PyRuntime") if runtime.is_none() => runtime = Some(sym.address()),
            Ok("Py_Version") if version.is_none() => version = Some(sym.address()),
            Ok("Py_IsNone") => minor = minor.max(10),
            Ok("PyFrame_GetBack") => minor = minor.max(9),
            Ok("PyCode_NewWithPosOnlyArgs") => minor = minor.max(8),
            Ok("PyContext_New") => minor = minor.max(7),
            _ => {}
        }
        if runtime.is_some() && version.is_some() {
            break;
        }
    }
    let runtime_vaddr = runtime.ok_or("no _PyRuntime symbol")?;
    let version = match version {
        Some(vaddr) => {
            let hex = bytes_at(&file, vaddr, 4).ok_or("Py_Version not in the file")?;
            let mut a = [0u8; 4];
            a.copy_from_slice(hex);
            let hex = if file.is_little_endian() {
                u32::from_le_bytes(a)
            } else {
                u32::from_be_bytes(a)
            };
            ((hex >> 24) as u8, (hex >> 16) as u8)
        }
        None if minor >= 7 => (3, minor),
        None => return Err("no Py_Version symbol, nor one of 3.7-3.10's".into()),
    };
    let layout = code::CodeLayout::for_version(version.0, version.1)
        .ok_or_else(|| format!("CPython {}.{} is not supported", version.0, version.1))?;
    let offsets = match version {
        (3, 13) => offsets_from_debug(
            bytes_at(&file, runtime_vaddr, 8 * 64).ok_or("_PyRuntime not in the file")?,
        )?,
        v => offsets_for(v).ok_or("no offsets for this version")?,
    };
    if !offsets.fits_header() {
        return Err(format!(
            "frame fields past the {} bytes the walk reads: {offsets:?}",
            offsets.frame_header()
        ));
    }
    let base_vaddr = file
        .segments()
        .filter(|s| s.file_range().0 == 0)
        .map(|s| s.address() & !0xfff)
        .min()
        .ok_or("no loadable segment at file offset 0")?;
    Ok(PyBuild {
        version,
        runtime_vaddr,
        base_vaddr,
        offsets,
        layout,
    })
}

/// A file as `/proc/PID/maps` names it: device, inode, path.
type FileKey = (u32, u32, u64, String);

fn file_key(m: &Mapping) -> FileKey {
    (m.dev_major, m.dev_minor, m.inode, m.path.clone())
}

/// What [`Finder::find`] knows of a process.
#[derive(Clone, Debug)]
pub enum Found {
    /// A CPython build, mapped from `start` at file offset `offset`.
    Python {
        build: Arc<PyBuild>,
        start: u64,
        offset: u64,
    },
    /// Its candidate file is being read: ask again later.
    Pending,
    /// Not a (supported) CPython process.
    No,
}

/// What the worker found in a file.
#[derive(Clone, Debug)]
enum Answer {
    /// A CPython build's file (or not one).
    Build(Option<Arc<PyBuild>>),
    /// The C library's: the thread id's offset in its thread descriptor (or none known).
    ThreadId(Option<u32>),
}

/// What the worker is asked to read of a file.
#[derive(Clone, Copy, Debug)]
enum Ask {
    Build,
    ThreadId,
}

type Answers = Arc<Mutex<HashMap<FileKey, Answer>>>;

/// Recognises CPython builds among processes' mappings (see the module's doc).
pub struct Finder {
    queue: SyncSender<(u32, Mapping, Ask)>,
    answers: Answers,
    asked: HashSet<FileKey>,
}

impl Finder {
    /// Starts the finder's worker thread.
    pub fn spawn() -> std::io::Result<Self> {
        let (queue, rx) = sync_channel(QUEUE);
        let answers: Answers = Arc::default();
        let shared = Arc::clone(&answers);
        std::thread::Builder::new()
            .name("sframe-python".into())
            .spawn(move || worker(&rx, &shared))?;
        Ok(Self {
            queue,
            answers,
            asked: HashSet::new(),
        })
    }

    /// The answer for `m`'s file, asking the worker for it when not known yet (None:
    /// ask again later).
    fn answer(&mut self, pid: u32, m: &Mapping, ask: Ask) -> Result<Option<Answer>, ()> {
        let key = file_key(m);
        let answer = self
            .answers
            .lock()
            .map(|a| a.get(&key).cloned())
            .unwrap_or(None);
        if answer.is_none() && !self.asked.contains(&key) {
            if self.asked.len() >= MAX_FILES {
                self.asked.clear();
            }
            match self.queue.try_send((pid, m.clone(), ask)) {
                Ok(()) => {
                    self.asked.insert(key);
                }
                Err(TrySendError::Full(_)) => {}
                Err(TrySendError::Disconnected(_)) => return Err(()),
            }
        }
        Ok(answer)
    }

    /// What process `pid`, mapping `maps`, is.
    pub fn find(&mut self, pid: u32, maps: &[Mapping]) -> Found {
        let mut pending = false;
        // A build before 3.11 needs the C library's thread id offset too: asked for at
        // once, beside the build (read one after the other, the second answer would come
        // a retry later, and the samples meanwhile lack their Python frames).
        if has_candidate(maps)
            && let Some(libc) = maps.iter().find(|m| m.executable && is_libc(m))
            && self.answer(pid, libc, Ask::ThreadId).is_err()
        {
            return Found::No;
        }
        for m in maps.iter().filter(|m| is_candidate(m) && m.executable) {
            // Its first mapping: the one at the lowest file offset.
            let Some(first) = maps
                .iter()
                .filter(|o| o.inode == m.inode && o.path == m.path)
                .min_by_key(|o| o.offset)
            else {
                continue;
            };
            match self.answer(pid, m, Ask::Build) {
                Err(()) => return Found::No,
                Ok(Some(Answer::Build(Some(build)))) => {
                    let build = match self.with_thread_id(pid, maps, build) {
                        Ok(Some(b)) => b,
                        Ok(None) => {
                            pending = true;
                            continue;
                        }
                        Err(()) => continue,
                    };
                    return Found::Python {
                        build,
                        start: first.start,
                        offset: first.offset,
                    };
                }
                Ok(Some(_)) => {}
                Ok(None) => pending = true,
            }
        }
        if pending { Found::Pending } else { Found::No }
    }

    /// `build` as process `pid` runs it: for a build that finds threads by their
    /// `pthread_t` (3.7–3.10), with the offset of the thread id in the C library's thread
    /// descriptor, read from the C library the process maps (`Ok(None)`: being read;
    /// `Err`: none known, no glibc).
    fn with_thread_id(
        &mut self,
        pid: u32,
        maps: &[Mapping],
        build: Arc<PyBuild>,
    ) -> Result<Option<Arc<PyBuild>>, ()> {
        if build.version >= (3, 11) {
            return Ok(Some(build));
        }
        let Some(libc) = maps.iter().find(|m| m.executable && is_libc(m)) else {
            log::debug!("pid {pid}: CPython before 3.11 without a C library mapped: no frames");
            return Err(());
        };
        match self.answer(pid, libc, Ask::ThreadId)? {
            None => Ok(None),
            Some(Answer::ThreadId(Some(off))) => {
                let mut b = (*build).clone();
                b.offsets.pthread_tid = off;
                Ok(Some(Arc::new(b)))
            }
            Some(_) => Err(()),
        }
    }
}

/// Whether `m` may be glibc's `libc.so.6`, by its name.
fn is_libc(m: &Mapping) -> bool {
    m.is_file()
        && m.path
            .rsplit('/')
            .next()
            .is_some_and(|n| n.starts_with("libc.so") || n.starts_with("libc-2."))
}

fn worker(rx: &Receiver<(u32, Mapping, Ask)>, answers: &Answers) {
    while let Ok((pid, m, ask)) = rx.recv() {
        let answer = match ask {
            Ask::Build => {
                let build = read_build(pid, &m)
                    .map_err(|e| log::debug!("pid {pid}: {}: not a CPython build: {e}", m.path))
                    .ok()
                    .map(Arc::new);
                if let Some(b) = &build {
                    log::debug!(
                        "pid {pid}: {}: CPython {}.{}",
                        m.path,
                        b.version.0,
                        b.version.1
                    );
                }
                Answer::Build(build)
            }
            Ask::ThreadId => Answer::ThreadId(
                read_mapped(pid, &m, thread_id_offset)
                    .map_err(|e| log::debug!("pid {pid}: {}: no thread id offset: {e}", m.path))
                    .ok(),
            ),
        };
        let Ok(mut a) = answers.lock() else {
            return;
        };
        if a.len() >= MAX_FILES {
            a.clear();
        }
        a.insert(file_key(&m), answer);
    }
}

fn read_build(pid: u32, m: &Mapping) -> Result<PyBuild, String> {
    read_mapped(pid, m, inspect)
}

/// `read` of the bytes of the file `m` of process `pid` maps (opened as other mapped
/// objects are, bounded in size, its pages released after).
fn read_mapped<T>(
    pid: u32,
    m: &Mapping,
    read: impl FnOnce(&[u8]) -> Result<T, String>,
) -> Result<T, String> {
    let (file, meta) = crate::objects::open_mapped_file(pid, m).map_err(|e| e.to_string())?;
    if meta.len() > crate::objects::MAX_OBJECT_BYTES {
        return Err("larger than the object size limit".into());
    }
    let bytes = crate::mapped::ObjectBytes::map(file, &meta).map_err(|e| e.to_string())?;
    bytes.releasing(|| read(&bytes))
}

/// The offset of the thread id in glibc's `struct pthread`, from the descriptor glibc
/// keeps for debuggers (`_thread_db_pthread_tid`: size in bits, count, offset).
pub fn thread_id_offset(data: &[u8]) -> Result<u32, String> {
    let file = object::File::parse(data).map_err(|e| format!("not an object file: {e}"))?;
    let sym = file
        .dynamic_symbols()
        .find(|s| s.name() == Ok("_thread_db_pthread_tid"))
        .ok_or("no _thread_db_pthread_tid (not glibc)")?;
    let raw = bytes_at(&file, sym.address(), 12).ok_or("_thread_db_pthread_tid not in the file")?;
    let word = |i: usize| -> Option<u32> {
        let b: [u8; 4] = raw.get(i * 4..i * 4 + 4)?.try_into().ok()?;
        Some(if file.is_little_endian() {
            u32::from_le_bytes(b)
        } else {
            u32::from_be_bytes(b)
        })
    };
    match (word(0), word(1), word(2)) {
        (Some(32), Some(1), Some(off)) if off < 4096 && off.is_multiple_of(4) => Ok(off),
        other => Err(format!("an unexpected _thread_db_pthread_tid {other:?}")),
    }
}

/// Names the Python frames of one process from its memory.
///
/// A code object's address may hold another code object later (the first freed: code
/// compiled by `exec`, a module's at start-up), and the kernel side records only the
/// address. So each address keeps the contents seen there, up to
/// [`PY_MAX_VERSION`](sframe_common::python::PY_MAX_VERSION) of them, and a stack's words
/// are bound to the one the address held when the stack reached user space
/// ([`PyNamer::bind`]).
pub struct PyNamer {
    layout: code::CodeLayout,
    mem: Option<code::ProcMem>,
    codes: Mutex<HashMap<u64, Versions>>,
}

/// The contents seen at one code object's address.
#[derive(Default)]
struct Versions {
    /// The latest (1 to `PY_MAX_VERSION`; 0: none).
    current: u8,
    slots: [Option<Arc<code::CodeInfo>>; sframe_common::python::PY_MAX_VERSION as usize],
}

impl Versions {
    fn get(&self, version: u8) -> Option<&Arc<code::CodeInfo>> {
        self.slots
            .get(usize::from(version).checked_sub(1)?)?
            .as_ref()
    }

    /// Stores `info` as the next version; returns it.
    fn push(&mut self, info: Option<Arc<code::CodeInfo>>) -> u8 {
        self.current = self.current % sframe_common::python::PY_MAX_VERSION + 1;
        if let Some(slot) = usize::from(self.current)
            .checked_sub(1)
            .and_then(|i| self.slots.get_mut(i))
        {
            *slot = info;
        }
        self.current
    }
}

impl std::fmt::Debug for PyNamer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PyNamer").finish_non_exhaustive()
    }
}

impl PyNamer {
    /// For process `pid`, running `build`.
    pub fn new(pid: u32, build: &PyBuild) -> Self {
        Self {
            layout: build.layout,
            mem: code::ProcMem::open(pid)
                .map_err(|e| log::debug!("pid {pid}: cannot read its memory: {e}"))
                .ok(),
            codes: Mutex::new(HashMap::new()),
        }
    }

    /// The frame of an interpreter frame's `word` (see `sframe_common::python`).
    pub fn frame(&self, word: u64) -> Frame {
        if sframe_common::python::is_unread(word) {
            return unread_frame();
        }
        let addr = sframe_common::python::code(word);
        let offset = sframe_common::python::offset(word);
        // The frame's address in the outputs (pprof's location): one per code object and
        // instruction.
        let address = addr | (u64::from(offset) << sframe_common::python::PY_OFFSET_SHIFT);
        match self.named(word) {
            Some(info) => Frame {
                name: Some(info.qualname.clone()),
                object: PYTHON_OBJECT.to_owned(),
                file_offset: address,
                build_id: None,
                location: Some(SourceLocation {
                    file: info.filename.clone(),
                    line: info.line(offset),
                }),
                inlined: Vec::new(),
                reason: None,
            },
            None => Frame::unknown(
                PYTHON_OBJECT,
                address,
                "the code object could not be read (the process exited, or its memory is not a code object)",
            ),
        }
    }

    /// `word` bound to what its code object's address holds now (read now when it is
    /// not known, or no longer what was read: one read of the object's header when it
    /// is). Done when a stack reaches user space, while its process lives; `seen`
    /// remembers the addresses checked in one round (one check per address and round).
    pub fn bind(&self, word: u64, seen: &mut HashMap<u64, u8>) -> u64 {
        if sframe_common::python::is_unread(word) {
            return word;
        }
        let addr = sframe_common::python::code(word);
        if let Some(&v) = seen.get(&addr) {
            return sframe_common::python::with_version(word, v);
        }
        let Some(mem) = self.mem.as_ref() else {
            return word;
        };
        // What the address held when last read. The lock is not held while the
        // process's memory is read (the naming thread takes it too, and a read can be
        // slow): another thread may push the same content meanwhile, which costs a slot.
        let (current, version) = {
            let Ok(codes) = self.codes.lock() else {
                return word;
            };
            match codes.get(&addr) {
                Some(known) => (known.get(known.current).cloned(), known.current),
                None => (None, 0),
            }
        };
        let v = match current.map(|info| info.still_at(mem, &self.layout, addr)) {
            // The same object, or its process gone (what was read stays the best name).
            Some(Some(true) | None) => version,
            // Never read, or another object now.
            _ => {
                let read = self.read(mem, addr);
                if read.is_none() && version == 0 {
                    // Not a code object (or the process gone) when first seen: not
                    // remembered, the word stays unbound.
                    return word;
                }
                let Ok(mut codes) = self.codes.lock() else {
                    return word;
                };
                if codes.len() >= MAX_CODES && !codes.contains_key(&addr) {
                    codes.clear();
                }
                codes.entry(addr).or_default().push(read)
            }
        };
        if seen.len() < MAX_CODES {
            seen.insert(addr, v);
        }
        sframe_common::python::with_version(word, v)
    }

    /// What names `word`: the version it was bound to, the latest one for a word not
    /// bound, read now for a code object never read.
    fn named(&self, word: u64) -> Option<Arc<code::CodeInfo>> {
        let addr = sframe_common::python::code(word);
        {
            let codes = self.codes.lock().ok()?;
            if let Some(known) = codes.get(&addr) {
                return match sframe_common::python::version(word) {
                    0 => known.get(known.current),
                    v => known.get(v),
                }
                .cloned();
            }
        }
        // Read without the lock held (see `bind`).
        let read = self.read(self.mem.as_ref()?, addr);
        let mut codes = self.codes.lock().ok()?;
        if codes.len() >= MAX_CODES {
            codes.clear();
        }
        // A code object not readable now (the process gone) is not remembered as such:
        // only answers read from the memory are.
        if read.is_some() {
            codes.entry(addr).or_default().push(read.clone());
        }
        read
    }

    fn read(&self, mem: &code::ProcMem, addr: u64) -> Option<Arc<code::CodeInfo>> {
        code::CodeInfo::read(mem, &self.layout, addr)
            .map_err(|e| log::debug!("code object {addr:#x}: {e}"))
            .ok()
            .map(Arc::new)
    }
}

/// Merges a symbolized user stack, innermost first, whose words (or lookup addresses)
/// are `addrs`: native frames in order, each `_PyEval_EvalFrameDefault` frame replaced by
/// the Python frames of its invocation (through the next entry frame); Python frames left
/// over (a native walk cut short) go where the outermost invocation was, or at the
/// outer end when no invocation was found.
pub fn merge(addrs: &[u64], frames: Vec<Frame>) -> Vec<Frame> {
    if !addrs.iter().any(|&a| sframe_common::python::is_frame(a)) {
        return frames;
    }
    let mut native = Vec::new();
    let mut python = std::collections::VecDeque::new();
    for (&a, f) in addrs.iter().zip(frames) {
        if sframe_common::python::is_frame(a) {
            python.push_back((sframe_common::python::is_entry(a), f));
        } else {
            native.push(f);
        }
    }
    let mut out = Vec::with_capacity(native.len() + python.len());
    let mut rest_at = None;
    for f in native {
        let eval = f
            .name
            .as_deref()
            .is_some_and(|n| n.starts_with(EVAL_FUNCTION));
        if eval && !python.is_empty() {
            while let Some((entry, p)) = python.pop_front() {
                out.push(p);
                if entry {
                    break;
                }
            }
            rest_at = Some(out.len());
        } else {
            out.push(f);
        }
    }
    let at = rest_at.unwrap_or(out.len());
    let rest: Vec<Frame> = python.into_iter().map(|(_, f)| f).collect();
    out.splice(at..at, rest);
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use sframe_common::python::frame_word;

    /// glibc tells its debuggers where a thread's id lies in its descriptor; this
    /// machine's glibc is read as the finder reads a process's.
    #[test]
    fn the_thread_id_offset_is_read_from_glibc() {
        let libc = [
            "/lib/x86_64-linux-gnu/libc.so.6",
            "/lib/aarch64-linux-gnu/libc.so.6",
        ]
        .into_iter()
        .find(|p| std::path::Path::new(p).exists())
        .expect("glibc");
        let data = std::fs::read(libc).unwrap();
        let off = thread_id_offset(&data).unwrap();
        // x86-64's `struct pthread` keeps the id at 720 since glibc 2.x's first NPTL.
        if cfg!(target_arch = "x86_64") {
            assert_eq!(off, 720);
        }
        // Not glibc: nothing.
        assert!(thread_id_offset(b"\x7fELF not really").is_err());
        let exe = std::fs::read("/proc/self/exe").unwrap();
        assert!(thread_id_offset(&exe).is_err());
    }

    fn named(n: &str) -> Frame {
        Frame {
            name: Some(n.into()),
            ..Frame::unknown("x", 0, "")
        }
    }

    #[test]
    fn each_evaluation_frame_takes_the_frames_of_its_invocation() {
        // Innermost first: C leaf, eval (inner invocation: f, g entry), a C function
        // calling back, eval (outer: h, main entry), main.
        let addrs = [
            1,
            2,
            frame_word(0x1000, 0, false),
            frame_word(0x2000, 0, true),
            3,
            4,
            frame_word(0x3000, 0, false),
            frame_word(0x4000, 0, true),
            5,
        ];
        let frames: Vec<Frame> = [
            "leaf",
            EVAL_FUNCTION,
            "f",
            "g",
            "call",
            EVAL_FUNCTION,
            "h",
            "main",
            "_start",
        ]
        .iter()
        .map(|n| named(n))
        .collect();
        // Python frames sit after the native ones in the words: reorder the test input.
        let order = [0, 1, 4, 5, 8, 2, 3, 6, 7];
        let addrs: Vec<u64> = order.iter().map(|&i| addrs[i]).collect();
        let frames: Vec<Frame> = order.iter().map(|&i| frames[i].clone()).collect();
        let merged: Vec<String> = merge(&addrs, frames)
            .iter()
            .map(|f| f.name.clone().unwrap_or_default())
            .collect();
        assert_eq!(merged, ["leaf", "f", "g", "call", "h", "main", "_start"]);
    }

    #[test]
    fn the_unread_marker_stands_in_the_evaluation_frame_whose_frames_are_missing() {
        use sframe_common::python::PY_UNREAD;
        // Innermost first: leaf, eval (f read), call, eval (frames not read), main; the
        // kernel side read `f` then could not go on.
        let addrs = [1, 2, 3, 4, 5, frame_word(0x1000, 0, true), PY_UNREAD];
        let frames: Vec<Frame> = ["leaf", EVAL_FUNCTION, "call", EVAL_FUNCTION, "main", "f"]
            .iter()
            .map(|n| named(n))
            .chain([unread_frame()])
            .collect();
        let merged: Vec<String> = merge(&addrs, frames)
            .iter()
            .map(Frame::folded_name)
            .collect();
        assert_eq!(merged, ["leaf", "f", "call", UNREAD_FRAME, "main"]);
    }

    #[test]
    fn python_frames_without_an_evaluation_frame_go_outermost() {
        let addrs = [1, frame_word(0x1000, 0, false)];
        let merged = merge(&addrs, vec![named("leaf"), named("f")]);
        let names: Vec<_> = merged
            .iter()
            .map(|f| f.name.clone().unwrap_or_default())
            .collect();
        assert_eq!(names, ["leaf", "f"]);
    }
}
