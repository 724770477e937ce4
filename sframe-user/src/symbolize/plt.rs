//! Names of PLT stubs, as perf and objdump give them: `NAME@plt`.
//!
//! PLT stubs have no symbols; blazesym would name them after the nearest preceding symbol
//! (often `_init`). Each x86-64 stub starts (after an optional `endbr64` and `bnd`
//! prefix) with one of:
//! - `jmp *DISP(%rip)`: through a GOT slot, whose `R_X86_64_JUMP_SLOT` (`.rela.plt`) or
//!   `R_X86_64_GLOB_DAT` (`.rela.dyn`, for `.plt.got`) relocation names the symbol.
//!   This covers `.plt` entries, `.plt.sec` (IBT) and `.plt.got`;
//! - `push $i`: the lazy-binding half of an IBT `.plt` entry, for relocation `i` of
//!   `.rela.plt`.
//!
//! PLT0 (`push GOT+8; jmp *GOT+16`), retpoline PLTs and anything else keep the generic
//! [`super::PLT_NAME`]. An `R_X86_64_IRELATIVE` slot (a local ifunc) is named after the
//! ifunc symbol at its resolver's address (else any symbol there), where objdump says
//! `*ABS*+0xADDR@plt`.
//!
//! The object is untrusted: the tables are read with bounds (a section larger than
//! [`MAX_SECTION_BYTES`] is not decoded) and a malformed one only loses the names.

use std::collections::HashMap;

use object::{
    Endianness, elf,
    read::elf::{ElfFile64, FileHeader as _, Rela as _, SectionHeader as _, Sym as _},
};

/// Largest PLT or relocation section decoded (a large program has a few thousand PLT
/// entries of 16 bytes, 24 bytes of relocation each).
pub(super) const MAX_SECTION_BYTES: u64 = 4 << 20;

const PLT_SECTIONS: [&[u8]; 3] = [b".plt", b".plt.sec", b".plt.got"];
const ENDBR64: [u8; 4] = [0xf3, 0x0f, 0x1e, 0xfa];

/// One PLT entry: its file-offset range and its name (`NAME@plt`), `None` when unknown.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct PltEntry {
    pub start: u64,
    pub end: u64,
    pub name: Option<String>,
}

/// The PLT sections of an object and their entries.
#[derive(Debug, Default)]
pub(super) struct PltStubs {
    /// File-offset ranges of the PLT sections.
    sections: Vec<(u64, u64)>,
    /// Sorted by `start`, not overlapping.
    entries: Vec<PltEntry>,
}

impl PltStubs {
    /// `None` when `offset` is in no PLT section; `Some(None)` in a PLT section but no
    /// known entry; else the entry's `NAME@plt`.
    pub(super) fn name_at(&self, offset: u64) -> Option<Option<&str>> {
        if !self
            .sections
            .iter()
            .any(|&(s, e)| s <= offset && offset < e)
        {
            return None;
        }
        let i = self.entries.partition_point(|e| e.start <= offset);
        let entry = i.checked_sub(1).and_then(|i| self.entries.get(i));
        Some(
            entry
                .filter(|e| offset < e.end)
                .and_then(|e| e.name.as_deref()),
        )
    }

    #[cfg(test)]
    pub(super) fn entries(&self) -> &[PltEntry] {
        &self.entries
    }

    /// Reads the PLT sections of the ELF file `data` (a `ReadRef`, e.g. a `ReadCache` of
    /// the file: only the headers, PLT and relocation sections and the symbol tables
    /// they need are read).
    pub(super) fn read<'data, R: object::ReadRef<'data>>(data: R) -> Self {
        let Ok(elf) = ElfFile64::<Endianness, R>::parse(data) else {
            return Self::default();
        };
        let endian = elf.endian();
        let sections = elf.elf_section_table();
        let mut stubs = Self::default();
        let mut plts = Vec::new();
        for (_, header) in sections.enumerate() {
            let Ok(name) = sections.section_name(endian, header) else {
                continue;
            };
            if !PLT_SECTIONS.contains(&name) {
                continue;
            }
            let Some((offset, size)) = header.file_range(endian) else {
                continue;
            };
            let Some(end) = offset.checked_add(size) else {
                continue;
            };
            stubs.sections.push((offset, end));
            plts.push(header);
        }
        if plts.is_empty() || elf.elf_header().e_machine(endian) != elf::EM_X86_64 {
            return stubs;
        }
        let slots = Slots::read(&elf);
        for header in plts {
            let (offset, size) = header.file_range(endian).unwrap_or_default();
            if size > MAX_SECTION_BYTES {
                continue;
            }
            let Ok(bytes) = header.data(endian, data) else {
                continue;
            };
            let addr: u64 = header.sh_addr(endian);
            let entsize = match header.sh_entsize(endian) {
                n @ (8 | 16 | 32) => n,
                _ => 16,
            };
            for (k, entry) in bytes.chunks_exact(entsize as usize).enumerate() {
                let at = k as u64 * entsize;
                stubs.entries.push(PltEntry {
                    start: offset + at,
                    end: offset + at + entsize,
                    name: slots.name_of(entry, addr.wrapping_add(at)),
                });
            }
        }
        stubs.entries.sort_by_key(|e| e.start);
        stubs.entries.dedup_by_key(|e| e.start);
        stubs
    }
}

/// What the PLT jumps through: GOT slot address → symbol, and `.rela.plt` in order.
#[derive(Default)]
struct Slots {
    by_got: HashMap<u64, String>,
    rela_plt: Vec<Option<String>>,
}

impl Slots {
    fn read<'data, R: object::ReadRef<'data>>(elf: &ElfFile64<'data, Endianness, R>) -> Self {
        let endian = elf.endian();
        let data = elf.data();
        let sections = elf.elf_section_table();
        let mut slots = Self::default();
        // Resolvers of IRELATIVE slots, named from .symtab (else .dynsym) on demand.
        let mut irelative: Vec<(u64, u64, Option<usize>)> = Vec::new();
        for (_, header) in sections.enumerate() {
            let name = sections.section_name(endian, header).unwrap_or_default();
            let is_rela_plt = name == b".rela.plt";
            if !(is_rela_plt || name == b".rela.dyn") {
                continue;
            }
            if header
                .file_range(endian)
                .is_none_or(|(_, n)| n > MAX_SECTION_BYTES)
            {
                continue;
            }
            let Ok(Some((relas, link))) = header.rela(endian, data) else {
                continue;
            };
            let symbols = sections.symbol_table_by_index(endian, data, link).ok();
            for rela in relas {
                let got = rela.r_offset(endian);
                let name = match rela.r_type(endian, false) {
                    elf::R_X86_64_JUMP_SLOT | elf::R_X86_64_GLOB_DAT => {
                        symbols.as_ref().and_then(|table| {
                            let sym = table.symbol(rela.symbol(endian, false)?).ok()?;
                            let name = table.symbol_name(endian, sym).ok()?;
                            (!name.is_empty()).then(|| plt_name(name))
                        })
                    }
                    elf::R_X86_64_IRELATIVE => {
                        let index = is_rela_plt.then_some(slots.rela_plt.len());
                        irelative.push((got, rela.r_addend(endian) as u64, index));
                        None
                    }
                    _ if is_rela_plt => None,
                    _ => continue,
                };
                if is_rela_plt {
                    slots.rela_plt.push(name.clone());
                }
                if let Some(name) = name {
                    slots.by_got.insert(got, name);
                }
            }
        }
        if !irelative.is_empty() {
            let resolvers = resolver_names(elf, &irelative);
            for (got, resolver, index) in irelative {
                if let Some(name) = resolvers.get(&resolver) {
                    slots.by_got.insert(got, name.clone());
                    if let Some(slot) = index.and_then(|i| slots.rela_plt.get_mut(i)) {
                        *slot = Some(name.clone());
                    }
                }
            }
        }
        slots
    }

    /// The name of the PLT entry `bytes` at address `addr`.
    fn name_of(&self, bytes: &[u8], addr: u64) -> Option<String> {
        let mut at = 0;
        if bytes.starts_with(&ENDBR64) {
            at = ENDBR64.len();
        }
        // `bnd` (MPX) prefix of older IBT PLTs.
        if bytes.get(at) == Some(&0xf2) {
            at += 1;
        }
        let imm = |from: usize| -> Option<i32> {
            Some(i32::from_le_bytes(
                bytes.get(from..from + 4)?.try_into().ok()?,
            ))
        };
        match bytes.get(at..at + 2)? {
            // jmp *disp32(%rip): the displacement is from the next instruction.
            [0xff, 0x25] => {
                let next = addr.wrapping_add(at as u64 + 6);
                let got = next.wrapping_add_signed(imm(at + 2)?.into());
                self.by_got.get(&got).cloned()
            }
            // push $index
            [0x68, _] => {
                let index = usize::try_from(imm(at + 1)?).ok()?;
                self.rela_plt.get(index)?.clone()
            }
            _ => None,
        }
    }
}

/// `NAME@plt`, demangled like the frames blazesym names.
fn plt_name(raw: &[u8]) -> String {
    let raw = String::from_utf8_lossy(raw);
    format!("{}@plt", crate::sanitize::name(&demangle(&raw)))
}

/// Rust, then C++ demangling (what blazesym does for names of unknown language); the
/// name as is when neither applies. Demanglers get untrusted names: a panic in one
/// keeps the mangled name.
fn demangle(name: &str) -> String {
    std::panic::catch_unwind(|| {
        if let Ok(d) = rustc_demangle::try_demangle(name) {
            return format!("{d:#}");
        }
        if name.starts_with("_Z")
            && let Ok(sym) = cpp_demangle::Symbol::new(name)
            && let Ok(d) = sym.demangle()
        {
            return d;
        }
        name.to_owned()
    })
    .unwrap_or_else(|_| name.to_owned())
}

/// Names (`NAME@plt`) of the functions at the resolver addresses of IRELATIVE slots.
fn resolver_names<'data, R: object::ReadRef<'data>>(
    elf: &ElfFile64<'data, Endianness, R>,
    irelative: &[(u64, u64, Option<usize>)],
) -> HashMap<u64, String> {
    let endian = elf.endian();
    let data = elf.data();
    let sections = elf.elf_section_table();
    let resolvers: std::collections::HashSet<u64> = irelative.iter().map(|&(_, r, _)| r).collect();
    // (is an ifunc symbol, name): the ifunc's own symbol has the resolver's address too,
    // and names what the program called.
    let mut wanted: HashMap<u64, (bool, String)> = HashMap::new();
    for sh_type in [elf::SHT_SYMTAB, elf::SHT_DYNSYM] {
        let Ok(table) = sections.symbols(endian, data, sh_type) else {
            continue;
        };
        for sym in table.iter() {
            let value: u64 = sym.st_value(endian);
            let ifunc = sym.st_type() == elf::STT_GNU_IFUNC;
            if sym.is_undefined(endian)
                || wanted.get(&value).is_some_and(|(i, _)| *i || !ifunc)
                || !resolvers.contains(&value)
            {
                continue;
            }
            if let Ok(name) = table.symbol_name(endian, sym)
                && !name.is_empty()
            {
                wanted.insert(value, (ifunc, plt_name(name)));
            }
        }
    }
    wanted.into_iter().map(|(v, (_, n))| (v, n)).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn slots() -> Slots {
        Slots {
            by_got: HashMap::from([(0x4000, "getppid@plt".to_owned())]),
            rela_plt: vec![Some("printf@plt".to_owned()), None],
        }
    }

    #[test]
    fn entry_forms() {
        let s = slots();
        // Classic entry at 0x1030: jmp *0x2fca(%rip) → 0x1036 + 0x2fca = 0x4000.
        let classic = [
            0xff, 0x25, 0xca, 0x2f, 0, 0, 0x68, 1, 0, 0, 0, 0xe9, 0, 0, 0, 0,
        ];
        assert_eq!(s.name_of(&classic, 0x1030).as_deref(), Some("getppid@plt"));
        // .plt.sec with endbr64 and bnd at 0x1080: next insn at 0x108b.
        let disp = (0x4000i64 - 0x108b) as i32;
        let mut sec = vec![0xf3, 0x0f, 0x1e, 0xfa, 0xf2, 0xff, 0x25];
        sec.extend(disp.to_le_bytes());
        sec.extend([0x0f, 0x1f, 0x44, 0x00, 0x00]);
        assert_eq!(s.name_of(&sec, 0x1080).as_deref(), Some("getppid@plt"));
        // IBT lazy entry: endbr64; push $0; bnd jmp PLT0.
        let lazy = [
            0xf3, 0x0f, 0x1e, 0xfa, 0x68, 0, 0, 0, 0, 0xf2, 0xe9, 0, 0, 0, 0, 0x90,
        ];
        assert_eq!(s.name_of(&lazy, 0x1030).as_deref(), Some("printf@plt"));
        // push of an index with an unnamed relocation, out of range, negative.
        for index in [1i32, 2, -1] {
            let mut e = vec![0x68];
            e.extend(index.to_le_bytes());
            assert_eq!(s.name_of(&e, 0), None, "{index}");
        }
        // PLT0: push GOT+8; jmp *GOT+16 (no relocation there).
        let plt0 = [
            0xff, 0x35, 0xca, 0x2f, 0, 0, 0xff, 0x25, 0xcc, 0x2f, 0, 0, 0x0f, 0x1f, 0x40, 0,
        ];
        assert_eq!(s.name_of(&plt0, 0x1020), None);
        // Truncated and empty entries.
        assert_eq!(s.name_of(&[0xff, 0x25, 0xca], 0x1030), None);
        assert_eq!(s.name_of(&[], 0), None);
        assert_eq!(s.name_of(&ENDBR64, 0), None);
        // The displacement wraps instead of overflowing.
        assert_eq!(
            s.name_of(&[0xff, 0x25, 0xff, 0xff, 0xff, 0x7f], u64::MAX),
            None
        );
    }

    #[test]
    fn name_at_uses_sections_and_entries() {
        let stubs = PltStubs {
            sections: vec![(0x1000, 0x1030)],
            entries: vec![
                PltEntry {
                    start: 0x1000,
                    end: 0x1010,
                    name: None,
                },
                PltEntry {
                    start: 0x1010,
                    end: 0x1020,
                    name: Some("a@plt".into()),
                },
            ],
        };
        assert_eq!(stubs.name_at(0xfff), None);
        assert_eq!(stubs.name_at(0x1000), Some(None));
        assert_eq!(stubs.name_at(0x1010), Some(Some("a@plt")));
        assert_eq!(stubs.name_at(0x101f), Some(Some("a@plt")));
        // In the section, after the last entry.
        assert_eq!(stubs.name_at(0x1025), Some(None));
        assert_eq!(stubs.name_at(0x1030), None);
    }

    #[test]
    fn demangles_like_blazesym() {
        assert_eq!(demangle("getppid"), "getppid");
        assert_eq!(demangle("_ZN2ns4funcEi"), "ns::func(int)");
        assert_eq!(
            demangle("_ZN4core3fmt5write17h0123456789abcdefE"),
            "core::fmt::write"
        );
        // Not valid mangling: unchanged.
        assert_eq!(demangle("_Zzz"), "_Zzz");
    }

    /// objdump's `<NAME@plt>` labels: (file offset, name).
    fn objdump_plt_labels(path: &std::path::Path) -> Vec<(u64, String)> {
        use object::{Object as _, ObjectSection as _};
        let data = std::fs::read(path).unwrap();
        let file = object::File::parse(&*data).unwrap();
        let out = std::process::Command::new("objdump")
            .args(["-d", "-j", ".plt", "-j", ".plt.sec", "-j", ".plt.got"])
            .arg(path)
            .output()
            .expect("run objdump");
        assert!(out.status.success());
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .filter_map(|l| {
                // "0000000000001030 <getppid@plt>:"
                let (addr, rest) = l.split_once(" <")?;
                let name = rest.strip_suffix(">:")?;
                // objdump names an ifunc's stub `*ABS*+0xRESOLVER@plt`; we name the ifunc.
                if !name.ends_with("@plt") || name.starts_with("*ABS*") {
                    return None;
                }
                let addr = u64::from_str_radix(addr, 16).ok()?;
                let section = file
                    .sections()
                    .find(|s| s.address() <= addr && addr < s.address() + s.size())?;
                let offset = section.file_range()?.0 + (addr - section.address());
                Some((offset, name.to_owned()))
            })
            .collect()
    }

    /// A shared library built by gcc, in each PLT layout ld makes: calls through the
    /// PLT to libc (`getppid`) and to its own exported function, and a function whose
    /// address is also taken (`.plt.got`). Every stub objdump names gets the same name,
    /// and PLT0 stays unnamed.
    #[test]
    fn gcc_shared_library_stubs_match_objdump() {
        let dir = std::env::temp_dir().join(format!("sframe-plt-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let src = dir.join("lib.c");
        std::fs::write(
            &src,
            "#include <unistd.h>\n#include <stdio.h>\n\
             __attribute__((noinline)) int lib_func(int x) { return x + getppid(); }\n\
             static int impl(int x) { return x * 2; }\n\
             static int (*resolve(void))(int) { return impl; }\n\
             static int ifn(int) __attribute__((ifunc(\"resolve\")));\n\
             int lib_entry(int x) { printf(\"%p\\n\", (void *)getpid); return lib_func(x) + (int)getpid() + ifn(x); }\n",
        )
        .unwrap();
        for (variant, flags) in [
            ("lazy", &["-Wl,-z,lazy"][..]),
            ("now", &["-Wl,-z,now"][..]),
            (
                "ibt",
                &["-fcf-protection=full", "-Wl,-z,ibtplt", "-Wl,-z,lazy"][..],
            ),
        ] {
            let lib = dir.join(format!("lib{variant}.so"));
            let status = std::process::Command::new("gcc")
                .args(["-O2", "-shared", "-fPIC"])
                .args(flags)
                .arg("-o")
                .arg(&lib)
                .arg(&src)
                .status()
                .expect("run gcc");
            assert!(status.success(), "gcc {flags:?}");
            let file = std::fs::File::open(&lib).unwrap();
            let stubs = PltStubs::read(&object::ReadCache::new(&file));
            let labels = objdump_plt_labels(&lib);
            assert!(labels.len() >= 3, "{variant}: objdump labels {labels:?}");
            for (offset, name) in &labels {
                assert_eq!(
                    stubs.name_at(*offset),
                    Some(Some(name.as_str())),
                    "{variant} at {offset:#x}: {:?}",
                    stubs.entries()
                );
                // Anywhere in the stub.
                assert_eq!(stubs.name_at(offset + 7), Some(Some(name.as_str())));
            }
            let names: Vec<&str> = stubs
                .entries()
                .iter()
                .filter_map(|e| e.name.as_deref())
                .collect();
            for want in [
                "getppid@plt",
                "lib_func@plt",
                "printf@plt",
                "getpid@plt",
                "ifn@plt",
            ] {
                assert!(names.contains(&want), "{variant}: {want} not in {names:?}");
            }
            let range = |name: &str| {
                use object::{Object as _, ObjectSection as _};
                let data = std::fs::read(&lib).unwrap();
                let file = object::File::parse(&*data).unwrap();
                let (start, size) = file.section_by_name(name)?.file_range()?;
                Some(start..start + size)
            };
            let names_in = |r: std::ops::Range<u64>| -> Vec<Option<&str>> {
                stubs
                    .entries()
                    .iter()
                    .filter(|e| r.contains(&e.start))
                    .map(|e| e.name.as_deref())
                    .collect()
            };
            // PLT0, at the start of .plt.
            let plt = range(".plt").unwrap();
            assert_eq!(stubs.name_at(plt.start), Some(None), "{variant}");
            assert_eq!(stubs.name_at(plt.start + 15), Some(None), "{variant}");
            if variant == "ibt" {
                // The lazy halves in .plt (`push $i`) have the names of their .plt.sec
                // entries, in the same order.
                let lazy = names_in(plt.start + 16..plt.end);
                assert_eq!(lazy, names_in(range(".plt.sec").unwrap()), "{variant}");
                assert!(lazy.iter().all(Option::is_some), "{lazy:?}");
            }
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn garbage_is_no_plt() {
        assert!(PltStubs::read(&[0u8; 64][..]).sections.is_empty());
        assert!(PltStubs::read(&b"\x7fELF"[..]).entries.is_empty());
    }
}
