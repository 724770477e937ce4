//! Feeding [`Metrics`] from the profiler: new samples per stack since the last update,
//! symbolized once per distinct stack, and the unwinder's health.

use std::{collections::HashMap, time::Instant};

use sframe_common::stack::CountKey;

use super::{GroupLabel, Health, Metrics, bpf_stats_enabled};
use crate::{
    export::{Stack, build},
    profiler::{Profiler, Snapshot, TargetInfo},
    symbolize::Symbolizer,
};

/// What the last update saw.
#[derive(Debug, Default)]
pub struct Feed {
    previous: HashMap<CountKey, u64>,
    /// (pid, user stack, kernel stack) → folded stack and user frame count.
    names: HashMap<(u32, u64, i32), (String, usize)>,
    /// The same for the off-CPU counts (nanoseconds; the key's outcome carries the
    /// sleep state, part of the name).
    previous_off_cpu: HashMap<CountKey, u64>,
    off_cpu_names: HashMap<(u32, u64, i32, u32), String>,
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
    /// Records the samples of `snap` not seen before and the health of `profiler`,
    /// then updates `metrics`. Only pids in `targets` are exported.
    pub fn update(
        &mut self,
        metrics: &mut Metrics,
        now: Instant,
        profiler: &Profiler,
        snap: &Snapshot,
        targets: &[TargetInfo],
        symbolizer: &mut Symbolizer,
    ) {
        let group = metrics.group();
        let by_pid: HashMap<u32, (&TargetInfo, Option<String>)> = targets
            .iter()
            .map(|t| (t.pid, (t, group.and_then(|g| group_value(g, t)))))
            .collect();
        // The counts of this snapshot replace the last ones: keys of processes the
        // profiler has forgotten are forgotten here too.
        let mut previous = HashMap::with_capacity(snap.counts.len());
        for c in &snap.counts {
            let k = c.key;
            previous.insert(k, c.count);
            let seen = self.previous.get(&k).copied().unwrap_or(0);
            let delta = c.count.saturating_sub(seen);
            let Some((target, group)) = by_pid.get(&k.pid) else {
                continue;
            };
            if delta == 0 {
                continue;
            }
            let (stack, frames) = self
                .names
                .entry((k.pid, k.user_stack, k.kernel_stack))
                .or_insert_with(|| {
                    let s = Stack {
                        tid: 0,
                        thread: String::new(),
                        user: build::user_frames(profiler, symbolizer, target, k.user_stack),
                        kernel: build::kernel_frames(profiler, symbolizer, k.kernel_stack),
                        count: 0,
                        outcome: sframe_common::WalkOutcome::Complete,
                        sleep: None,
                    };
                    let names: Vec<String> =
                        s.names().iter().map(|n| n.replace(';', ":")).collect();
                    let frames = profiler.stack(k.user_stack).map_or(0, <[u64]>::len);
                    (names.join(";"), frames)
                });
            metrics.record(
                k.pid,
                &crate::sanitize::name(&target.comm),
                group.as_deref(),
                stack,
                *frames,
                delta,
            );
        }
        self.previous = previous;
        let mut previous = HashMap::with_capacity(snap.off_cpu.len());
        for c in &snap.off_cpu {
            let k = c.key;
            previous.insert(k, c.count);
            let seen = self.previous_off_cpu.get(&k).copied().unwrap_or(0);
            let delta = c.count.saturating_sub(seen);
            let Some((target, group)) = by_pid.get(&k.pid) else {
                continue;
            };
            if delta == 0 {
                continue;
            }
            let uninterruptible = k.outcome & sframe_common::offcpu::OFF_CPU_UNINTERRUPTIBLE;
            let stack = self
                .off_cpu_names
                .entry((k.pid, k.user_stack, k.kernel_stack, uninterruptible))
                .or_insert_with(|| {
                    let s = Stack {
                        tid: 0,
                        thread: String::new(),
                        user: build::user_frames(profiler, symbolizer, target, k.user_stack),
                        kernel: build::kernel_frames(profiler, symbolizer, k.kernel_stack),
                        count: 0,
                        outcome: sframe_common::WalkOutcome::Complete,
                        sleep: Some(if uninterruptible != 0 {
                            crate::export::Sleep::Uninterruptible
                        } else {
                            crate::export::Sleep::Interruptible
                        }),
                    };
                    let names: Vec<String> =
                        s.names().iter().map(|n| n.replace(';', ":")).collect();
                    names.join(";")
                });
            metrics.record_off_cpu(
                k.pid,
                &crate::sanitize::name(&target.comm),
                group.as_deref(),
                stack,
                delta,
            );
        }
        self.previous_off_cpu = previous;
        // Forget the stacks of processes that have no series any more.
        let live: std::collections::HashSet<u32> = metrics
            .pids()
            .into_iter()
            .chain(targets.iter().map(|t| t.pid))
            .collect();
        self.names.retain(|(pid, _, _), _| live.contains(pid));
        self.off_cpu_names
            .retain(|(pid, _, _, _), _| live.contains(pid));
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
        };
        metrics.update(now, &health);
    }
}
