//! What an object is: the file behind a mapping (opened without following the
//! profiled process's choices out of its own files), its stamp (to tell a file
//! rewritten in place), and its key — the content digest of everything its table is
//! derived from.

use std::{fs, os::unix::fs::MetadataExt as _};

use crate::{mapped::ObjectBytes, procfs::Mapping};

/// Largest object file used (bigger ones get no table and use frame pointers). Files
/// are mapped, not read: the memory they cost is the pages the parsers touch.
pub const MAX_OBJECT_BYTES: u64 = 1 << 30;

/// How an object is identified across processes and in the disk cache.
///
/// Not by build-id: a build-id is what the file says about itself, and any user can
/// link a program with another program's build-id (`-Wl,--build-id=0x…`). An ELF
/// object is identified by [`content_digest`], a SHA-256 of everything its table is
/// derived from; two files share a table only when that is the same.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum ObjectKey {
    Content([u8; 32]),
    File {
        dev: u64,
        inode: u64,
        size: u64,
        mtime: i64,
    },
}

// What tells a file rewritten in place (same device and inode) from the one read
// before: its size and its modification and status-change times.
pub(super) use crate::mapped::Stamp as FileStamp;

/// The stamp of the file a process maps now (`None` when it cannot be reached).
/// Checked at every refresh of every new mapping: a `stat`, never an open of the
/// file (`map_files` is a link to the mapped inode; the path in the process's root
/// is resolved inside it with `O_PATH`, which neither reads nor blocks).
pub(super) fn stamp_of_mapping(pid: u32, m: &Mapping) -> Option<FileStamp> {
    let map_files = format!("/proc/{pid}/map_files/{:x}-{:x}", m.start, m.end);
    if let Ok(meta) = fs::metadata(&map_files) {
        return Some(FileStamp::of(&meta));
    }
    let root = std::path::PathBuf::from(format!("/proc/{pid}/root"));
    crate::safe_open::stat_in_root(&root, m.live_path()?)
        .ok()
        .map(|meta| FileStamp::of(&meta))
}

/// Why the file behind a mapping was not opened.
#[derive(Debug, thiserror::Error)]
pub enum MappedFileError {
    /// `/proc/PID/map_files` could not be opened, and the mapping has no live path.
    #[error(transparent)]
    Open(crate::safe_open::OpenError),
    /// Neither `/proc/PID/map_files` nor the path in the process's root could be opened.
    #[error("{map_files}; {in_root}")]
    OpenEither {
        map_files: crate::safe_open::OpenError,
        #[source]
        in_root: crate::safe_open::OpenError,
    },
    /// The path now names another file on the mapped device.
    #[error(
        "{path}: inode {found} is not the mapped inode {mapped} (replaced since it was mapped)"
    )]
    Replaced {
        path: String,
        found: u64,
        mapped: u64,
    },
}

/// Opens the file behind a mapping (`crate::safe_open`: regular files only, never
/// blocking): `/proc/PID/map_files/START-END` (the mapped inode itself, even when
/// deleted or renamed over), else the path resolved inside the process's root (its
/// mount namespace; its symlinks cannot leave it), which must then be the mapped inode
/// when it is on the mapped device.
pub(crate) fn open_mapped_file(
    pid: u32,
    m: &Mapping,
) -> Result<(fs::File, fs::Metadata), MappedFileError> {
    let map_files = format!("/proc/{pid}/map_files/{:x}-{:x}", m.start, m.end);
    let first = match crate::safe_open::open_regular(std::path::Path::new(&map_files)) {
        Ok(opened) => return Ok(opened),
        Err(e) => e,
    };
    let Some(path) = m.live_path() else {
        return Err(MappedFileError::Open(first));
    };
    let root = std::path::PathBuf::from(format!("/proc/{pid}/root"));
    let (file, meta) = crate::safe_open::open_in_root(&root, path).map_err(|in_root| {
        MappedFileError::OpenEither {
            map_files: first,
            in_root,
        }
    })?;
    let replaced = crate::procfs::dev_major_minor(meta.dev()) == (m.dev_major, m.dev_minor)
        && meta.ino() != m.inode;
    if replaced {
        return Err(MappedFileError::Replaced {
            path: m.path.clone(),
            found: meta.ino(),
            mapped: m.inode,
        });
    }
    Ok((file, meta))
}

/// A mapped file as `/proc/PID/maps` names it: device (major, minor), inode, path.
pub(super) type FileId = (u32, u32, u64, String);

/// What identifies a mapping across reloads of its process.
pub(super) type MappingId = (u64, u64, u64, u32, u32, u64);

pub(super) fn mapping_id(m: &Mapping) -> MappingId {
    (m.start, m.end, m.offset, m.dev_major, m.dev_minor, m.inode)
}

/// The `FileId` a mapping's object is known by; the vDSO (no file) by its size, one
/// image per size for the whole boot.
pub(super) fn file_id(m: &Mapping) -> FileId {
    if m.path == "[vdso]" {
        (0, 0, m.end.saturating_sub(m.start), m.path.clone())
    } else {
        (m.dev_major, m.dev_minor, m.inode, m.path.clone())
    }
}

/// Maps the file behind `m` (size checked from `fstat` first): its key if it is not
/// ELF (by file identity), its stamp and its bytes.
pub(super) fn open_object(pid: u32, m: &Mapping) -> Option<(ObjectKey, FileStamp, ObjectBytes)> {
    let (file, meta) = open_mapped_file(pid, m)
        .map_err(|e| log::debug!("pid {pid}: cannot open {}: {e}", m.path))
        .ok()?;
    if meta.len() > MAX_OBJECT_BYTES {
        log::warn!(
            "{}: {} bytes, larger than the limit; no table",
            m.path,
            meta.len()
        );
        return None;
    }
    let data = ObjectBytes::map(file, &meta)
        .map_err(|e| log::debug!("pid {pid}: cannot map {}: {e}", m.path))
        .ok()?;
    let fallback = ObjectKey::File {
        dev: meta.dev(),
        inode: meta.ino(),
        size: meta.len(),
        mtime: meta.mtime(),
    };
    Some((fallback, FileStamp::of(&meta), data))
}

/// Sections whose bytes a table is derived from, besides the executable ones.
pub(super) const UNWIND_SECTIONS: &[&str] = &[
    ".sframe",
    ".eh_frame",
    ".eh_frame_hdr",
    ".debug_frame",
    ".zdebug_frame",
    ".plt",
    ".plt.sec",
    ".plt.got",
    ".got",
];

/// A SHA-256 of everything an ELF object's table is derived from: its class,
/// endianness, machine and entry point, every segment's layout, every section's name,
/// kind, flags, address and size, and the bytes of its executable and unwind sections
/// (not debug information, symbols or data). `None` when it is not an ELF file.
///
/// The bytes hashed (the code of a large object is most of it) are released from the
/// profiler's memory a chunk at a time as they are hashed.
pub fn content_digest(data: &ObjectBytes) -> Option<[u8; 32]> {
    crate::ehframe::count_parse();
    let file = object::File::parse(&data[..]).ok()?;
    Some(digest_of_file(&file, data))
}

/// [`content_digest`] of `data` parsed already as `file` (the same value).
pub fn digest_of_file<'d>(file: &impl object::Object<'d>, data: &ObjectBytes) -> [u8; 32] {
    use object::{ObjectSection as _, ObjectSegment as _, SectionFlags};
    use sha2::Digest as _;
    let mut h = sha2::Sha256::new();
    h.update(b"sframe-user object v1\0");
    h.update([u8::from(file.is_64()), u8::from(file.is_little_endian())]);
    h.update(format!("{:?}", file.architecture()).as_bytes());
    h.update(file.entry().to_le_bytes());
    for s in file.segments() {
        let (offset, size) = s.file_range();
        let flags = match s.flags() {
            object::SegmentFlags::Elf { p_flags } => p_flags,
            _ => 0,
        };
        for v in [offset, size, s.address(), s.size(), u64::from(flags)] {
            h.update(v.to_le_bytes());
        }
    }
    for s in file.sections() {
        let name = s.name_bytes().unwrap_or(b"");
        let flags = match s.flags() {
            SectionFlags::Elf { sh_flags } => sh_flags,
            _ => 0,
        };
        h.update((name.len() as u64).to_le_bytes());
        h.update(name);
        for v in [
            flags,
            s.address(),
            s.size(),
            s.file_range().map_or(0, |r| r.1),
        ] {
            h.update(v.to_le_bytes());
        }
        h.update(format!("{:?}", s.kind()).as_bytes());
        let wanted = flags & u64::from(object::elf::SHF_EXECINSTR) != 0
            || std::str::from_utf8(name).is_ok_and(|n| UNWIND_SECTIONS.contains(&n));
        if wanted && let Some((offset, size)) = s.file_range() {
            let range = usize::try_from(offset)
                .ok()
                .zip(usize::try_from(size).ok())
                .and_then(|(o, n)| Some(o..o.checked_add(n)?))
                .filter(|r| r.end <= data.len());
            match range {
                Some(r) => {
                    const CHUNK: usize = 8 << 20;
                    let mut at = r.start;
                    while at < r.end {
                        let end = (at + CHUNK).min(r.end);
                        h.update(data.get(at..end).unwrap_or_default());
                        data.release(at..end);
                        at = end;
                    }
                }
                // Out of the file: the table derivation refuses it too.
                None => h.update(b"\xffout of file"),
            }
        }
    }
    h.finalize().into()
}

/// A SHA-256 of raw bytes (the vDSO image).
pub(super) fn digest_bytes(data: &[u8]) -> [u8; 32] {
    use sha2::Digest as _;
    sha2::Sha256::digest(data).into()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The loop hashes a file from the parse its table is then built from: the key is
    /// the one `content_digest` gives (and the disk cache was filled with), and the
    /// table the one `table_for_elf` gives.
    #[test]
    fn one_parse_gives_the_same_key_and_table() {
        let exe = std::fs::read("/proc/self/exe").expect("read own executable");
        let data = ObjectBytes::Heap(exe.clone());
        let parsed = crate::ehframe::ParsedElf::parse(&exe).expect("parse own executable");
        assert_eq!(
            Some(digest_of_file(parsed.file(), &data)),
            content_digest(&data)
        );
        let opts = crate::objtable::ObjTableOptions::default();
        let once = crate::objtable::table_for_parsed(&parsed, &opts).expect("table");
        let again = crate::objtable::table_for_elf(&exe, &opts).expect("table");
        assert_eq!(once.table, again.table);
        assert_eq!(once.segments, again.segments);
        assert!(once.table.row_count() > 1000);
    }
}
