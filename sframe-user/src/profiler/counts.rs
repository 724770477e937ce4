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
    offcpu::OffCpuKey,
    stack::{CountKey, UserStack},
};

use super::{Snapshot, StackCount, kstacks::KernelStacks};
use crate::bpf::{LoadError, take_map as take};

/// Distinct count keys user space keeps, all processes together. The kernel's maps are
/// bounded and drained every collection; what is drained accumulates here for the whole
/// profile (Prometheus counters are cumulative), so without a bound a process that keeps
/// making new stacks (or new threads) would grow the profiler's memory forever.
pub const MAX_KEYS: usize = 131_072;
/// Distinct count keys one process may hold: one process cannot take the room of the
/// others (a hostile process makes new stacks at will, from words it writes on its stack).
pub const MAX_KEYS_PER_PROCESS: usize = MAX_KEYS / 16;
/// Frame words of the distinct user stacks kept (8 bytes each: 16 MiB).
pub const MAX_STACK_WORDS: usize = 2 << 20;
/// Frame words of the stacks one process may bring in.
pub const MAX_STACK_WORDS_PER_PROCESS: usize = MAX_STACK_WORDS / 16;

/// What [`Counts::drain`] does to the words of a user stack of a process (its pid) new
/// to user space before they are kept.
pub(super) type Bind<'a> = dyn FnMut(u32, &mut [u64]) + 'a;

/// A key past the bounds: the sample stays counted for its process and outcome, at the
/// process's root (no thread, no stack), so totals and outcome shares stay right.
fn folded(key: CountKey) -> CountKey {
    CountKey {
        pid: key.pid,
        outcome: key.outcome,
        kernel_stack: -1,
        ..CountKey::default()
    }
}

/// Keys and stack words charged to one process.
#[derive(Clone, Copy, Default)]
struct Charge {
    keys: usize,
    words: usize,
}

/// The bounds of [`Kept`].
#[derive(Clone, Copy, Debug)]
struct Bounds {
    keys: usize,
    keys_per_process: usize,
    words: usize,
    words_per_process: usize,
}

impl Bounds {
    /// For `keys` distinct keys in all (the default [`MAX_KEYS`]): a sixteenth of them
    /// per process, 16 frame words per key on average.
    fn for_keys(keys: usize) -> Self {
        let keys = keys.max(1);
        let words = keys.saturating_mul(MAX_STACK_WORDS / MAX_KEYS);
        Self {
            keys,
            keys_per_process: (keys / 16).max(1),
            words,
            words_per_process: (words / 16).max(1),
        }
    }
}

const _: () = assert!(MAX_KEYS_PER_PROCESS == MAX_KEYS / 16);
const _: () = assert!(MAX_STACK_WORDS_PER_PROCESS == MAX_STACK_WORDS / 16);

/// Which counts: samples on CPU, or nanoseconds off CPU.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    OnCpu = 0,
    OffCpu = 1,
}

/// The counts and user stacks kept in user space, within [`Bounds`] (on- and off-CPU
/// counts together; they share the stacks).
struct Kept {
    bounds: Bounds,
    /// By [`Kind`].
    counts: [StdHashMap<CountKey, u64>; 2],
    /// User stacks by key, innermost first.
    stacks: StdHashMap<u64, Vec<u64>>,
    /// What each process holds of `counts` and `stacks` (a stack is charged to the
    /// process that brought it in).
    charges: StdHashMap<u32, Charge>,
    /// Frame words in `stacks`.
    words: usize,
    /// Samples counted under a folded key because a bound was reached.
    folded: u64,
}

impl Kept {
    fn new(bounds: Bounds) -> Self {
        Self {
            bounds,
            counts: [StdHashMap::new(), StdHashMap::new()],
            stacks: StdHashMap::new(),
            charges: StdHashMap::new(),
            words: 0,
            folded: 0,
        }
    }

    /// Adds `n` samples to `key`, whose user stack is `frames` (when known and not
    /// stored yet). Past a bound, the samples go to the key's folded form.
    /// The counts of `kind`.
    fn of(&mut self, kind: Kind) -> &mut StdHashMap<CountKey, u64> {
        let [on, off] = &mut self.counts;
        match kind {
            Kind::OnCpu => on,
            Kind::OffCpu => off,
        }
    }

    /// Keys counted, of both kinds.
    fn key_count(&self) -> usize {
        self.counts.iter().map(StdHashMap::len).sum()
    }

    /// Whether the keys or the stack words kept are over `num/den` of their bounds.
    fn crowded(&self, num: usize, den: usize) -> bool {
        self.excess(num, den) != (0, 0)
    }

    /// The keys and stack words kept beyond `num/den` of their bounds.
    fn excess(&self, num: usize, den: usize) -> (usize, usize) {
        let over = |n: usize, bound: usize| n.saturating_sub(bound / den * num);
        (
            over(self.key_count(), self.bounds.keys),
            over(self.words, self.bounds.words),
        )
    }

    fn add(&mut self, kind: Kind, key: CountKey, n: u64, frames: Option<&[u64]>) {
        if let Some(c) = self.of(kind).get_mut(&key) {
            *c += n;
            return;
        }
        let b = self.bounds;
        let charge = self.charges.get(&key.pid).copied().unwrap_or_default();
        let new_stack = key.user_stack != 0 && !self.stacks.contains_key(&key.user_stack);
        let words = if new_stack {
            frames.map_or(0, <[u64]>::len)
        } else {
            0
        };
        let fits = self.key_count() < b.keys
            && charge.keys < b.keys_per_process
            && (!new_stack
                || (frames.is_some()
                    && self.words + words <= b.words
                    && charge.words + words <= b.words_per_process));
        if !fits {
            self.folded += n;
            // The folded keys are kept beyond the bound: one per process and outcome.
            *self.of(kind).entry(folded(key)).or_default() += n;
            return;
        }
        if new_stack && let Some(frames) = frames {
            self.stacks.insert(key.user_stack, frames.to_vec());
            self.words += words;
        }
        let c = self.charges.entry(key.pid).or_default();
        c.keys += 1;
        c.words += words;
        self.of(kind).insert(key, n);
    }

    /// Drops the counts of the processes `gone`, and the stacks no count uses any more.
    fn forget(&mut self, gone: &HashSet<u32>) {
        for counts in &mut self.counts {
            counts.retain(|k, _| !gone.contains(&k.pid));
        }
        let used: HashSet<u64> = self.keys().map(|k| k.user_stack).collect();
        self.stacks.retain(|id, _| used.contains(id));
        // Charges again from what is left: each stack to the lowest pid that uses it.
        self.charges.clear();
        let mut charged = HashSet::new();
        let mut keys: Vec<&CountKey> = self.counts.iter().flat_map(StdHashMap::keys).collect();
        keys.sort_unstable_by_key(|k| k.pid);
        for k in keys {
            if *k == folded(*k) {
                continue;
            }
            let c = self.charges.entry(k.pid).or_default();
            c.keys += 1;
            if k.user_stack != 0 && charged.insert(k.user_stack) {
                c.words += self.stacks.get(&k.user_stack).map_or(0, Vec::len);
            }
        }
        self.words = self.stacks.values().map(Vec::len).sum();
    }

    fn keys(&self) -> impl Iterator<Item = &CountKey> {
        self.counts.iter().flat_map(StdHashMap::keys)
    }
}

pub(super) struct Counts {
    counts_map: HashMap<MapData, CountKey, u64>,
    stacks_map: HashMap<MapData, u64, UserStack>,
    outcomes_map: PerCpuArray<MapData, u64>,
    counters_map: PerCpuArray<MapData, u64>,
    /// Off-CPU nanoseconds by key (`sframe_common::offcpu`).
    off_cpu_map: HashMap<MapData, OffCpuKey, u64>,
    /// Counts accumulated in user space (the kernel map is drained on each collect).
    kept: Kept,
    /// Outcomes of the samples walked in user space (added to the kernel's).
    walked_here: [u64; WalkOutcome::COUNT],
    /// The kernel's full-map counters (stacks, counts, off-CPU counts) at the last drain.
    map_failures: u64,
    /// Samples walked in user space (deferred), per process.
    walked_by_pid: StdHashMap<u32, super::DeferredWalks>,
}

/// Every key of a kernel count map with its count, the map emptied. Read then delete:
/// a count landing in between is lost (rare; on CPU it shows as the difference between
/// `samples` and the sum of counts).
fn drain_keys<K: aya::Pod + Copy>(map: &mut HashMap<MapData, K, u64>) -> Vec<(K, u64)> {
    let keys: Vec<K> = map.keys().filter_map(Result::ok).collect();
    let mut drained = Vec::with_capacity(keys.len());
    for key in keys {
        if let Ok(n) = map.get(&key, 0) {
            drained.push((key, n));
        }
        let _ = map.remove(&key);
    }
    drained
}

fn drain(map: &mut HashMap<MapData, CountKey, u64>, kind: Kind) -> Vec<(Kind, CountKey, u64)> {
    drain_keys(map)
        .into_iter()
        .map(|(key, n)| (kind, key, n))
        .collect()
}

impl Counts {
    /// `max_keys`: distinct count keys kept in all (`None`: [`MAX_KEYS`]).
    pub(super) fn new(ebpf: &mut Ebpf, max_keys: Option<usize>) -> Result<Self, LoadError> {
        Ok(Self {
            counts_map: take(ebpf, maps::COUNTS)?,
            stacks_map: take(ebpf, maps::STACKS)?,
            outcomes_map: take(ebpf, maps::OUTCOMES)?,
            counters_map: take(ebpf, maps::COUNTERS)?,
            off_cpu_map: take(ebpf, maps::OFF_CPU_COUNTS)?,
            kept: Kept::new(Bounds::for_keys(max_keys.unwrap_or(MAX_KEYS))),
            walked_here: [0; WalkOutcome::COUNT],
            map_failures: 0,
            walked_by_pid: StdHashMap::new(),
        })
    }

    /// Samples counted at their process's root because a bound on what user space keeps
    /// was reached ([`MAX_KEYS`] and the others).
    pub(super) fn folded(&self) -> u64 {
        self.kept.folded
    }

    /// Counts one sample walked in user space: `frames` is its user stack (the key's).
    pub(super) fn add_walked(&mut self, key: CountKey, frames: &[u64]) {
        self.kept.add(Kind::OnCpu, key, 1, Some(frames));
        if let Some(n) = self.walked_here.get_mut(key.outcome as usize) {
            *n += 1;
        }
        // One entry per process that had deferred samples; processes are forgotten with
        // their counts (`forget`), and the map is bounded like the counts.
        if self.walked_by_pid.len() < MAX_KEYS || self.walked_by_pid.contains_key(&key.pid) {
            let w = self.walked_by_pid.entry(key.pid).or_default();
            w.samples += 1;
            if WalkOutcome::try_from(key.outcome).is_ok_and(WalkOutcome::is_complete) {
                w.complete += 1;
            }
        }
    }

    /// The samples of process `pid` walked in user space so far.
    pub(super) fn walked_of(&self, pid: u32) -> super::DeferredWalks {
        self.walked_by_pid.get(&pid).copied().unwrap_or_default()
    }

    /// The id in `kernel_stacks` of the off-CPU kernel stack stored under `key` in
    /// `STACKS` (read and removed from the map the first time; -1: none).
    pub(super) fn off_cpu_kernel_stack(
        &mut self,
        key: u64,
        kernel_stacks: &mut KernelStacks,
    ) -> i32 {
        let stacks_map = &mut self.stacks_map;
        kernel_stacks.intern_stored(key, |key| {
            let stack = stacks_map.get(&key, 0).ok()?;
            let _ = stacks_map.remove(&key);
            let len = (stack.len as usize).min(stack.frames.len());
            stack.frames.get(..len).map(<[u64]>::to_vec)
        })
    }

    /// Counts one off-CPU sleep walked in user space: `ns` asleep, `state` its flags
    /// (`sframe_common::offcpu`), `frames` its user stack.
    pub(super) fn add_walked_off_cpu(
        &mut self,
        key: CountKey,
        state: u32,
        ns: u64,
        frames: &[u64],
    ) {
        let key = CountKey {
            outcome: key.outcome | state,
            ..key
        };
        self.kept.add(Kind::OffCpu, key, ns, Some(frames));
    }

    /// Moves the kernel's counts and user stacks into user space (their kernel stacks
    /// interned into `kernel_stacks`), emptying the kernel's maps for the samples to
    /// come: they hold about a second of a busy machine's samples (`MAX_STACKS`).
    /// `bind` rewrites the words of each user stack new to user space (of its process):
    /// see [`PyNamer::bind`](crate::python::PyNamer::bind).
    pub(super) fn drain(&mut self, kernel_stacks: &mut KernelStacks, bind: &mut Bind<'_>) {
        let mut drained = drain(&mut self.counts_map, Kind::OnCpu);
        // Off CPU: the kernel stack is a key in `STACKS`, made an id of `kernel_stacks`
        // here (-1 meaning none, as for on-CPU keys).
        for (key, ns) in drain_keys(&mut self.off_cpu_map) {
            let kernel_stack = self.off_cpu_kernel_stack(key.kernel_stack, kernel_stacks);
            drained.push((
                Kind::OffCpu,
                CountKey {
                    pid: key.pid,
                    tid: key.tid,
                    user_stack: key.user_stack,
                    kernel_stack,
                    outcome: key.outcome,
                    comm: key.comm,
                },
                ns,
            ));
        }
        // The user stacks not copied yet, read once each. Every stack the drained keys
        // name is removed from the kernel's map, copied or not: the walker stores a
        // stack again when it is missing, and the map must not fill up with stacks user
        // space holds already.
        let mut read: StdHashMap<u64, Option<Vec<u64>>> = StdHashMap::new();
        for (_, key, _) in &drained {
            let id = key.user_stack;
            if id == 0 || read.contains_key(&id) {
                continue;
            }
            let mut frames = if self.kept.stacks.contains_key(&id) {
                None
            } else {
                self.stacks_map.get(&id, 0).ok().and_then(|stack| {
                    let len = (stack.len as usize).min(stack.frames.len());
                    stack.frames.get(..len).map(<[u64]>::to_vec)
                })
            };
            let _ = self.stacks_map.remove(&id);
            if let Some(frames) = &mut frames {
                bind(key.pid, frames);
            }
            read.insert(id, frames);
        }
        let mut round = StdHashMap::new();
        for (kind, key, n) in drained {
            // On CPU, the kernel stack is an id of the kernel's stack-trace map (off CPU
            // it was made one of `kernel_stacks` above).
            let key = match kind {
                Kind::OnCpu => CountKey {
                    kernel_stack: kernel_stacks.intern(key.kernel_stack, &mut round),
                    ..key
                },
                Kind::OffCpu => key,
            };
            let frames = read.get(&key.user_stack).and_then(Option::as_deref);
            self.kept.add(kind, key, n, frames);
        }
        let failed = self.counter(Counter::KernelStackFailed);
        kernel_stacks.empty_when_full(failed);
        self.empty_stacks_when_full();
    }

    /// The kernel's counter `c`, summed over CPUs.
    fn counter(&self, c: Counter) -> u64 {
        self.counters_map
            .get(&(c as u32), 0)
            .map_or(0, |v| v.iter().sum())
    }

    /// Empties `STACKS` after a drain when a kernel map was full since the last one. A
    /// stack no drained count names stays there otherwise (the kernel stores a stack,
    /// then finds no room for its count), and a full map's stacks stay for good: every
    /// new stack would then be counted without frames. A sample counted between this
    /// drain's reading of the counts and the emptying loses its stack (its count is
    /// drained next time without frames); the map was full, so such samples were losing
    /// theirs already.
    fn empty_stacks_when_full(&mut self) {
        let failures = self
            .counter(Counter::StackMapFull)
            .saturating_add(self.counter(Counter::CountMapFull))
            .saturating_add(self.counter(Counter::OffCpuMapFull));
        if failures == self.map_failures {
            return;
        }
        self.map_failures = failures;
        let keys: Vec<u64> = self.stacks_map.keys().filter_map(Result::ok).collect();
        for key in keys {
            let _ = self.stacks_map.remove(&key);
        }
    }

    /// [`Counts::drain`], then everything counted so far.
    pub(super) fn collect(
        &mut self,
        kernel_stacks: &mut KernelStacks,
        bind: &mut Bind<'_>,
    ) -> Snapshot {
        self.drain(kernel_stacks, bind);
        let [on_cpu, off_cpu] = &self.kept.counts;
        let mut snap = Snapshot {
            counts: on_cpu
                .iter()
                .map(|(k, &count)| StackCount { key: *k, count })
                .collect(),
            off_cpu: off_cpu
                .iter()
                .map(|(k, &ns)| StackCount { key: *k, count: ns })
                .collect(),
            ..Snapshot::default()
        };
        for (i, slot) in snap.outcomes.iter_mut().enumerate() {
            if let Ok(v) = self.outcomes_map.get(&(i as u32), 0) {
                *slot = v.iter().sum();
            }
            *slot += self.walked_here.get(i).copied().unwrap_or(0);
        }
        for (i, slot) in snap.counters.iter_mut().enumerate() {
            if let Ok(v) = self.counters_map.get(&(i as u32), 0) {
                *slot = v.iter().sum();
            }
        }
        snap
    }

    /// Stacks in the kernel's `STACKS` map now (user stacks and off-CPU kernel stacks).
    pub(super) fn stacks_in_kernel(&self) -> usize {
        self.stacks_map.keys().filter(Result::is_ok).count()
    }

    /// Drops the counts of the processes `gone`, and the stacks no count uses any more.
    pub(super) fn forget(&mut self, gone: &HashSet<u32>) {
        self.kept.forget(gone);
        self.walked_by_pid.retain(|pid, _| !gone.contains(pid));
    }

    /// Whether the counts kept (keys or stack words, all processes together) are over
    /// `num/den` of their bounds.
    pub(super) fn crowded(&self, num: usize, den: usize) -> bool {
        self.kept.crowded(num, den)
    }

    /// The keys and stack words kept beyond `num/den` of their bounds.
    pub(super) fn excess(&self, num: usize, den: usize) -> (usize, usize) {
        self.kept.excess(num, den)
    }

    /// The keys and stack words charged to process `pid` (a stack shared by several
    /// processes is charged to the lowest pid).
    pub(super) fn charge(&self, pid: u32) -> (usize, usize) {
        self.kept
            .charges
            .get(&pid)
            .map_or((0, 0), |c| (c.keys, c.words))
    }

    /// The frames of a user stack (innermost first) seen by `collect`.
    pub(super) fn stack(&self, id: u64) -> Option<&[u64]> {
        self.kept.stacks.get(&id).map(Vec::as_slice)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SMALL: Bounds = Bounds {
        keys: 40,
        keys_per_process: 10,
        words: 60,
        words_per_process: 20,
    };

    fn key(pid: u32, tid: u32, user_stack: u64) -> CountKey {
        CountKey {
            pid,
            tid,
            user_stack,
            kernel_stack: 7,
            outcome: WalkOutcome::Complete as u32,
            comm: *b"worker\0\0\0\0\0\0\0\0\0\0",
        }
    }

    fn total(kept: &Kept, pid: u32) -> u64 {
        kept.counts[0]
            .iter()
            .filter(|(k, _)| k.pid == pid)
            .map(|(_, n)| n)
            .sum()
    }

    #[test]
    fn a_process_making_new_keys_is_folded_at_its_own_bound_and_others_keep_theirs() {
        let mut kept = Kept::new(SMALL);
        // A hostile process: a new thread and stack for every sample.
        for i in 0..1000u64 {
            kept.add(Kind::OnCpu, key(666, i as u32, 1000 + i), 3, Some(&[i]));
        }
        assert_eq!(total(&kept, 666), 3000, "every sample still counted");
        let own = kept.counts[0].keys().filter(|k| k.pid == 666).count();
        assert!(own <= SMALL.keys_per_process + 1, "{own} keys");
        assert_eq!(kept.folded, 3 * (1000 - SMALL.keys_per_process as u64));
        let root = folded(key(666, 0, 0));
        assert_eq!(root.user_stack, 0);
        assert_eq!(root.tid, 0);
        assert_eq!(root.kernel_stack, -1);
        assert!(kept.counts[0][&root] > 0);
        // Another process's stacks are kept whole.
        for i in 0..5u64 {
            kept.add(Kind::OnCpu, key(42, 1, 1 + i), 1, Some(&[1, 2, 3]));
        }
        assert_eq!(kept.counts[0].keys().filter(|k| k.pid == 42).count(), 5);
        assert!(kept.stacks.len() <= SMALL.keys_per_process + 5);
    }

    #[test]
    fn stack_words_are_bounded_per_process_and_in_all() {
        let mut kept = Kept::new(SMALL);
        let long = [9u64; 15];
        // 20 words per process: the second 15-word stack does not fit.
        kept.add(Kind::OnCpu, key(1, 1, 1), 1, Some(&long));
        kept.add(Kind::OnCpu, key(1, 1, 2), 1, Some(&long));
        assert_eq!(kept.words, 15);
        assert_eq!(kept.folded, 1);
        // A stack already kept costs another process nothing.
        kept.add(Kind::OnCpu, key(2, 1, 1), 1, None);
        assert_eq!(kept.counts[0][&key(2, 1, 1)], 1);
        // Without its frames a new stack cannot be kept.
        kept.add(Kind::OnCpu, key(2, 1, 3), 1, None);
        assert_eq!(kept.folded, 2);
        for pid in 3..10 {
            kept.add(
                Kind::OnCpu,
                key(pid, 1, u64::from(pid) * 100),
                1,
                Some(&long),
            );
        }
        assert!(kept.words <= SMALL.words, "{} words", kept.words);
    }

    #[test]
    fn forgetting_a_process_gives_its_room_back() {
        let mut kept = Kept::new(SMALL);
        for i in 0..SMALL.keys_per_process as u64 {
            kept.add(Kind::OnCpu, key(5, 1, 10 + i), 1, Some(&[1, 2]));
        }
        kept.add(Kind::OnCpu, key(5, 1, 99), 1, Some(&[1]));
        assert_eq!(kept.folded, 1);
        kept.add(Kind::OnCpu, key(6, 1, 10), 1, None);
        kept.forget(&HashSet::from([5]));
        assert_eq!(kept.counts[0].len(), 1, "pid 6's key is left");
        assert_eq!(kept.stacks.len(), 1, "and the stack it shares");
        assert_eq!(kept.words, 2);
        assert_eq!(kept.charges[&6].words, 2, "charged to its user now");
        for i in 0..SMALL.keys_per_process as u64 - 1 {
            kept.add(Kind::OnCpu, key(6, 2, 200 + i), 1, Some(&[1]));
        }
        assert_eq!(kept.folded, 1, "room back for pid 6");
    }
}
