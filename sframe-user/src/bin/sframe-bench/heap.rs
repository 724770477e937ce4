//! The system allocator, counting heap bytes for the peak-heap figures of section 2,
//! and allocations per thread for the reader's "no allocation per row" figure (3b).

use std::{
    alloc::{GlobalAlloc, Layout, System},
    cell::Cell,
    sync::atomic::{AtomicUsize, Ordering::Relaxed},
};

/// The system allocator, counting the bytes allocated now and their high-water mark,
/// for the heap figures of section 2. (A global allocator is the only way to see every
/// allocation a library call makes; it is confined to this binary.)
struct CountingAlloc;

static HEAP_NOW: AtomicUsize = AtomicUsize::new(0);
static HEAP_PEAK: AtomicUsize = AtomicUsize::new(0);

thread_local! {
    /// Allocations made by this thread (a growing or moving `realloc` counts as one)
    /// and the bytes they asked for. Thread-local, so that other threads (the test
    /// harness, ...) do not count; `const`-initialized without a destructor, so that
    /// using it from the allocator allocates nothing.
    static THREAD_ALLOCS: Cell<Allocs> = const { Cell::new(Allocs { count: 0, bytes: 0 }) };
}

fn heap_grew(bytes: usize) {
    let now = HEAP_NOW.fetch_add(bytes, Relaxed) + bytes;
    HEAP_PEAK.fetch_max(now, Relaxed);
    // Fails only while the thread is being torn down: nothing to count then.
    let _ = THREAD_ALLOCS.try_with(|c| {
        let a = c.get();
        c.set(Allocs {
            count: a.count + 1,
            bytes: a.bytes + bytes as u64,
        });
    });
}

fn heap_shrank(bytes: usize) {
    HEAP_NOW.fetch_sub(bytes, Relaxed);
}

// SAFETY: every method forwards its arguments unchanged to `System`, whose contract
// they satisfy because they satisfy `GlobalAlloc`'s; the counters never touch memory.
unsafe impl GlobalAlloc for CountingAlloc {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: forwarded (see the impl).
        let p = unsafe { System.alloc(layout) };
        if !p.is_null() {
            heap_grew(layout.size());
        }
        p
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        // SAFETY: forwarded (see the impl).
        let p = unsafe { System.alloc_zeroed(layout) };
        if !p.is_null() {
            heap_grew(layout.size());
        }
        p
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: forwarded (see the impl).
        unsafe { System.dealloc(ptr, layout) };
        heap_shrank(layout.size());
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: forwarded (see the impl).
        let p = unsafe { System.realloc(ptr, layout, new_size) };
        if !p.is_null() {
            // Counted as if old and new coexisted (a moving realloc does): the peak
            // errs high, never low.
            heap_grew(new_size);
            heap_shrank(layout.size());
        }
        p
    }
}

#[global_allocator]
static GLOBAL: CountingAlloc = CountingAlloc;

/// Runs `f` and returns its result with the most heap bytes that were allocated at once
/// during it, beyond those allocated before (its result included; single-threaded).
pub(crate) fn peak_heap<T>(f: impl FnOnce() -> T) -> (T, usize) {
    let before = HEAP_NOW.load(Relaxed);
    HEAP_PEAK.store(before, Relaxed);
    let out = f();
    (out, HEAP_PEAK.load(Relaxed).saturating_sub(before))
}

/// Heap allocations and the bytes they requested.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Allocs {
    pub count: u64,
    pub bytes: u64,
}

/// Runs `f` and returns its result with the allocations this thread made during it
/// (reallocations included; deallocations are not subtracted).
pub(crate) fn count_allocs<T>(f: impl FnOnce() -> T) -> (T, Allocs) {
    let now = || THREAD_ALLOCS.with(Cell::get);
    let before = now();
    let out = f();
    let after = now();
    (
        out,
        Allocs {
            count: after.count - before.count,
            bytes: after.bytes - before.bytes,
        },
    )
}
