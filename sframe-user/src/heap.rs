//! Heap bytes per thread: [`Counting`], the system allocator counting what each thread
//! allocates less what it frees, so that a long-lived cache built by library calls it
//! cannot see inside (blazesym's parsed symbols and DWARF) is measured in bytes.
//!
//! The count runs only where `Counting` is the process's global allocator (the
//! profiler's binary installs it, and so do this crate's unit tests); elsewhere
//! [`thread_net`] stays 0 and what is bounded by it is bounded by counts alone.

use std::{
    alloc::{GlobalAlloc, Layout, System},
    cell::Cell,
};

thread_local! {
    /// Bytes this thread allocated less those it freed (memory freed by another thread
    /// than the one that allocated it moves the count of both). `const`-initialized
    /// without a destructor: using it from the allocator allocates nothing.
    static NET: Cell<i64> = const { Cell::new(0) };
    /// The highest `NET` reached since [`thread_peak_reset`] last ran on this thread.
    static PEAK: Cell<i64> = const { Cell::new(0) };
}

fn add(bytes: i64) {
    // Fails only while the thread is being torn down: nothing to count then.
    let Ok(net) = NET.try_with(|c| {
        let net = c.get().wrapping_add(bytes);
        c.set(net);
        net
    }) else {
        return;
    };
    if bytes > 0 {
        let _ = PEAK.try_with(|p| p.set(p.get().max(net)));
    }
}

/// The highest [`thread_net`] reached on this thread since the last call (or since the
/// thread started), and a new period starting from the current count: what a call
/// between two readings held at most at once, transient buffers included.
pub fn thread_peak_reset() -> i64 {
    let net = thread_net();
    PEAK.try_with(|p| p.replace(net).max(net)).unwrap_or(net)
}

/// The bytes the current thread allocated less those it freed, so far (0 if
/// [`Counting`] is not the global allocator). Differences of two readings around a
/// call give what it kept.
pub fn thread_net() -> i64 {
    NET.try_with(Cell::get).unwrap_or(0)
}

/// The system allocator, counting heap bytes per thread (see the module).
pub struct Counting;

/// Bytes as a count (a `Layout`'s size fits `isize`).
fn signed(bytes: usize) -> i64 {
    i64::try_from(bytes).unwrap_or(i64::MAX)
}

// SAFETY: every method forwards its arguments unchanged to `System`, whose contract
// they satisfy because they satisfy `GlobalAlloc`'s; the count never touches memory.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: forwarded (see the impl).
        let p = unsafe { System.alloc(layout) };
        if !p.is_null() {
            add(signed(layout.size()));
        }
        p
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        // SAFETY: forwarded (see the impl).
        let p = unsafe { System.alloc_zeroed(layout) };
        if !p.is_null() {
            add(signed(layout.size()));
        }
        p
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: forwarded (see the impl).
        unsafe { System.dealloc(ptr, layout) };
        add(-signed(layout.size()));
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: forwarded (see the impl).
        let p = unsafe { System.realloc(ptr, layout, new_size) };
        if !p.is_null() {
            add(signed(new_size) - signed(layout.size()));
        }
        p
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn what_a_thread_keeps_is_counted_and_what_it_frees_is_not() {
        let before = thread_net();
        let kept = std::hint::black_box(vec![0u8; 1 << 20]);
        let with = thread_net();
        assert!(with - before >= 1 << 20, "{before} {with}");
        drop(kept);
        let after = thread_net();
        assert!(after - before < 1 << 10, "{before} {after}");
        // Another thread's allocations are its own.
        let other = std::thread::spawn(|| {
            let v = std::hint::black_box(vec![0u8; 1 << 20]);
            std::mem::forget(v);
        });
        other.join().unwrap();
        assert!(thread_net() - after < 1 << 16);
    }

    #[test]
    fn a_transient_buffer_shows_in_the_peak_only() {
        let start = thread_peak_reset();
        let before = thread_net();
        drop(std::hint::black_box(vec![0u8; 4 << 20]));
        let peak = thread_peak_reset();
        assert!(peak - before >= 4 << 20, "{start} {before} {peak}");
        assert!(thread_net() - before < 1 << 10);
        // A new period: nothing held since.
        assert!(thread_peak_reset() - thread_net() < 1 << 10);
    }
}
