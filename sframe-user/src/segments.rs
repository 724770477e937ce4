//! Where an ELF object's code is at run time: its `PT_LOAD` segments, and the bias of a
//! mapping of it (`run-time address − object virtual address`).

#![deny(missing_docs)]

/// A `PT_LOAD` segment.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Segment {
    /// File offset.
    pub offset: u64,
    /// Object virtual address.
    pub vaddr: u64,
    /// Bytes in the file.
    pub size: u64,
    /// Mapped executable (`PF_X`).
    pub executable: bool,
}

/// The `PT_LOAD` segments of the ELF image `data` (none if it does not parse).
pub fn segments(data: &[u8]) -> Vec<Segment> {
    crate::ehframe::count_parse();
    object::File::parse(data).map_or_else(|_| Vec::new(), |file| of_file(&file))
}

/// The `PT_LOAD` segments of a parsed ELF file.
pub fn of_file<'d>(file: &impl object::Object<'d>) -> Vec<Segment> {
    use object::ObjectSegment as _;
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

/// The bias (`pc − bias = object virtual address`) of a mapping of the file at `start`
/// from file offset `file_offset`, or `None` when no segment holds that offset.
///
/// ```
/// use sframe_user::segments::{Segment, mapping_bias};
///
/// let text = Segment { offset: 0x1000, vaddr: 0x1000, size: 0x2e1, executable: true };
/// // A position-independent executable's text, mapped at 0x5555_5555_5000 from file
/// // offset 0x1000: the object is loaded at 0x5555_5555_4000.
/// assert_eq!(mapping_bias(&[text], 0x5555_5555_5000, 0x1000), Some(0x5555_5555_4000));
/// assert_eq!(mapping_bias(&[text], 0x5555_5555_5000, 0x8000), None);
/// ```
pub fn mapping_bias(segments: &[Segment], start: u64, file_offset: u64) -> Option<u64> {
    // Segments are mapped from their page-aligned file offset. Two segments can share
    // a file page (the end of the read-only one and the start of the text, e.g. in
    // binaries linked by lld): executable mappings belong to executable segments.
    const PAGE: u64 = 4096;
    let executable = segments.iter().filter(|s| s.executable);
    let others = segments.iter().filter(|s| !s.executable);
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
            if !(aligned <= file_offset && file_offset < end) {
                return None;
            }
            // Object vaddr of the mapping's first byte.
            let start_vaddr = vaddr
                .checked_sub(slack)?
                .checked_add(file_offset - aligned)?;
            Some(start.wrapping_sub(start_vaddr))
        },
    )
}

/// The bias of an image mapped whole from its start (file offset 0 at `start`), as the
/// vDSO is: read from memory, not from a file.
pub fn image_bias(segments: &[Segment], start: u64) -> Option<u64> {
    let vaddr0 = segments.iter().find(|s| s.offset == 0)?.vaddr;
    Some(start.wrapping_sub(vaddr0))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bias_of_text_sharing_a_file_page_with_the_read_only_segment() {
        // The layout of a Rust binary linked here: the read-only segment ends at 0x12a28
        // and the text starts at file offset 0x12a30, vaddr 0x13a30, in the same page.
        let s = [
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
        ];
        let start = 0x55b4_6ae2_a000;
        assert_eq!(mapping_bias(&s, start, 0x12000), Some(start - 0x13000));
    }

    #[test]
    fn bias_of_a_plain_pie_text_segment() {
        let s = [
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
        ];
        assert_eq!(
            mapping_bias(&s, 0x5555_0000_1000, 0x1000),
            Some(0x5555_0000_0000)
        );
        // Unrelated offsets have no bias.
        assert_eq!(mapping_bias(&s, 0x5555_0000_1000, 0x9000), None);
        assert_eq!(image_bias(&s, 0x7fff_0000_0000), Some(0x7fff_0000_0000));
    }
}
