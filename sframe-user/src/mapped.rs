//! Object files mapped read-only instead of read into the heap, and the guard that makes
//! mapping a file another user can truncate safe.
//!
//! The profiler parses files other users own. Read into the heap, a 1 GiB file (even a
//! sparse one, 8 KB on disk) costs 1 GiB of memory; mapped, it costs only the pages the
//! parsers touch (the ELF headers and the unwind sections), and those are page cache,
//! dropped with the mapping. But a file that shrinks while mapped makes any access past
//! its new end raise `SIGBUS`, which would kill a root daemon at a user's will (and
//! blazesym, the symbolizer, maps files too). [`install_sigbus_guard`] installs a
//! handler that, for a fault past the end of a file mapping (`BUS_ADRERR`), maps a page
//! of zeros over the faulting page and lets the access retry: the parser reads zeros,
//! which it treats as any malformed input, and every such fault is counted. Any other
//! `SIGBUS` (a hardware memory error) gets the default action.
//!
//! Files on a FUSE file system served by a hostile user can still make a page fault
//! wait; see SECURITY.md.

use std::{
    fs::File,
    io,
    sync::{
        Once,
        atomic::{AtomicU64, Ordering},
    },
};

/// Pages replaced by zeros after a `SIGBUS` (files truncated while mapped), since start.
static TRUNCATED_PAGES: AtomicU64 = AtomicU64::new(0);

/// Pages of mapped files found truncated (and read as zeros) since the start.
pub fn truncated_pages() -> u64 {
    TRUNCATED_PAGES.load(Ordering::Relaxed)
}

extern "C" fn on_sigbus(sig: libc::c_int, info: *mut libc::siginfo_t, _ctx: *mut libc::c_void) {
    // SAFETY: the kernel passes a valid siginfo_t to an SA_SIGINFO handler.
    let (code, addr) = unsafe { ((*info).si_code, (*info).si_addr() as usize) };
    if code == libc::BUS_ADRERR && addr != 0 {
        // SAFETY: sysconf and mmap are async-signal-safe system calls. The page replaced
        // is one of a read-only file mapping past the file's end: its contents are gone
        // already; zeros take their place.
        unsafe {
            let page = libc::sysconf(libc::_SC_PAGESIZE).max(4096) as usize;
            let at = (addr & !(page - 1)) as *mut libc::c_void;
            let p = libc::mmap(
                at,
                page,
                libc::PROT_READ,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED,
                -1,
                0,
            );
            if p == at {
                TRUNCATED_PAGES.fetch_add(1, Ordering::Relaxed);
                return;
            }
        }
    }
    // Not ours to mend: the default action on return (the access faults again).
    // SAFETY: signal(2) is async-signal-safe.
    unsafe {
        libc::signal(sig, libc::SIG_DFL);
    }
}

/// Installs the `SIGBUS` handler (once per process; later calls do nothing).
pub fn install_sigbus_guard() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        // SAFETY: a sigaction with an SA_SIGINFO handler of the right signature, an
        // empty mask, installed before any file is mapped.
        unsafe {
            let mut sa: libc::sigaction = std::mem::zeroed();
            sa.sa_sigaction = on_sigbus as *const () as usize;
            sa.sa_flags = libc::SA_SIGINFO | libc::SA_ONSTACK;
            libc::sigemptyset(&mut sa.sa_mask);
            if libc::sigaction(libc::SIGBUS, &sa, std::ptr::null_mut()) != 0 {
                log::warn!(
                    "cannot install the SIGBUS guard ({}): a mapped file truncated by its owner could stop the profiler",
                    io::Error::last_os_error()
                );
            }
        }
    });
}

/// What tells a file changed: size, modification and status-change times (a write, a
/// truncation, even `utimes` to hide a write, change the last).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Stamp {
    size: u64,
    mtime: (i64, i64),
    ctime: (i64, i64),
}

impl Stamp {
    /// The stamp of a file, from its metadata.
    pub fn of(meta: &std::fs::Metadata) -> Self {
        use std::os::unix::fs::MetadataExt as _;
        Self {
            size: meta.len(),
            mtime: (meta.mtime(), meta.mtime_nsec()),
            ctime: (meta.ctime(), meta.ctime_nsec()),
        }
    }
}

std::thread_local! {
    /// The mapping (address, length) whose pages [`release_read`] may drop on this
    /// thread: set by [`ObjectBytes::releasing`] for the duration of one derivation.
    static RELEASABLE: std::cell::Cell<Option<(usize, usize)>> =
        const { std::cell::Cell::new(None) };
}

/// Drops from this process's memory the pages of `bytes` when they lie in the file
/// mapping of the enclosing [`ObjectBytes::releasing`] on this thread; otherwise (a
/// heap copy, another buffer, no derivation running) does nothing. For passes that read
/// a large object once, front to back (the padding scan touches every page where a
/// function starts): what they are done with leaves the RSS as they go.
pub fn release_read(bytes: &[u8]) {
    let Some((base, len)) = RELEASABLE.with(std::cell::Cell::get) else {
        return;
    };
    let page = 4096;
    let start = (bytes.as_ptr() as usize).next_multiple_of(page);
    let end = (bytes.as_ptr() as usize + bytes.len()) / page * page;
    if start < base || end > base + len || start >= end {
        return;
    }
    // SAFETY: whole pages inside a live private, read-only file mapping that is never
    // written (`releasing` borrows it): MADV_DONTNEED drops them and the next access
    // reads them again from the file, so every byte keeps its value.
    let _ = unsafe { libc::madvise(start as *mut libc::c_void, end - start, libc::MADV_DONTNEED) };
}

/// Most mappings [`release_shared_file_pages`] looks at in one call.
const MAX_RELEASED_MAPPINGS: usize = 4096;

/// Drops from this process's resident set the pages of its read-only, shared, not
/// executable mappings of regular files: in the profiler, the object files blazesym maps
/// to symbolize. The pages stay in the page cache (shared with the processes running
/// those objects, reclaimable) and are faulted in again from there when touched; without
/// this, every object the profiler symbolized stays in its RSS for as long as blazesym
/// keeps it open (tens of MB for a compiler's libraries). Returns the bytes of the
/// mappings advised.
///
/// Nothing else qualifies: the BPF ring buffer and mmapped BPF maps are `anon_inode:`
/// mappings, whose pages have no file to come back from; the profiler's executable and
/// libraries are executable or private (relocated pages among them); [`ObjectBytes`] is
/// a private mapping; devices, `memfd:` and System V memory are left out.
///
/// # Safety
///
/// No other thread may unmap a shared read-only file mapping of this process while this
/// runs: the advice is given to the address ranges `/proc/self/maps` listed, and a range
/// unmapped and reused meanwhile (by the heap, say) would lose its contents. In the
/// profiler such mappings are only blazesym's, made and unmapped by the
/// `Symbolizer` (module `symbolize`) that calls this, under `&mut`.
pub unsafe fn release_shared_file_pages() -> u64 {
    let maps = match crate::procfs::read_shared_read_only_maps(
        std::process::id(),
        MAX_RELEASED_MAPPINGS,
    ) {
        Ok(maps) => maps,
        Err(e) => {
            log::debug!("not releasing mapped file pages: {e}");
            return 0;
        }
    };
    let mut bytes = 0;
    for m in maps.iter().filter(|m| releasable(m)) {
        let (Ok(start), Ok(len)) = (usize::try_from(m.start), usize::try_from(m.end - m.start))
        else {
            continue;
        };
        // SAFETY: a whole mapping of this process, shared, read-only and backed by a
        // regular file (from the kernel's list, still in place by the caller's
        // contract): MADV_DONTNEED only removes its pages from our page tables; their
        // contents stay in the page cache and the next access maps them again, so every
        // byte keeps its value.
        if unsafe { libc::madvise(start as *mut libc::c_void, len, libc::MADV_DONTNEED) } == 0 {
            bytes += m.end - m.start;
        }
    }
    bytes
}

/// Whether `m` (of our own maps) is a mapping [`release_shared_file_pages`] may drop
/// the pages of.
fn releasable(m: &crate::procfs::Mapping) -> bool {
    m.shared
        && m.readable
        && !m.writable
        && !m.executable
        && m.is_file()
        && !["/dev/", "/memfd:", "/SYSV"]
            .iter()
            .any(|p| m.path.starts_with(p))
}

/// The bytes of an object: a read-only private mapping of its file, or a heap copy (the
/// vDSO, read from a process's memory).
pub enum ObjectBytes {
    /// A read-only private mapping of the object's file.
    Mapped {
        /// The mapping.
        map: memmap2::Mmap,
        /// [`truncated_pages`] when it was mapped.
        faults_before: u64,
        /// The file, and its size, modification and status-change times when mapped.
        file: File,
        /// The file's size, modification and status-change times when it was mapped.
        stamp: Stamp,
    },
    /// A copy on the heap (the vDSO, read from a process's memory).
    Heap(Vec<u8>),
}

impl ObjectBytes {
    /// Runs `f` (a derivation reading these bytes) with [`release_read`] allowed to drop
    /// pages of this mapping on this thread.
    pub fn releasing<R>(&self, f: impl FnOnce() -> R) -> R {
        let range = match self {
            Self::Mapped { map, .. } => Some((map.as_ptr() as usize, map.len())),
            Self::Heap(_) => None,
        };
        let previous = RELEASABLE.with(|c| c.replace(range));
        let out = f();
        RELEASABLE.with(|c| c.set(previous));
        out
    }

    /// Maps the first `len` bytes of `file` (its size from `fstat`). An empty file maps
    /// to an empty slice.
    pub fn map(file: File, meta: &std::fs::Metadata) -> io::Result<Self> {
        install_sigbus_guard();
        let len = usize::try_from(meta.len())
            .map_err(|_| io::Error::from(io::ErrorKind::FileTooLarge))?;
        if len == 0 {
            return Ok(Self::Heap(Vec::new()));
        }
        let faults_before = truncated_pages();
        // SAFETY: a read-only private mapping; a file truncated while mapped raises
        // SIGBUS, which the guard installed above turns into pages of zeros. Private,
        // not shared: [`release_shared_file_pages`] must not see it (the build worker
        // unmaps it on its own thread).
        let map = unsafe {
            memmap2::MmapOptions::new()
                .len(len)
                .map_copy_read_only(&file)?
        };
        Ok(Self::Mapped {
            map,
            faults_before,
            file,
            stamp: Stamp::of(meta),
        })
    }

    /// Drops the pages of `range` from this process's memory (a mapped file's pages are
    /// read again from the file if touched again; a heap copy is left as it is): what
    /// has been read once, such as the bytes hashed for the object's key, does not stay
    /// in the profiler's RSS while the rest is parsed.
    pub fn release(&self, range: std::ops::Range<usize>) {
        let Self::Mapped { map, .. } = self else {
            return;
        };
        let page = 4096;
        let start = range.start / page * page;
        let end = range.end.min(map.len());
        if start >= end {
            return;
        }
        // SAFETY: MADV_DONTNEED on a private read-only file mapping that was never
        // written: its pages are dropped and read again from the file on the next
        // access, so every byte keeps its value (a file changed meanwhile is caught by
        // `maybe_changed`, as for any other read).
        let _ = unsafe {
            map.unchecked_advise_range(memmap2::UncheckedAdvice::DontNeed, start, end - start)
        };
    }

    /// Whether the bytes may have changed since the file was mapped: it was written
    /// (its size or times changed), or a page of some mapped file read as zeros because
    /// it was truncated. Then what was derived from them is suspect.
    pub fn maybe_changed(&self) -> bool {
        match self {
            Self::Mapped {
                faults_before,
                file,
                stamp,
                ..
            } => {
                truncated_pages() != *faults_before
                    || file.metadata().map(|m| Stamp::of(&m)).ok() != Some(*stamp)
            }
            Self::Heap(_) => false,
        }
    }
}

impl std::ops::Deref for ObjectBytes {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        match self {
            Self::Mapped { map, .. } => map,
            Self::Heap(v) => v,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write as _;

    #[test]
    fn a_file_written_while_mapped_is_noticed() {
        let path = std::env::temp_dir().join(format!("mapped-w-{}", std::process::id()));
        std::fs::write(&path, vec![1u8; 8192]).unwrap();
        let file = File::open(&path).unwrap();
        let meta = file.metadata().unwrap();
        let bytes = ObjectBytes::map(file, &meta).unwrap();
        assert!(!bytes.maybe_changed());
        // In place, same size, and the modification time put back: the status-change
        // time still moves.
        let before = std::fs::metadata(&path).unwrap().modified().unwrap();
        std::thread::sleep(std::time::Duration::from_millis(10));
        {
            use std::os::unix::fs::FileExt as _;
            let w = File::options().write(true).open(&path).unwrap();
            w.write_all_at(&[2u8; 16], 100).unwrap();
            w.set_modified(before).unwrap();
        }
        assert!(bytes.maybe_changed());
        let _ = std::fs::remove_file(&path);
    }

    #[test]
    fn a_file_truncated_while_mapped_reads_as_zeros() {
        let path = std::env::temp_dir().join(format!("mapped-{}", std::process::id()));
        let mut f = File::create(&path).unwrap();
        f.write_all(&vec![0xabu8; 3 * 4096]).unwrap();
        drop(f);
        let file = File::open(&path).unwrap();
        let meta = file.metadata().unwrap();
        let bytes = ObjectBytes::map(file, &meta).unwrap();
        assert_eq!(bytes[4096], 0xab);
        assert!(!bytes.maybe_changed());
        File::options()
            .write(true)
            .open(&path)
            .unwrap()
            .set_len(4096)
            .unwrap();
        // Past the new end: zeros, not a SIGBUS.
        assert_eq!(bytes[2 * 4096 + 17], 0);
        assert!(bytes.maybe_changed());
        assert_eq!(bytes[100], 0xab);
        let _ = std::fs::remove_file(&path);
    }
}
