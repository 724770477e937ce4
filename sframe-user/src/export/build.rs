//! Building a [`Profile`] from the profiler's counts.

use std::{
    collections::{BTreeMap, HashMap},
    time::{Duration, SystemTime},
};

use sframe_common::{WalkOutcome, offcpu};

use super::{ProcessProfile, Profile, Sleep, Stack};
use crate::{
    profiler::{
        Profiler, Snapshot, StackCount, TargetInfo, kernel_symbolization_addresses,
        symbolization_addresses,
    },
    symbolize::{Frame, Symbolizer},
};

/// The counts of `current` that `previous` did not have (one `--interval`).
pub fn snapshot_delta(current: &Snapshot, previous: &Snapshot) -> Snapshot {
    let minus = |current: &[StackCount], previous: &[StackCount]| -> Vec<StackCount> {
        let before: HashMap<_, u64> = previous.iter().map(|c| (c.key, c.count)).collect();
        current
            .iter()
            .filter_map(|c| {
                let count = c
                    .count
                    .saturating_sub(before.get(&c.key).copied().unwrap_or(0));
                (count > 0).then_some(StackCount { key: c.key, count })
            })
            .collect()
    };
    let mut delta = Snapshot {
        counts: minus(&current.counts, &previous.counts),
        off_cpu: minus(&current.off_cpu, &previous.off_cpu),
        ..Snapshot::default()
    };
    for (d, (c, p)) in delta
        .outcomes
        .iter_mut()
        .zip(current.outcomes.iter().zip(&previous.outcomes))
    {
        *d = c.saturating_sub(*p);
    }
    for (d, (c, p)) in delta
        .counters
        .iter_mut()
        .zip(current.counters.iter().zip(&previous.counters))
    {
        *d = c.saturating_sub(*p);
    }
    delta
}

impl Profile {
    /// Symbolizes the stacks of `snap` (one per thread and distinct stack) for the
    /// processes in `targets`; samples of other pids are left out.
    pub fn build(
        profiler: &Profiler,
        snap: &Snapshot,
        targets: &[TargetInfo],
        symbolizer: &mut Symbolizer,
        start: SystemTime,
        duration: Duration,
        frequency: u64,
    ) -> Profile {
        Self::build_from(
            profiler, snap, false, targets, symbolizer, start, duration, frequency,
        )
    }

    /// The off-CPU profile of `snap` (nanoseconds asleep per stack; see
    /// [`Profile::off_cpu`]), built like [`Profile::build`].
    pub fn build_off_cpu(
        profiler: &Profiler,
        snap: &Snapshot,
        targets: &[TargetInfo],
        symbolizer: &mut Symbolizer,
        start: SystemTime,
        duration: Duration,
    ) -> Profile {
        Self::build_from(
            profiler, snap, true, targets, symbolizer, start, duration, 0,
        )
    }

    #[allow(
        clippy::too_many_arguments,
        reason = "the two public builders' arguments"
    )]
    fn build_from(
        profiler: &Profiler,
        snap: &Snapshot,
        off_cpu: bool,
        targets: &[TargetInfo],
        symbolizer: &mut Symbolizer,
        start: SystemTime,
        duration: Duration,
        frequency: u64,
    ) -> Profile {
        // (pid, tid, thread name, user stack, kernel stack, outcome) → count.
        type Key = (u32, u32, [u8; 16], u64, i32, u32);
        let mut merged: BTreeMap<Key, u64> = BTreeMap::new();
        let counts = if off_cpu { &snap.off_cpu } else { &snap.counts };
        for c in counts {
            let k = c.key;
            *merged
                .entry((
                    k.pid,
                    k.tid,
                    k.comm,
                    k.user_stack,
                    k.kernel_stack,
                    k.outcome,
                ))
                .or_default() += c.count;
        }
        let mut processes: Vec<ProcessProfile> = Vec::new();
        for t in targets {
            if processes.iter().any(|p| p.pid == t.pid) {
                continue;
            }
            let mut stacks: Vec<Stack> = merged
                .range(
                    (t.pid, 0, [0; 16], 0, i32::MIN, 0)
                        ..=(t.pid, u32::MAX, [u8::MAX; 16], u64::MAX, i32::MAX, u32::MAX),
                )
                .map(|(&(_, tid, comm, user, kernel, outcome), &count)| Stack {
                    tid,
                    thread: thread_name(&comm, profiler.thread_name(tid)),
                    user: user_frames(profiler, symbolizer, t, user),
                    kernel: kernel_frames(profiler, symbolizer, kernel),
                    count,
                    outcome: WalkOutcome::try_from(offcpu::outcome_code(outcome))
                        .unwrap_or(WalkOutcome::Truncated),
                    sleep: off_cpu.then(|| Sleep::of_outcome(outcome)),
                })
                .collect();
            stacks.sort_by(|a, b| {
                b.count
                    .cmp(&a.count)
                    .then_with(|| a.names().cmp(&b.names()))
            });
            let container = t.cgroup.as_deref().and_then(crate::cgroup::container);
            processes.push(ProcessProfile {
                deferred: profiler.deferred_walks(t.pid),
                pid: t.pid,
                ns_pid: t.ns_pid,
                cgroup: t
                    .cgroup
                    .as_deref()
                    .map(|c| crate::sanitize::name(c).into_owned()),
                container_id: container.map(|c| c.id),
                comm: crate::sanitize::name(&t.comm).into_owned(),
                stacks,
            });
        }
        processes.sort_by_key(|p| p.pid);
        symbolizer.end_round();
        Profile {
            group_by: super::GroupBy::default(),
            processes,
            start: Some(start),
            duration,
            frequency,
            outcomes: snap.outcomes,
            counters: snap.counters,
            off_cpu,
        }
    }
}

/// A thread's name for the outputs: the kernel's `comm` of the sample, else the one read
/// when its samples were first collected; sanitized (non-UTF-8 shown lossily).
fn thread_name(comm: &[u8; 16], read: Option<&str>) -> String {
    let len = comm.iter().position(|&b| b == 0).unwrap_or(comm.len());
    if len > 0 {
        return crate::sanitize::name_bytes(comm.get(..len).unwrap_or_default());
    }
    crate::sanitize::name(read.unwrap_or_default()).into_owned()
}

/// Outermost first.
pub(super) fn user_frames(
    profiler: &Profiler,
    symbolizer: &mut Symbolizer,
    target: &TargetInfo,
    id: u64,
) -> Vec<Frame> {
    let addrs = symbolization_addresses(profiler.stack(id).unwrap_or(&[]));
    let frames = symbolizer.symbolize_process(
        target.pid,
        &target.maps,
        target.perf_map.as_deref(),
        target.python.as_deref(),
        &addrs,
    );
    let mut frames = crate::python::merge(&addrs, frames);
    frames.reverse();
    frames
}

/// Outermost first.
pub(super) fn kernel_frames(
    profiler: &Profiler,
    symbolizer: &mut Symbolizer,
    id: i32,
) -> Vec<Frame> {
    if id < 0 {
        return Vec::new();
    }
    let Some(kernel) = profiler.kernel_stack(id) else {
        return Vec::new();
    };
    let mut frames = symbolizer.symbolize_kernel(&kernel_symbolization_addresses(kernel));
    frames.reverse();
    frames
}
