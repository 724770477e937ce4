//! Changes the type of a BTF-defined map (a `.maps` variable) in a BPF object before it
//! is loaded: how the profiler creates `OFF_CPU_TASKS`, a task-storage map, on kernels
//! that have no task storage (before Linux 5.11), where the kernel would refuse the
//! whole object. aya creates every map of an object, and has no way to leave one out.
//!
//! A BTF map definition encodes each attribute as the length of an array its member
//! points to (libbpf's convention: `int (*type)[BPF_MAP_TYPE_HASH]`); the type is that
//! array's `nelems`, 4 bytes in `.BTF`, changed in a copy of the object. Nothing else
//! moves: sections, sizes and relocations stay as they were.

use object::{Object as _, ObjectSection as _};

/// BTF kinds (`include/uapi/linux/btf.h`).
const KIND_INT: u32 = 1;
const KIND_PTR: u32 = 2;
const KIND_ARRAY: u32 = 3;
const KIND_STRUCT: u32 = 4;
const KIND_UNION: u32 = 5;
const KIND_ENUM: u32 = 6;
const KIND_TYPEDEF: u32 = 8;
const KIND_VOLATILE: u32 = 9;
const KIND_CONST: u32 = 10;
const KIND_FUNC_PROTO: u32 = 13;
const KIND_VAR: u32 = 14;
const KIND_DATASEC: u32 = 15;
const KIND_DECL_TAG: u32 = 17;
const KIND_ENUM64: u32 = 19;
const KIND_MAX: u32 = 19;

/// One type of the BTF type section.
struct Type {
    kind: u32,
    name_off: u32,
    vlen: u32,
    /// `size` or `type`, by kind.
    size_or_type: u32,
    /// Offset of the kind-specific data after the 12-byte header, in the object.
    data: usize,
}

/// The parsed type section: types by id (id 0 is `void`, index 0 here is unused).
struct Btf<'a> {
    object: &'a [u8],
    types: Vec<Type>,
    strings: std::ops::Range<usize>,
}

fn u32_at(b: &[u8], at: usize) -> Result<u32, String> {
    b.get(at..at.saturating_add(4))
        .and_then(|w| <[u8; 4]>::try_from(w).ok())
        .map(u32::from_le_bytes)
        .ok_or_else(|| format!("BTF truncated at byte {at}"))
}

impl<'a> Btf<'a> {
    fn parse(object: &'a [u8]) -> Result<Self, String> {
        let file = object::File::parse(object).map_err(|e| e.to_string())?;
        let section = file
            .section_by_name(".BTF")
            .ok_or("the object has no .BTF")?;
        let (start, len) = section.file_range().ok_or(".BTF has no file data")?;
        let (start, len) = (start as usize, len as usize);
        let btf = object
            .get(start..start + len)
            .ok_or(".BTF out of the file")?;
        if btf.get(0..2) != Some(&[0x9f, 0xeb][..]) {
            return Err("not little-endian BTF".into());
        }
        let hdr_len = u32_at(btf, 4)? as usize;
        let type_off = u32_at(btf, 8)? as usize;
        let type_len = u32_at(btf, 12)? as usize;
        let str_off = u32_at(btf, 16)? as usize;
        let str_len = u32_at(btf, 20)? as usize;
        let types_start = start + hdr_len + type_off;
        let types_end = types_start + type_len;
        let strings = start + hdr_len + str_off..start + hdr_len + str_off + str_len;
        if types_end > start + len || strings.end > start + len {
            return Err("BTF sections out of .BTF".into());
        }
        let mut types = vec![Type {
            kind: 0,
            name_off: 0,
            vlen: 0,
            size_or_type: 0,
            data: 0,
        }];
        let mut at = types_start;
        while at < types_end {
            let name_off = u32_at(object, at)?;
            let info = u32_at(object, at + 4)?;
            let size_or_type = u32_at(object, at + 8)?;
            let kind = (info >> 24) & 0x1f;
            let vlen = info & 0xffff;
            let data = at + 12;
            let extra = match kind {
                KIND_INT | KIND_VAR | KIND_DECL_TAG => 4,
                KIND_ARRAY => 12,
                KIND_STRUCT | KIND_UNION | KIND_DATASEC | KIND_ENUM64 => 12 * vlen as usize,
                KIND_ENUM | KIND_FUNC_PROTO => 8 * vlen as usize,
                k if k <= KIND_MAX => 0,
                k => return Err(format!("unknown BTF kind {k}")),
            };
            types.push(Type {
                kind,
                name_off,
                vlen,
                size_or_type,
                data,
            });
            at = data + extra;
        }
        Ok(Self {
            object,
            types,
            strings,
        })
    }

    fn name(&self, off: u32) -> &[u8] {
        let from = self.strings.start + off as usize;
        let tail = self.object.get(from..self.strings.end).unwrap_or(&[]);
        tail.split(|&c| c == 0).next().unwrap_or(&[])
    }

    fn get(&self, id: u32) -> Result<&Type, String> {
        self.types
            .get(id as usize)
            .filter(|_| id != 0)
            .ok_or_else(|| format!("no BTF type {id}"))
    }

    /// `id` past typedefs and qualifiers.
    fn resolve(&self, mut id: u32) -> Result<&Type, String> {
        for _ in 0..16 {
            let t = self.get(id)?;
            if !matches!(t.kind, KIND_TYPEDEF | KIND_VOLATILE | KIND_CONST) {
                return Ok(t);
            }
            id = t.size_or_type;
        }
        Err("BTF type chain too long".into())
    }
}

/// A copy of `object` in which map `map` has type `map_type` (a `BPF_MAP_TYPE_*`).
pub fn with_map_type(object: &[u8], map: &str, map_type: u32) -> Result<Vec<u8>, String> {
    let btf = Btf::parse(object)?;
    let var = btf
        .types
        .iter()
        .find(|t| t.kind == KIND_VAR && btf.name(t.name_off) == map.as_bytes())
        .ok_or_else(|| format!("no BTF variable {map}"))?;
    let def = btf.resolve(var.size_or_type)?;
    if def.kind != KIND_STRUCT {
        return Err(format!("{map}'s BTF type is not a struct"));
    }
    let member = (0..def.vlen as usize)
        .map(|i| def.data + 12 * i)
        .find(|&m| u32_at(object, m).is_ok_and(|n| btf.name(n) == b"type"))
        .ok_or_else(|| format!("{map}'s definition has no `type` member"))?;
    let ptr_id = u32_at(object, member + 4)?;
    let ptr = btf.get(ptr_id)?;
    if ptr.kind != KIND_PTR {
        return Err(format!("{map}'s `type` is not a pointer"));
    }
    // The pointer type must be this member's alone: another map's definition (or any
    // struct) sharing it would change too.
    let users = btf
        .types
        .iter()
        .filter(|t| matches!(t.kind, KIND_STRUCT | KIND_UNION))
        .flat_map(|t| (0..t.vlen as usize).map(move |i| t.data + 12 * i + 4))
        .filter(|&at| u32_at(object, at).is_ok_and(|id| id == ptr_id))
        .count();
    if users != 1 {
        return Err(format!("{map}'s `type` pointer is shared ({users} users)"));
    }
    let array = btf.get(ptr.size_or_type)?;
    if array.kind != KIND_ARRAY {
        return Err(format!("{map}'s `type` does not point to an array"));
    }
    let nelems = array.data + 8;
    let mut out = object.to_vec();
    out.get_mut(nelems..nelems + 4)
        .ok_or("BTF array out of the object")?
        .copy_from_slice(&map_type.to_le_bytes());
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use aya_obj::generated::bpf_map_type;
    use sframe_common::names::maps;

    #[test]
    fn the_task_storage_map_becomes_a_hash_and_nothing_else_changes() {
        let object = crate::bpf::EBPF_OBJECT;
        let before = Btf::parse(object).expect("the object's BTF parses");
        let patched = with_map_type(
            object,
            maps::OFF_CPU_TASKS,
            bpf_map_type::BPF_MAP_TYPE_HASH as u32,
        )
        .expect("patched");
        assert_eq!(patched.len(), object.len());
        let changed: Vec<usize> = (0..object.len())
            .filter(|&i| object[i] != patched[i])
            .collect();
        assert!(!changed.is_empty() && changed.len() <= 4, "{changed:?}");
        let parsed = aya_obj::Object::parse(&patched).expect("the patched object parses");
        let map = &parsed.maps[maps::OFF_CPU_TASKS];
        assert_eq!(map.map_type(), bpf_map_type::BPF_MAP_TYPE_HASH as u32);
        let original = aya_obj::Object::parse(object).expect("parses");
        assert_eq!(
            original.maps[maps::OFF_CPU_TASKS].map_type(),
            bpf_map_type::BPF_MAP_TYPE_TASK_STORAGE as u32
        );
        for (name, m) in &original.maps {
            if name != maps::OFF_CPU_TASKS {
                assert_eq!(parsed.maps[name].map_type(), m.map_type(), "{name}");
            }
        }
        assert_eq!(
            before.types.len(),
            Btf::parse(&patched).unwrap().types.len()
        );
        assert!(with_map_type(object, "NO_SUCH_MAP", 1).is_err());
        assert!(with_map_type(&object[..object.len() / 2], maps::OFF_CPU_TASKS, 1).is_err());
    }
}
