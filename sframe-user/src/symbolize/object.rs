//! Opening the file behind a mapping of another process.

use std::{
    fmt::Write as _, fs::File, os::unix::ffi::OsStrExt as _, os::unix::fs::MetadataExt,
    os::unix::io::AsRawFd, path::PathBuf,
};

use super::{object_basename, plt::PltStubs};
use crate::procfs::Mapping;

/// Identity of a mapped object, shared by every process that maps it.
#[derive(Clone, Debug, Hash, PartialEq, Eq)]
pub(super) struct ObjectKey {
    dev_major: u32,
    dev_minor: u32,
    inode: u64,
    /// Without ` (deleted)`: the object is the same before and after its unlink.
    path: String,
}

impl ObjectKey {
    pub(super) fn of(m: &Mapping) -> Self {
        Self {
            dev_major: m.dev_major,
            dev_minor: m.dev_minor,
            inode: m.inode,
            path: strip_deleted(&m.path).to_owned(),
        }
    }
}

/// An object file opened for symbolization.
pub(super) struct OpenedObject {
    /// Kept open for the life of the cache so that `blaze_path` names this file and no
    /// other (the descriptor number cannot be reused while we hold it).
    _file: File,
    /// `/proc/self/fd/N`: what blazesym opens and the key of its own cache.
    pub(super) blaze_path: PathBuf,
    /// The path as the process's maps show it, for messages.
    pub(super) display_path: String,
    pub(super) basename: String,
    /// GNU build-id, lowercase hex.
    pub(super) build_id: Option<String>,
    /// PLT sections and entries: stubs have no symbols, and the nearest preceding symbol
    /// (often `_init`, of size 0) would be a wrong name.
    pub(super) plt: PltStubs,
    /// Why its debug information (and separate debug files) is not used, if so: a
    /// compressed section over the bound or not what its header claims.
    pub(super) symbols_only: Option<String>,
    /// It has no line tables of its own (no `.debug_info`) nor a separate debug file
    /// under `/usr/lib/debug` by its build-id: a debuginfod server may have one.
    pub(super) needs_debuginfo: bool,
    /// Its PT_LOAD segments (file offset, virtual address, bytes in the file): a file
    /// offset's address in a separate debug file, which has the same layout.
    pub(super) segments: Vec<(u64, u64, u64)>,
}

impl OpenedObject {
    /// The virtual address of file offset `offset`, by the PT_LOAD segment holding it.
    pub(super) fn virtual_address(&self, offset: u64) -> Option<u64> {
        self.segments.iter().find_map(|&(file, vaddr, size)| {
            let rel = offset.checked_sub(file)?;
            (rel < size).then(|| vaddr.checked_add(rel)).flatten()
        })
    }
}

/// What an ELF file says of its own debug information: whether it has line tables
/// (`.debug_info`), its build-id (lowercase hex), and its PT_LOAD segments.
pub(super) struct ElfFacts {
    pub(super) has_debug_info: bool,
    pub(super) build_id: Option<String>,
    pub(super) segments: Vec<(u64, u64, u64)>,
}

/// Reads [`ElfFacts`] of `data` (`None`: not an ELF file the `object` crate parses).
pub(super) fn elf_facts<'d, R: object::ReadRef<'d>>(data: R) -> Option<ElfFacts> {
    use object::{Object as _, ObjectSection as _, ObjectSegment as _};
    let file = object::File::parse(data).ok()?;
    let has_debug_info = file.sections().any(|s| {
        matches!(s.name_bytes(), Ok(b".debug_info" | b".zdebug_info"))
            && s.kind() != object::SectionKind::UninitializedData
    });
    let build_id = file.build_id().ok().flatten().map(hex);
    let segments = file
        .segments()
        .map(|seg| {
            let (offset, size) = seg.file_range();
            (offset, seg.address(), size)
        })
        .collect();
    Some(ElfFacts {
        has_debug_info,
        build_id,
        segments,
    })
}

/// Lowercase hex of `bytes`.
pub(super) fn hex(bytes: &[u8]) -> String {
    bytes
        .iter()
        .fold(String::with_capacity(bytes.len() * 2), |mut s, b| {
            let _ = write!(s, "{b:02x}");
            s
        })
}

/// Whether a separate debug file for `build_id` is where blazesym looks for one.
pub(super) fn local_debug_file(build_id: &str) -> bool {
    let (Some(dir), Some(rest)) = (build_id.get(..2), build_id.get(2..)) else {
        return false;
    };
    std::fs::symlink_metadata(format!("/usr/lib/debug/.build-id/{dir}/{rest}.debug")).is_ok()
}

/// Why the file of a mapping could not be opened for symbolization.
#[derive(Debug, thiserror::Error)]
pub enum OpenError {
    #[error("{path} was replaced since it was mapped (inode {found}, mapped inode {mapped})")]
    Replaced {
        path: PathBuf,
        found: u64,
        mapped: u64,
    },
    #[error("{first}; {second}")]
    Both {
        first: Box<OpenError>,
        second: Box<OpenError>,
    },
    #[error(transparent)]
    Unsafe(#[from] crate::safe_open::OpenError),
    #[error("{path}: {reason}")]
    Compressed { path: String, reason: String },
    #[error("{path}: cannot map: {source}")]
    Map {
        path: String,
        #[source]
        source: std::io::Error,
    },
}

/// Most bytes the compressed sections of an object may decompress to, in all, for
/// blazesym, which allocates what a section's header claims and reads on past it
/// while the data lasts: a header claiming a terabyte aborted the profiler (allocation
/// failure), and a zlib stream expands up to a thousandfold. Debug information over
/// the bound is not used (the symbol tables still are).
pub const MAX_SYMBOLIZE_DECOMPRESSED: u64 = 64 << 20;

/// What blazesym may read of an object, by its compressed sections.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Compression {
    /// None, or each holds what its header claims, within the bound.
    Fine,
    /// A debug section is over the bound or not what its header claims: symbol tables
    /// only.
    SymbolsOnly(String),
    /// A compressed symbol or string table (no linker makes one): not read at all.
    Refused(String),
}

/// Checks every `SHF_COMPRESSED` section of the ELF file `data` (streamed through the
/// decompressor, output counted and discarded: no allocation of its size). The claims
/// of all of them together must stay within [`MAX_SYMBOLIZE_DECOMPRESSED`], so that
/// checking an object decompresses that much at most (sections may share their bytes:
/// thousands of them could each decompress the same honest stream).
pub(super) fn check_compression<'d, R: object::ReadRef<'d>>(data: R) -> Compression {
    use object::{Object as _, ObjectSection as _};
    let Ok(file) = object::File::parse(data) else {
        // blazesym refuses it as well, without decompressing anything.
        return Compression::Fine;
    };
    let mut symbols_only = None;
    let mut claimed = 0u64;
    for section in file.sections() {
        // Only `SHF_COMPRESSED` sections are decompressed by blazesym. Asked of any other
        // section, `compressed_data` would read its bytes (all of a 150 MB library's).
        let object::SectionFlags::Elf { sh_flags } = section.flags() else {
            continue;
        };
        if sh_flags & u64::from(object::elf::SHF_COMPRESSED) == 0 {
            continue;
        }
        let Ok(c) = section.compressed_data() else {
            continue;
        };
        if c.format == object::CompressionFormat::None {
            continue;
        }
        let name = String::from_utf8_lossy(section.name_bytes().unwrap_or_default()).into_owned();
        if matches!(name.as_str(), ".symtab" | ".dynsym" | ".strtab" | ".dynstr") {
            return Compression::Refused(format!("compressed symbol table {name}"));
        }
        if symbols_only.is_some() {
            continue;
        }
        let size = c.uncompressed_size;
        claimed = claimed.saturating_add(size);
        if claimed > MAX_SYMBOLIZE_DECOMPRESSED {
            symbols_only = Some(format!(
                "{name} claims {size} bytes decompressed, {claimed} with the sections before \
                 it (more than {MAX_SYMBOLIZE_DECOMPRESSED})"
            ));
            continue;
        }
        match decompressed_len(c.format, c.data, size) {
            Some(n) if n == size => {}
            got => {
                symbols_only = Some(format!(
                    "{name} claims {size} bytes decompressed and holds {}",
                    got.map_or_else(|| "a corrupt stream".to_owned(), |n| format!("{n} or more"))
                ));
            }
        }
    }
    symbols_only.map_or(Compression::Fine, Compression::SymbolsOnly)
}

/// The decompressed length of `data`, counted up to `size + 1` (None: corrupt or
/// unknown format).
fn decompressed_len(format: object::CompressionFormat, data: &[u8], size: u64) -> Option<u64> {
    use std::io::Read as _;
    let limit = size.saturating_add(1);
    match format {
        object::CompressionFormat::Zlib => {
            let decoder = flate2::read::ZlibDecoder::new(data);
            std::io::copy(&mut decoder.take(limit), &mut std::io::sink()).ok()
        }
        object::CompressionFormat::Zstandard => {
            let decoder = ruzstd::decoding::StreamingDecoder::new(data).ok()?;
            std::io::copy(&mut decoder.take(limit), &mut std::io::sink()).ok()
        }
        _ => None,
    }
}

impl OpenedObject {
    /// Opens the file of mapping `m` of `pid`: through `map_files` (the mapped file
    /// itself), else through the process's root directory unless the file was deleted.
    pub(super) fn open(pid: u32, m: &Mapping) -> Result<Self, OpenError> {
        Self::new(open_mapped_file(pid, m)?, m)
    }

    fn new(file: File, m: &Mapping) -> Result<Self, OpenError> {
        // Read through a read-only mapping, dropped on return: the pages the checks
        // touch (headers, compressed sections, PLT) leave the RSS with it.
        let bytes = file
            .try_clone()
            .and_then(|f| {
                let meta = f.metadata()?;
                crate::mapped::ObjectBytes::map(f, &meta)
            })
            .map_err(|source| OpenError::Map {
                path: m.path.clone(),
                source,
            })?;
        let symbols_only = match check_compression(&*bytes) {
            Compression::Fine => None,
            Compression::SymbolsOnly(reason) => Some(reason),
            Compression::Refused(reason) => {
                return Err(OpenError::Compressed {
                    path: m.path.clone(),
                    reason,
                });
            }
        };
        let blaze_path = PathBuf::from(format!("/proc/self/fd/{}", file.as_raw_fd()));
        let facts = elf_facts(&*bytes);
        let build_id = facts.as_ref().and_then(|f| f.build_id.clone());
        let needs_debuginfo = facts.as_ref().is_some_and(|f| !f.has_debug_info)
            && build_id.as_deref().is_some_and(|id| !local_debug_file(id));
        let segments = facts.map(|f| f.segments).unwrap_or_default();
        let plt = PltStubs::read(&*bytes);
        drop(bytes);
        Ok(Self {
            _file: file,
            blaze_path,
            display_path: m.path.clone(),
            basename: object_basename(&m.path),
            build_id,
            plt,
            symbols_only,
            needs_debuginfo,
            segments,
        })
    }
}

/// Opens the file of mapping `m` of `pid`: through `map_files` (the mapped file itself),
/// else through the process's root directory unless the file was deleted, else (the
/// process exited) by its path if it is the very file that was mapped.
pub(super) fn open_mapped_file(pid: u32, m: &Mapping) -> Result<File, OpenError> {
    let map_files = PathBuf::from(format!("/proc/{pid}/map_files/{:x}-{:x}", m.start, m.end));
    let first = match open_regular(&map_files) {
        Ok((file, _)) => return Ok(file),
        Err(e) => e,
    };
    // A deleted file's path now names another file or none.
    let Some(path) = m.live_path() else {
        return Err(first);
    };
    let root_dir = PathBuf::from(format!("/proc/{pid}/root"));
    let root = root_dir.join(std::ffi::OsStr::from_bytes(
        path.get(1..).unwrap_or_default(),
    ));
    // Resolved inside the process's root: its symlinks cannot reach the host's files.
    let second = match crate::safe_open::open_in_root(&root_dir, path).map_err(OpenError::from) {
        Ok((file, meta)) => {
            let (major, minor) = dev_major_minor(meta.dev());
            // Same file system and another inode: replaced on disk. Another device
            // (overlayfs shows its own) cannot be checked.
            if (major, minor) == (m.dev_major, m.dev_minor) && meta.ino() != m.inode {
                OpenError::Replaced {
                    path: root,
                    found: meta.ino(),
                    mapped: m.inode,
                }
            } else {
                return Ok(file);
            }
        }
        Err(e) => e,
    };
    // The process exited (short-lived processes of a whole-system profile): the
    // path in this mount namespace, only if it is the very file that was mapped
    // (checked before it is opened).
    if let Ok((file, _)) =
        crate::safe_open::open_if_inode(path, (m.dev_major, m.dev_minor), m.inode)
    {
        return Ok(file);
    }
    Err(OpenError::Both {
        first: Box::new(first),
        second: Box::new(second),
    })
}

/// Opens `path` if it is a regular file, without blocking on a FIFO
/// (`crate::safe_open`).
fn open_regular(path: &std::path::Path) -> Result<(File, std::fs::Metadata), OpenError> {
    Ok(crate::safe_open::open_regular(path)?)
}

fn strip_deleted(path: &str) -> &str {
    path.strip_suffix(" (deleted)").unwrap_or(path)
}

use crate::procfs::dev_major_minor;

#[cfg(test)]
mod tests {
    use super::*;

    /// Both formats are counted as streams, up to one byte past the claim, and a
    /// corrupt stream is no length.
    #[test]
    fn decompressed_lengths_are_counted_up_to_one_past_the_claim() {
        use std::io::Write as _;
        let plain: Vec<u8> = (0..1u32 << 20).map(|i| (i % 251) as u8).collect();
        let n = plain.len() as u64;
        let zstd = ruzstd::encoding::compress_to_vec(
            &plain[..],
            ruzstd::encoding::CompressionLevel::Fastest,
        );
        let mut z = flate2::write::ZlibEncoder::new(Vec::new(), flate2::Compression::fast());
        z.write_all(&plain).unwrap();
        let zlib = z.finish().unwrap();
        for (format, data) in [
            (object::CompressionFormat::Zstandard, &zstd),
            (object::CompressionFormat::Zlib, &zlib),
        ] {
            assert_eq!(decompressed_len(format, data, n), Some(n), "{format:?}");
            // A short claim: counting stops one byte past it.
            assert_eq!(decompressed_len(format, data, 16), Some(17), "{format:?}");
            // A long claim: what the stream holds.
            assert_eq!(decompressed_len(format, data, n * 2), Some(n), "{format:?}");
            assert_eq!(decompressed_len(format, &data[..8], n), None, "{format:?}");
        }
    }

    #[test]
    fn dev_numbers_match_procfs() {
        // The device of this test binary, as maps and stat see it.
        let maps = crate::procfs::read_maps(std::process::id()).unwrap();
        let here = dev_numbers_match_procfs as *const () as u64;
        let m = crate::procfs::find(&maps, here).unwrap();
        let meta = std::fs::metadata(strip_deleted(&m.path)).unwrap();
        if meta.ino() == m.inode {
            assert_eq!(dev_major_minor(meta.dev()), (m.dev_major, m.dev_minor));
        }
        assert_eq!(dev_major_minor(0xfe01), (0xfe, 1));
        // glibc makedev(0x123, 0x67845).
        assert_eq!(
            dev_major_minor(0x6780_0000 | (0x123 << 8) | 0x45),
            (0x123, 0x67845)
        );
    }

    #[test]
    fn opens_own_executable_and_reads_build_id() {
        let pid = std::process::id();
        let maps = crate::procfs::read_maps(pid).unwrap();
        let here = opens_own_executable_and_reads_build_id as *const () as u64;
        let m = crate::procfs::find(&maps, here).unwrap();
        let obj = OpenedObject::open(pid, m).unwrap();
        assert!(obj.blaze_path.starts_with("/proc/self/fd/"));
        assert_eq!(obj.basename, object_basename(&m.path));
        if let Some(id) = &obj.build_id {
            assert!(id.len() >= 16 && id.bytes().all(|b| b.is_ascii_hexdigit()));
        }
    }

    #[test]
    fn file_replaced_on_disk_is_not_used() {
        let exe = std::env::current_exe().unwrap();
        let meta = std::fs::metadata(&exe).unwrap();
        let (dev_major, dev_minor) = dev_major_minor(meta.dev());
        let m = Mapping {
            start: 0x1000,
            end: 0x2000,
            readable: true,
            writable: false,
            executable: true,
            shared: false,
            offset: 0,
            dev_major,
            dev_minor,
            // Same file system, another inode: what a replaced file looks like.
            inode: meta.ino() + 1,
            path: exe.to_str().unwrap().to_owned(),
            raw_path: None,
        };
        let err = OpenedObject::open(std::process::id(), &m).err().unwrap();
        let OpenError::Both { second, .. } = &err else {
            panic!("{err}")
        };
        assert!(matches!(**second, OpenError::Replaced { .. }), "{err}");
    }

    #[test]
    fn deleted_path_without_map_files_is_an_error() {
        let m = Mapping {
            start: 0x1000,
            end: 0x2000,
            readable: true,
            writable: false,
            executable: true,
            shared: false,
            offset: 0,
            dev_major: 0,
            dev_minor: 0,
            inode: 1,
            path: "/bin/sh (deleted)".into(),
            raw_path: None,
        };
        // Our own process has no mapping at 0x1000, and a deleted path is not retried.
        let err = OpenedObject::open(std::process::id(), &m).err().unwrap();
        assert!(
            matches!(
                err,
                OpenError::Unsafe(crate::safe_open::OpenError::Io { .. })
            ),
            "{err}"
        );
    }
}
