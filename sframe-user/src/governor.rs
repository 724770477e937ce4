//! `--max-overhead`: keeps the profiler's sampling cost (its BPF programs' run time,
//! from `bpf_stats`, plus its own user-space CPU less what loading tables took) under a
//! share of the machine by lowering the sampling frequency, and raises it back when
//! there is room.
//!
//! Loading tables is left out: it scales with how many new processes and objects the
//! host runs, not with the rate, and lowering the rate would not make it cheaper — it
//! would only cost the profile its samples exactly when a busy host needs them. Loading
//! has its own bounds instead (a throttle per process, a bounded build queue, first
//! loads limited per turn of the loop) and its own metric
//! (`sframe_table_load_cpu_seconds_total`).

use std::{os::fd::OwnedFd, time::Instant};

use crate::{export::prometheus::own_cpu_seconds, profiler::Profiler};

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

/// The sampling and loading overheads (shares of `capacity` CPU seconds) of a period in
/// which the BPF programs ran `bpf` seconds and the profiler used `cpu` seconds, `load`
/// of them loading tables.
pub fn overheads(bpf: f64, cpu: f64, load: f64, capacity: f64) -> (f64, f64) {
    let load = load.max(0.0);
    let sampling = bpf.max(0.0) + (cpu - load).max(0.0);
    (sampling / capacity, load / capacity)
}

pub struct Governor {
    /// Share of all CPUs the profiler may use (0.01 = 1% of every CPU).
    budget: f64,
    requested: u64,
    cpus: f64,
    /// Keeps `bpf_stats` enabled while the governor lives (BPF_ENABLE_STATS).
    _stats: Option<OwnedFd>,
    last: Option<(Instant, u64, f64, f64)>,
    /// The last measured sampling overhead (share of all CPUs), for logs and metrics.
    pub overhead: Option<f64>,
    /// The last measured loading overhead (share of all CPUs), not budgeted.
    pub load_overhead: Option<f64>,
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
        }
    }

    /// Measures and, every `PERIOD_SECS`, adjusts the profiler's frequency.
    pub fn tick(&mut self, profiler: &mut Profiler) {
        let now = Instant::now();
        let bpf_ns = profiler.program_stats().map_or(0, |(ns, _)| ns);
        let cpu = own_cpu_seconds().unwrap_or(0.0);
        let load = crate::objects::load_cpu_seconds();
        let Some((then, last_ns, last_cpu, last_load)) = self.last else {
            self.last = Some((now, bpf_ns, cpu, load));
            return;
        };
        let wall = now.duration_since(then).as_secs_f64();
        if wall < PERIOD_SECS {
            return;
        }
        self.last = Some((now, bpf_ns, cpu, load));
        let (overhead, loading) = overheads(
            bpf_ns.saturating_sub(last_ns) as f64 / 1e9,
            cpu - last_cpu,
            load - last_load,
            wall * self.cpus,
        );
        self.overhead = Some(overhead);
        self.load_overhead = Some(loading);
        let current = profiler.frequency();
        let next = decide(current, self.requested, overhead, self.budget);
        if next != current {
            log::info!(
                "sampling overhead {:.3}% of the CPUs (budget {:.3}%; loading tables {:.3}% more): sampling at {next} Hz instead of {current} Hz",
                overhead * 100.0,
                self.budget * 100.0,
                self.load_overhead.unwrap_or(0.0) * 100.0
            );
            if let Err(err) = profiler.set_frequency(next) {
                log::warn!("changing the sampling frequency: {err}");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{decide, overheads};

    #[test]
    fn loading_tables_is_not_charged_to_sampling() {
        // 10 s on 2 CPUs: BPF 0.05 s, user space 0.5 s of which 0.4 s loading.
        let (sampling, loading) = overheads(0.05, 0.5, 0.4, 20.0);
        assert!((sampling - 0.0075).abs() < 1e-9, "{sampling}");
        assert!((loading - 0.02).abs() < 1e-9, "{loading}");
        // Under a 1 % budget a churning host keeps its rate: the loading alone (2 %)
        // would have cut it to about 0.9 × 1 / 2.75 of the requested.
        assert_eq!(decide(99, 99, sampling, 0.01), 99);
        assert!(decide(99, 99, sampling + loading, 0.01) < 40);
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
