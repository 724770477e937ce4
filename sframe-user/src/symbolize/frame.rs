//! The symbolized frame handed to the outputs (folded, svg, pprof, Prometheus).

use std::fmt::Write as _;

/// A source location (from DWARF line tables).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SourceLocation {
    /// File path as recorded in DWARF (directory joined when known).
    pub file: String,
    pub line: Option<u32>,
}

/// A function inlined into [`Frame::name`] at the symbolized address.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct InlinedFrame {
    /// Demangled name.
    pub name: String,
    /// Where in this inlined function the address is (for the innermost one), or where it
    /// calls the next inlined function.
    pub location: Option<SourceLocation>,
}

/// One symbolized address. Never an error: an address that cannot be symbolized has
/// `name: None` and says why in `reason`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Frame {
    /// Demangled function name without offset; `None` when unknown.
    pub name: Option<String>,
    /// Basename of the object (`libc.so.6`), a pseudo-name (`[vdso]`, `[heap]`,
    /// `[kernel.kallsyms]`) or `[unknown]` for an address in no mapping.
    pub object: String,
    /// Offset of the address in `object`'s file; for kernel frames and addresses outside
    /// any file mapping, the offset in the mapping (or the address itself).
    pub file_offset: u64,
    /// GNU build-id of the object, lowercase hex, when it has one.
    pub build_id: Option<String>,
    /// Source location of the address in `name` (or of its call to `inlined[0]`).
    pub location: Option<SourceLocation>,
    /// Functions inlined into `name` at this address, outermost first (DWARF only).
    pub inlined: Vec<InlinedFrame>,
    /// Why `name` is `None` (or a caveat when it is not).
    pub reason: Option<String>,
}

impl Frame {
    /// A frame that could not be symbolized.
    pub fn unknown(object: impl Into<String>, file_offset: u64, reason: impl Into<String>) -> Self {
        Self {
            name: None,
            object: object.into(),
            file_offset,
            build_id: None,
            location: None,
            inlined: Vec::new(),
            reason: Some(reason.into()),
        }
    }

    /// The function name, or `[object+0xOFFSET]` when unknown (the folded-format contract).
    pub fn folded_name(&self) -> String {
        match &self.name {
            // An interpreted frame: `qualname (file.py:line)`, as py-spy shows them.
            Some(name) if self.object == crate::python::PYTHON_OBJECT => match &self.location {
                Some(SourceLocation { file, line }) => {
                    let file = file.rsplit('/').next().unwrap_or(file);
                    match line {
                        Some(line) => format!("{name} ({file}:{line})"),
                        None => format!("{name} ({file})"),
                    }
                }
                None => name.clone(),
            },
            Some(name) => name.clone(),
            None => {
                let mut s = String::with_capacity(self.object.len() + 20);
                let _ = write!(s, "[{}+{:#x}]", self.object, self.file_offset);
                s
            }
        }
    }

    /// The frame as one or more folded frames, outermost first: the function, then each
    /// function inlined into it.
    pub fn folded_names(&self) -> Vec<String> {
        let mut names = Vec::with_capacity(1 + self.inlined.len());
        names.push(self.folded_name());
        if self.name.is_some() {
            names.extend(self.inlined.iter().map(|f| f.name.clone()));
        }
        names
    }
}

/// The file name of a mapping's path, without the ` (deleted)` suffix the kernel appends
/// to unlinked files. Pseudo-names (`[vdso]`) and empty paths come back unchanged.
pub fn object_basename(path: &str) -> String {
    let path = path.strip_suffix(" (deleted)").unwrap_or(path);
    let base = match path.rsplit('/').next() {
        Some(base) if path.starts_with('/') && !base.is_empty() => base,
        _ => path,
    };
    crate::sanitize::name(base).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn basename_strips_directories_and_deleted_suffix() {
        assert_eq!(object_basename("/usr/lib/libc.so.6"), "libc.so.6");
        assert_eq!(object_basename("/tmp/a b/prog (deleted)"), "prog");
        assert_eq!(
            object_basename("/tmp/prog (deleted) (deleted)"),
            "prog (deleted)"
        );
        assert_eq!(object_basename("[vdso]"), "[vdso]");
        assert_eq!(object_basename(""), "");
        assert_eq!(object_basename("/"), "/");
        assert_eq!(object_basename("/dir/"), "/dir/");
    }

    #[test]
    fn folded_names() {
        let mut f = Frame::unknown("prog", 0x1234, "stripped");
        assert_eq!(f.folded_name(), "[prog+0x1234]");
        assert_eq!(f.folded_names(), ["[prog+0x1234]"]);
        f.name = Some("outer".into());
        f.inlined = vec![
            InlinedFrame {
                name: "mid".into(),
                location: None,
            },
            InlinedFrame {
                name: "inner".into(),
                location: None,
            },
        ];
        assert_eq!(f.folded_name(), "outer");
        assert_eq!(f.folded_names(), ["outer", "mid", "inner"]);
    }
}
