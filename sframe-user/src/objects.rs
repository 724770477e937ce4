//! From `/proc/PID/maps` to kernel tables: every executable mapping of a process gets
//! its object's table (built once per object, shared by all processes that map it) and
//! its load bias.
//!
//! Files are opened through `/proc/PID/map_files/START-END` (so deleted-but-mapped files
//! work and the process's own mount namespace is used), falling back to
//! `/proc/PID/root/PATH`. The vDSO is read from the process's memory.

use std::{collections::HashMap, fs, io::Read as _, os::unix::fs::MetadataExt as _};

use object::{Object as _, ObjectSegment as _};
use sframe_common::layout::{MAPPING_FLAG_VDSO, MappingEntry, NO_OBJECT};

use crate::{
    flatten::flatten,
    kmaps::{KernelTables, Placement},
    objtable::{ObjTableOptions, table_for_elf},
    procfs::{self, Mapping},
    table::Source,
};

/// Largest object file read (bigger ones get no table and use frame pointers).
pub const MAX_OBJECT_BYTES: u64 = 1 << 30;

/// How an object is identified across processes.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum ObjectKey {
    BuildId(Vec<u8>),
    File {
        dev: u64,
        inode: u64,
        size: u64,
        mtime: i64,
    },
}

/// What happened to one object.
#[derive(Clone, Debug)]
pub struct ObjectInfo {
    pub path: String,
    pub placement: Option<Placement>,
    pub source: Option<Source>,
    /// Why the object has no kernel table.
    pub error: Option<String>,
    /// The PT_LOAD segments.
    segments: Vec<Segment>,
    pub table_rows: usize,
    pub unencodable_rows: u64,
}

impl ObjectInfo {
    /// `pc - bias = object virtual address` for a mapping of this object.
    fn bias(&self, m: &Mapping) -> Option<u64> {
        // Segments are mapped from their page-aligned file offset. Two segments can share
        // a file page (the end of the read-only one and the start of the text, e.g. in
        // binaries linked by lld): executable mappings belong to executable segments.
        const PAGE: u64 = 4096;
        let executable = self.segments.iter().filter(|s| s.executable);
        let others = self.segments.iter().filter(|s| !s.executable);
        executable.chain(others).find_map(
            |&Segment {
                 offset,
                 vaddr,
                 size,
                 ..
             }| {
                let aligned = offset & !(PAGE - 1);
                let slack = offset - aligned;
                let end = offset.checked_add(size.max(1))?;
                if !(aligned <= m.offset && m.offset < end) {
                    return None;
                }
                // Object vaddr of the mapping's first byte.
                let start_vaddr = vaddr.checked_sub(slack)?.checked_add(m.offset - aligned)?;
                Some(m.start.wrapping_sub(start_vaddr))
            },
        )
    }
}

/// A PT_LOAD segment: file offset, virtual address, file size, executable.
#[derive(Clone, Copy, Debug)]
struct Segment {
    offset: u64,
    vaddr: u64,
    size: u64,
    executable: bool,
}

/// Per-process results.
#[derive(Clone, Debug, Default)]
pub struct ProcessReport {
    pub executable_mappings: usize,
    pub with_table: usize,
    pub dropped_mappings: usize,
    /// The mappings read (all of them, for symbolization), so callers need not re-read.
    pub maps: Vec<Mapping>,
}

/// Objects loaded so far, and the kernel tables they live in.
pub struct ObjectStore {
    pub tables: KernelTables,
    objects: HashMap<ObjectKey, ObjectInfo>,
    /// (dev, inode, path) of a mapped file → its key, so a file is read once.
    files: HashMap<(u32, u32, u64, String), ObjectKey>,
    options: ObjTableOptions,
    /// Objects whose table could not be built or loaded.
    pub failed_objects: u64,
}

impl ObjectStore {
    pub fn new(tables: KernelTables) -> Self {
        Self {
            tables,
            objects: HashMap::new(),
            files: HashMap::new(),
            options: ObjTableOptions::default(),
            failed_objects: 0,
        }
    }

    pub fn objects(&self) -> impl Iterator<Item = &ObjectInfo> {
        self.objects.values()
    }

    /// Reads the process's maps and installs its mapping table in the kernel.
    pub fn refresh_process(&mut self, pid: u32) -> Result<ProcessReport, procfs::MapsError> {
        let maps = procfs::read_maps(pid)?;
        let mut report = ProcessReport::default();
        let mut entries = Vec::new();
        for m in maps.iter().filter(|m| m.executable) {
            report.executable_mappings += 1;
            let (object, bias, flags) = self.mapping_object(pid, m);
            if object != NO_OBJECT {
                report.with_table += 1;
            }
            entries.push(MappingEntry {
                start: m.start,
                end: m.end,
                bias,
                object,
                flags,
            });
        }
        entries.sort_by_key(|e| e.start);
        match self.tables.set_process(pid, &entries) {
            Ok(dropped) => report.dropped_mappings = dropped,
            Err(err) => log::warn!("pid {pid}: {err}"),
        }
        report.maps = maps;
        Ok(report)
    }

    fn mapping_object(&mut self, pid: u32, m: &Mapping) -> (u32, u64, u32) {
        if m.path == "[vdso]" {
            return match self.vdso(pid, m) {
                Some((id, bias)) => (id, bias, MAPPING_FLAG_VDSO),
                None => (NO_OBJECT, 0, MAPPING_FLAG_VDSO),
            };
        }
        if !m.is_file() {
            return (NO_OBJECT, 0, 0); // anonymous executable memory (JIT code)
        }
        let file_id = (m.dev_major, m.dev_minor, m.inode, m.path.clone());
        let key = match self.files.get(&file_id) {
            Some(k) => k.clone(),
            None => match self.read_file(pid, m) {
                Some((key, data)) => {
                    if !self.objects.contains_key(&key) {
                        let info = self.build(&m.path, &data);
                        self.objects.insert(key.clone(), info);
                    }
                    self.files.insert(file_id, key.clone());
                    key
                }
                None => return (NO_OBJECT, 0, 0),
            },
        };
        let Some(info) = self.objects.get(&key) else {
            return (NO_OBJECT, 0, 0);
        };
        match (info.placement, info.bias(m)) {
            (Some(p), Some(bias)) => (p.object, bias, 0),
            _ => (NO_OBJECT, 0, 0),
        }
    }

    fn read_file(&mut self, pid: u32, m: &Mapping) -> Option<(ObjectKey, Vec<u8>)> {
        let via_map_files = format!("/proc/{pid}/map_files/{:x}-{:x}", m.start, m.end);
        let path = m.path.strip_suffix(" (deleted)").unwrap_or(&m.path);
        let via_root = format!("/proc/{pid}/root{path}");
        let file = fs::File::open(&via_map_files)
            .or_else(|_| fs::File::open(&via_root))
            .map_err(|e| log::debug!("pid {pid}: cannot open {}: {e}", m.path))
            .ok()?;
        let meta = file.metadata().ok()?;
        if meta.len() > MAX_OBJECT_BYTES {
            log::warn!(
                "{}: {} bytes, larger than the limit; no table",
                m.path,
                meta.len()
            );
            return None;
        }
        let mut data = Vec::with_capacity(meta.len() as usize);
        file.take(MAX_OBJECT_BYTES).read_to_end(&mut data).ok()?;
        let key = build_id(&data)
            .map(ObjectKey::BuildId)
            .unwrap_or(ObjectKey::File {
                dev: meta.dev(),
                inode: meta.ino(),
                size: meta.len(),
                mtime: meta.mtime(),
            });
        Some((key, data))
    }

    fn vdso(&mut self, pid: u32, m: &Mapping) -> Option<(u32, u64)> {
        let len = m.end.checked_sub(m.start)?;
        if len > 1 << 20 {
            return None;
        }
        let mut data = vec![0u8; len as usize];
        let mem = fs::File::open(format!("/proc/{pid}/mem")).ok()?;
        std::os::unix::fs::FileExt::read_exact_at(&mem, &mut data, m.start).ok()?;
        let key = ObjectKey::BuildId(build_id(&data).unwrap_or_else(|| data.clone()));
        if !self.objects.contains_key(&key) {
            let info = self.build("[vdso]", &data);
            self.objects.insert(key.clone(), info);
        }
        let info = self.objects.get(&key)?;
        // The vDSO image is mapped from its start: file offset 0 is at m.start.
        let vaddr0 = info
            .segments
            .iter()
            .find(|s| s.offset == 0)
            .map(|s| s.vaddr)?;
        Some((info.placement?.object, m.start.wrapping_sub(vaddr0)))
    }

    fn build(&mut self, path: &str, data: &[u8]) -> ObjectInfo {
        let mut info = ObjectInfo {
            path: path.to_owned(),
            placement: None,
            source: None,
            error: None,
            segments: segments(data),
            table_rows: 0,
            unencodable_rows: 0,
        };
        let result = table_for_elf(data, &self.options)
            .map_err(|e| e.to_string())
            .and_then(|t| {
                info.source = Some(t.source);
                info.table_rows = t.table.row_count();
                flatten(&t.table, self.tables.rule_dict()).map_err(|e| e.to_string())
            })
            .and_then(|flat| {
                info.unencodable_rows = flat.unencodable_rows;
                self.tables.load_object(&flat).map_err(|e| e.to_string())
            });
        match result {
            Ok(p) => info.placement = Some(p),
            Err(e) => {
                log::info!("{path}: no unwind table: {e}");
                self.failed_objects += 1;
                info.error = Some(e);
            }
        }
        info
    }
}

fn build_id(data: &[u8]) -> Option<Vec<u8>> {
    let file = object::File::parse(data).ok()?;
    file.build_id().ok().flatten().map(|b| b.to_vec())
}

fn segments(data: &[u8]) -> Vec<Segment> {
    let Ok(file) = object::File::parse(data) else {
        return Vec::new();
    };
    file.segments()
        .map(|s| {
            let (offset, size) = s.file_range();
            let executable = matches!(
                s.flags(),
                object::SegmentFlags::Elf { p_flags } if p_flags & object::elf::PF_X != 0
            );
            Segment {
                offset,
                vaddr: s.address(),
                size,
                executable,
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn info(segments: Vec<Segment>) -> ObjectInfo {
        ObjectInfo {
            path: "x".into(),
            placement: None,
            source: None,
            error: None,
            segments,
            table_rows: 0,
            unencodable_rows: 0,
        }
    }

    fn mapping(start: u64, offset: u64) -> Mapping {
        Mapping {
            start,
            end: start + 0x1000,
            readable: true,
            writable: false,
            executable: true,
            offset,
            dev_major: 0,
            dev_minor: 0,
            inode: 1,
            path: "/x".into(),
        }
    }

    #[test]
    fn bias_of_text_sharing_a_file_page_with_the_read_only_segment() {
        // The layout of a Rust binary linked here: the read-only segment ends at 0x12a28
        // and the text starts at file offset 0x12a30, vaddr 0x13a30, in the same page.
        let o = info(vec![
            Segment {
                offset: 0,
                vaddr: 0,
                size: 0x12a28,
                executable: false,
            },
            Segment {
                offset: 0x12a30,
                vaddr: 0x13a30,
                size: 0x3dd70,
                executable: true,
            },
        ]);
        let start = 0x55b4_6ae2_a000;
        assert_eq!(o.bias(&mapping(start, 0x12000)), Some(start - 0x13000));
    }

    #[test]
    fn bias_of_a_plain_pie_text_segment() {
        let o = info(vec![
            Segment {
                offset: 0,
                vaddr: 0,
                size: 0x5e0,
                executable: false,
            },
            Segment {
                offset: 0x1000,
                vaddr: 0x1000,
                size: 0x2e1,
                executable: true,
            },
        ]);
        assert_eq!(
            o.bias(&mapping(0x5555_0000_1000, 0x1000)),
            Some(0x5555_0000_0000)
        );
        // Unrelated offsets have no bias.
        assert_eq!(o.bias(&mapping(0x5555_0000_1000, 0x9000)), None);
    }
}
