//! Adds an allocated `.sframe` section to a copy of an ELF64 file, in a new read-only
//! `PT_LOAD` segment so that a loader maps it (objcopy's `--add-section` adds the section
//! but no segment).
//!
//! Layout of the output: the input bytes unchanged, then, at the next page boundary, a
//! region mapped by the new segment at the next page after the highest `PT_LOAD` end:
//! the program header table (moved there because there is no room for one more entry in
//! place; `PT_PHDR` is updated), then the section. After it, outside any segment, the
//! section name table extended with `.sframe` and the section header table with one
//! more entry. The old program header table and name table stay behind as unused bytes.

use anyhow::{Context as _, Result, bail, ensure};
use object::Endianness;
use object::elf::{FileHeader64, PT_LOAD, PT_PHDR, ProgramHeader64, SHF_ALLOC, SHT_PROGBITS};
use object::pod::bytes_of;
use object::read::elf::{FileHeader, ProgramHeader, SectionHeader};

const PAGE: u64 = 0x1000;
const PHDR_SIZE: u64 = 56;
const SHDR_SIZE: u64 = 64;

/// Where the new region goes.
#[derive(Clone, Copy, Debug)]
pub struct Plan {
    region_offset: u64,
    region_vaddr: u64,
    /// Index in the new program header table of the new `PT_LOAD`.
    insert_at: usize,
    /// Virtual address the section will have: the writer needs it before the bytes exist.
    pub sframe_vaddr: u64,
}

fn align(v: u64, a: u64) -> Option<u64> {
    v.checked_add(a - 1).map(|x| x & !(a - 1))
}

fn parse(data: &[u8]) -> Result<(&FileHeader64<Endianness>, Endianness)> {
    let header = FileHeader64::<Endianness>::parse(data).context("not an ELF64 file")?;
    let e = header.endian().context("bad ELF byte order")?;
    Ok((header, e))
}

pub fn plan(data: &[u8]) -> Result<Plan> {
    let (h, e) = parse(data)?;
    ensure!(
        u64::from(h.e_phentsize.get(e)) == PHDR_SIZE,
        "unexpected program header size"
    );
    let phdrs = h
        .program_headers(e, data)
        .context("program headers unreadable")?;
    ensure!(!phdrs.is_empty(), "no program headers (not a linked file)");
    let mut max_end = 0u64;
    let mut last_load = None;
    for (i, p) in phdrs.iter().enumerate() {
        if p.p_type(e) == PT_LOAD {
            let end = p
                .p_vaddr(e)
                .checked_add(p.p_memsz(e))
                .context("PT_LOAD end overflows")?;
            max_end = max_end.max(end);
            last_load = Some(i);
        }
    }
    let last_load = last_load.context("no PT_LOAD segment")?;
    let region_vaddr = align(max_end, PAGE).context("address space full")?;
    let region_offset = align(data.len() as u64, PAGE).context("file too large")?;
    let table = (phdrs.len() as u64 + 1) * PHDR_SIZE;
    Ok(Plan {
        region_offset,
        region_vaddr,
        insert_at: last_load + 1,
        sframe_vaddr: region_vaddr
            .checked_add(align(table, 8).context("overflow")?)
            .context("address space full")?,
    })
}

/// A copy of `data` with `sframe` added as an allocated `.sframe` section at
/// `plan.sframe_vaddr`.
pub fn add_sframe(data: &[u8], plan: &Plan, sframe: &[u8]) -> Result<Vec<u8>> {
    let (h, e) = parse(data)?;
    ensure!(
        u64::from(h.e_shentsize.get(e)) == SHDR_SIZE,
        "unexpected section header size"
    );
    let shnum = h.e_shnum.get(e);
    let shstrndx = h.e_shstrndx.get(e);
    if shnum == 0 || shnum + 1 >= object::elf::SHN_LORESERVE || shstrndx >= shnum {
        bail!("no section headers, or extended section numbering (not supported)");
    }
    let shdrs = h
        .section_headers(e, data)
        .context("section headers unreadable")?;
    let strtab_hdr = shdrs
        .get(usize::from(shstrndx))
        .context("no section name table")?;
    let strtab = strtab_hdr
        .data(e, data)
        .context("section name table unreadable")?;
    for s in shdrs {
        let name_off = s.sh_name(e) as usize;
        if strtab
            .get(name_off..)
            .is_some_and(|n| n.starts_with(b".sframe\0"))
        {
            bail!("the file already has a .sframe section");
        }
    }
    let mut phdrs: Vec<ProgramHeader64<Endianness>> = h
        .program_headers(e, data)
        .context("program headers unreadable")?
        .to_vec();
    let table_len = (phdrs.len() as u64 + 1) * PHDR_SIZE;
    let sframe_in_region = plan.sframe_vaddr - plan.region_vaddr;
    let region_len = sframe_in_region + sframe.len() as u64;
    for p in phdrs.iter_mut().filter(|p| p.p_type(e) == PT_PHDR) {
        p.p_offset.set(e, plan.region_offset);
        p.p_vaddr.set(e, plan.region_vaddr);
        p.p_paddr.set(e, plan.region_vaddr);
        p.p_filesz.set(e, table_len);
        p.p_memsz.set(e, table_len);
    }
    let mut load = phdrs
        .iter()
        .copied()
        .find(|p| p.p_type(e) == PT_LOAD)
        .context("no PT_LOAD segment")?;
    load.p_flags.set(e, object::elf::PF_R);
    load.p_offset.set(e, plan.region_offset);
    load.p_vaddr.set(e, plan.region_vaddr);
    load.p_paddr.set(e, plan.region_vaddr);
    load.p_filesz.set(e, region_len);
    load.p_memsz.set(e, region_len);
    load.p_align.set(e, PAGE);
    phdrs.insert(plan.insert_at.min(phdrs.len()), load);

    let mut out = data.to_vec();
    out.resize(usize::try_from(plan.region_offset)?, 0);
    for p in &phdrs {
        out.extend_from_slice(bytes_of(p));
    }
    out.resize(out.len() + (sframe_in_region - table_len) as usize, 0);
    let sframe_offset = out.len() as u64;
    out.extend_from_slice(sframe);

    let mut names = strtab.to_vec();
    let name = u32::try_from(names.len()).context("name table too large")?;
    names.extend_from_slice(b".sframe\0");
    let names_offset = out.len() as u64;
    out.extend_from_slice(&names);
    out.resize(
        usize::try_from(align(out.len() as u64, 8).context("overflow")?)?,
        0,
    );
    let shoff = out.len() as u64;
    let mut new_shdrs = shdrs.to_vec();
    if let Some(s) = new_shdrs.get_mut(usize::from(shstrndx)) {
        s.sh_offset.set(e, names_offset);
        s.sh_size.set(e, names.len() as u64);
    }
    let mut sf = new_shdrs[usize::from(shstrndx)];
    sf.sh_name.set(e, name);
    sf.sh_type.set(e, SHT_PROGBITS);
    sf.sh_flags.set(e, u64::from(SHF_ALLOC));
    sf.sh_addr.set(e, plan.sframe_vaddr);
    sf.sh_offset.set(e, sframe_offset);
    sf.sh_size.set(e, sframe.len() as u64);
    sf.sh_link.set(e, 0);
    sf.sh_info.set(e, 0);
    sf.sh_addralign.set(e, 8);
    sf.sh_entsize.set(e, 0);
    new_shdrs.push(sf);
    for s in &new_shdrs {
        out.extend_from_slice(bytes_of(s));
    }

    let mut nh = *h;
    nh.e_phoff.set(e, plan.region_offset);
    nh.e_phnum.set(
        e,
        u16::try_from(phdrs.len())
            .ok()
            .filter(|n| *n < object::elf::PN_XNUM)
            .context("too many program headers")?,
    );
    nh.e_shoff.set(e, shoff);
    nh.e_shnum.set(e, shnum + 1);
    out[..size_of::<FileHeader64<Endianness>>()].copy_from_slice(bytes_of(&nh));
    Ok(out)
}
