//! The kernel side of the unwind tables: the BPF maps of `sframe_common::layout`, and
//! the allocation of their space among objects.
//!
//! ROWS and PAGES are `BPF_F_MMAPABLE` arrays mapped into this process a chunk at a
//! time as loads and walks of deferred samples touch them (unmapped when idle), so
//! loading an object is a memory copy, not a syscall per row. OBJECTS, RULES and PROCESSES are
//! updated with one syscall per entry (objects, new rules, processes).

use sframe_common::names::maps;
use std::{
    cell::Cell,
    os::fd::{AsFd as _, AsRawFd as _},
    ptr::NonNull,
};

use aya::{
    Ebpf,
    maps::{Array, HashMap, Map, MapData},
};
use sframe_common::{
    budget::MAX_MAPPINGS,
    layout::{
        MappingEntry, ObjectEntry, PAGE_BLOCK, PageBlock, ProcessEntry, ROW_BLOCK, RowBlock,
        RowEntry, RuleEntry,
    },
};

use crate::{
    bpf::LoadError,
    flatten::{FlatObject, RuleDict},
};

#[derive(Debug, thiserror::Error)]
pub enum TablesError {
    #[error("kernel table space exhausted: {what} needs {needed} more entries, {free} free")]
    Full {
        what: &'static str,
        needed: u64,
        free: u64,
    },
    #[error("updating map {map}: {source}")]
    Map {
        map: &'static str,
        #[source]
        source: aya::maps::MapError,
    },
    #[error("mapping map {map} into memory: {source}")]
    Mmap {
        map: &'static str,
        #[source]
        source: std::io::Error,
    },
    #[error(transparent)]
    Flatten(#[from] crate::flatten::FlattenError),
}

/// Bytes of an mmapable array mapped at once: a load or a walk maps only the chunks it
/// touches.
const CHUNK_BYTES: usize = 256 << 10;

/// A `BPF_F_MMAPABLE` array map, mapped read-write into this process a chunk at a time,
/// as loads and walks touch it. The kernel inserts every page of a mapping at `mmap`
/// time, so a mapped chunk counts in the profiler's RSS on top of the kernel memory it
/// is (the whole of ROWS would be 16 MB): only touched chunks are mapped, and
/// [`KernelTables::unmap_if_idle`] unmaps them when no load or walk used them for a
/// while.
struct MmapArray<T> {
    /// Mapped chunks by number ([`CHUNK_BYTES`] each, the last one shorter).
    chunks: Box<[Cell<Option<NonNull<T>>>]>,
    /// Elements in all, and per chunk.
    len: usize,
    per_chunk: usize,
    /// The array's size in bytes, rounded up to pages.
    bytes: usize,
    name: &'static str,
    map: MapData,
}

impl<T: Copy> MmapArray<T> {
    fn new(ebpf: &mut Ebpf, name: &'static str) -> Result<Self, LoadError> {
        const { assert!(CHUNK_BYTES.is_multiple_of(size_of::<T>()) && CHUNK_BYTES.is_multiple_of(4096)) };
        let map = ebpf.take_map(name).ok_or(LoadError::MissingMap { name })?;
        let Map::Array(map) = map else {
            return Err(LoadError::MissingMap { name });
        };
        let info = map
            .info()
            .map_err(|source| LoadError::Map { name, source })?;
        let len = info.max_entries() as usize;
        let bytes = (len * size_of::<T>()).div_ceil(4096) * 4096;
        let array = Self {
            chunks: (0..bytes.div_ceil(CHUNK_BYTES))
                .map(|_| Cell::new(None))
                .collect(),
            len,
            per_chunk: CHUNK_BYTES / size_of::<T>(),
            bytes,
            name,
            map,
        };
        // A map that cannot be mapped fails the load here, not at the first object.
        if len > 0 {
            array
                .chunk(0)
                .map_err(|source| LoadError::Mmap { name, source })?;
        }
        Ok(array)
    }

    /// Chunk `c`, mapped now if it was not.
    fn chunk(&self, c: usize) -> std::io::Result<NonNull<T>> {
        let cell = self
            .chunks
            .get(c)
            .ok_or_else(|| std::io::Error::from(std::io::ErrorKind::InvalidInput))?;
        if let Some(ptr) = cell.get() {
            return Ok(ptr);
        }
        let offset = c * CHUNK_BYTES;
        // SAFETY: a shared read-write mapping of the BPF array's descriptor, of a
        // page-aligned range inside the array (the kernel checks it too).
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                self.chunk_bytes(c),
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                self.map.fd().as_fd().as_raw_fd(),
                offset as libc::off_t,
            )
        };
        if ptr == libc::MAP_FAILED {
            return Err(std::io::Error::last_os_error());
        }
        let ptr = NonNull::new(ptr.cast::<T>())
            .ok_or_else(|| std::io::Error::from(std::io::ErrorKind::AddrNotAvailable))?;
        cell.set(Some(ptr));
        Ok(ptr)
    }

    fn chunk_bytes(&self, c: usize) -> usize {
        CHUNK_BYTES.min(self.bytes - c * CHUNK_BYTES)
    }

    /// Element `i`, its chunk mapped if needed; `None` past the end or if the chunk
    /// cannot be mapped.
    fn get(&self, i: usize) -> Option<T> {
        if i >= self.len {
            return None;
        }
        let ptr = self.chunk(i / self.per_chunk).ok()?;
        // SAFETY: `i % per_chunk` is inside the chunk (its bytes hold `per_chunk`
        // elements, the last chunk at least those up to `len`), mapped until `unmap`,
        // which takes `&mut self`.
        Some(unsafe { ptr.as_ptr().add(i % self.per_chunk).read() })
    }

    /// Writes element `i`, mapping its chunk if needed.
    fn set(&mut self, i: usize, value: T) -> Result<(), TablesError> {
        let mapped = if i < self.len {
            self.chunk(i / self.per_chunk)
        } else {
            Err(std::io::Error::from(std::io::ErrorKind::InvalidInput))
        };
        let ptr = mapped.map_err(|source| TablesError::Mmap {
            map: self.name,
            source,
        })?;
        // SAFETY: as in `get`; the kernel side only reads the array.
        unsafe { ptr.as_ptr().add(i % self.per_chunk).write(value) };
        Ok(())
    }

    /// Bytes of the array mapped into this process now.
    fn mapped_bytes(&self) -> usize {
        self.chunks
            .iter()
            .enumerate()
            .filter(|(_, chunk)| chunk.get().is_some())
            .map(|(c, _)| self.chunk_bytes(c))
            .sum()
    }

    fn unmap(&mut self) {
        for c in 0..self.chunks.len() {
            if let Some(ptr) = self.chunks.get_mut(c).and_then(|chunk| chunk.take()) {
                // SAFETY: unmapping what `chunk` mapped; no reference into it outlives
                // `&mut self`.
                unsafe { libc::munmap(ptr.as_ptr().cast(), self.chunk_bytes(c)) };
            }
        }
    }
}

impl<T> Drop for MmapArray<T> {
    fn drop(&mut self) {
        for (c, cell) in self.chunks.iter().enumerate() {
            if let Some(ptr) = cell.take() {
                let len = CHUNK_BYTES.min(self.bytes - c * CHUNK_BYTES);
                // SAFETY: unmapping what `chunk` mapped.
                unsafe { libc::munmap(ptr.as_ptr().cast(), len) };
            }
        }
    }
}

/// Where one object's tables live in the kernel.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Placement {
    pub object: u32,
    pub rows: u32,
    pub pages: u32,
    pub kernel_bytes: u64,
    /// First block and block count of its rows and of its page entries.
    row_blocks: (u32, u32),
    page_blocks: (u32, u32),
}

/// First-fit allocation of block ranges, with coalescing on free.
#[derive(Debug)]
struct RangeAlloc {
    /// Free ranges: start → length (disjoint, never adjacent).
    free: std::collections::BTreeMap<u32, u32>,
    used: u32,
}

impl RangeAlloc {
    fn new(capacity: u32) -> Self {
        let mut free = std::collections::BTreeMap::new();
        if capacity > 0 {
            free.insert(0, capacity);
        }
        Self { free, used: 0 }
    }

    fn alloc(&mut self, n: u32) -> Option<u32> {
        if n == 0 {
            return Some(0);
        }
        let (&start, &len) = self.free.iter().find(|&(_, &len)| len >= n)?;
        self.free.remove(&start);
        if len > n {
            self.free.insert(start + n, len - n);
        }
        self.used += n;
        Some(start)
    }

    fn free(&mut self, start: u32, n: u32) {
        if n == 0 {
            return;
        }
        self.used -= n;
        let (mut start, mut n) = (start, n);
        if let Some((&prev, &plen)) = self.free.range(..start).next_back()
            && prev + plen == start
        {
            self.free.remove(&prev);
            start = prev;
            n += plen;
        }
        if let Some(&next_len) = self.free.get(&(start + n)) {
            self.free.remove(&(start + n));
            n += next_len;
        }
        self.free.insert(start, n);
    }

    fn largest_free(&self) -> u32 {
        self.free.values().copied().max().unwrap_or(0)
    }
}

/// The unwind-table maps and their allocation state.
pub struct KernelTables {
    processes: HashMap<MapData, u32, ProcessEntry>,
    objects: Array<MapData, ObjectEntry>,
    /// What `objects` holds, by id (for walks in user space).
    object_entries: Vec<ObjectEntry>,
    rules: Array<MapData, RuleEntry>,
    rows: MmapArray<RowBlock>,
    pages: MmapArray<PageBlock>,
    /// Object ids never used yet start here; freed ids are reused from `free_objects`.
    next_object: u32,
    free_objects: Vec<u32>,
    object_capacity: u32,
    row_alloc: RangeAlloc,
    page_alloc: RangeAlloc,
    /// Rows and page entries of loaded objects (not rounded to blocks).
    rows_in_use: u64,
    pages_in_use: u64,
    loaded_objects: u32,
    dict: RuleDict,
    uploaded_rules: usize,
    /// Last load or [`KernelTables::view`] (see [`KernelTables::unmap_if_idle`]).
    last_use: Cell<std::time::Instant>,
}

fn take<T: TryFrom<Map, Error = aya::maps::MapError>>(
    ebpf: &mut Ebpf,
    name: &'static str,
) -> Result<T, LoadError> {
    let map = ebpf.take_map(name).ok_or(LoadError::MissingMap { name })?;
    T::try_from(map).map_err(|source| LoadError::Map { name, source })
}

impl KernelTables {
    pub fn new(ebpf: &mut Ebpf) -> Result<Self, LoadError> {
        let objects: Array<MapData, ObjectEntry> = take(ebpf, maps::OBJECTS)?;
        let object_capacity = objects.len();
        let rows: MmapArray<RowBlock> = MmapArray::new(ebpf, maps::ROWS)?;
        let pages: MmapArray<PageBlock> = MmapArray::new(ebpf, maps::PAGES)?;
        Ok(Self {
            processes: take(ebpf, maps::PROCESSES)?,
            objects,
            object_entries: Vec::new(),
            rules: take(ebpf, maps::RULES)?,
            row_alloc: RangeAlloc::new(rows.len as u32),
            page_alloc: RangeAlloc::new(pages.len as u32),
            rows,
            pages,
            next_object: 0,
            free_objects: Vec::new(),
            object_capacity,
            rows_in_use: 0,
            pages_in_use: 0,
            loaded_objects: 0,
            dict: RuleDict::default(),
            uploaded_rules: 0,
            last_use: Cell::new(std::time::Instant::now()),
        })
    }

    pub fn rule_dict(&mut self) -> &mut RuleDict {
        &mut self.dict
    }

    /// Rows in use, row capacity.
    pub fn row_usage(&self) -> (u64, u64) {
        (self.rows_in_use, (self.rows.len * ROW_BLOCK) as u64)
    }

    /// Objects loaded now.
    pub fn loaded_objects(&self) -> u32 {
        self.loaded_objects
    }

    /// Bytes of kernel table memory in use: rows, pages, objects and rules.
    pub fn bytes_in_use(&self) -> u64 {
        self.rows_in_use * 4
            + self.pages_in_use * 4
            + u64::from(self.loaded_objects) * size_of::<ObjectEntry>() as u64
            + self.dict.len() as u64 * size_of::<RuleEntry>() as u64
    }

    /// Bytes the row and page maps can hold (the table memory budget).
    pub fn capacity_bytes(&self) -> u64 {
        (self.rows.len * size_of::<RowBlock>() + self.pages.len * size_of::<PageBlock>()) as u64
    }

    /// Frees an object's rows, pages and id. Its entry is cleared first, so a walk
    /// that still reaches it finds no pages (no rule) rather than another's rows.
    pub fn unload_object(&mut self, p: &Placement) -> Result<(), TablesError> {
        self.objects
            .set(p.object, ObjectEntry::default(), 0)
            .map_err(|source| TablesError::Map {
                map: maps::OBJECTS,
                source,
            })?;
        if let Some(e) = self.object_entries.get_mut(p.object as usize) {
            *e = ObjectEntry::default();
        }
        self.row_alloc.free(p.row_blocks.0, p.row_blocks.1);
        self.page_alloc.free(p.page_blocks.0, p.page_blocks.1);
        self.free_objects.push(p.object);
        self.rows_in_use -= u64::from(p.rows);
        self.pages_in_use -= u64::from(p.pages);
        self.loaded_objects -= 1;
        Ok(())
    }

    /// Copies a flattened object into the maps and returns its id. Rules it interned in
    /// the dictionary must be uploaded first: this does it.
    pub fn load_object(&mut self, flat: &FlatObject) -> Result<Placement, TablesError> {
        self.upload_rules()?;
        let id = match self.free_objects.last() {
            Some(&id) => id,
            None if self.next_object < self.object_capacity => self.next_object,
            None => {
                return Err(TablesError::Full {
                    what: "objects",
                    needed: 1,
                    free: 0,
                });
            }
        };
        // Each object's rows and pages start on a block boundary so that blocks are
        // never shared: a later object cannot race with a reader of an earlier one.
        let rows = flat.rows.len() as u64;
        let pages = flat.pages.len() as u64;
        let row_blocks = u32::try_from(rows.div_ceil(ROW_BLOCK as u64)).unwrap_or(u32::MAX);
        let page_blocks = u32::try_from(pages.div_ceil(PAGE_BLOCK as u64)).unwrap_or(u32::MAX);
        let Some(row_block) = self.row_alloc.alloc(row_blocks) else {
            return Err(TablesError::Full {
                what: "rows",
                needed: rows,
                free: u64::from(self.row_alloc.largest_free()) * ROW_BLOCK as u64,
            });
        };
        let Some(page_block) = self.page_alloc.alloc(page_blocks) else {
            self.row_alloc.free(row_block, row_blocks);
            return Err(TablesError::Full {
                what: "pages",
                needed: pages,
                free: u64::from(self.page_alloc.largest_free()) * PAGE_BLOCK as u64,
            });
        };
        let row_first = row_block as usize * ROW_BLOCK;
        let page_first = page_block as usize * PAGE_BLOCK;
        // Whole blocks (an object's rows and pages start on a block boundary and no
        // other object shares its blocks), each chunk mapped as the copy reaches it.
        self.last_use.set(std::time::Instant::now());
        let written = (|| {
            for (b, rows) in flat.rows.chunks(ROW_BLOCK).enumerate() {
                let mut block = RowBlock::default();
                // `chunks` gives at most a block's worth.
                for (slot, row) in block.0.iter_mut().zip(rows) {
                    *slot = *row;
                }
                self.rows.set(row_block as usize + b, block)?;
            }
            for (b, entries) in flat.pages.chunks(PAGE_BLOCK).enumerate() {
                let mut block = PageBlock::default();
                for (slot, entry) in block.0.iter_mut().zip(entries) {
                    *slot = *entry;
                }
                self.pages.set(page_block as usize + b, block)?;
            }
            Ok(())
        })();
        if let Err(e) = written {
            self.row_alloc.free(row_block, row_blocks);
            self.page_alloc.free(page_block, page_blocks);
            return Err(e);
        }
        let entry = ObjectEntry {
            base: flat.base,
            page_first: page_first as u32,
            page_count: flat.page_count(),
            row_first: row_first as u32,
            page_shift: flat.page_shift,
        };
        if let Err(source) = self.objects.set(id, entry, 0) {
            self.row_alloc.free(row_block, row_blocks);
            self.page_alloc.free(page_block, page_blocks);
            return Err(TablesError::Map {
                map: maps::OBJECTS,
                source,
            });
        }
        let slot = id as usize;
        if self.object_entries.len() <= slot {
            self.object_entries.resize(slot + 1, ObjectEntry::default());
        }
        if let Some(e) = self.object_entries.get_mut(slot) {
            *e = entry;
        }
        if self.free_objects.last() == Some(&id) {
            self.free_objects.pop();
        } else {
            self.next_object += 1;
        }
        self.rows_in_use += rows;
        self.pages_in_use += pages;
        self.loaded_objects += 1;
        Ok(Placement {
            object: id,
            rows: rows as u32,
            pages: pages as u32,
            kernel_bytes: flat.kernel_bytes(),
            row_blocks: (row_block, row_blocks),
            page_blocks: (page_block, page_blocks),
        })
    }

    fn upload_rules(&mut self) -> Result<(), TablesError> {
        let rules = self.dict.rules();
        while let Some(&rule) = rules.get(self.uploaded_rules) {
            let i = self.uploaded_rules;
            self.rules
                .set(i as u32, rule, 0)
                .map_err(|source| TablesError::Map {
                    map: maps::RULES,
                    source,
                })?;
            self.uploaded_rules += 1;
        }
        Ok(())
    }

    /// Installs a process's executable mappings (at most `MAX_MAPPINGS`, sorted by the
    /// caller); returns how many did not fit.
    pub fn set_process(
        &mut self,
        pid: u32,
        mappings: &[MappingEntry],
    ) -> Result<usize, TablesError> {
        let mut entry = Box::<ProcessEntry>::default();
        let n = mappings.len().min(MAX_MAPPINGS);
        for (slot, m) in entry.mappings.iter_mut().zip(mappings) {
            *slot = *m;
        }
        entry.count = n as u32;
        entry.addr_bits = process_addr_bits(mappings);
        self.processes
            .insert(pid, *entry, 0)
            .map_err(|source| TablesError::Map {
                map: maps::PROCESSES,
                source,
            })?;
        Ok(mappings.len() - n)
    }

    pub fn remove_process(&mut self, pid: u32) {
        let _ = self.processes.remove(&pid);
    }

    /// Pids with a mapping table in the kernel map (including ones the kernel side
    /// added for children).
    pub fn process_ids(&self) -> Vec<u32> {
        self.processes.keys().filter_map(Result::ok).collect()
    }
}

/// The kernel tables seen from user space, for one process's mappings: the same
/// `Tables` the BPF program walks with (deferred samples are unwound with it).
pub struct KernelView<'a> {
    tables: &'a KernelTables,
    mappings: &'a [MappingEntry],
    /// `return_address_mask`, computed once per view (it is asked at every step).
    ra_mask: u64,
}

impl KernelTables {
    pub fn view<'a>(&'a self, mappings: &'a [MappingEntry]) -> KernelView<'a> {
        self.last_use.set(std::time::Instant::now());
        KernelView {
            tables: self,
            mappings,
            ra_mask: sframe_common::layout::addr_mask(process_addr_bits(mappings)),
        }
    }

    /// Unmaps ROWS and PAGES when no load or walk ([`KernelTables::view`]) used them
    /// for `idle`: their pages are kernel memory, counted once more in the profiler's
    /// RSS while mapped. Returns whether anything was unmapped now.
    pub fn unmap_if_idle(&mut self, idle: std::time::Duration) -> bool {
        if self.mapped_bytes() == 0 || self.last_use.get().elapsed() < idle {
            return false;
        }
        self.rows.unmap();
        self.pages.unmap();
        true
    }

    /// Bytes of ROWS and PAGES mapped into this process now (the chunks loads and walks
    /// touched since they were last unmapped).
    pub fn mapped_bytes(&self) -> u64 {
        (self.rows.mapped_bytes() + self.pages.mapped_bytes()) as u64
    }
}

/// `ProcessEntry::addr_bits` of a process with these executable mappings, on the
/// architecture the profiler runs on.
pub fn process_addr_bits(mappings: &[MappingEntry]) -> u32 {
    let max_end = mappings.iter().map(|m| m.end).max().unwrap_or(0);
    sframe_common::layout::addr_bits(cfg!(target_arch = "aarch64"), max_end)
}

impl sframe_common::step::Tables for KernelView<'_> {
    fn return_address_mask(&mut self) -> u64 {
        self.ra_mask
    }
    fn mapping_count(&mut self) -> u32 {
        self.mappings.len().min(MAX_MAPPINGS) as u32
    }
    fn mapping(&mut self, index: u32) -> Option<MappingEntry> {
        self.mappings.get(index as usize).copied()
    }
    fn object(&mut self, id: u32) -> Option<ObjectEntry> {
        self.tables.object_entries.get(id as usize).copied()
    }
    fn page_entry(&mut self, index: u32) -> Option<u32> {
        let i = index as usize;
        self.tables
            .pages
            .get(i / PAGE_BLOCK)
            .and_then(|b| b.0.get(i % PAGE_BLOCK).copied())
    }
    fn row(&mut self, index: u32) -> Option<RowEntry> {
        let i = index as usize;
        self.tables
            .rows
            .get(i / ROW_BLOCK)
            .and_then(|b| b.0.get(i % ROW_BLOCK).copied())
    }
    fn rule(&mut self, index: u16) -> Option<RuleEntry> {
        self.tables.dict.rules().get(usize::from(index)).copied()
    }
}

/// Reads back rows for tests and diagnostics.
impl KernelTables {
    pub fn row(&mut self, index: u32) -> Option<RowEntry> {
        let i = index as usize;
        self.rows
            .get(i / ROW_BLOCK)
            .and_then(|b| b.0.get(i % ROW_BLOCK).copied())
    }
}

#[cfg(test)]
mod tests {
    use super::RangeAlloc;

    #[test]
    fn ranges_are_reused_and_coalesced() {
        let mut a = RangeAlloc::new(10);
        let x = a.alloc(4).unwrap();
        let y = a.alloc(4).unwrap();
        assert_eq!((x, y), (0, 4));
        assert_eq!(a.alloc(3), None);
        a.free(x, 4);
        assert_eq!(a.largest_free(), 4);
        a.free(y, 4);
        // All three free ranges merged into one.
        assert_eq!(a.largest_free(), 10);
        assert_eq!(a.used, 0);
        assert_eq!(a.alloc(10), Some(0));
        assert_eq!(a.alloc(0), Some(0));
    }
}
