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
//! counting for N; the others are counted, `off_cpu_unsampled`), N raised to fit when
//! over budget and lowered by steps when well under, decided at the end of each
//! observation window ([`OFF_CPU_WINDOW_SECS`]). What the programs cost at every switch
//! and system call whatever N is a floor that sampling does not lower; when it alone is
//! over the budget ([`decide_off_cpu`] tells it from two windows), the programs are
//! detached for all but one window in K, and a sleep seen whole in a window counts for
//! N × K.

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

/// Seconds of an off-CPU observation window: the governor measures the off-CPU
/// programs' cost over each and decides at its end.
pub const OFF_CPU_WINDOW_SECS: f64 = 3.0;

/// The off-CPU sampling to use next, `(every, pause)`: 1 in `every` sleeps timed, and
/// the programs attached for one observation window in `pause`. `cost` is what the
/// programs cost (share of all CPUs) while attached, at `current`; `last` the previous
/// window's `(every, cost)`.
///
/// Over `budget` (counting the pause: `cost / pause`), the cost is modelled as a
/// floor — running at every context switch and system call, whatever is sampled — plus
/// what the timed sleeps cost, in proportion to 1/`every`; two windows at different
/// `every` give both parts (one window: all of it taken as the sleeps'). The sampling is
/// raised to fit 10 % under the budget; if the floor alone does not fit, `every` goes to
/// its maximum and the pause makes up the rest (up to `MAX_OFF_CPU_PAUSE`). Under half
/// the budget, one step back: a shorter pause first, then 1.5× less sampling.
pub fn decide_off_cpu(
    current: (u32, u32),
    cost: f64,
    last: Option<(u32, f64)>,
    budget: f64,
) -> (u32, u32) {
    use sframe_common::offcpu::{MAX_OFF_CPU_EVERY, MAX_OFF_CPU_PAUSE};
    let (every, pause) = (current.0.max(1), current.1.max(1));
    if !(cost.is_finite() && cost >= 0.0 && budget > 0.0) {
        return (every, pause);
    }
    let effective = cost / f64::from(pause);
    if effective <= budget {
        if effective < budget / 2.0 {
            if pause > 1 {
                return (every, pause - 1);
            }
            if every > 1 {
                return (((f64::from(every) / 1.5).floor() as u32).max(1), 1);
            }
        }
        return (every, pause);
    }
    let (floor, sleeps) = match last {
        Some((e0, c0)) if e0.max(1) != every && c0.is_finite() => {
            let d = 1.0 / f64::from(e0.max(1)) - 1.0 / f64::from(every);
            let sleeps = ((c0 - cost) / d).max(0.0);
            ((cost - sleeps / f64::from(every)).max(0.0), sleeps)
        }
        _ => (0.0, cost * f64::from(every)),
    };
    let target = 0.9 * budget;
    let max_every = f64::from(MAX_OFF_CPU_EVERY);
    if floor < target {
        let needed = (sleeps / (target - floor)).ceil();
        if needed <= max_every {
            // Over budget always raises the sampling.
            return ((needed as u32).max(every + 1).min(MAX_OFF_CPU_EVERY), 1);
        }
    }
    let at_max = floor + sleeps / max_every;
    let mut next = (at_max / target)
        .ceil()
        .clamp(1.0, f64::from(MAX_OFF_CPU_PAUSE)) as u32;
    if every == MAX_OFF_CPU_EVERY {
        // Over budget at the most sampling: always a longer pause.
        next = next.max(pause + 1).min(MAX_OFF_CPU_PAUSE);
    }
    (MAX_OFF_CPU_EVERY, next)
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
    /// The last measured cost of the off-CPU programs (share of all CPUs, over the
    /// last observation window and the pause before it).
    pub off_cpu_overhead: Option<f64>,
    off_cpu: Option<OffCpuWindow>,
}

/// The off-CPU observation window under way, or the pause after one.
struct OffCpuWindow {
    /// When it (or the pause) began.
    since: Instant,
    /// The off-CPU programs' run time then (ns).
    ns: u64,
    /// When the last window ended, and the run time then: the cycle's cost.
    cycle: (Instant, u64),
    /// The last window's `(every, cost while attached)`.
    last: Option<(u32, f64)>,
}

/// What the governor reads at each tick.
#[derive(Clone, Copy)]
struct Reading {
    at: Instant,
    /// BPF run time of the sampling program (ns).
    bpf_ns: u64,
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
            off_cpu: None,
        }
    }

    /// Measures and, every `PERIOD_SECS`, adjusts the profiler's frequency; at the end
    /// of each off-CPU observation window, the off-CPU sampling.
    pub fn tick(&mut self, profiler: &mut Profiler) {
        let (on_cpu, off_cpu) = profiler.modes();
        // Each mode keeps to its share: half the budget each when both run.
        let share = if on_cpu && off_cpu {
            self.budget / 2.0
        } else {
            self.budget
        };
        if off_cpu {
            self.off_cpu_tick(profiler, share);
        }
        let now = Reading {
            at: Instant::now(),
            bpf_ns: profiler.program_stats().map_or(0, |(ns, _)| ns),
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

    /// The off-CPU duty cycle: at the end of each observation window, measures what the
    /// programs cost while attached and decides the sampling and pause; while paused,
    /// attaches them again after `pause - 1` windows.
    fn off_cpu_tick(&mut self, profiler: &mut Profiler, share: f64) {
        let now = Instant::now();
        let ns = profiler.off_cpu_program_stats().map_or(0, |(ns, _)| ns);
        let w = self.off_cpu.get_or_insert(OffCpuWindow {
            since: now,
            ns,
            cycle: (now, ns),
            last: None,
        });
        let elapsed = now.duration_since(w.since).as_secs_f64();
        let (every, pause) = (profiler.off_cpu_every(), profiler.off_cpu_pause());
        if !profiler.off_cpu_attached() {
            if elapsed < OFF_CPU_WINDOW_SECS * f64::from(pause.saturating_sub(1)) {
                return;
            }
            if let Err(err) = profiler.set_off_cpu_attached(true) {
                log::warn!("attaching the off-CPU programs again: {err}");
                return;
            }
            let ns = profiler.off_cpu_program_stats().map_or(ns, |(ns, _)| ns);
            (w.since, w.ns) = (Instant::now(), ns);
            return;
        }
        if elapsed < OFF_CPU_WINDOW_SECS {
            return;
        }
        let capacity = self.cpus;
        let cost = ns.saturating_sub(w.ns) as f64 / 1e9 / (elapsed * capacity);
        let cycle_wall = now.duration_since(w.cycle.0).as_secs_f64();
        let cycle = ns.saturating_sub(w.cycle.1) as f64 / 1e9 / (cycle_wall * capacity);
        self.off_cpu_overhead = Some(cycle);
        let (next_every, next_pause) = decide_off_cpu((every, pause), cost, w.last, share);
        log::debug!(
            "off-CPU window: programs {:.4}% of the CPUs while attached, {:.4}% over the cycle, budget {:.4}%, timing 1 in {every} sleeps, watching 1 window in {pause}",
            cost * 100.0,
            cycle * 100.0,
            share * 100.0
        );
        w.last = Some((every, cost));
        w.cycle = (now, ns);
        (w.since, w.ns) = (now, ns);
        if (next_every, next_pause) != (every, pause) {
            log::info!(
                "off-CPU programs {:.3}% of the CPUs while attached (budget {:.3}%): timing 1 in {next_every} sleeps (was {every}), watching 1 window of {OFF_CPU_WINDOW_SECS} s in {next_pause} (was {pause})",
                cost * 100.0,
                share * 100.0
            );
            if let Err(err) = profiler
                .set_off_cpu_every(next_every)
                .and_then(|()| profiler.set_off_cpu_pause(next_pause))
            {
                log::warn!("changing the off-CPU sampling: {err}");
            }
        }
        if next_pause > 1
            && let Err(err) = profiler.set_off_cpu_attached(false)
        {
            log::warn!("pausing the off-CPU programs: {err}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{decide, decide_off_cpu, overheads};

    #[test]
    fn off_cpu_sampling_follows_the_cost() {
        // One window, three times the budget: all of it taken as the sleeps' cost,
        // 1 in 3.3 → 4 timed.
        assert_eq!(decide_off_cpu((1, 1), 0.03, None, 0.01), (4, 1));
        // Over budget always raises it, never past the maximum.
        assert_eq!(decide_off_cpu((4, 1), 0.0101, None, 0.01), (5, 1));
        // Room: down by 1.5×, to 1 at least; a pause shortens first.
        assert_eq!(decide_off_cpu((9, 1), 0.001, None, 0.01), (6, 1));
        assert_eq!(decide_off_cpu((1, 1), 0.0, None, 0.01), (1, 1));
        assert_eq!(decide_off_cpu((1024, 4), 0.001, None, 0.01), (1024, 3));
        // Between half the budget and the budget: stay.
        assert_eq!(decide_off_cpu((8, 1), 0.007, None, 0.01), (8, 1));
        assert_eq!(decide_off_cpu((8, 1), f64::NAN, None, 0.01), (8, 1));
    }

    #[test]
    fn a_floor_over_the_budget_pauses_the_off_cpu_programs() {
        // 5 % at 1 in 1, 4 % at 1 in 7: a floor of 3.83 % (watching every switch)
        // and 1.17 % for timing every sleep. No sampling fits a 1 % budget: the most
        // sampling, and 1 window in 5 watched (3.83 % / 5 = 0.77 %).
        assert_eq!(
            decide_off_cpu((7, 1), 0.04, Some((1, 0.05)), 0.01),
            (1024, 5)
        );
        // A floor under the budget: sampling alone (1.17 / (0.9 - 0.5) → 1 in 3).
        assert_eq!(
            decide_off_cpu((1, 1), 0.0167, Some((2, 0.01085)), 0.01),
            (3, 1)
        );
        // Paused and still over: a longer pause, never past the maximum.
        assert_eq!(
            decide_off_cpu((1024, 5), 0.06, Some((1024, 0.04)), 0.01),
            (1024, 7)
        );
        assert_eq!(decide_off_cpu((1024, 8), 0.5, None, 0.01), (1024, 8));
        // Paused within budget: stay.
        assert_eq!(
            decide_off_cpu((1024, 5), 0.04, Some((7, 0.04)), 0.01),
            (1024, 5)
        );
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
