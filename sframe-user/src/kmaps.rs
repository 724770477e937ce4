//! The kernel side of the unwind tables: the BPF maps of `sframe_common::layout`, and
//! the allocation of their space among objects.
//!
//! ROWS and PAGES are `BPF_F_MMAPABLE` arrays mapped into this process, so loading an
//! object is a memory copy, not a syscall per row. OBJECTS, RULES and PROCESSES are
//! updated with one syscall per entry (objects, new rules, processes).

use std::{
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
    #[error(transparent)]
    Flatten(#[from] crate::flatten::FlattenError),
}

/// A `BPF_F_MMAPABLE` array map mapped read-write into this process.
struct MmapArray<T> {
    ptr: NonNull<T>,
    len: usize,
    bytes: usize,
    _map: MapData,
}

impl<T: Copy> MmapArray<T> {
    fn new(ebpf: &mut Ebpf, name: &'static str) -> Result<Self, LoadError> {
        let map = ebpf.take_map(name).ok_or(LoadError::MissingMap { name })?;
        let Map::Array(data) = map else {
            return Err(LoadError::MissingMap { name });
        };
        let info = data
            .info()
            .map_err(|source| LoadError::Map { name, source })?;
        let len = info.max_entries() as usize;
        let page = 4096usize;
        let bytes = (len * size_of::<T>()).div_ceil(page) * page;
        // SAFETY: mapping a BPF array map fd, shared and read-write, for its whole size.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                bytes,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                data.fd().as_fd().as_raw_fd(),
                0,
            )
        };
        if ptr == libc::MAP_FAILED {
            return Err(LoadError::Mmap {
                name,
                source: std::io::Error::last_os_error(),
            });
        }
        let ptr = NonNull::new(ptr.cast::<T>()).ok_or(LoadError::MissingMap { name })?;
        Ok(Self {
            ptr,
            len,
            bytes,
            _map: data,
        })
    }

    fn as_mut_slice(&mut self) -> &mut [T] {
        // SAFETY: the mapping is `len` elements of T (array element size equals
        // size_of::<T>() because T's size is a multiple of 8), valid while `_map` lives.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }
}

impl<T> Drop for MmapArray<T> {
    fn drop(&mut self) {
        // SAFETY: unmapping what `new` mapped.
        unsafe { libc::munmap(self.ptr.as_ptr().cast(), self.bytes) };
    }
}

/// Where one object's tables live in the kernel.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Placement {
    pub object: u32,
    pub rows: u32,
    pub pages: u32,
    pub kernel_bytes: u64,
}

/// The unwind-table maps and their allocation state.
pub struct KernelTables {
    processes: HashMap<MapData, u32, ProcessEntry>,
    objects: Array<MapData, ObjectEntry>,
    rules: Array<MapData, RuleEntry>,
    rows: MmapArray<RowBlock>,
    pages: MmapArray<PageBlock>,
    next_object: u32,
    object_capacity: u32,
    next_row: u64,
    next_page: u64,
    dict: RuleDict,
    uploaded_rules: usize,
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
        let objects: Array<MapData, ObjectEntry> = take(ebpf, "OBJECTS")?;
        let object_capacity = objects.len();
        Ok(Self {
            processes: take(ebpf, "PROCESSES")?,
            objects,
            rules: take(ebpf, "RULES")?,
            rows: MmapArray::new(ebpf, "ROWS")?,
            pages: MmapArray::new(ebpf, "PAGES")?,
            next_object: 0,
            object_capacity,
            next_row: 0,
            next_page: 0,
            dict: RuleDict::default(),
            uploaded_rules: 0,
        })
    }

    pub fn rule_dict(&mut self) -> &mut RuleDict {
        &mut self.dict
    }

    /// Rows in use, row capacity.
    pub fn row_usage(&self) -> (u64, u64) {
        (self.next_row, (self.rows.len * ROW_BLOCK) as u64)
    }

    /// Bytes of kernel table memory in use: rows, pages, objects and rules.
    pub fn bytes_in_use(&self) -> u64 {
        self.next_row * 4
            + self.next_page * 4
            + u64::from(self.next_object) * size_of::<ObjectEntry>() as u64
            + self.dict.len() as u64 * size_of::<RuleEntry>() as u64
    }

    /// Copies a flattened object into the maps and returns its id. Rules it interned in
    /// the dictionary must be uploaded first: this does it.
    pub fn load_object(&mut self, flat: &FlatObject) -> Result<Placement, TablesError> {
        self.upload_rules()?;
        if self.next_object >= self.object_capacity {
            return Err(TablesError::Full {
                what: "objects",
                needed: 1,
                free: 0,
            });
        }
        // Each object's rows and pages start on a block boundary so that blocks are
        // never shared: a later object cannot race with a reader of an earlier one.
        let row_first = self.next_row.next_multiple_of(ROW_BLOCK as u64);
        let page_first = self.next_page.next_multiple_of(PAGE_BLOCK as u64);
        let row_cap = (self.rows.len * ROW_BLOCK) as u64;
        let page_cap = (self.pages.len * PAGE_BLOCK) as u64;
        let rows = flat.rows.len() as u64;
        let pages = flat.pages.len() as u64;
        if row_first + rows > row_cap || row_first + rows > u64::from(u32::MAX) {
            return Err(TablesError::Full {
                what: "rows",
                needed: rows,
                free: row_cap.saturating_sub(row_first),
            });
        }
        if page_first + pages > page_cap {
            return Err(TablesError::Full {
                what: "pages",
                needed: pages,
                free: page_cap.saturating_sub(page_first),
            });
        }
        let row_blocks = self.rows.as_mut_slice();
        for (i, row) in flat.rows.iter().enumerate() {
            let idx = row_first as usize + i;
            row_blocks[idx / ROW_BLOCK].0[idx % ROW_BLOCK] = *row;
        }
        let page_blocks = self.pages.as_mut_slice();
        for (i, &entry) in flat.pages.iter().enumerate() {
            let idx = page_first as usize + i;
            page_blocks[idx / PAGE_BLOCK].0[idx % PAGE_BLOCK] = entry;
        }
        let id = self.next_object;
        let entry = ObjectEntry {
            base: flat.base,
            page_first: page_first as u32,
            page_count: flat.page_count(),
            row_first: row_first as u32,
            _pad: 0,
        };
        self.objects
            .set(id, entry, 0)
            .map_err(|source| TablesError::Map {
                map: "OBJECTS",
                source,
            })?;
        self.next_object += 1;
        self.next_row = row_first + rows;
        self.next_page = page_first + pages;
        Ok(Placement {
            object: id,
            rows: rows as u32,
            pages: pages as u32,
            kernel_bytes: flat.kernel_bytes(),
        })
    }

    fn upload_rules(&mut self) -> Result<(), TablesError> {
        let rules = self.dict.rules();
        while self.uploaded_rules < rules.len() {
            let i = self.uploaded_rules;
            self.rules
                .set(i as u32, rules[i], 0)
                .map_err(|source| TablesError::Map {
                    map: "RULES",
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
        entry.mappings[..n].copy_from_slice(&mappings[..n]);
        entry.count = n as u32;
        self.processes
            .insert(pid, *entry, 0)
            .map_err(|source| TablesError::Map {
                map: "PROCESSES",
                source,
            })?;
        Ok(mappings.len() - n)
    }

    pub fn remove_process(&mut self, pid: u32) {
        let _ = self.processes.remove(&pid);
    }
}

/// Reads back rows for tests and diagnostics.
impl KernelTables {
    pub fn row(&mut self, index: u32) -> Option<RowEntry> {
        let i = index as usize;
        self.rows
            .as_mut_slice()
            .get(i / ROW_BLOCK)
            .map(|b| b.0[i % ROW_BLOCK])
    }
}
