//! Feeding [`Metrics`] from the profiler: new samples per stack since the last update,
//! named once per distinct stack (on the naming thread, [`super::namer`]), and the
//! unwinder's health.

use std::{collections::HashMap, sync::Arc, time::Instant};

use sframe_common::stack::CountKey;

use super::{
    FastMap, GroupLabel, Health, Metrics, bpf_stats_enabled,
    namer::{Batch, Job, NameKey, Namer},
};
use crate::{
    export::Sleep,
    profiler::{
        Profiler, Snapshot, StackCount, TargetInfo, kernel_symbolization_addresses,
        symbolization_addresses,
    },
};

/// What the last update saw.
pub struct Feed {
    /// Each count key's count at the last update and the update that saw it.
    previous: FastMap<CountKey, (u64, u64)>,
    /// The same for the off-CPU counts (nanoseconds asleep).
    previous_off_cpu: FastMap<CountKey, (u64, u64)>,
    /// Updates so far.
    round: u64,
    /// Named stacks → folded name and user frame count.
    /// The name is shared with the windows' series (not copied there).
    names: FastMap<NameKey, (Arc<str>, usize)>,
    /// Samples of stacks the naming thread has not named yet, recorded when it has.
    waiting: FastMap<NameKey, Waiting>,
    namer: Namer,
    /// Samples dropped because the naming thread had no room for their stacks
    /// ([`super::namer::MAX_JOBS_IN_FLIGHT`], [`super::namer::MAX_BATCHES_IN_FLIGHT`]).
    dropped: u64,
}

/// The batches an update assembles for the naming thread, one per process.
#[derive(Default)]
struct Pending {
    batches: HashMap<u32, Batch>,
    jobs: usize,
}

/// Samples (or off-CPU nanoseconds) of one stack waiting for its name.
struct Waiting {
    comm: String,
    group: Option<String>,
    frames: usize,
    delta: u64,
}

/// The keys of `counts` whose count grew since `previous`, with how much; `previous`
/// becomes `counts` (updated in place: the entries `counts` has are marked with
/// `round`, the others removed).
fn new_counts(
    previous: &mut FastMap<CountKey, (u64, u64)>,
    round: u64,
    counts: &[StackCount],
) -> Vec<(CountKey, u64)> {
    let mut grown = Vec::new();
    for c in counts {
        let seen = previous.entry(c.key).or_insert((0, round));
        let delta = c.count.saturating_sub(seen.0);
        *seen = (c.count, round);
        if delta > 0 {
            grown.push((c.key, delta));
        }
    }
    previous.retain(|_, &mut (_, r)| r == round);
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
    /// A feed whose stacks are named on their own thread.
    pub fn new() -> std::io::Result<Self> {
        Self::with_debuginfod(None)
    }

    /// [`Feed::new`], naming objects without line tables from the debug files
    /// `debuginfod` fetches.
    pub fn with_debuginfod(
        debuginfod: Option<std::sync::Arc<crate::symbolize::debuginfod::Debuginfod>>,
    ) -> std::io::Result<Self> {
        Ok(Self {
            previous: FastMap::default(),
            previous_off_cpu: FastMap::default(),
            round: 0,
            names: FastMap::default(),
            waiting: FastMap::default(),
            namer: Namer::spawn_with(debuginfod)?,
            dropped: 0,
        })
    }

    /// Records `delta` of stack `key` now if it is named, else keeps it until it is
    /// (asking for its name the first time).
    #[allow(clippy::too_many_arguments)]
    fn add(
        &mut self,
        metrics: &mut Metrics,
        profiler: &Profiler,
        target: &TargetInfo,
        group: Option<String>,
        key: NameKey,
        delta: u64,
        pending: &mut Pending,
    ) {
        let comm = crate::sanitize::name(&target.comm);
        if let Some((stack, frames)) = self.names.get(&key) {
            record(metrics, key, &comm, group.as_deref(), stack, *frames, delta);
            return;
        }
        if let Some(w) = self.waiting.get_mut(&key) {
            w.delta = w.delta.saturating_add(delta);
            return;
        }
        // Every waiting stack is a job in flight or in `pending`, so this bounds the
        // waiting samples too.
        let new_batch = usize::from(!pending.batches.contains_key(&target.pid));
        if !self.namer.room(
            pending.jobs.saturating_add(1),
            pending.batches.len().saturating_add(new_batch),
        ) {
            self.dropped = self.dropped.saturating_add(delta);
            return;
        }
        let (_, user_stack, kernel_stack, _) = key;
        let user = profiler.stack(user_stack).unwrap_or(&[]);
        let kernel = if kernel_stack < 0 {
            Vec::new()
        } else {
            profiler
                .kernel_stack(kernel_stack)
                .map(kernel_symbolization_addresses)
                .unwrap_or_default()
        };
        self.waiting.insert(
            key,
            Waiting {
                comm: comm.into_owned(),
                group,
                frames: user.len(),
                delta,
            },
        );
        pending.jobs += 1;
        pending
            .batches
            .entry(target.pid)
            .or_insert_with(|| Batch {
                pid: target.pid,
                maps: target.maps.clone(),
                perf_map: target.perf_map.clone(),
                python: target.python.clone(),
                jobs: Vec::new(),
            })
            .jobs
            .push(Job {
                key,
                user: symbolization_addresses(user),
                kernel,
            });
    }

    /// Records the samples of `snap` not seen before (those of stacks named since
    /// the last update too) and the health of `profiler`, then updates `metrics`.
    /// Only the processes of [`Profiler::target`] are exported (looked up for the
    /// stacks that grew: nothing is copied per update). Never waits for names.
    pub fn update(
        &mut self,
        metrics: &mut Metrics,
        now: Instant,
        profiler: &Profiler,
        snap: &Snapshot,
    ) {
        // Names made since the last update, and the samples that waited for them.
        for (key, stack) in self.namer.take_names() {
            let Some(w) = self.waiting.remove(&key) else {
                continue;
            };
            let stack: Arc<str> = Arc::from(stack);
            record(
                metrics,
                key,
                &w.comm,
                w.group.as_deref(),
                &stack,
                w.frames,
                w.delta,
            );
            self.names.insert(key, (stack, w.frames));
        }
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
        self.round = self.round.wrapping_add(1);
        let grown = new_counts(&mut self.previous, self.round, &snap.counts);
        let grown_off_cpu = new_counts(&mut self.previous_off_cpu, self.round, &snap.off_cpu);
        let mut found = Vec::with_capacity(grown.len() + grown_off_cpu.len());
        for (k, delta) in grown {
            found.push((lookup(k.pid), k, delta, None));
        }
        for (k, delta) in grown_off_cpu {
            found.push((lookup(k.pid), k, delta, Some(Sleep::of_outcome(k.outcome))));
        }
        let mut pending = Pending::default();
        for (t, k, delta, sleep) in found {
            let Some((target, group)) = t else {
                // A process the profiler no longer knows (forgotten after it exited):
                // its samples have no name to be exported under.
                self.dropped = self.dropped.saturating_add(delta);
                continue;
            };
            let key = (k.pid, k.user_stack, k.kernel_stack, sleep);
            self.add(metrics, profiler, target, group, key, delta, &mut pending);
        }
        if !self.namer.submit(pending.batches.into_values().collect()) {
            log::warn!("the stack naming thread is gone: new stacks stay unnamed");
        }
        // Forget the names and waiting samples of processes the profiler forgot.
        let kept = |pid: &u32| profiler.target(*pid).is_some();
        self.names.retain(|(pid, _, _, _), _| kept(pid));
        let mut forgotten = 0u64;
        self.waiting.retain(|(pid, _, _, _), w| {
            let keep = kept(pid);
            if !keep {
                forgotten = forgotten.saturating_add(w.delta);
            }
            keep
        });
        self.dropped = self.dropped.saturating_add(forgotten);

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
            naming_waiting: self.waiting.len() as u64,
            naming_dropped: self.dropped,
            naming_state_bytes: self.namer.state_bytes(),
            naming_evictions: self.namer.evictions(),
        };
        metrics.update(now, &health);
    }
}

/// Records `delta` of the named stack `key` (off CPU when it has a sleep).
fn record(
    metrics: &mut Metrics,
    key: NameKey,
    comm: &str,
    group: Option<&str>,
    stack: &Arc<str>,
    frames: usize,
    delta: u64,
) {
    if key.3.is_some() {
        metrics.record_off_cpu(key.0, comm, group, Arc::clone(stack), delta);
    } else {
        metrics.record(key.0, comm, group, Arc::clone(stack), frames, delta);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn count(user_stack: u64, count: u64) -> StackCount {
        StackCount {
            key: CountKey {
                pid: 1,
                user_stack,
                ..CountKey::default()
            },
            count,
        }
    }

    /// Only growth is reported; a key missing from a snapshot is forgotten (when it
    /// comes back, all of its count is new), and nothing else is kept.
    #[test]
    fn counts_grow_in_place_and_gone_keys_are_forgotten() {
        let mut previous = FastMap::default();
        let grown = |p: &mut FastMap<_, _>, round, counts: &[StackCount]| {
            let mut g: Vec<(u64, u64)> = new_counts(p, round, counts)
                .into_iter()
                .map(|(k, d)| (k.user_stack, d))
                .collect();
            g.sort_unstable();
            g
        };
        assert_eq!(
            grown(&mut previous, 1, &[count(1, 5), count(2, 3)]),
            [(1, 5), (2, 3)]
        );
        assert_eq!(
            grown(&mut previous, 2, &[count(1, 7), count(2, 3)]),
            [(1, 2)]
        );
        assert_eq!(grown(&mut previous, 3, &[count(2, 4)]), [(2, 1)]);
        assert_eq!(previous.len(), 1);
        assert_eq!(
            grown(&mut previous, 4, &[count(1, 7), count(2, 4)]),
            [(1, 7)]
        );
        assert_eq!(grown(&mut previous, 5, &[]), []);
        assert!(previous.is_empty());
    }
}
