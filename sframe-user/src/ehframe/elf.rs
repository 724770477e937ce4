//! Finds what the deriver needs in an ELF file: the CFI sections (by section header, or
//! through `PT_GNU_EH_FRAME` when the file has no section headers), the PLT sections,
//! and the build-id / `.gnu_debuglink` that name a separate debug file.

use std::path::{Path, PathBuf};

use gimli::RunTimeEndian;
use object::elf;
use object::read::CompressedData;
use object::read::elf::{ElfFile64, FileHeader, ProgramHeader, SectionHeader};
use object::{Endianness, Object, ObjectSection};

use super::cfi::SectionData;
use super::error::{CfiSection, DecompressError, EhFrameError, Warning};
use super::plt::{PltKind, PltSection};
use crate::table::Arch;

/// The CFI-related contents of one ELF file.
#[derive(Debug)]
pub(crate) struct ElfCfi<'a> {
    pub arch: Arch,
    pub endian: RunTimeEndian,
    pub eh_frame: Option<SectionData<'a>>,
    pub eh_frame_hdr: Option<SectionData<'a>>,
    pub debug_frame: Option<SectionData<'a>>,
    /// `.debug_frame` compressed (`SHF_COMPRESSED`, zlib or zstd), to be decompressed
    /// by the caller, which owns the result ([`CompressedSection::decompress`]).
    pub compressed_debug_frame: Option<CompressedSection<'a>>,
    pub text: Option<u64>,
    pub got: Option<u64>,
    pub plts: Vec<PltSection<'a>>,
    /// Sections with `SHF_EXECINSTR` and contents, for the coverage counts.
    pub exec: Vec<SectionData<'a>>,
    pub build_id: Option<&'a [u8]>,
    pub debuglink: Option<&'a [u8]>,
    /// The CRC-32 of the debug file that `.gnu_debuglink` names.
    pub debuglink_crc: Option<u32>,
    pub warnings: Vec<Warning>,
}

pub(crate) fn parse<'a>(data: &'a [u8]) -> Result<ElfCfi<'a>, EhFrameError> {
    super::count_parse();
    scan(&ElfFile64::<Endianness>::parse(data).map_err(EhFrameError::Elf)?)
}

/// What the deriver needs from the parsed ELF file `file`.
pub(crate) fn scan<'a>(file: &ElfFile64<'a, Endianness>) -> Result<ElfCfi<'a>, EhFrameError> {
    let data = file.data();
    let endian = file.endian();
    let machine = file.elf_header().e_machine(endian);
    let big = endian == Endianness::Big;
    let arch = match machine {
        elf::EM_X86_64 => Arch::Amd64,
        elf::EM_AARCH64 => Arch::Aarch64 { big_endian: big },
        _ => return Err(EhFrameError::UnsupportedArch { machine }),
    };
    let mut out = ElfCfi {
        arch,
        endian: if big {
            RunTimeEndian::Big
        } else {
            RunTimeEndian::Little
        },
        eh_frame: None,
        eh_frame_hdr: None,
        debug_frame: None,
        compressed_debug_frame: None,
        text: None,
        got: None,
        plts: Vec::new(),
        exec: Vec::new(),
        // Malformed notes only cost the debug file lookup.
        build_id: file.build_id().ok().flatten(),
        debuglink: file.gnu_debuglink().ok().flatten().map(|(name, _crc)| name),
        debuglink_crc: file.gnu_debuglink().ok().flatten().map(|(_name, crc)| crc),
        warnings: Vec::new(),
    };

    for section in file.sections() {
        let Ok(name) = section.name() else { continue };
        let header = section.elf_section_header();
        let nobits = header.sh_type(endian) == elf::SHT_NOBITS;
        let compressed = header.sh_flags(endian) & u64::from(elf::SHF_COMPRESSED) != 0;
        let address = section.address();
        let contents: Option<&'a [u8]> = if nobits || compressed {
            None
        } else {
            section.data().ok().filter(|d| !d.is_empty())
        };
        let sd = contents.map(|data| SectionData { data, address });
        if header.sh_flags(endian) & u64::from(elf::SHF_EXECINSTR) != 0
            && let Some(s) = sd
        {
            out.exec.push(s);
        }
        match name {
            ".eh_frame" => out.eh_frame = sd,
            ".eh_frame_hdr" => out.eh_frame_hdr = sd,
            ".debug_frame" if compressed => match section.compressed_data() {
                Ok(data) => out.compressed_debug_frame = Some(CompressedSection { data, address }),
                Err(_) => out.warnings.push(Warning::Compressed {
                    section: CfiSection::DebugFrame,
                    reason: DecompressError::Header,
                }),
            },
            ".debug_frame" => out.debug_frame = sd,
            ".text" => out.text = Some(section.address()),
            ".got" => out.got = Some(section.address()),
            _ => {
                if let Some(kind) = PltKind::from_name(name)
                    && !nobits
                    && section.size() > 0
                {
                    out.plts.push(PltSection {
                        kind,
                        address: section.address(),
                        size: section.size(),
                        data: section.data().unwrap_or(&[]),
                    });
                }
            }
        }
    }

    if out.eh_frame_hdr.is_none() || out.eh_frame.is_none() {
        from_program_headers(file, data, &mut out);
    }
    Ok(out)
}

/// Largest decompressed `.debug_frame` (the compressed header's size is checked before
/// anything is allocated).
pub(crate) const MAX_DECOMPRESSED_BYTES: u64 = 512 << 20;

/// A compressed section and its address.
#[derive(Debug)]
pub(crate) struct CompressedSection<'a> {
    pub data: object::read::CompressedData<'a>,
    pub address: u64,
}

impl CompressedSection<'_> {
    /// The section's bytes, or why they cannot be had.
    pub fn decompress(&self) -> Result<Vec<u8>, DecompressError> {
        let size = self.data.uncompressed_size;
        if size > MAX_DECOMPRESSED_BYTES {
            return Err(DecompressError::TooLarge {
                size,
                limit: MAX_DECOMPRESSED_BYTES,
            });
        }
        let CompressedData { format, data, .. } = self.data;
        let bytes = CompressedData {
            format,
            data,
            uncompressed_size: size,
        }
        .decompress()
        .map_err(|source| DecompressError::Corrupt { format, source })?;
        if bytes.len() as u64 != size {
            return Err(DecompressError::WrongSize {
                got: bytes.len() as u64,
                size,
            });
        }
        Ok(bytes.into_owned())
    }
}

/// Locates `.eh_frame_hdr` through `PT_GNU_EH_FRAME` and `.eh_frame` through the header's
/// `eh_frame_ptr` (extending to the end of its `PT_LOAD` segment's file data; the
/// section's zero terminator ends the walk), for files without section headers.
fn from_program_headers<'a>(
    file: &ElfFile64<'a, Endianness>,
    data: &'a [u8],
    out: &mut ElfCfi<'a>,
) {
    let endian = file.endian();
    let phdrs = file.elf_program_headers();
    if out.eh_frame_hdr.is_none() {
        let hdr = phdrs
            .iter()
            .find(|p| p.p_type(endian) == elf::PT_GNU_EH_FRAME);
        out.eh_frame_hdr = hdr.and_then(|p| {
            let d = p.data(endian, data).ok()?;
            (!d.is_empty()).then_some(SectionData {
                data: d,
                address: p.p_vaddr(endian),
            })
        });
    }
    if out.eh_frame.is_some() {
        return;
    }
    let Some(hdr) = out.eh_frame_hdr else { return };
    let bases = gimli::BaseAddresses::default().set_eh_frame_hdr(hdr.address);
    let Ok(parsed) = gimli::EhFrameHdr::new(hdr.data, out.endian).parse(&bases, 8) else {
        return;
    };
    let Ok(eh_addr) = parsed.eh_frame_ptr().direct() else {
        return;
    };
    for p in phdrs.iter().filter(|p| p.p_type(endian) == elf::PT_LOAD) {
        let (vaddr, filesz) = (p.p_vaddr(endian), p.p_filesz(endian));
        if eh_addr < vaddr || eh_addr - vaddr >= filesz {
            continue;
        }
        let Ok(seg) = p.data(endian, data) else {
            return;
        };
        let Some(d) = usize::try_from(eh_addr - vaddr)
            .ok()
            .and_then(|o| seg.get(o..))
        else {
            return;
        };
        out.eh_frame = Some(SectionData {
            data: d,
            address: eh_addr,
        });
        return;
    }
}

/// Candidate paths of the separate debug file, most specific first: by build-id under
/// `root/.build-id/`, then by `.gnu_debuglink` next to the object, in its `.debug/`
/// directory, and under `root` + the object's directory (GDB's search order).
pub(crate) fn debug_file_candidates(
    root: &Path,
    build_id: Option<&[u8]>,
    debuglink: Option<&[u8]>,
    object_path: Option<&Path>,
) -> Vec<PathBuf> {
    let mut out = Vec::new();
    if let Some(id) = build_id.filter(|id| id.len() >= 2) {
        let hex: String = id.iter().map(|b| format!("{b:02x}")).collect();
        out.push(
            root.join(".build-id")
                .join(&hex[..2])
                .join(format!("{}.debug", &hex[2..])),
        );
    }
    let name = debuglink
        .and_then(|n| std::str::from_utf8(n).ok())
        // A debuglink names a file, never a path.
        .filter(|n| !n.is_empty() && !n.contains('/') && *n != "." && *n != "..");
    if let (Some(name), Some(obj)) = (name, object_path)
        && let Some(dir) = obj.parent()
    {
        let own = obj.file_name().and_then(|f| f.to_str());
        if own != Some(name) {
            out.push(dir.join(name));
        }
        out.push(dir.join(".debug").join(name));
        if let Ok(rel) = dir.strip_prefix("/") {
            out.push(root.join(rel).join(name));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use object::CompressionFormat;

    use super::*;

    fn section(
        format: CompressionFormat,
        data: &[u8],
        size: u64,
    ) -> Result<Vec<u8>, DecompressError> {
        CompressedSection {
            data: CompressedData {
                format,
                data,
                uncompressed_size: size,
            },
            address: 0,
        }
        .decompress()
    }

    #[test]
    fn a_huge_announced_size_is_refused_before_allocating() {
        let err = section(CompressionFormat::Zlib, &[0x78, 0x9c, 3, 0], 1 << 40).unwrap_err();
        assert!(
            matches!(err, DecompressError::TooLarge { size, .. } if size == 1 << 40),
            "{err}"
        );
    }

    #[test]
    fn corrupt_or_short_data_is_an_error() {
        // Not a zlib stream.
        assert!(section(CompressionFormat::Zlib, b"not zlib", 64).is_err());
        // An empty zlib stream announced as 64 bytes.
        let err = section(CompressionFormat::Zlib, &[0x78, 0x9c, 3, 0, 0, 0, 0, 1], 64);
        assert!(err.is_err(), "{err:?}");
        assert!(section(CompressionFormat::Zstandard, b"garbage!", 64).is_err());
    }
}
