//! Bounded stack series for Prometheus: the top-K stacks per process over a sliding
//! window, the rest summed into one `[other]` series, processes forgotten a grace
//! period after they exit.
//!
//! Every exported value is a counter that only grows: an increment goes to a stack's
//! series when that stack is in its process's top-K at the time of the update, else to
//! `[other]`. A stack leaving the top-K loses its series (and starts from 0 if it comes
//! back), so a process never has more than K + 1 series.

use std::{
    collections::{HashMap, HashSet, VecDeque},
    time::{Duration, Instant},
};

/// The `stack` label of the series that sums stacks outside the top-K.
pub const OTHER: &str = "[other]";

/// One exported series.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Series {
    pub pid: u32,
    pub comm: String,
    pub stack: String,
    pub value: u64,
}

#[derive(Debug, Default)]
struct ProcessWindow {
    comm: String,
    /// Increments inside the window, oldest first.
    recent: VecDeque<(Instant, String, u64)>,
    /// Sum of `recent` per stack.
    sums: HashMap<String, u64>,
    /// Values of the stacks currently in the top-K.
    exported: HashMap<String, u64>,
    other: u64,
    /// Increments since the last [`StackWindow::update`].
    pending: Vec<(String, u64)>,
    exited_at: Option<Instant>,
}

/// The top-K aggregation. Time is passed in by the caller (tests use made-up instants).
#[derive(Debug)]
pub struct StackWindow {
    top_k: usize,
    window: Duration,
    grace: Duration,
    processes: HashMap<u32, ProcessWindow>,
}

impl StackWindow {
    pub fn new(top_k: usize, window: Duration, grace: Duration) -> Self {
        Self {
            top_k,
            window,
            grace,
            processes: HashMap::new(),
        }
    }

    /// Records `delta` new samples of `stack` (folded form) in process `pid`.
    pub fn record(&mut self, pid: u32, comm: &str, stack: &str, delta: u64) {
        if delta == 0 {
            return;
        }
        let p = self.processes.entry(pid).or_default();
        if p.comm != comm {
            p.comm = comm.to_owned();
        }
        p.pending.push((stack.to_owned(), delta));
    }

    /// Process `pid` exited: its series go away `grace` after `now`.
    pub fn exited(&mut self, pid: u32, now: Instant) {
        if let Some(p) = self.processes.get_mut(&pid) {
            p.exited_at.get_or_insert(now);
        }
    }

    /// Applies the increments recorded since the last update: slides the window to
    /// `now`, chooses each process's top-K by samples in the window, and adds each
    /// increment to its stack's series or to `[other]`. Drops processes whose grace
    /// period is over.
    pub fn update(&mut self, now: Instant) {
        let (top_k, window, grace) = (self.top_k, self.window, self.grace);
        self.processes.retain(|_, p| {
            p.exited_at
                .is_none_or(|t| now.saturating_duration_since(t) < grace)
        });
        for p in self.processes.values_mut() {
            for (stack, delta) in std::mem::take(&mut p.pending) {
                *p.sums.entry(stack.clone()).or_default() += delta;
                p.recent.push_back((now, stack, delta));
            }
            while let Some((t, _, _)) = p.recent.front() {
                if now.saturating_duration_since(*t) < window {
                    break;
                }
                if let Some((_, stack, delta)) = p.recent.pop_front()
                    && let Some(sum) = p.sums.get_mut(&stack)
                {
                    *sum = sum.saturating_sub(delta);
                    if *sum == 0 {
                        p.sums.remove(&stack);
                    }
                }
            }
            let mut ranked: Vec<(&String, &u64)> = p.sums.iter().collect();
            ranked.sort_by(|a, b| b.1.cmp(a.1).then_with(|| a.0.cmp(b.0)));
            let top: HashSet<&String> = ranked.iter().take(top_k).map(|(s, _)| *s).collect();
            p.exported.retain(|stack, _| top.contains(stack));
            // The increments of this update are the newest entries of `recent`.
            for (t, stack, delta) in p.recent.iter().rev() {
                if *t != now {
                    break;
                }
                if top.contains(stack) {
                    *p.exported.entry(stack.clone()).or_default() += delta;
                } else {
                    p.other += delta;
                }
            }
        }
    }

    /// The series: per process (by pid) its top-K stacks by name, then `[other]`.
    pub fn series(&self) -> Vec<Series> {
        let mut pids: Vec<&u32> = self.processes.keys().collect();
        pids.sort();
        let mut out = Vec::new();
        for pid in pids {
            let p = &self.processes[pid];
            let mut stacks: Vec<(&String, &u64)> = p.exported.iter().collect();
            stacks.sort();
            let series = |stack: &str, value: u64| Series {
                pid: *pid,
                comm: p.comm.clone(),
                stack: stack.to_owned(),
                value,
            };
            out.extend(stacks.into_iter().map(|(s, &v)| series(s, v)));
            out.push(series(OTHER, p.other));
        }
        out
    }

    /// Pids with series.
    pub fn pids(&self) -> impl Iterator<Item = u32> + '_ {
        self.processes.keys().copied()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn values(w: &StackWindow) -> Vec<(u32, String, u64)> {
        w.series()
            .into_iter()
            .map(|s| (s.pid, s.stack, s.value))
            .collect()
    }

    fn v(pid: u32, stack: &str, value: u64) -> (u32, String, u64) {
        (pid, stack.to_owned(), value)
    }

    #[test]
    fn top_k_and_other() {
        let t0 = Instant::now();
        let mut w = StackWindow::new(2, Duration::from_secs(60), Duration::from_secs(30));
        for (stack, n) in [("a", 10), ("b", 5), ("c", 3), ("d", 1)] {
            w.record(1, "p", stack, n);
        }
        w.record(2, "q", "x", 4);
        w.update(t0);
        assert_eq!(
            values(&w),
            [
                v(1, "a", 10),
                v(1, "b", 5),
                v(1, OTHER, 4),
                v(2, "x", 4),
                v(2, OTHER, 0)
            ]
        );
        // c overtakes b inside the window: b's series goes, c's starts with this
        // update's samples; every remaining value only grew.
        w.record(1, "p", "c", 6);
        w.record(1, "p", "b", 1);
        w.update(t0 + Duration::from_secs(10));
        assert_eq!(
            values(&w),
            [
                v(1, "a", 10),
                v(1, "c", 6),
                v(1, OTHER, 5),
                v(2, "x", 4),
                v(2, OTHER, 0)
            ]
        );
        let series = w.series();
        assert!(series.iter().all(|s| s.pid != 1 || s.comm == "p"));
    }

    #[test]
    fn window_slides() {
        let t0 = Instant::now();
        let mut w = StackWindow::new(1, Duration::from_secs(60), Duration::from_secs(30));
        w.record(1, "p", "old", 100);
        w.update(t0);
        w.record(1, "p", "new", 1);
        w.update(t0 + Duration::from_secs(30));
        // "old" still leads the window.
        assert_eq!(values(&w), [v(1, "old", 100), v(1, OTHER, 1)]);
        w.record(1, "p", "new", 1);
        w.update(t0 + Duration::from_secs(61));
        // "old" left the window: "new" is the top stack now.
        assert_eq!(values(&w), [v(1, "new", 1), v(1, OTHER, 1)]);
    }

    #[test]
    fn exited_processes_expire_after_grace() {
        let t0 = Instant::now();
        let mut w = StackWindow::new(5, Duration::from_secs(60), Duration::from_secs(30));
        w.record(1, "p", "a", 1);
        w.record(2, "q", "b", 1);
        w.update(t0);
        w.exited(1, t0 + Duration::from_secs(5));
        w.update(t0 + Duration::from_secs(34));
        assert_eq!(w.series().len(), 4);
        // A later exit report does not extend the grace period.
        w.exited(1, t0 + Duration::from_secs(30));
        w.update(t0 + Duration::from_secs(35));
        assert_eq!(values(&w), [v(2, "b", 1), v(2, OTHER, 0)]);
        assert_eq!(w.pids().collect::<Vec<_>>(), [2]);
    }

    #[test]
    fn zero_top_k_puts_everything_in_other() {
        let mut w = StackWindow::new(0, Duration::from_secs(60), Duration::from_secs(30));
        w.record(1, "p", "a", 3);
        w.update(Instant::now());
        assert_eq!(values(&w), [v(1, OTHER, 3)]);
    }
}
