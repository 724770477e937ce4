//! Feeding [`Metrics`] from the profiler: new samples per stack since the last update,
//! symbolized once per distinct stack, and the unwinder's health.

use std::{collections::HashMap, time::Instant};

use sframe_common::stack::CountKey;

use super::{GroupLabel, Health, Metrics, bpf_stats_enabled};
use crate::{
    export::{Sleep, Stack, build},
    profiler::{Profiler, Snapshot, StackCount, TargetInfo},
    symbolize::Symbolizer,
};

/// What the last update saw.
#[derive(Debug, Default)]
pub struct Feed {
    previous: HashMap<CountKey, u64>,
    /// The same for the off-CPU counts (nanoseconds asleep).
    previous_off_cpu: HashMap<CountKey, u64>,
    /// (pid, user stack, kernel stack, off-CPU sleep) → folded stack and user frame
    /// count.
    names: HashMap<NameKey, (String, usize)>,
}

/// (pid, user stack, kernel stack, off-CPU sleep).
type NameKey = (u32, u64, i32, Option<Sleep>);

/// The keys of `counts` whose count grew since `previous`, with how much; `previous`
/// becomes `counts`.
fn new_counts(
    previous: &mut HashMap<CountKey, u64>,
    counts: &[StackCount],
) -> Vec<(CountKey, u64)> {
    let mut now = HashMap::with_capacity(counts.len());
    let mut grown = Vec::new();
    for c in counts {
        now.insert(c.key, c.count);
        let delta = c
            .count
            .saturating_sub(previous.get(&c.key).copied().unwrap_or(0));
        if delta > 0 {
            grown.push((c.key, delta));
        }
    }
    *previous = now;
    grown
}

/// The value of `label` for process `t`: its cgroup path (sanitized like every name
/// in the outputs), or the id of the container that path names.
fn group_value(label: GroupLabel, t: &TargetInfo) -> Option<String> {
    let cgroup = t.cgroup.as_deref()?;
    match label {
        GroupLabel::Cgroup => Some(crate::sanitize::name(cgroup).into_owned()),
        GroupLabel::Container => crate::cgroup::container(cgroup).map(|c| c.id),
    }
}

impl Feed {
    /// The folded name of a stack of process `target` (`;` inside names made `:`), and
    /// its user frame count, symbolized once.
    fn name(
        &mut self,
        profiler: &Profiler,
        symbolizer: &mut Symbolizer,
        target: &TargetInfo,
        user_stack: u64,
        kernel_stack: i32,
        sleep: Option<Sleep>,
    ) -> (String, usize) {
        self.names
            .entry((target.pid, user_stack, kernel_stack, sleep))
            .or_insert_with(|| {
                let s = Stack {
                    tid: 0,
                    thread: String::new(),
                    user: build::user_frames(profiler, symbolizer, target, user_stack),
                    kernel: build::kernel_frames(profiler, symbolizer, kernel_stack),
                    count: 0,
                    outcome: sframe_common::WalkOutcome::Complete,
                    sleep,
                };
                let names: Vec<String> = s.names().iter().map(|n| n.replace(';', ":")).collect();
                let frames = profiler.stack(user_stack).map_or(0, <[u64]>::len);
                (names.join(";"), frames)
            })
            .clone()
    }

    /// Records the samples of `snap` not seen before and the health of `profiler`,
    /// then updates `metrics`. Only the processes of [`Profiler::target`] are exported
    /// (looked up for the stacks that grew: nothing is copied per update).
    pub fn update(
        &mut self,
        metrics: &mut Metrics,
        now: Instant,
        profiler: &Profiler,
        snap: &Snapshot,
        symbolizer: &mut Symbolizer,
    ) {
        let group = metrics.group();
        // The group label value of each process with new samples (this update's).
        let mut groups: HashMap<u32, Option<String>> = HashMap::new();
        let mut lookup = |pid: u32| -> Option<(&TargetInfo, Option<String>)> {
            let target = profiler.target(pid)?;
            let value = groups
                .entry(pid)
                .or_insert_with(|| group.and_then(|g| group_value(g, target)));
            Some((target, value.clone()))
        };
        // On CPU (samples) then off CPU (nanoseconds asleep); the counts of this
        // snapshot replace the last ones, so keys of processes the profiler has
        // forgotten are forgotten here too.
        let grown = new_counts(&mut self.previous, &snap.counts);
        let grown_off_cpu = new_counts(&mut self.previous_off_cpu, &snap.off_cpu);
        let mut found = Vec::with_capacity(grown.len() + grown_off_cpu.len());
        for (k, delta) in grown {
            found.push((lookup(k.pid), k, delta, false));
        }
        for (k, delta) in grown_off_cpu {
            found.push((lookup(k.pid), k, delta, true));
        }
        for (t, k, delta, off_cpu) in found {
            let Some((target, group)) = t else {
                continue;
            };
            if off_cpu {
                let sleep = Some(Sleep::of_outcome(k.outcome));
                let (stack, _) = self.name(
                    profiler,
                    symbolizer,
                    target,
                    k.user_stack,
                    k.kernel_stack,
                    sleep,
                );
                metrics.record_off_cpu(
                    k.pid,
                    &crate::sanitize::name(&target.comm),
                    group.as_deref(),
                    &stack,
                    delta,
                );
                continue;
            }
            let (stack, frames) = self.name(
                profiler,
                symbolizer,
                target,
                k.user_stack,
                k.kernel_stack,
                None,
            );
            metrics.record(
                k.pid,
                &crate::sanitize::name(&target.comm),
                group.as_deref(),
                &stack,
                frames,
                delta,
            );
        }
        // Forget the stacks of processes that have no series any more.
        let live: std::collections::HashSet<u32> = metrics.pids().into_iter().collect();
        let kept = |pid: &u32| live.contains(pid) || profiler.target(*pid).is_some();
        self.names.retain(|(pid, _, _, _), _| kept(pid));

        let store = profiler.store().figures();
        let health = Health {
            outcomes: snap.outcomes,
            counters: snap.counters,
            objects_loaded: store.objects_loaded,
            objects_by_source: store.objects_by_source,
            objects_failed: store.objects_failed,
            rows_in_use: store.rows_in_use,
            row_capacity: store.row_capacity,
            table_bytes: store.table_bytes,
            bpf_program: profiler.program_stats(),
            bpf_stats_enabled: bpf_stats_enabled(),
            fleet: profiler.fleet_counters(),
            processes: profiler.alive_targets() as u64,
            frequency: profiler.frequency(),
            load_cpu: crate::objects::load_cpu_seconds(),
            collect_cpu: crate::governor::collection_cpu_seconds(),
            event_lag: profiler.lifecycle().event_lag_ns as f64 / 1e9,
            event_lag_max: profiler.lifecycle().event_lag_max_ns as f64 / 1e9,
        };
        metrics.update(now, &health);
        symbolizer.end_round();
    }
}
