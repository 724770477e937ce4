//! `perf record --call-graph dwarf` as ground truth for the walker: recording a process,
//! reading the user stacks `perf script` prints, and the frame keys stacks are compared by
//! (tests and `sframe-bench`'s accuracy section).

use std::{
    io,
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
};

/// One user frame as `perf script` prints it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PerfFrame {
    /// File-relative address (PC for the innermost frame, RA − 1 for callers).
    pub offset: u64,
    pub sym: String,
    /// Object basename.
    pub object: String,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PerfStack {
    /// User frames, outermost first.
    pub frames: Vec<PerfFrame>,
}

#[derive(Debug, thiserror::Error)]
pub enum PerfError {
    #[error("cannot run perf: {0}")]
    Spawn(#[source] io::Error),
    #[error("perf {what} failed: {stderr}")]
    Failed { what: &'static str, stderr: String },
}

/// A running `perf record -e cpu-clock --call-graph dwarf,STACK -p PID -- sleep SECS`.
pub struct PerfRecord {
    child: Child,
    data: PathBuf,
}

impl PerfRecord {
    /// Starts recording `pid` for `secs` at `frequency` Hz, copying `stack_bytes` of
    /// user stack per sample, into `dir/perf.data`.
    pub fn start(
        pid: u32,
        frequency: u64,
        stack_bytes: u32,
        secs: f64,
        dir: &Path,
    ) -> Result<Self, PerfError> {
        let data = dir.join(format!("perf-{pid}.data"));
        let child = Command::new("perf")
            .args(["record", "-q", "-e", "cpu-clock", "-F"])
            .arg(frequency.to_string())
            .arg("--call-graph")
            .arg(format!("dwarf,{stack_bytes}"))
            .arg("-o")
            .arg(&data)
            .arg("-p")
            .arg(pid.to_string())
            .args(["--", "sleep"])
            .arg(format!("{secs}"))
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(PerfError::Spawn)?;
        Ok(Self { child, data })
    }

    /// Waits for the recording to end and returns its user stacks (the data file is
    /// removed: several MB per second).
    pub fn finish(self) -> Result<Vec<PerfStack>, PerfError> {
        let out = self.child.wait_with_output().map_err(PerfError::Spawn)?;
        if !out.status.success() {
            let _ = std::fs::remove_file(&self.data);
            return Err(PerfError::Failed {
                what: "record",
                stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
            });
        }
        let script = Command::new("perf")
            .args(["script", "--no-inline", "--max-stack", "1024"])
            .args(["-F", "tid,ip,sym,dso", "-i"])
            .arg(&self.data)
            .output();
        let _ = std::fs::remove_file(&self.data);
        let script = script.map_err(PerfError::Spawn)?;
        if !script.status.success() {
            return Err(PerfError::Failed {
                what: "script",
                stderr: String::from_utf8_lossy(&script.stderr).into_owned(),
            });
        }
        Ok(parse_script(&String::from_utf8_lossy(&script.stdout)))
    }
}

/// Parses `perf script -F tid,ip,sym,dso` output: a line with the tid, then one line per
/// frame (`\t ADDR SYM (DSO)`, innermost first), then a blank line. Kernel frames are
/// dropped.
pub fn parse_script(text: &str) -> Vec<PerfStack> {
    let mut stacks = Vec::new();
    let mut current: Option<Vec<PerfFrame>> = None;
    for line in text.lines() {
        if line.starts_with('\t') {
            let (addr, rest) = line.trim().split_once(' ').unwrap_or((line.trim(), ""));
            let (sym, dso) = rest.rsplit_once(" (").unwrap_or((rest, ""));
            let dso = dso.strip_suffix(')').unwrap_or(dso);
            let Ok(offset) = u64::from_str_radix(addr, 16) else {
                continue;
            };
            if dso == "[kernel.kallsyms]" || offset >= 0xffff_8000_0000_0000 {
                continue;
            }
            if let Some(frames) = current.as_mut() {
                frames.push(PerfFrame {
                    offset,
                    sym: sym.to_string(),
                    object: dso.rsplit('/').next().unwrap_or(dso).to_string(),
                });
            }
        } else {
            if let Some(mut frames) = current.take() {
                frames.reverse();
                stacks.push(PerfStack { frames });
            }
            if !line.trim().is_empty() {
                current = Some(Vec::new());
            }
        }
    }
    if let Some(mut frames) = current {
        frames.reverse();
        stacks.push(PerfStack { frames });
    }
    stacks
}

/// A symbol name without the aliases' decorations that differ between symbol tables
/// (`__GI___getppid`, `__libc_start_main@@GLIBC_2.34`).
pub fn normalize(name: &str) -> &str {
    let name = name.split('@').next().unwrap_or(name);
    let name = name.strip_prefix("__GI_").unwrap_or(name);
    name.trim_start_matches('_')
}

/// A function's name reduced to what every symbolizer agrees on, to compare functions
/// named by different tools: `normalize`d, without a C++ return type and parameter list
/// (blazesym demangles both, perf neither), and without glibc's `__libc_` alias prefix
/// (`__libc_malloc` is `malloc`).
pub fn function_key(name: &str) -> &str {
    let name = normalize(name);
    let mut depth = 0i32;
    let mut start = 0;
    let mut end = name.len();
    for (i, c) in name.char_indices() {
        match c {
            '<' => depth += 1,
            '>' => depth -= 1,
            ' ' if depth == 0 && !name[..i].ends_with("operator") => start = i + 1,
            '(' if depth == 0 && i > start => {
                end = i;
                break;
            }
            _ => {}
        }
    }
    let base = name.get(start..end).unwrap_or(name);
    base.strip_prefix("libc_").unwrap_or(base)
}

/// A frame as compared with perf: object, normalized name, and for callers the exact
/// offset of the call (the leaf's PC moves).
pub type CmpFrame = (String, String, Option<u64>);

/// The comparison key of a stack given outermost first as (object, name, offset).
pub fn cmp_key<'a>(
    frames: impl DoubleEndedIterator<Item = (&'a str, &'a str, u64)>,
) -> Vec<CmpFrame> {
    // Innermost first to know the leaf, then back to outermost first.
    let mut key: Vec<CmpFrame> = frames
        .rev()
        .enumerate()
        .map(|(i, (object, name, offset))| {
            (
                object.to_string(),
                normalize(name).to_string(),
                (i > 0).then_some(offset),
            )
        })
        .collect();
    key.reverse();
    key
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_stacks_outermost_first_without_kernel_frames() {
        let text = "1234\n\
            \tffffffff81000000 do_syscall_64 ([kernel.kallsyms])\n\
            \t1139 leaf (/tmp/fx)\n\
            \t1160 main (/tmp/fx)\n\
            \t29d8f __libc_start_call_main (/usr/lib/x86_64-linux-gnu/libc.so.6)\n\
            \n\
            1234\n\
            \t1139 leaf (/tmp/fx)\n";
        let stacks = parse_script(text);
        assert_eq!(stacks.len(), 2);
        let names: Vec<&str> = stacks[0].frames.iter().map(|f| f.sym.as_str()).collect();
        assert_eq!(names, ["__libc_start_call_main", "main", "leaf"]);
        assert_eq!(stacks[0].frames[0].object, "libc.so.6");
        assert_eq!(stacks[0].frames[2].offset, 0x1139);
        assert_eq!(stacks[1].frames.len(), 1);
    }

    #[test]
    fn function_keys_agree_across_symbolizers() {
        let blazesym = "void std::__introsort_loop<__gnu_cxx::__normal_iterator<unsigned int*, std::vector<unsigned int> >, long>(__gnu_cxx::__normal_iterator<unsigned int*, std::vector<unsigned int> >, long)";
        let perf = "std::__introsort_loop<__gnu_cxx::__normal_iterator<unsigned int*, std::vector<unsigned int> >, long>";
        assert_eq!(function_key(blazesym), function_key(perf));
        assert_eq!(function_key("Tree::run(int)"), "Tree::run");
        assert_eq!(function_key("__libc_malloc"), function_key("malloc"));
        assert_eq!(function_key("int_free"), "int_free");
        assert_eq!(function_key("operator new(unsigned long)"), "operator new");
    }

    #[test]
    fn keys_ignore_the_leaf_offset_and_alias_decorations() {
        let a = cmp_key(
            [
                ("libc.so.6", "__libc_start_main@@GLIBC_2.34", 0x10),
                ("fx", "leaf", 0x20),
            ]
            .into_iter(),
        );
        let b = cmp_key([("libc.so.6", "libc_start_main", 0x10), ("fx", "leaf", 0x24)].into_iter());
        assert_eq!(a, b);
        assert_eq!(a[0].2, Some(0x10));
        assert_eq!(a[1].2, None);
    }
}
