//! Where the profiler's own CPU goes, measured per thread (`CLOCK_THREAD_CPUTIME_ID`)
//! around the work: what the overhead governor budgets ([`COLLECTION`]: reading and
//! counting the kernel's samples and unwinding deferred ones, which scales with the
//! sampling rate) apart from what it does not ([`LOADING`]: tables for new processes
//! and objects, which scales with churn; symbolization and export, the rest of the
//! process's CPU, which scale with distinct stacks and outputs).

use std::sync::atomic::{AtomicU64, Ordering};

/// CPU time spent loading tables (ns), every thread: maps read, files opened, hashed,
/// derived, flattened, copied into the kernel.
pub static LOADING: AtomicU64 = AtomicU64::new(0);
/// CPU time spent collecting samples (ns): the kernel maps read and emptied, deferred
/// samples unwound.
pub static COLLECTION: AtomicU64 = AtomicU64::new(0);

/// Seconds accumulated in `counter`.
pub fn seconds(counter: &AtomicU64) -> f64 {
    counter.load(Ordering::Relaxed) as f64 / 1e9
}

/// CPU time (user + system) of this process so far.
pub fn process_seconds() -> Option<f64> {
    // SAFETY: getrusage writes only into the struct we pass.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    if unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut usage) } != 0 {
        return None;
    }
    let secs = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    Some(secs(usage.ru_utime) + secs(usage.ru_stime))
}

/// This thread's CPU time (ns).
fn thread_ns() -> u64 {
    clock_ns(libc::CLOCK_THREAD_CPUTIME_ID)
}

/// CLOCK_MONOTONIC now (ns): the clock of the kernel side's `bpf_ktime_get_ns`.
pub fn monotonic_ns() -> u64 {
    clock_ns(libc::CLOCK_MONOTONIC)
}

fn clock_ns(clock: libc::clockid_t) -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime(2) writes only into the timespec passed.
    if unsafe { libc::clock_gettime(clock, &mut ts) } != 0 {
        return 0;
    }
    (ts.tv_sec as u64).saturating_mul(1_000_000_000) + ts.tv_nsec as u64
}

/// Adds this thread's CPU time from its creation to its drop to a counter. Timers of
/// the same counter must not nest (the time would count twice).
pub struct Timer {
    counter: &'static AtomicU64,
    start: u64,
}

impl Timer {
    pub fn start(counter: &'static AtomicU64) -> Self {
        Self {
            counter,
            start: thread_ns(),
        }
    }
}

impl Drop for Timer {
    fn drop(&mut self) {
        let spent = thread_ns().saturating_sub(self.start);
        self.counter.fetch_add(spent, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_this_threads_cpu_not_its_sleep() {
        static C: AtomicU64 = AtomicU64::new(0);
        {
            let _t = Timer::start(&C);
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
        let slept = seconds(&C);
        // Spin for 50 ms of this thread's own CPU (not of wall time: on a busy machine
        // the thread may get a fraction of it), measured by the kernel independently.
        let thread_cpu = || {
            let mut t = libc::timespec {
                tv_sec: 0,
                tv_nsec: 0,
            };
            // SAFETY: clock_gettime writes only into `t`.
            unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut t) };
            t.tv_sec as f64 + t.tv_nsec as f64 / 1e9
        };
        let spun_by_kernel = {
            let _t = Timer::start(&C);
            let start = thread_cpu();
            let mut x = 0u64;
            while thread_cpu() - start < 0.05 {
                x = std::hint::black_box(x.wrapping_add(1));
            }
            thread_cpu() - start
        };
        let spun = seconds(&C) - slept;
        assert!(slept < 0.02, "{slept}");
        assert!(
            spun >= spun_by_kernel * 0.9 && spun >= 0.05,
            "{spun} s counted for {spun_by_kernel} s spun"
        );
    }
}
