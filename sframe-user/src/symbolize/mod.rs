//! Symbolization of sampled addresses for the profile outputs, with blazesym.
//!
//! User addresses are normalized per object: the mapping containing an address gives the
//! object (device, inode, path) and the file offset, and the file offset is symbolized
//! against the ELF file (symbol tables, DWARF when present, separate debug files found
//! by build-id or debuglink under `/usr/lib/debug`). The file is opened through
//! `/proc/PID/map_files/START-END` (the exact mapped file, even deleted or in another
//! mount namespace; needs `CAP_SYS_ADMIN` or `CAP_CHECKPOINT_RESTORE`), else through
//! `/proc/PID/root/PATH` (checked against the mapping's inode). Objects and frames are
//! cached: a profile costs work proportional to its distinct (object, offset) pairs, not
//! to its samples, and processes that map the same object share its cache entry. The
//! caches are bounded for an always-on profiler: past [`MAX_OBJECTS`] open objects (each
//! holds a descriptor and blazesym's parsed state), [`MAX_FRAMES`] user frames or
//! [`MAX_STATE_BYTES`] of heap kept by its calls (blazesym's parsed symbols, decompressed
//! DWARF and kallsyms, and the frames cached: measured by [`crate::heap`] where the
//! process counts it), the least recently used objects are dropped with their state and
//! frames at the start of the next call, until the cache is within its bounds again;
//! past [`MAX_KERNEL_FRAMES`] kernel frames (or with no object left to drop), the
//! kernel's and the vDSO's state and frames are. Both are counted in
//! [`SymbolizerStats::evictions`]. Each object has its own blazesym symbolizer, dropped
//! before the descriptor its path (`/proc/self/fd/N`) names: blazesym caches by path,
//! and a descriptor number reused by another object must not find the first one's state.
//!
//! Addresses are symbolized as given: callers pass `return address - 1` for caller
//! frames so that a call at the end of a function is attributed to it.
//!
//! Kernel addresses are symbolized with `/proc/kallsyms`.
//!
//! A [`Symbolizer`] is not `Send` (blazesym's caches use `Rc`); keep it on one thread.

pub mod debuginfod;
mod frame;
mod object;
pub mod perfmap;
mod plt;

use std::{
    collections::{HashMap, HashSet, hash_map::Entry},
    io::{BufRead, BufReader},
    sync::{Mutex, MutexGuard, PoisonError},
};

use blazesym::{
    ErrorExt as _, MaybeDefault,
    symbolize::{
        self, CodeInfo, Input, Symbolized,
        source::{Elf, Kernel, Process, Source},
    },
};

pub use self::frame::{Frame, InlinedFrame, SourceLocation, object_basename};
use self::object::{ObjectKey, OpenedObject};
pub use self::perfmap::PerfMap;
use crate::procfs::Mapping;

/// Object name of kernel frames (perf's name for it).
pub const KERNEL_OBJECT: &str = "[kernel.kallsyms]";
/// Object name of addresses outside any mapping.
pub const UNKNOWN_OBJECT: &str = "[unknown]";
const VDSO: &str = "[vdso]";

/// The name of a frame in a PLT stub whose target is unknown (PLT0, unusual stubs).
/// Other stubs are `NAME@plt`, after the symbol their GOT slot is relocated to.
pub const PLT_NAME: &str = "[plt]";

/// Work counters, for tests and the profiler's own health metrics.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SymbolizerStats {
    /// Objects opened and handed to blazesym (each is parsed at most once).
    pub objects_opened: u64,
    /// Attempts to open an object that failed (retried on a later call).
    pub open_failures: u64,
    /// Distinct (object, offset) pairs symbolized by blazesym.
    pub frames_symbolized: u64,
    /// Addresses answered from the frame cache.
    pub frame_cache_hits: u64,
    /// Objects dropped (least recently used first) with their state and frames to stay
    /// within the bounds; the kernel's and the vDSO's state counts as one.
    pub evictions: u64,
    /// Heap bytes kept by the calls of the objects kept, the kernel's and the vDSO's
    /// (0 where the process does not count them: see [`crate::heap`]).
    pub state_bytes: u64,
}

/// How many objects and frames a [`Symbolizer`] keeps at most (see the module's
/// documentation).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CacheLimits {
    pub objects: usize,
    pub frames: usize,
    pub kernel_frames: usize,
    /// Heap bytes kept by the calls of the objects kept (and the kernel's and vDSO's).
    pub state_bytes: u64,
}

impl Default for CacheLimits {
    fn default() -> Self {
        Self {
            objects: MAX_OBJECTS,
            frames: MAX_FRAMES,
            kernel_frames: MAX_KERNEL_FRAMES,
            state_bytes: MAX_STATE_BYTES,
        }
    }
}

/// Objects open at once at most (descriptors and blazesym state).
pub const MAX_OBJECTS: usize = 512;
/// Cached user frames at most.
pub const MAX_FRAMES: usize = 256 * 1024;
/// Cached kernel frames at most.
pub const MAX_KERNEL_FRAMES: usize = 64 * 1024;
/// Heap bytes the symbolizer keeps at most, checked between calls (one call may go past
/// it by what it parses). The busy-host bench's naming symbolizer keeps about 25 MB:
/// a decompressed debug file of libc (11 MB), kallsyms (6 MB), symbol indexes (4.5 MB)
/// and the frames.
pub const MAX_STATE_BYTES: u64 = 64 << 20;

/// Held by every [`Symbolizer`] of the process while blazesym may map or unmap files
/// (each call into it, and dropping it) and by [`Symbolizer::end_round`] while it
/// releases pages: the release advises the address ranges `/proc/self/maps` listed,
/// which must not be unmapped and reused meanwhile by another thread's symbolizer.
static BLAZE_MAPPINGS: Mutex<()> = Mutex::new(());

fn blaze_mappings() -> MutexGuard<'static, ()> {
    BLAZE_MAPPINGS
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
}

/// Holds every symbolizer of the process back from blazesym until dropped (tests of
/// callers that must not wait for one).
#[cfg(test)]
pub(crate) fn hold_blazesym() -> MutexGuard<'static, ()> {
    blaze_mappings()
}

/// Least time between two releases of mapped object pages ([`Symbolizer::end_round`]).
pub const RELEASE_INTERVAL: std::time::Duration = std::time::Duration::from_secs(3);

/// Symbolizer of user and kernel addresses with per-object caches.
pub struct Symbolizer {
    /// blazesym's state for the kernel (kallsyms) and the vDSO.
    blaze: symbolize::Symbolizer,
    /// Object key → id in `objects`.
    object_ids: HashMap<ObjectKey, u64>,
    /// Objects kept, by id (ids are never reused).
    objects: HashMap<u64, Resident>,
    next_id: u64,
    /// Calls so far: the clock of [`Resident::last_used`].
    tick: u64,
    /// vDSO offset → frame: its image is the kernel's, the same in every process.
    vdso_frames: HashMap<u64, Frame>,
    kernel_frames: HashMap<u64, Frame>,
    /// Heap kept by the kernel's and the vDSO's calls.
    shared_bytes: u64,
    /// Frames kept for all objects and the vDSO.
    user_frames: usize,
    /// Why `/proc/kallsyms` cannot be used, if so; computed on first use.
    kallsyms: Option<Result<(), KallsymsError>>,
    stats: SymbolizerStats,
    limits: CacheLimits,
    /// When [`Symbolizer::end_round`] last released mapped pages.
    last_release: Option<std::time::Instant>,
    /// Where debug files of objects without line tables are fetched, if anywhere.
    debuginfod: Option<std::sync::Arc<debuginfod::Debuginfod>>,
}

/// How often an object's debug file, asked of debuginfod, is looked for on the disk.
const DEBUG_FILE_POLL: std::time::Duration = std::time::Duration::from_secs(1);

/// An object's separate debug file from debuginfod.
enum DebugFile {
    /// Not needed, not asked for, or no server has it.
    None,
    /// Asked for: looked for again from this time on.
    Waiting(std::time::Instant),
    /// On the disk, open: its frames are named from it.
    Ready(DebugObject),
}

/// A debug file opened for symbolization.
struct DebugObject {
    /// Kept open so that `blaze_path` names this file.
    _file: std::fs::File,
    blaze_path: std::path::PathBuf,
    /// Why its DWARF is not used, if so (as [`OpenedObject::symbols_only`]).
    symbols_only: Option<String>,
}

/// An object kept, with its own blazesym state and its frames. Dropped only while
/// holding [`BLAZE_MAPPINGS`] (blazesym unmaps the file).
struct Resident {
    /// Declared first, so dropped before `object`, whose descriptor its cache's path
    /// names.
    blaze: symbolize::Symbolizer,
    object: OpenedObject,
    key: ObjectKey,
    /// File offset → frame.
    frames: HashMap<u64, Frame>,
    /// Heap kept by its opening and its calls.
    bytes: u64,
    /// [`Symbolizer::tick`] of its last use.
    last_used: u64,
    /// Its debug file from debuginfod.
    debug: DebugFile,
}

/// The id of the vDSO in a call's slots (objects' ids count up from 0).
const VDSO_ID: u64 = u64::MAX;

impl Drop for Symbolizer {
    fn drop(&mut self) {
        // blazesym's mappings go now, under the lock (the fields are dropped after
        // this returns); the one put in its place has opened nothing.
        let _mappings = blaze_mappings();
        self.objects.clear();
        drop(std::mem::replace(&mut self.blaze, new_blaze()));
    }
}

/// A blazesym symbolizer as every one of ours is configured.
fn new_blaze() -> symbolize::Symbolizer {
    symbolize::Symbolizer::builder()
        // Objects are reached through `/proc/self/fd/N` of a descriptor we keep open,
        // so the path names one file for as long as its state is kept: no need to stat
        // it at every call.
        .enable_auto_reload(false)
        .enable_code_info(true)
        .enable_inlined_fns(true)
        .enable_demangling(true)
        .build()
}

impl Default for Symbolizer {
    fn default() -> Self {
        Self::new()
    }
}

impl Symbolizer {
    pub fn new() -> Self {
        Self {
            blaze: new_blaze(),
            object_ids: HashMap::new(),
            objects: HashMap::new(),
            next_id: 0,
            tick: 0,
            vdso_frames: HashMap::new(),
            kernel_frames: HashMap::new(),
            shared_bytes: 0,
            user_frames: 0,
            kallsyms: None,
            stats: SymbolizerStats::default(),
            limits: CacheLimits::default(),
            last_release: None,
            debuginfod: None,
        }
    }

    /// Names the frames of objects without line tables of their own from the debug files
    /// `client` fetches (from the next call on; what is not fetched yet stays
    /// `[object+0xOFFSET]`, and is named once it is).
    pub fn set_debuginfod(&mut self, client: Option<std::sync::Arc<debuginfod::Debuginfod>>) {
        self.debuginfod = client;
    }

    /// A symbolizer with other cache bounds.
    pub fn with_limits(limits: CacheLimits) -> Self {
        let mut s = Self::new();
        s.limits = limits;
        s
    }

    /// Drops the least recently used objects while a cache is over its bound, then the
    /// kernel's and the vDSO's state if still over (or over the kernel frames' bound).
    /// Only between calls: no object id is held then.
    fn bound(&mut self) {
        // The sum of what each part kept (each saturates at 0 on its own).
        self.stats.state_bytes = self
            .objects
            .values()
            .fold(self.shared_bytes, |sum, r| sum.saturating_add(r.bytes));
        let over = |s: &Self| {
            s.objects.len() > s.limits.objects
                || s.user_frames > s.limits.frames
                || s.stats.state_bytes > s.limits.state_bytes
        };
        if !over(self) && self.kernel_frames.len() <= self.limits.kernel_frames {
            return;
        }
        let (objects, frames, bytes) =
            (self.objects.len(), self.user_frames, self.stats.state_bytes);
        let _mappings = blaze_mappings();
        let evicted = self.stats.evictions;
        while over(self) {
            let Some(id) = self
                .objects
                .iter()
                .min_by_key(|(_, r)| r.last_used)
                .map(|(&id, _)| id)
            else {
                break;
            };
            if let Some(resident) = self.objects.remove(&id) {
                self.object_ids.remove(&resident.key);
                self.user_frames = self.user_frames.saturating_sub(resident.frames.len());
                self.stats.state_bytes = self.stats.state_bytes.saturating_sub(resident.bytes);
                self.stats.evictions += 1;
            }
        }
        if over(self) || self.kernel_frames.len() > self.limits.kernel_frames {
            self.blaze = new_blaze();
            self.user_frames = self.user_frames.saturating_sub(self.vdso_frames.len());
            self.vdso_frames = HashMap::new();
            self.kernel_frames = HashMap::new();
            self.stats.state_bytes = self.stats.state_bytes.saturating_sub(self.shared_bytes);
            self.shared_bytes = 0;
            self.stats.evictions += 1;
        }
        log::info!(
            "symbolizer: {objects} objects, {frames} frames, {bytes} heap bytes kept: \
             dropped {} (least recently used first)",
            self.stats.evictions - evicted
        );
    }

    pub fn stats(&self) -> SymbolizerStats {
        self.stats
    }

    /// Adds to the state's bytes, and to `bytes` (an object's or the shared state's),
    /// what this thread kept since `since`, a reading of [`crate::heap::thread_net`]
    /// (less, if it freed more).
    fn kept_since(state_bytes: &mut u64, bytes: &mut u64, since: i64) {
        let kept = crate::heap::thread_net().wrapping_sub(since);
        *state_bytes = state_bytes.saturating_add_signed(kept);
        *bytes = bytes.saturating_add_signed(kept);
    }

    /// Ends a round of symbolization (a profile written, a scrape's new stacks named):
    /// the pages of the object files blazesym read stay in the page cache but leave the
    /// profiler's RSS (see [`crate::mapped::release_shared_file_pages`]); the parsed
    /// state and the frame cache stay. Returns the bytes of mappings advised.
    ///
    /// At most once per [`RELEASE_INTERVAL`]: the next round faults back in the pages it
    /// reads (symbol names, line tables), which is not worth doing every second (the
    /// busy-host bench scrapes every second). Every shared read-only file mapping of the
    /// process is released: in a program that makes such mappings itself and unmaps them
    /// on another thread, do not call this.
    pub fn end_round(&mut self) -> u64 {
        if self
            .last_release
            .is_some_and(|at| at.elapsed() < RELEASE_INTERVAL)
        {
            return 0;
        }
        self.last_release = Some(std::time::Instant::now());
        let _mappings = blaze_mappings();
        // SAFETY: the profiler's shared read-only file mappings are blazesym's, and
        // every symbolizer maps and unmaps them only while holding BLAZE_MAPPINGS, held
        // here; `ObjectBytes` (the build worker's) are private.
        unsafe { crate::mapped::release_shared_file_pages() }
    }

    /// Symbolizes absolute user addresses of process `pid`, whose mappings are `maps`
    /// (from [`crate::procfs::read_maps`]). Returns one frame per address, in order.
    pub fn symbolize_user(&mut self, pid: u32, maps: &[Mapping], addrs: &[u64]) -> Vec<Frame> {
        self.symbolize_process(pid, maps, None, None, addrs)
    }

    /// [`Symbolizer::symbolize_user`], naming addresses in anonymous executable memory, or
    /// in no mapping, from the process's perf map when it has one (JIT code), and the
    /// words of CPython's interpreter frames with `python` (see [`crate::python::merge`]
    /// for their place in the stack).
    pub fn symbolize_process(
        &mut self,
        pid: u32,
        maps: &[Mapping],
        perf_map: Option<&PerfMap>,
        python: Option<&crate::python::PyNamer>,
        addrs: &[u64],
    ) -> Vec<Frame> {
        self.bound();
        self.tick += 1;
        let _mappings = blaze_mappings();
        // Mappings sorted by start for a binary search (procfs gives them sorted; do not
        // rely on it).
        let mut order: Vec<usize> = (0..maps.len()).collect();
        order.sort_by_key(|&i| maps.get(i).map(|m| m.start));
        // Per mapping, for this call: its object, or why it has none.
        let mut resolved: HashMap<usize, Result<u64, std::sync::Arc<self::object::OpenError>>> =
            HashMap::new();
        let mut slots: Vec<Slot> = Vec::with_capacity(addrs.len());
        // Offsets to symbolize, per object (each once).
        let mut pending: HashMap<u64, Vec<u64>> = HashMap::new();
        let mut pending_set: HashSet<(u64, u64)> = HashSet::new();
        // vDSO addresses to symbolize (absolute, blazesym reads the image from the process).
        let mut vdso_pending: Vec<(u64, u64)> = Vec::new();

        for &addr in addrs {
            if sframe_common::python::is_frame(addr) {
                slots.push(Slot::Done(match python {
                    _ if sframe_common::python::is_unread(addr) => crate::python::unread_frame(),
                    Some(namer) => namer.frame(addr),
                    None => Frame::unknown(
                        crate::python::PYTHON_OBJECT,
                        sframe_common::python::code(addr),
                        "no CPython build known for the process",
                    ),
                }));
                continue;
            }
            let found = find_mapping(maps, &order, addr);
            if found.is_none_or(|(_, m)| perfmap::is_jit_mapping(m))
                && let Some(frame) = perf_map.and_then(|p| jit_frame(p, addr, found))
            {
                slots.push(Slot::Done(frame));
                continue;
            }
            let Some((mi, m)) = found else {
                slots.push(Slot::Done(Frame::unknown(
                    UNKNOWN_OBJECT,
                    addr,
                    format!("address {addr:#x} is in no mapping of pid {pid}"),
                )));
                continue;
            };
            let rel = addr - m.start;
            if m.path == VDSO {
                let key = (VDSO_ID, rel);
                if self.vdso_frames.contains_key(&rel) {
                    self.stats.frame_cache_hits += 1;
                } else if pending_set.insert(key) {
                    vdso_pending.push((addr, rel));
                }
                slots.push(Slot::Cached(key));
                continue;
            }
            if !m.is_file() {
                let object = if m.path.is_empty() {
                    "[anon]".to_owned()
                } else {
                    m.path.clone()
                };
                slots.push(Slot::Done(Frame::unknown(
                    object,
                    rel,
                    "not a file mapping (anonymous memory or JIT code)",
                )));
                continue;
            }
            let Some(file_offset) = m.offset.checked_add(rel) else {
                slots.push(Slot::Done(Frame::unknown(
                    object_basename(&m.path),
                    rel,
                    "mapping offset overflows",
                )));
                continue;
            };
            let object = match resolved.entry(mi) {
                Entry::Occupied(e) => e.get().clone(),
                Entry::Vacant(e) => e.insert(self.object_for(pid, m)).clone(),
            };
            match object {
                Ok(id) => {
                    let key = (id, file_offset);
                    if self
                        .objects
                        .get(&id)
                        .is_some_and(|r| r.frames.contains_key(&file_offset))
                    {
                        self.stats.frame_cache_hits += 1;
                    } else if pending_set.insert(key) {
                        pending.entry(id).or_default().push(file_offset);
                    }
                    slots.push(Slot::Cached(key));
                }
                Err(reason) => slots.push(Slot::Done(Frame::unknown(
                    object_basename(&m.path),
                    file_offset,
                    reason.to_string(),
                ))),
            }
        }

        // Frames of batches that failed as a whole (the file could not be parsed, the
        // process exited): answered for this call only, retried on the next.
        let mut uncached: HashMap<(u64, u64), Frame> = HashMap::new();
        for (id, offsets) in pending {
            let since = crate::heap::thread_net();
            let (frames, cache) = self.symbolize_object(id, &offsets);
            let Some(r) = self.objects.get_mut(&id) else {
                uncached.extend(offsets.iter().map(|&o| (id, o)).zip(frames));
                continue;
            };
            if cache {
                let before = r.frames.len();
                r.frames.extend(offsets.iter().copied().zip(frames));
                self.user_frames += r.frames.len() - before;
            } else {
                uncached.extend(offsets.iter().map(|&o| (id, o)).zip(frames));
            }
            Self::kept_since(&mut self.stats.state_bytes, &mut r.bytes, since);
        }
        if !vdso_pending.is_empty() {
            let since = crate::heap::thread_net();
            let (frames, cache) = self.symbolize_vdso(pid, &vdso_pending);
            let rels = vdso_pending.iter().map(|&(_, rel)| rel);
            if cache {
                let before = self.vdso_frames.len();
                self.vdso_frames.extend(rels.zip(frames));
                self.user_frames += self.vdso_frames.len() - before;
            } else {
                uncached.extend(rels.map(|rel| (VDSO_ID, rel)).zip(frames));
            }
            Self::kept_since(&mut self.stats.state_bytes, &mut self.shared_bytes, since);
        }

        slots
            .into_iter()
            .map(|slot| match slot {
                Slot::Done(frame) => frame,
                Slot::Cached(key) => self
                    .cached(key)
                    .or_else(|| uncached.get(&key))
                    .cloned()
                    .unwrap_or_else(|| {
                        // Unreachable: every pending key was answered above.
                        Frame::unknown(UNKNOWN_OBJECT, key.1, "internal: frame missing")
                    }),
            })
            .collect()
    }

    /// The cached frame of `(object id, file offset)` (the vDSO's: `(VDSO_ID, offset)`).
    fn cached(&self, (id, offset): (u64, u64)) -> Option<&Frame> {
        if id == VDSO_ID {
            self.vdso_frames.get(&offset)
        } else {
            self.objects.get(&id)?.frames.get(&offset)
        }
    }

    /// Symbolizes kernel addresses with `/proc/kallsyms`. One frame per address.
    pub fn symbolize_kernel(&mut self, addrs: &[u64]) -> Vec<Frame> {
        self.bound();
        self.tick += 1;
        let _mappings = blaze_mappings();
        let usable = *self.kallsyms.get_or_insert_with(kallsyms_usable);
        if let Err(reason) = usable {
            return addrs
                .iter()
                .map(|&a| Frame::unknown(KERNEL_OBJECT, a, reason.to_string()))
                .collect();
        }
        let mut missing: Vec<u64> = addrs
            .iter()
            .copied()
            .filter(|a| !self.kernel_frames.contains_key(a))
            .collect();
        self.stats.frame_cache_hits += (addrs.len() - missing.len()) as u64;
        missing.sort_unstable();
        missing.dedup();
        if !missing.is_empty() {
            let since = crate::heap::thread_net();
            let src = Source::Kernel(Kernel {
                kallsyms: MaybeDefault::Default,
                // kallsyms only: searching for a vmlinux image is slow and rarely fruitful.
                vmlinux: MaybeDefault::None,
                debug_syms: false,
                ..Kernel::default()
            });
            let results = guarded(|| self.blaze.symbolize(&src, Input::AbsAddr(&missing)));
            self.stats.frames_symbolized += missing.len() as u64;
            let (frames, cache) = batch_to_frames(results, &missing, KERNEL_OBJECT, None, |a| a);
            if !cache {
                // kallsyms could not be read: answer without caching.
                let failed: HashMap<u64, Frame> = missing.iter().copied().zip(frames).collect();
                return addrs
                    .iter()
                    .map(
                        |a| match self.kernel_frames.get(a).or_else(|| failed.get(a)) {
                            Some(f) => f.clone(),
                            None => Frame::unknown(KERNEL_OBJECT, *a, "internal: frame missing"),
                        },
                    )
                    .collect();
            }
            self.kernel_frames
                .extend(missing.iter().copied().zip(frames));
            Self::kept_since(&mut self.stats.state_bytes, &mut self.shared_bytes, since);
        }
        addrs
            .iter()
            .map(|a| {
                self.kernel_frames
                    .get(a)
                    .cloned()
                    .unwrap_or_else(|| Frame::unknown(KERNEL_OBJECT, *a, "internal: frame missing"))
            })
            .collect()
    }

    /// The cached object of mapping `m` of `pid`, opened now if new.
    fn object_for(
        &mut self,
        pid: u32,
        m: &Mapping,
    ) -> Result<u64, std::sync::Arc<self::object::OpenError>> {
        let key = ObjectKey::of(m);
        if let Some(&id) = self.object_ids.get(&key)
            && let Some(r) = self.objects.get_mut(&id)
        {
            r.last_used = self.tick;
            self.poll_debug_file(id, pid);
            return Ok(id);
        }
        let since = crate::heap::thread_net();
        match OpenedObject::open(pid, m) {
            Ok(object) => {
                self.stats.objects_opened += 1;
                let id = self.next_id;
                self.next_id += 1;
                let debug = if object.needs_debuginfo && self.debuginfod.is_some() {
                    DebugFile::Waiting(std::time::Instant::now())
                } else {
                    DebugFile::None
                };
                let mut resident = Resident {
                    blaze: new_blaze(),
                    object,
                    key: key.clone(),
                    frames: HashMap::new(),
                    bytes: 0,
                    last_used: self.tick,
                    debug,
                };
                Self::kept_since(&mut self.stats.state_bytes, &mut resident.bytes, since);
                self.objects.insert(id, resident);
                self.object_ids.insert(key, id);
                self.poll_debug_file(id, pid);
                Ok(id)
            }
            Err(e) => {
                self.stats.open_failures += 1;
                Err(std::sync::Arc::new(e))
            }
        }
    }

    /// Object `id`'s debug file, if one was asked for and its time to look again has
    /// come: opened once debuginfod has it (the frames cached so far, named without it,
    /// are dropped), forgotten if no server has it.
    fn poll_debug_file(&mut self, id: u64, pid: u32) {
        let Some(client) = &self.debuginfod else {
            return;
        };
        let Some(r) = self.objects.get_mut(&id) else {
            return;
        };
        let now = std::time::Instant::now();
        if !matches!(r.debug, DebugFile::Waiting(at) if at <= now) {
            return;
        }
        let Some(build_id) = r.object.build_id.as_deref() else {
            r.debug = DebugFile::None;
            return;
        };
        r.debug = match client.lookup(build_id, pid) {
            debuginfod::Lookup::Ready(path) => match DebugObject::open(&path) {
                Ok(debug) => {
                    self.user_frames = self.user_frames.saturating_sub(r.frames.len());
                    r.frames.clear();
                    DebugFile::Ready(debug)
                }
                Err(e) => {
                    log::info!("debug file {}: {e}", path.display());
                    DebugFile::None
                }
            },
            debuginfod::Lookup::Waiting => DebugFile::Waiting(now + DEBUG_FILE_POLL),
            debuginfod::Lookup::Unavailable => DebugFile::None,
        };
    }

    /// Frames of `offsets` in object `id`, and whether they may be cached.
    fn symbolize_object(&mut self, id: u64, offsets: &[u64]) -> (Vec<Frame>, bool) {
        self.stats.frames_symbolized += offsets.len() as u64;
        let Some(Resident {
            blaze,
            object: obj,
            debug,
            ..
        }) = self.objects.get(&id)
        else {
            let frames = offsets
                .iter()
                .map(|&o| Frame::unknown(UNKNOWN_OBJECT, o, "internal: no such object"))
                .collect();
            return (frames, false);
        };
        if let DebugFile::Ready(debug) = debug {
            return symbolize_with_debug_file(blaze, obj, debug, offsets);
        }
        // `Elf::new` consults DWARF and debug files (`debug_syms: true`), unless a
        // compressed section of the object was found unsafe to decompress.
        let mut elf = Elf::new(obj.blaze_path.clone());
        if let Some(reason) = &obj.symbols_only {
            log::debug!("{}: symbol tables only: {reason}", obj.display_path);
            elf.debug_syms = false;
        }
        let src = Source::Elf(elf);
        let results = guarded(|| {
            blaze
                .symbolize(&src, Input::FileOffset(offsets))
                .context(obj.display_path.clone())
        });
        let (mut frames, cacheable) = batch_to_frames(
            results,
            offsets,
            &obj.basename,
            obj.build_id.as_deref(),
            |o| o,
        );
        for f in &mut frames {
            if let Some(name) = obj.plt.name_at(f.file_offset) {
                f.name = Some(name.unwrap_or(PLT_NAME).to_owned());
                f.location = None;
                f.inlined.clear();
                f.reason = None;
            }
        }
        (frames, cacheable)
    }

    /// vDSO addresses: blazesym reads the image from the process's memory once.
    fn symbolize_vdso(&mut self, pid: u32, pending: &[(u64, u64)]) -> (Vec<Frame>, bool) {
        self.stats.frames_symbolized += pending.len() as u64;
        let addrs: Vec<u64> = pending.iter().map(|&(a, _)| a).collect();
        let src = Source::Process(Process {
            debug_syms: false,
            perf_map: false,
            // Only vDSO addresses are passed: no file is opened.
            map_files: false,
            vdso: true,
            ..Process::new(pid.into())
        });
        let results = guarded(|| self.blaze.symbolize(&src, Input::AbsAddr(&addrs)));
        let rel: HashMap<u64, u64> = pending.iter().copied().collect();
        batch_to_frames(results, &addrs, VDSO, None, |a| {
            rel.get(&a).copied().unwrap_or(a)
        })
    }
}

impl DebugObject {
    /// Opens a debug file of the cache (a regular file, no link followed), its compressed
    /// sections checked as an object's are.
    fn open(path: &std::path::Path) -> Result<Self, self::object::OpenError> {
        use std::os::unix::io::AsRawFd as _;
        let (file, meta) = crate::safe_open::open_regular(path)?;
        let shown = path.display().to_string();
        let bytes = file
            .try_clone()
            .and_then(|f| crate::mapped::ObjectBytes::map(f, &meta))
            .map_err(|source| self::object::OpenError::Map {
                path: shown.clone(),
                source,
            })?;
        let symbols_only = match self::object::check_compression(&*bytes) {
            self::object::Compression::Fine => None,
            self::object::Compression::SymbolsOnly(reason) => Some(reason),
            self::object::Compression::Refused(reason) => {
                return Err(self::object::OpenError::Compressed {
                    path: shown,
                    reason,
                });
            }
        };
        drop(bytes);
        let blaze_path = std::path::PathBuf::from(format!("/proc/self/fd/{}", file.as_raw_fd()));
        Ok(Self {
            _file: file,
            blaze_path,
            symbols_only,
        })
    }
}

/// Frames of `offsets` in `obj` named from its debug file: each file offset becomes the
/// virtual address its PT_LOAD segment gives it, which the debug file (same layout)
/// describes.
fn symbolize_with_debug_file(
    blaze: &symbolize::Symbolizer,
    obj: &OpenedObject,
    debug: &DebugObject,
    offsets: &[u64],
) -> (Vec<Frame>, bool) {
    let mut elf = Elf::new(debug.blaze_path.clone());
    if debug.symbols_only.is_some() {
        elf.debug_syms = false;
    }
    let src = Source::Elf(elf);
    // Offsets outside every segment keep the object's own answer (none: unknown).
    let mapped: Vec<(u64, u64)> = offsets
        .iter()
        .filter_map(|&o| Some((obj.virtual_address(o)?, o)))
        .collect();
    let addrs: Vec<u64> = mapped.iter().map(|&(a, _)| a).collect();
    let results = guarded(|| {
        blaze
            .symbolize(&src, Input::VirtOffset(&addrs))
            .context(obj.display_path.clone())
    });
    let offset_of: HashMap<u64, u64> = mapped.iter().copied().collect();
    let (frames, cacheable) = batch_to_frames(
        results,
        &addrs,
        &obj.basename,
        obj.build_id.as_deref(),
        |a| offset_of.get(&a).copied().unwrap_or(a),
    );
    let mut by_offset: HashMap<u64, Frame> = mapped.iter().map(|&(_, o)| o).zip(frames).collect();
    let frames = offsets
        .iter()
        .map(|&o| {
            let mut f = by_offset.remove(&o).unwrap_or_else(|| {
                Frame::unknown(obj.basename.clone(), o, "outside the object's segments")
            });
            if f.build_id.is_none() {
                f.build_id = obj.build_id.clone();
            }
            if let Some(name) = obj.plt.name_at(f.file_offset) {
                f.name = Some(name.unwrap_or(PLT_NAME).to_owned());
                f.location = None;
                f.inlined.clear();
                f.reason = None;
            }
            f
        })
        .collect();
    (frames, cacheable)
}

/// The frame of `addr` in JIT code (in `mapping`, if in one) named by `perf_map`.
fn jit_frame(perf_map: &PerfMap, addr: u64, mapping: Option<(usize, &Mapping)>) -> Option<Frame> {
    let (name, _start) = perf_map.lookup(addr)?;
    let file_offset = mapping.map_or(addr, |(_, m)| addr - m.start);
    Some(Frame {
        name: Some(name),
        object: perfmap::JIT_OBJECT.to_owned(),
        file_offset,
        build_id: None,
        location: None,
        inlined: Vec::new(),
        reason: None,
    })
}

enum Slot {
    Done(Frame),
    /// (object id or [`VDSO_ID`], file offset).
    Cached((u64, u64)),
}

/// The index in `maps` of the mapping containing `addr`; `order` sorts `maps` by start.
fn find_mapping<'m>(
    maps: &'m [Mapping],
    order: &[usize],
    addr: u64,
) -> Option<(usize, &'m Mapping)> {
    // Last mapping starting at or below addr.
    let n = order.partition_point(|&i| maps.get(i).is_some_and(|m| m.start <= addr));
    let i = *order.get(n.checked_sub(1)?)?;
    let m = maps.get(i)?;
    (addr < m.end).then_some((i, m))
}

/// Why a blazesym call gave no result.
#[derive(Debug, thiserror::Error)]
pub enum BlazeFailure {
    /// It returned an error (shown with its chain of causes).
    #[error("{0:#}")]
    Error(blazesym::Error),
    /// It panicked (on a malformed file, say).
    #[error("blazesym panicked: {0}")]
    Panic(String),
}

/// Runs a blazesym call, catching its error or a panic: the files it parses come from
/// the processes we profile, and a malformed one must not take the profiler down.
fn guarded<T>(f: impl FnOnce() -> blazesym::Result<T>) -> Result<T, BlazeFailure> {
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)) {
        Ok(result) => result.map_err(BlazeFailure::Error),
        Err(panic) => {
            let msg = panic
                .downcast_ref::<&str>()
                .copied()
                .or_else(|| panic.downcast_ref::<String>().map(String::as_str))
                .unwrap_or("unknown panic");
            Err(BlazeFailure::Panic(msg.to_owned()))
        }
    }
}

/// Converts a blazesym batch result into one frame per input, and whether the frames
/// may be cached (not when the batch failed as a whole). `offset_of` maps an input to the
/// offset reported in the frame.
fn batch_to_frames(
    results: Result<Vec<Symbolized<'_>>, BlazeFailure>,
    inputs: &[u64],
    object: &str,
    build_id: Option<&str>,
    offset_of: impl Fn(u64) -> u64,
) -> (Vec<Frame>, bool) {
    let results = match results {
        Ok(r) if r.len() == inputs.len() => r,
        other => {
            let reason = match other {
                Ok(r) => format!(
                    "blazesym returned {} results for {} inputs",
                    r.len(),
                    inputs.len()
                ),
                Err(e) => e.to_string(),
            };
            let frames = inputs
                .iter()
                .map(|&i| Frame::unknown(object, offset_of(i), reason.clone()))
                .collect();
            return (frames, false);
        }
    };
    let frames = inputs
        .iter()
        .zip(results)
        .map(|(&input, result)| {
            let mut frame = match result {
                Symbolized::Sym(sym) => Frame {
                    name: Some(crate::sanitize::name(&sym.name).into_owned()),
                    object: object.to_owned(),
                    file_offset: offset_of(input),
                    build_id: None,
                    location: sym.code_info.as_deref().map(location),
                    inlined: sym
                        .inlined
                        .iter()
                        .map(|f| InlinedFrame {
                            name: crate::sanitize::name(&f.name).into_owned(),
                            location: f.code_info.as_ref().map(location),
                        })
                        .collect(),
                    reason: None,
                },
                Symbolized::Unknown(reason) => {
                    Frame::unknown(object, offset_of(input), reason.to_string())
                }
            };
            frame.build_id = build_id.map(str::to_owned);
            frame
        })
        .collect();
    (frames, true)
}

fn location(info: &CodeInfo<'_>) -> SourceLocation {
    SourceLocation {
        file: info.to_path().to_string_lossy().into_owned(),
        line: info.line,
    }
}

/// Why kernel addresses cannot be symbolized.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum KallsymsError {
    #[error("cannot open /proc/kallsyms: {0}")]
    Open(std::io::ErrorKind),
    #[error("reading /proc/kallsyms: {0}")]
    Read(std::io::ErrorKind),
    #[error("/proc/kallsyms hides addresses (kptr_restrict; needs root or CAP_SYSLOG)")]
    Hidden,
}

/// `Ok` when `/proc/kallsyms` shows real addresses. Without root (kptr_restrict) it
/// shows zeros, and blazesym would then name every address after an arbitrary symbol.
fn kallsyms_usable() -> Result<(), KallsymsError> {
    let file = std::fs::File::open("/proc/kallsyms").map_err(|e| KallsymsError::Open(e.kind()))?;
    kallsyms_shows_addresses(BufReader::new(file))
}

fn kallsyms_shows_addresses(text: impl BufRead) -> Result<(), KallsymsError> {
    for line in text.lines().take(1000) {
        let line = line.map_err(|e| KallsymsError::Read(e.kind()))?;
        let addr = line.split(' ').next().unwrap_or("");
        if u64::from_str_radix(addr, 16).is_ok_and(|a| a != 0) {
            return Ok(());
        }
    }
    Err(KallsymsError::Hidden)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mapping(start: u64, end: u64, path: &str) -> Mapping {
        Mapping {
            start,
            end,
            readable: true,
            writable: false,
            executable: true,
            shared: false,
            offset: 0x1000,
            dev_major: 0,
            dev_minor: 0,
            inode: if path.starts_with('/') { 1 } else { 0 },
            path: path.to_owned(),
            raw_path: None,
        }
    }

    #[test]
    fn find_mapping_handles_unsorted_maps_and_gaps() {
        let maps = [
            mapping(0x5000, 0x6000, "/b"),
            mapping(0x1000, 0x2000, "/a"),
            mapping(0x2000, 0x3000, "/c"),
        ];
        let mut order: Vec<usize> = (0..maps.len()).collect();
        order.sort_by_key(|&i| maps.get(i).map(|m| m.start));
        assert_eq!(find_mapping(&maps, &order, 0x0fff).map(|(i, _)| i), None);
        assert_eq!(find_mapping(&maps, &order, 0x1000).map(|(i, _)| i), Some(1));
        assert_eq!(find_mapping(&maps, &order, 0x1fff).map(|(i, _)| i), Some(1));
        assert_eq!(find_mapping(&maps, &order, 0x2000).map(|(i, _)| i), Some(2));
        assert_eq!(find_mapping(&maps, &order, 0x3000).map(|(i, _)| i), None);
        assert_eq!(find_mapping(&maps, &order, 0x5fff).map(|(i, _)| i), Some(0));
        assert_eq!(find_mapping(&maps, &order, u64::MAX).map(|(i, _)| i), None);
        assert_eq!(find_mapping(&[], &[], 0x1000), None);
    }

    #[test]
    fn unmapped_anonymous_and_unopenable_addresses_are_unknown_frames() {
        let maps = [
            mapping(0x1000, 0x2000, "/nonexistent/sframe-test-object"),
            mapping(0x3000, 0x4000, ""),
            mapping(0x4000, 0x5000, "[heap]"),
        ];
        let mut s = Symbolizer::new();
        // A pid that cannot exist (above PID_MAX_LIMIT).
        let frames = s.symbolize_user(0x7fff_fff0, &maps, &[0x10, 0x1010, 0x3008, 0x4010]);
        assert_eq!(frames.len(), 4);
        assert!(
            frames
                .iter()
                .all(|f| f.name.is_none() && f.reason.is_some())
        );
        assert_eq!(frames[0].object, UNKNOWN_OBJECT);
        assert_eq!(frames[1].object, "sframe-test-object");
        assert_eq!(frames[1].file_offset, 0x1010);
        assert_eq!(frames[1].folded_name(), "[sframe-test-object+0x1010]");
        assert_eq!(frames[2].object, "[anon]");
        assert_eq!(frames[3].folded_name(), "[[heap]+0x10]");
        assert_eq!(s.stats().objects_opened, 0);
        assert_eq!(s.stats().open_failures, 1);
    }

    #[test]
    fn unparsable_object_gives_unknown_frames_that_are_not_cached() {
        let path = std::env::temp_dir().join(format!("sframe-symbolize-{}", std::process::id()));
        std::fs::write(&path, vec![0x5au8; 8192]).unwrap();
        let maps = [mapping(0x1000, 0x3000, path.to_str().unwrap())];
        let mut s = Symbolizer::new();
        // Not mapped in this process: opened through /proc/self/root/PATH.
        let first = s.symbolize_user(std::process::id(), &maps, &[0x1010, 0x1010]);
        let second = s.symbolize_user(std::process::id(), &maps, &[0x1010]);
        std::fs::remove_file(&path).unwrap();
        assert_eq!(first[0], first[1]);
        assert_eq!(first[0], second[0]);
        assert_eq!(first[0].name, None);
        assert_eq!(first[0].file_offset, 0x1010);
        let reason = first[0].reason.as_deref().unwrap();
        assert!(reason.contains(path.to_str().unwrap()), "{reason}");
        let stats = s.stats();
        assert_eq!(stats.objects_opened, 1);
        // Failed batches are retried, not cached.
        assert_eq!(stats.frames_symbolized, 2);
    }

    #[test]
    fn hidden_kallsyms_addresses_are_detected() {
        let hidden = "0000000000000000 A fixed_percpu_data\n0000000000000000 T _text\n";
        assert!(kallsyms_shows_addresses(hidden.as_bytes()).is_err());
        assert!(kallsyms_shows_addresses(&b""[..]).is_err());
        let shown = "0000000000000000 A fixed_percpu_data\nffffffff81000000 T _text\n";
        assert_eq!(kallsyms_shows_addresses(shown.as_bytes()), Ok(()));
    }

    #[test]
    fn own_function_symbolizes() {
        #[inline(never)]
        fn sframe_symbolize_unit_probe() -> u64 {
            std::hint::black_box(42)
        }
        let pid = std::process::id();
        let maps = crate::procfs::read_maps(pid).unwrap();
        let addr = sframe_symbolize_unit_probe as *const () as u64;
        let mut s = Symbolizer::new();
        let frames = s.symbolize_user(pid, &maps, &[addr, addr]);
        let name = frames[0].name.as_deref().unwrap_or_default();
        assert!(
            name.ends_with("sframe_symbolize_unit_probe"),
            "{:?}",
            frames[0]
        );
        assert_eq!(frames[0], frames[1]);
        assert_eq!(s.stats().frames_symbolized, 1);
    }

    #[test]
    fn caches_over_their_bounds_drop_the_least_recently_used_objects() {
        #[inline(never)]
        fn sframe_symbolize_bound_probe() -> u64 {
            std::hint::black_box(7)
        }
        let pid = std::process::id();
        let maps = crate::procfs::read_maps(pid).unwrap();
        let here = sframe_symbolize_bound_probe as *const () as u64;
        // An address in another object (libc: `getpid`), and one in a third (the
        // dynamic loader, or whichever other object this test maps).
        let there = libc::getpid as *const () as u64;
        let object_of = |addr: u64| {
            maps.iter()
                .find(|m| (m.start..m.end).contains(&addr))
                .map(|m| m.path.clone())
                .unwrap()
        };
        let (exe, libc_path) = (object_of(here), object_of(there));
        let third = maps
            .iter()
            .find(|m| m.executable && m.is_file() && m.path != exe && m.path != libc_path)
            .map(|m| m.start)
            .expect("a third object mapped");
        let named = |frames: &[Frame]| {
            frames[0]
                .name
                .as_deref()
                .unwrap_or_default()
                .ends_with("sframe_symbolize_bound_probe")
        };

        let mut s = Symbolizer::with_limits(CacheLimits {
            objects: 2,
            ..CacheLimits::default()
        });
        assert!(named(&s.symbolize_user(pid, &maps, &[here])));
        s.symbolize_user(pid, &maps, &[there]);
        // The executable is used again: libc is now the least recently used.
        assert!(named(&s.symbolize_user(pid, &maps, &[here])));
        s.symbolize_user(pid, &maps, &[third]);
        assert_eq!((s.stats().objects_opened, s.stats().evictions), (3, 0));
        // Three objects, over the bound of two: libc goes at the start of the next call,
        // and the executable's state and frames stay.
        let hits = s.stats().frame_cache_hits;
        assert!(named(&s.symbolize_user(pid, &maps, &[here])));
        assert_eq!((s.stats().objects_opened, s.stats().evictions), (3, 1));
        assert_eq!(s.stats().frame_cache_hits, hits + 1);
        assert_eq!(s.objects.len(), 2);
        // libc is opened again when used again.
        s.symbolize_user(pid, &maps, &[there]);
        assert_eq!(s.stats().objects_opened, 4);

        // Over the frames' bound: the least recently used object's frames go with it.
        let mut s = Symbolizer::with_limits(CacheLimits {
            frames: 1,
            ..CacheLimits::default()
        });
        s.symbolize_user(pid, &maps, &[there]);
        assert!(named(&s.symbolize_user(pid, &maps, &[here])));
        assert_eq!(s.user_frames, 2);
        assert!(named(&s.symbolize_user(pid, &maps, &[here])));
        assert_eq!(
            (s.stats().evictions, s.user_frames, s.objects.len()),
            (1, 1, 1)
        );
        assert_eq!(s.stats().objects_opened, 2);
    }

    #[test]
    fn state_over_its_bytes_drops_objects() {
        #[inline(never)]
        fn sframe_symbolize_bytes_probe() -> u64 {
            std::hint::black_box(9)
        }
        let pid = std::process::id();
        let maps = crate::procfs::read_maps(pid).unwrap();
        let here = sframe_symbolize_bytes_probe as *const () as u64;
        // Within the count bounds, over a byte bound that one object's state passes
        // (this test binary's symbols and DWARF: megabytes).
        let mut s = Symbolizer::with_limits(CacheLimits {
            state_bytes: 64 << 10,
            ..CacheLimits::default()
        });
        let first = s.symbolize_user(pid, &maps, &[here]);
        let kept = s.stats().state_bytes;
        assert!(kept > 64 << 10, "{kept} bytes kept");
        assert_eq!(s.stats().evictions, 0);
        // The next call drops the object, opens it again and still names the frame.
        let second = s.symbolize_user(pid, &maps, &[here]);
        assert_eq!(s.stats().evictions, 1);
        assert_eq!(s.stats().objects_opened, 2);
        assert_eq!(first, second);
        assert!(
            second[0]
                .name
                .as_deref()
                .unwrap_or_default()
                .ends_with("sframe_symbolize_bytes_probe"),
            "{second:?}"
        );
        // Under the default bound, the same state stays.
        let mut s = Symbolizer::new();
        for _ in 0..3 {
            s.symbolize_user(pid, &maps, &[here]);
        }
        assert_eq!(s.stats().evictions, 0);
        assert!(s.stats().state_bytes > 0);
    }
}
