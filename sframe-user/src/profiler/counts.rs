//! The stack counts: the kernel's count and stack maps drained into user space, the
//! samples walked here (deferred ones) added, and the outcome and counter arrays read.

use std::collections::{HashMap as StdHashMap, HashSet};

use aya::{
    Ebpf,
    maps::{HashMap, MapData, PerCpuArray},
};
use sframe_common::{
    Counter, WalkOutcome,
    names::maps,
    stack::{CountKey, UserStack},
};

use super::{Snapshot, StackCount, kstacks::KernelStacks};
use crate::bpf::{LoadError, take_map as take};

pub(super) struct Counts {
    counts_map: HashMap<MapData, CountKey, u64>,
    stacks_map: HashMap<MapData, u64, UserStack>,
    outcomes_map: PerCpuArray<MapData, u64>,
    counters_map: PerCpuArray<MapData, u64>,
    /// Counts accumulated in user space (the kernel map is drained on each collect).
    counts: StdHashMap<CountKey, u64>,
    /// User stacks by key, innermost first.
    stacks: StdHashMap<u64, Vec<u64>>,
    /// Outcomes of the samples walked in user space (added to the kernel's).
    walked_here: [u64; WalkOutcome::COUNT],
}

impl Counts {
    pub(super) fn new(ebpf: &mut Ebpf) -> Result<Self, LoadError> {
        Ok(Self {
            counts_map: take(ebpf, maps::COUNTS)?,
            stacks_map: take(ebpf, maps::STACKS)?,
            outcomes_map: take(ebpf, maps::OUTCOMES)?,
            counters_map: take(ebpf, maps::COUNTERS)?,
            counts: StdHashMap::new(),
            stacks: StdHashMap::new(),
            walked_here: [0; WalkOutcome::COUNT],
        })
    }

    /// Counts one sample walked in user space: `frames` is its user stack (the key's).
    pub(super) fn add_walked(&mut self, key: CountKey, frames: &[u64]) {
        self.stacks
            .entry(key.user_stack)
            .or_insert_with(|| frames.to_vec());
        *self.counts.entry(key).or_default() += 1;
        if let Some(n) = self.walked_here.get_mut(key.outcome as usize) {
            *n += 1;
        }
    }

    /// Moves the kernel's counts into user space (their kernel stacks interned into
    /// `kernel_stacks`) and returns everything counted so far.
    pub(super) fn collect(&mut self, kernel_stacks: &mut KernelStacks) -> Snapshot {
        let keys: Vec<CountKey> = self.counts_map.keys().filter_map(Result::ok).collect();
        let mut wanted = HashSet::new();
        let mut round = StdHashMap::new();
        for key in keys {
            // Read then delete: a sample landing in between is lost (rare, counted as
            // the difference between `samples` and the sum of counts).
            if let Ok(n) = self.counts_map.get(&key, 0) {
                let kernel_stack = kernel_stacks.intern(key.kernel_stack, &mut round);
                *self
                    .counts
                    .entry(CountKey {
                        kernel_stack,
                        ..key
                    })
                    .or_default() += n;
                if key.user_stack != 0 && !self.stacks.contains_key(&key.user_stack) {
                    wanted.insert(key.user_stack);
                }
            }
            let _ = self.counts_map.remove(&key);
        }
        for id in wanted {
            if let Ok(stack) = self.stacks_map.get(&id, 0) {
                let len = (stack.len as usize).min(stack.frames.len());
                self.stacks.insert(id, stack.frames[..len].to_vec());
                let _ = self.stacks_map.remove(&id);
            }
        }
        let mut snap = Snapshot {
            counts: self
                .counts
                .iter()
                .map(|(k, &count)| StackCount { key: *k, count })
                .collect(),
            ..Snapshot::default()
        };
        for (i, slot) in snap.outcomes.iter_mut().enumerate() {
            if let Ok(v) = self.outcomes_map.get(&(i as u32), 0) {
                *slot = v.iter().sum();
            }
            *slot += self.walked_here[i];
        }
        for (i, slot) in snap.counters.iter_mut().enumerate() {
            if let Ok(v) = self.counters_map.get(&(i as u32), 0) {
                *slot = v.iter().sum();
            }
        }
        kernel_stacks.empty_when_full(snap.counters[Counter::KernelStackFailed as usize]);
        snap
    }

    /// Drops the counts of the processes `gone`, and the stacks no count uses any more.
    pub(super) fn forget(&mut self, gone: &HashSet<u32>) {
        self.counts.retain(|k, _| !gone.contains(&k.pid));
        let used: HashSet<u64> = self.counts.keys().map(|k| k.user_stack).collect();
        self.stacks.retain(|id, _| used.contains(id));
    }

    /// The frames of a user stack (innermost first) seen by `collect`.
    pub(super) fn stack(&self, id: u64) -> Option<&[u64]> {
        self.stacks.get(&id).map(Vec::as_slice)
    }
}
