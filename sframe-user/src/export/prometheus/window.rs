//! Bounded stack series for Prometheus: the top-K stacks per process over a sliding
//! window, the rest summed into one `[other]` series, processes forgotten a grace
//! period after they exit.
//!
//! Every exported value is a counter that only grows: an increment goes to a stack's
//! series when that stack is in its process's top-K at the time of the update, else to
//! `[other]`. A stack leaving the top-K loses its series (and starts from 0 if it comes
//! back), so a process never has more than K + 1 series.
//!
//! With a group label (`--prometheus-group`), each process carries one value (its cgroup
//! or container) chosen when it first has samples. At most `group_limit` distinct values
//! have series at a time; a process whose value would exceed the bound gets
//! [`OTHER`] instead, counted in [`StackWindow::group_overflow`]. Values free up when
//! the last process carrying them is forgotten.
//!
//! Costs per update grow with the processes that had samples or whose window slid,
//! not with every process kept: an idle process (or one in its grace period) is not
//! ranked again. Stack names are hashed with a seeded fast hash (foldhash), not SipHash.

use std::{
    collections::{HashMap, VecDeque},
    sync::Arc,
    time::{Duration, Instant},
};

use super::{FastMap, FastSet};

/// The `stack` label of the series that sums stacks outside the top-K.
pub const OTHER: &str = "[other]";

/// One exported series.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Series {
    pub pid: u32,
    pub comm: String,
    /// The process's group label value, when grouping.
    pub group: Option<String>,
    pub stack: String,
    pub value: u64,
}

/// One exported series, borrowed from the window.
#[derive(Clone, Copy, Debug)]
pub struct SeriesRef<'a> {
    pub pid: u32,
    pub comm: &'a str,
    pub group: Option<&'a str>,
    pub stack: &'a str,
    pub value: u64,
}

#[derive(Debug, Default)]
struct ProcessWindow {
    comm: String,
    group: Option<String>,
    /// Increments inside the window, oldest first. Each distinct stack's name is
    /// allocated once per process and shared by every entry that names it.
    recent: VecDeque<(Instant, Arc<str>, u64)>,
    /// Sum of `recent` per stack.
    sums: FastMap<Arc<str>, u64>,
    /// Values of the stacks currently in the top-K.
    exported: FastMap<Arc<str>, u64>,
    other: u64,
    /// Increments since the last [`StackWindow::update`].
    pending: Vec<(Arc<str>, u64)>,
    exited_at: Option<Instant>,
}

/// The top-K aggregation. Time is passed in by the caller (tests use made-up instants).
#[derive(Debug)]
pub struct StackWindow {
    top_k: usize,
    window: Duration,
    grace: Duration,
    processes: HashMap<u32, ProcessWindow>,
    group_limit: usize,
    /// Distinct group values with series, and how many processes carry each.
    groups: HashMap<String, usize>,
    group_overflow: u64,
}

impl StackWindow {
    pub fn new(top_k: usize, window: Duration, grace: Duration) -> Self {
        Self {
            top_k,
            window,
            grace,
            processes: HashMap::new(),
            group_limit: usize::MAX,
            groups: HashMap::new(),
            group_overflow: 0,
        }
    }

    /// Bounds the distinct group values with series to `limit`.
    pub fn with_group_limit(mut self, limit: usize) -> Self {
        self.set_group_limit(limit);
        self
    }

    /// Bounds the distinct group values with series to `limit` from now on.
    pub fn set_group_limit(&mut self, limit: usize) {
        self.group_limit = limit;
    }

    /// Processes whose group value was replaced by [`OTHER`] because `group_limit`
    /// values already had series.
    pub fn group_overflow(&self) -> u64 {
        self.group_overflow
    }

    /// The label value a new process of group `value` gets.
    fn admit(&mut self, value: &str) -> String {
        if let Some(n) = self.groups.get_mut(value) {
            *n += 1;
            return value.to_owned();
        }
        if self.groups.len() < self.group_limit && value != OTHER {
            self.groups.insert(value.to_owned(), 1);
            return value.to_owned();
        }
        self.group_overflow += 1;
        OTHER.to_owned()
    }

    /// Records `delta` new samples of `stack` (folded form) in process `pid`, whose
    /// group value (cgroup, container) is `group` when grouping.
    /// The name is shared, not copied, when given as an `Arc<str>` (the feed's own).
    pub fn record(
        &mut self,
        pid: u32,
        comm: &str,
        group: Option<&str>,
        stack: impl Into<Arc<str>>,
        delta: u64,
    ) {
        if delta == 0 {
            return;
        }
        if !self.processes.contains_key(&pid) {
            let group = group.map(|g| self.admit(g));
            self.processes.insert(
                pid,
                ProcessWindow {
                    group,
                    ..ProcessWindow::default()
                },
            );
        }
        let Some(p) = self.processes.get_mut(&pid) else {
            return;
        };
        if p.comm != comm {
            p.comm = comm.to_owned();
        }
        // One allocation per distinct name and process, whichever way it came.
        let stack: Arc<str> = stack.into();
        let stack = p
            .sums
            .get_key_value(&stack)
            .map_or(stack, |(known, _)| Arc::clone(known));
        p.pending.push((stack, delta));
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
        let groups = &mut self.groups;
        self.processes.retain(|_, p| {
            let keep = p
                .exited_at
                .is_none_or(|t| now.saturating_duration_since(t) < grace);
            if !keep
                && let Some(g) = &p.group
                && let Some(n) = groups.get_mut(g)
            {
                *n -= 1;
                if *n == 0 {
                    groups.remove(g);
                }
            }
            keep
        });
        for p in self.processes.values_mut() {
            let added = !p.pending.is_empty();
            for (stack, delta) in std::mem::take(&mut p.pending) {
                *p.sums.entry(stack.clone()).or_default() += delta;
                p.recent.push_back((now, stack, delta));
            }
            let mut slid = false;
            while let Some((t, _, _)) = p.recent.front() {
                if now.saturating_duration_since(*t) < window {
                    break;
                }
                slid = true;
                if let Some((_, stack, delta)) = p.recent.pop_front()
                    && let Some(sum) = p.sums.get_mut(&stack)
                {
                    *sum = sum.saturating_sub(delta);
                    if *sum == 0 {
                        p.sums.remove(&stack);
                    }
                }
            }
            // Nothing new and nothing left the window: the top-K and the values stay.
            if !added && !slid {
                continue;
            }
            let mut ranked: Vec<(&Arc<str>, &u64)> = p.sums.iter().collect();
            ranked.sort_by(|a, b| b.1.cmp(a.1).then_with(|| a.0.cmp(b.0)));
            let top: FastSet<&Arc<str>> = ranked.iter().take(top_k).map(|(s, _)| *s).collect();
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
        let mut out = Vec::new();
        let _ = self.for_each_series(|s| {
            out.push(Series {
                pid: s.pid,
                comm: s.comm.to_owned(),
                group: s.group.map(str::to_owned),
                stack: s.stack.to_owned(),
                value: s.value,
            });
            Ok::<(), ()>(())
        });
        out
    }

    /// Calls `f` with each series, borrowed, in the order of [`Self::series`]
    /// (nothing copied: the exposition is encoded from here); stops at its first
    /// error.
    pub fn for_each_series<E>(
        &self,
        mut f: impl FnMut(SeriesRef<'_>) -> Result<(), E>,
    ) -> Result<(), E> {
        let mut processes: Vec<(&u32, &ProcessWindow)> = self.processes.iter().collect();
        processes.sort_unstable_by_key(|&(pid, _)| *pid);
        let mut stacks: Vec<(&Arc<str>, &u64)> = Vec::new();
        for (&pid, p) in processes {
            stacks.clear();
            stacks.extend(p.exported.iter());
            stacks.sort_unstable();
            let series = |stack, value| SeriesRef {
                pid,
                comm: &p.comm,
                group: p.group.as_deref(),
                stack,
                value,
            };
            for &(stack, &value) in &stacks {
                f(series(stack, value))?;
            }
            f(series(OTHER, p.other))?;
        }
        Ok(())
    }

    /// Whether there is any series.
    pub fn is_empty(&self) -> bool {
        self.processes.is_empty()
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
            w.record(1, "p", None, stack, n);
        }
        w.record(2, "q", None, "x", 4);
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
        w.record(1, "p", None, "c", 6);
        w.record(1, "p", None, "b", 1);
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
        w.record(1, "p", None, "old", 100);
        w.update(t0);
        w.record(1, "p", None, "new", 1);
        w.update(t0 + Duration::from_secs(30));
        // "old" still leads the window.
        assert_eq!(values(&w), [v(1, "old", 100), v(1, OTHER, 1)]);
        w.record(1, "p", None, "new", 1);
        w.update(t0 + Duration::from_secs(61));
        // "old" left the window: "new" is the top stack now.
        assert_eq!(values(&w), [v(1, "new", 1), v(1, OTHER, 1)]);
    }

    #[test]
    fn exited_processes_expire_after_grace() {
        let t0 = Instant::now();
        let mut w = StackWindow::new(5, Duration::from_secs(60), Duration::from_secs(30));
        w.record(1, "p", None, "a", 1);
        w.record(2, "q", None, "b", 1);
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

    /// A process with nothing new is not ranked again until its window slides; its
    /// series stay as they were meanwhile.
    #[test]
    fn idle_processes_keep_their_series_until_the_window_slides() {
        let t0 = Instant::now();
        let mut w = StackWindow::new(1, Duration::from_secs(60), Duration::from_secs(30));
        w.record(1, "p", None, "a", 3);
        w.record(1, "p", None, "b", 2);
        w.update(t0);
        w.record(2, "q", None, "x", 1);
        w.update(t0 + Duration::from_secs(10));
        let idle = [v(1, "a", 3), v(1, OTHER, 2), v(2, "x", 1), v(2, OTHER, 0)];
        assert_eq!(values(&w), idle);
        w.update(t0 + Duration::from_secs(20));
        assert_eq!(values(&w), idle);
        // Process 1's samples leave the window: its top-K empties, the counters stay.
        w.update(t0 + Duration::from_secs(61));
        assert_eq!(values(&w), [v(1, OTHER, 2), v(2, "x", 1), v(2, OTHER, 0)]);
        // A new stack of process 1 is ranked on its own.
        w.record(1, "p", None, "c", 1);
        w.update(t0 + Duration::from_secs(62));
        assert_eq!(values(&w)[..2], [v(1, "c", 1), v(1, OTHER, 2)]);
    }

    #[test]
    fn zero_top_k_puts_everything_in_other() {
        let mut w = StackWindow::new(0, Duration::from_secs(60), Duration::from_secs(30));
        w.record(1, "p", None, "a", 3);
        w.update(Instant::now());
        assert_eq!(values(&w), [v(1, OTHER, 3)]);
    }

    #[test]
    fn group_values_are_bounded_and_freed() {
        let grace = Duration::from_secs(30);
        let mut w = StackWindow::new(5, Duration::from_secs(60), grace).with_group_limit(2);
        let t0 = Instant::now();
        w.record(1, "p", Some("/a"), "s", 1);
        w.record(2, "p", Some("/b"), "s", 1);
        w.record(3, "p", Some("/a"), "s", 1);
        w.record(4, "p", Some("/c"), "s", 1);
        w.update(t0);
        let groups = |w: &StackWindow| -> Vec<(u32, Option<String>)> {
            let mut g: Vec<_> = w.series().into_iter().map(|s| (s.pid, s.group)).collect();
            g.dedup();
            g
        };
        let g = |s: &str| Some(s.to_owned());
        assert_eq!(
            groups(&w),
            [(1, g("/a")), (2, g("/b")), (3, g("/a")), (4, g(OTHER))]
        );
        assert_eq!(w.group_overflow(), 1);
        // A later process of a known group keeps it; `/b` is freed once its only
        // process is forgotten, and `/c` takes its place.
        w.exited(2, t0);
        w.update(t0 + grace);
        w.record(5, "p", Some("/a"), "s", 1);
        w.record(6, "p", Some("/c"), "s", 1);
        w.update(t0 + grace);
        let now = groups(&w);
        assert!(
            now.contains(&(5, g("/a"))) && now.contains(&(6, g("/c"))),
            "{now:?}"
        );
        assert!(!now.iter().any(|(pid, _)| *pid == 2), "{now:?}");
        assert_eq!(w.group_overflow(), 1);
        // No group: no label.
        w.record(7, "p", None, "s", 1);
        w.update(t0 + grace);
        assert!(groups(&w).contains(&(7, None)));
    }
}
