//! `--max-overhead`: keeps the profiler's sampling cost — what scales with the rate: its
//! BPF programs' run time (from `bpf_stats`) plus the user-space CPU spent collecting
//! samples (reading and emptying the kernel maps, unwinding deferred samples;
//! [`crate::cputime::COLLECTION`]) — under a share of the machine by lowering the
//! sampling frequency, and raises it back when there is room.
//!
//! Loading tables (new processes and objects) and symbolizing and exporting stacks are
//! left out: they scale with how many new processes, objects and distinct stacks the
//! host has, not with the rate, and lowering the rate would not make them cheaper — it
//! would only cost the profile its samples exactly when a busy host needs them. Loading
//! has its own bounds (a throttle per process, a bounded build queue, first loads limited
//! per turn of the loop); each share is exported (`sframe_table_load_cpu_seconds_total`,
//! `sframe_collection_cpu_seconds_total`, beside `sframe_process_cpu_seconds_total`).
//!
//! Off-CPU profiling (`--off-cpu`) has its own cost: its switch and return programs'
//! run time, which scales with the host's context-switch and system-call rates, not
//! with the sampling frequency. It is kept under its share of the budget (half of it
//! beside on-CPU sampling, all of it alone) by timing 1 in N sleeps at random (each
//! counting for N; the others are counted, `off_cpu_unsampled`), N raised in proportion
//! when over budget and lowered by steps when well under. What the programs cost for
//! every switch and system call whatever N (a map lookup, a compare) is a floor that
//! sampling does not lower.

use std::{os::fd::OwnedFd, time::Instant};

use crate::{cputime::process_seconds, profiler::Profiler};

/// User-space CPU seconds spent collecting samples so far.
pub fn collection_cpu_seconds() -> f64 {
    crate::cputime::seconds(&crate::cputime::COLLECTION)
}

/// Seconds between two decisions.
pub const PERIOD_SECS: f64 = 5.0;

/// The frequency to use next: proportional decrease when `overhead` (a share of all
/// CPUs) is above `budget`; a 1.5× step back towards `requested` when it is below half
/// the budget.
pub fn decide(current: u64, requested: u64, overhead: f64, budget: f64) -> u64 {
    if !(overhead.is_finite() && budget > 0.0) {
        return current;
    }
    if overhead > budget {
        // Cost is about proportional to the frequency; aim 10% under the budget.
        let scaled = (current as f64 * budget / overhead * 0.9).floor() as u64;
        return scaled.clamp(1, current);
    }
    if overhead < budget / 2.0 && current < requested {
        let raised = ((current as f64 * 1.5).ceil() as u64).max(current + 1);
        return raised.min(requested);
    }
    current
}

/// 1 in how many sleeps to time next: raised in proportion when `overhead` is above
/// `budget` (aiming 10 % under it, as [`decide`]), lowered by 1.5× when it is under half
/// the budget; within 1..=`MAX_OFF_CPU_EVERY`.
pub fn decide_every(current: u32, overhead: f64, budget: f64) -> u32 {
    use sframe_common::offcpu::MAX_OFF_CPU_EVERY;
    let current = current.max(1);
    if !(overhead.is_finite() && budget > 0.0) {
        return current;
    }
    if overhead > budget {
        let scaled = (f64::from(current) * overhead / budget / 0.9).ceil();
        return (scaled.min(f64::from(MAX_OFF_CPU_EVERY)) as u32)
            .max(current + 1)
            .min(MAX_OFF_CPU_EVERY);
    }
    if overhead < budget / 2.0 && current > 1 {
        return ((f64::from(current) / 1.5).floor() as u32).max(1);
    }
    current
}

/// Shares of the machine's CPU over a period.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Overheads {
    /// BPF run time plus collection: what the budget applies to.
    pub sampling: f64,
    /// Loading tables.
    pub loading: f64,
    /// The rest of the profiler's user space (symbolization, export).
    pub other: f64,
}

/// The overheads of a period of `capacity` CPU seconds in which the BPF programs ran
/// `bpf` seconds and the profiler used `cpu` seconds, `collect` of them collecting
/// samples and `load` loading tables.
pub fn overheads(bpf: f64, collect: f64, load: f64, cpu: f64, capacity: f64) -> Overheads {
    let (collect, load) = (collect.max(0.0), load.max(0.0));
    Overheads {
        sampling: (bpf.max(0.0) + collect) / capacity,
        loading: load / capacity,
        other: (cpu - collect - load).max(0.0) / capacity,
    }
}

pub struct Governor {
    /// Share of all CPUs the profiler may use (0.01 = 1% of every CPU).
    budget: f64,
    requested: u64,
    cpus: f64,
    /// Keeps `bpf_stats` enabled while the governor lives (BPF_ENABLE_STATS).
    _stats: Option<OwnedFd>,
    last: Option<Reading>,
    /// The last measured sampling overhead (share of all CPUs), for logs and metrics.
    pub overhead: Option<f64>,
    /// The last measured loading overhead (share of all CPUs), not budgeted.
    pub load_overhead: Option<f64>,
    /// The last measured overhead of everything else in user space (symbolization,
    /// export; share of all CPUs), not budgeted.
    pub other_overhead: Option<f64>,
    /// The last measured cost of the off-CPU programs (share of all CPUs).
    pub off_cpu_overhead: Option<f64>,
}

/// What the governor reads at each tick.
#[derive(Clone, Copy)]
struct Reading {
    at: Instant,
    /// BPF run time of the sampling program, and of the off-CPU programs (ns).
    bpf_ns: u64,
    off_cpu_ns: u64,
    cpu: f64,
    load: f64,
    collect: f64,
}

impl Governor {
    /// `max_overhead_percent`: percent of each CPU.
    pub fn new(max_overhead_percent: f64, requested: u64) -> Self {
        let stats = aya::sys::enable_stats(aya::sys::Stats::RunTime)
            .map_err(|e| {
                log::warn!("bpf_stats unavailable, the governor sees user space only: {e}")
            })
            .ok();
        let cpus = std::thread::available_parallelism().map_or(1, |n| n.get()) as f64;
        Self {
            budget: max_overhead_percent / 100.0,
            requested,
            cpus,
            _stats: stats,
            last: None,
            overhead: None,
            load_overhead: None,
            other_overhead: None,
            off_cpu_overhead: None,
        }
    }

    /// Measures and, every `PERIOD_SECS`, adjusts the profiler's frequency.
    pub fn tick(&mut self, profiler: &mut Profiler) {
        let now = Reading {
            at: Instant::now(),
            bpf_ns: profiler.program_stats().map_or(0, |(ns, _)| ns),
            off_cpu_ns: profiler.off_cpu_program_stats().map_or(0, |(ns, _)| ns),
            cpu: process_seconds().unwrap_or(0.0),
            load: crate::objects::load_cpu_seconds(),
            collect: collection_cpu_seconds(),
        };
        let Some(last) = self.last else {
            self.last = Some(now);
            return;
        };
        let wall = now.at.duration_since(last.at).as_secs_f64();
        if wall < PERIOD_SECS {
            return;
        }
        self.last = Some(now);
        let capacity = wall * self.cpus;
        let o = overheads(
            now.bpf_ns.saturating_sub(last.bpf_ns) as f64 / 1e9,
            now.collect - last.collect,
            now.load - last.load,
            now.cpu - last.cpu,
            capacity,
        );
        self.overhead = Some(o.sampling);
        self.load_overhead = Some(o.loading);
        self.other_overhead = Some(o.other);
        let (on_cpu, off_cpu) = profiler.modes();
        // Each mode keeps to its share: half the budget each when both run.
        let share = if on_cpu && off_cpu {
            self.budget / 2.0
        } else {
            self.budget
        };
        if off_cpu {
            let off = now.off_cpu_ns.saturating_sub(last.off_cpu_ns) as f64 / 1e9 / capacity;
            self.off_cpu_overhead = Some(off);
            let current = profiler.off_cpu_every();
            let next = decide_every(current, off, share);
            log::debug!(
                "off-CPU period: programs {:.4}% of the CPUs, budget {:.4}%, timing 1 in {current} sleeps",
                off * 100.0,
                share * 100.0
            );
            if next != current {
                log::info!(
                    "off-CPU programs {:.3}% of the CPUs (budget {:.3}%): timing 1 in {next} sleeps instead of 1 in {current}",
                    off * 100.0,
                    share * 100.0
                );
                if let Err(err) = profiler.set_off_cpu_every(next) {
                    log::warn!("changing the off-CPU sampling: {err}");
                }
            }
        }
        if !on_cpu {
            return;
        }
        let overhead = o.sampling;
        let current = profiler.frequency();
        let next = decide(current, self.requested, overhead, share);
        if next != current {
            log::info!(
                "sampling overhead {:.3}% of the CPUs (budget {:.3}%; besides, loading tables {:.3}%, symbolizing and exporting {:.3}%): sampling at {next} Hz instead of {current} Hz",
                overhead * 100.0,
                share * 100.0,
                o.loading * 100.0,
                o.other * 100.0
            );
            if let Err(err) = profiler.set_frequency(next) {
                log::warn!("changing the sampling frequency: {err}");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{decide, decide_every, overheads};

    #[test]
    fn off_cpu_sampling_follows_the_cost() {
        // Three times the budget: time about 1 in 3.3 → 4 sleeps.
        assert_eq!(decide_every(1, 0.03, 0.01), 4);
        // Over budget always raises it, never past the maximum.
        assert_eq!(decide_every(4, 0.0101, 0.01), 5);
        assert_eq!(decide_every(1000, 1.0, 0.01), 1024);
        assert_eq!(decide_every(1024, 1.0, 0.01), 1024);
        // Room: down by 1.5×, to 1 at least.
        assert_eq!(decide_every(9, 0.001, 0.01), 6);
        assert_eq!(decide_every(1, 0.0, 0.01), 1);
        // Between half the budget and the budget: stay.
        assert_eq!(decide_every(8, 0.007, 0.01), 8);
        assert_eq!(decide_every(8, f64::NAN, 0.01), 8);
    }

    #[test]
    fn only_what_scales_with_the_rate_is_charged_to_sampling() {
        // 10 s on 2 CPUs: BPF 0.05 s; user space 0.7 s: 0.1 s collecting, 0.4 s loading,
        // 0.2 s symbolizing and exporting.
        let o = overheads(0.05, 0.1, 0.4, 0.7, 20.0);
        assert!((o.sampling - 0.0075).abs() < 1e-9, "{o:?}");
        assert!((o.loading - 0.02).abs() < 1e-9, "{o:?}");
        assert!((o.other - 0.01).abs() < 1e-9, "{o:?}");
        // Under a 1 % budget a churning host keeps its rate; charging everything (3.75 %)
        // would have cut it to about a quarter.
        assert_eq!(decide(99, 99, o.sampling, 0.01), 99);
        assert!(decide(99, 99, o.sampling + o.loading + o.other, 0.01) < 30);
    }

    #[test]
    fn lowers_in_proportion_and_raises_in_steps() {
        // Twice the budget: about half the frequency, with a margin.
        assert_eq!(decide(100, 100, 0.02, 0.01), 45);
        // Never below 1 Hz, never above the current when over budget.
        assert_eq!(decide(3, 100, 10.0, 0.01), 1);
        // Room: back up by 1.5×, capped at the request.
        assert_eq!(decide(45, 100, 0.001, 0.01), 68);
        assert_eq!(decide(90, 100, 0.001, 0.01), 100);
        assert_eq!(decide(1, 100, 0.0, 0.01), 2);
        // Between half the budget and the budget: stay.
        assert_eq!(decide(50, 100, 0.007, 0.01), 50);
        // At the request with room: stay.
        assert_eq!(decide(100, 100, 0.0, 0.01), 100);
        // Nonsense measurements change nothing.
        assert_eq!(decide(50, 100, f64::NAN, 0.01), 50);
    }
}
