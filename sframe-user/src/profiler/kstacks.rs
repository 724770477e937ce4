//! Kernel stacks of the samples: the kernel's stack map (`KERNEL_STACKS`, whose ids are
//! reused once it is emptied) copied into ids of this profiler's own, each distinct
//! stack stored once.

use std::{
    collections::{HashMap, HashSet},
    sync::Arc,
};

use aya::maps::{MapData, StackTraceMap};

/// Distinct kernel stacks kept (each read from the kernel map once and kept for the
/// whole profile): past it, a sample's kernel stack is dropped (counted in `dropped`).
pub const MAX_KERNEL_STACKS_KEPT: usize = 65_536;

pub(super) struct KernelStacks {
    map: StackTraceMap<MapData>,
    /// Stacks by this profiler's id (the index), innermost first.
    frames: Vec<Arc<[u64]>>,
    /// The id of each distinct stack in `frames`.
    ids: HashMap<Arc<[u64]>, i32>,
    /// Kernel map ids read since the map was last emptied.
    read: HashSet<u32>,
    /// Entries of the kernel map.
    capacity: u32,
    /// `kernel_stack_failed` when the kernel map was last emptied.
    failures: u64,
    /// Samples whose kernel stack was new when `MAX_KERNEL_STACKS_KEPT` were kept.
    pub(super) dropped: u64,
    /// Off-CPU kernel stacks: this profiler's id by their key in `STACKS`.
    by_key: HashMap<u64, i32>,
}

impl KernelStacks {
    pub(super) fn new(map: StackTraceMap<MapData>, capacity: u32) -> Self {
        Self {
            map,
            frames: Vec::new(),
            ids: HashMap::new(),
            read: HashSet::new(),
            capacity,
            failures: 0,
            dropped: 0,
            by_key: HashMap::new(),
        }
    }

    /// This profiler's id of the kernel stack with kernel map id `id` (negative: none),
    /// read from the map once per collection (`round`).
    pub(super) fn intern(&mut self, id: i32, round: &mut HashMap<i32, i32>) -> i32 {
        if id < 0 {
            return id;
        }
        if let Some(&mine) = round.get(&id) {
            return mine;
        }
        let Ok(trace) = self.map.get(&(id as u32), 0) else {
            return -1;
        };
        self.read.insert(id as u32);
        let mine = self.intern_frames(trace.frames().iter().map(|f| f.ip).collect());
        round.insert(id, mine);
        mine
    }

    /// This profiler's id of a stack of `frames` (innermost first); -1 past the bound.
    fn intern_frames(&mut self, frames: Arc<[u64]>) -> i32 {
        match self.ids.get(&frames) {
            Some(&mine) => mine,
            None if self.frames.len() >= MAX_KERNEL_STACKS_KEPT => {
                self.dropped += 1;
                -1
            }
            None => {
                let mine = i32::try_from(self.frames.len()).unwrap_or(i32::MAX);
                self.frames.push(frames.clone());
                self.ids.insert(frames, mine);
                mine
            }
        }
    }

    /// This profiler's id of the off-CPU kernel stack stored under `key` in `STACKS`
    /// (0: none), `read` taking its frames out of the map the first time.
    pub(super) fn intern_stored(
        &mut self,
        key: u64,
        read: impl FnOnce(u64) -> Option<Vec<u64>>,
    ) -> i32 {
        if key == 0 {
            return -1;
        }
        // Read (and so taken out of the kernel's map, which must not fill up with
        // stacks user space holds) every time the key comes back.
        let frames = read(key);
        if let Some(&mine) = self.by_key.get(&key) {
            return mine;
        }
        let Some(frames) = frames else {
            return -1;
        };
        let mine = self.intern_frames(frames.into());
        if mine >= 0 {
            self.by_key.insert(key, mine);
        }
        mine
    }

    /// Empties the kernel map once half of it has been read, or when stacks failed to
    /// find room since the last time (`failures`: the map's buckets are hashed, it
    /// refuses stacks well before it is full). Its stacks are copied already; a sample
    /// counted between this collection's reading and the removal may lose its kernel
    /// stack (or, rarely, get the stack that reuses its id).
    pub(super) fn empty_when_full(&mut self, failures: u64) {
        let half = self.read.len() as u64 * 2 >= u64::from(self.capacity);
        if !half && failures <= self.failures {
            return;
        }
        for id in self.read.drain() {
            let _ = self.map.remove(&id);
        }
        self.failures = failures;
    }

    /// The frames of a stack (innermost first) by this profiler's id.
    pub(super) fn get(&self, id: i32) -> Option<&[u64]> {
        let i = usize::try_from(id).ok()?;
        self.frames.get(i).map(|f| &f[..])
    }
}
