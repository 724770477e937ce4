//! `--cgroup PATH`: which processes belong to a cgroup.
//!
//! A cgroup v2 directory becomes a kernel-side filter (its id and depth: a sampled task
//! is a target when its ancestor at that depth is the cgroup), so processes that enter
//! it later are targets from their first sample. A cgroup v1 directory has no id the
//! BPF helpers can compare: its processes (`cgroup.procs`, sub-cgroups included) are
//! listed as targets, re-read every second, and their children are followed.

use std::{
    os::unix::fs::MetadataExt as _,
    path::{Path, PathBuf},
};

use sframe_common::event::CgroupFilter;

const CGROUP2_SUPER_MAGIC: i64 = 0x6367_7270;
const CGROUP_SUPER_MAGIC: i64 = 0x0027_e0eb;
/// Sub-cgroup depth scanned under a v1 cgroup.
const MAX_V1_DEPTH: usize = 16;
/// Processes read from one v1 cgroup tree.
const MAX_V1_PIDS: usize = 65_536;

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Cgroup {
    V2 { path: PathBuf, filter: CgroupFilter },
    V1 { path: PathBuf },
}

#[derive(Debug, thiserror::Error)]
pub enum CgroupError {
    #[error("cgroup {path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path} is not a cgroup directory (neither cgroup2 nor cgroup v1)")]
    NotACgroup { path: PathBuf },
    #[error("{path}: no cgroup2 mount contains it")]
    NoMount { path: PathBuf },
}

/// Resolves `path`: absolute, or relative to `/sys/fs/cgroup` (then
/// `/sys/fs/cgroup/unified`, where hybrid systems mount cgroup2).
pub fn resolve(path: &Path) -> Result<Cgroup, CgroupError> {
    let candidates: Vec<PathBuf> = if path.is_absolute() {
        vec![path.to_owned()]
    } else {
        vec![
            Path::new("/sys/fs/cgroup").join(path),
            Path::new("/sys/fs/cgroup/unified").join(path),
        ]
    };
    let path = candidates
        .iter()
        .find(|p| p.is_dir())
        .unwrap_or(&candidates[0]);
    let io = |source| CgroupError::Io {
        path: path.clone(),
        source,
    };
    let path = path.canonicalize().map_err(io)?;
    let magic = fs_magic(&path).map_err(io)?;
    if magic == CGROUP_SUPER_MAGIC {
        return Ok(Cgroup::V1 { path });
    }
    if magic != CGROUP2_SUPER_MAGIC {
        return Err(CgroupError::NotACgroup { path });
    }
    let id = std::fs::metadata(&path).map_err(io)?.ino();
    let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").map_err(io)?;
    let level = cgroup2_mounts(&mountinfo)
        .into_iter()
        .filter_map(|mount| {
            path.strip_prefix(&mount)
                .ok()
                .map(|rest| rest.components().count())
        })
        .min()
        .ok_or_else(|| CgroupError::NoMount { path: path.clone() })?;
    Ok(Cgroup::V2 {
        path,
        filter: CgroupFilter {
            id,
            level: level as u32,
            _pad: 0,
        },
    })
}

fn fs_magic(path: &Path) -> std::io::Result<i64> {
    let c = std::ffi::CString::new(path.as_os_str().as_encoded_bytes())
        .map_err(|_| std::io::Error::from(std::io::ErrorKind::InvalidInput))?;
    // SAFETY: statfs with a NUL-terminated path and a zeroed out-struct.
    let mut st: libc::statfs = unsafe { std::mem::zeroed() };
    if unsafe { libc::statfs(c.as_ptr(), &mut st) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(st.f_type as i64)
}

/// Mount points of cgroup2 file systems, from `/proc/self/mountinfo` text.
fn cgroup2_mounts(mountinfo: &str) -> Vec<PathBuf> {
    mountinfo
        .lines()
        .filter_map(|line| {
            let (left, right) = line.split_once(" - ")?;
            (right.split_whitespace().next()? == "cgroup2")
                .then(|| left.split_whitespace().nth(4).map(PathBuf::from))?
        })
        .collect()
}

/// Processes of a v1 cgroup and its sub-cgroups (at most `MAX_V1_PIDS`).
pub fn v1_pids(path: &Path) -> Vec<u32> {
    let mut pids = Vec::new();
    let mut dirs = vec![(path.to_owned(), 0)];
    while let Some((dir, depth)) = dirs.pop() {
        if let Ok(text) = std::fs::read_to_string(dir.join("cgroup.procs")) {
            pids.extend(text.lines().filter_map(|l| l.trim().parse::<u32>().ok()));
        }
        if pids.len() >= MAX_V1_PIDS {
            pids.truncate(MAX_V1_PIDS);
            break;
        }
        if depth < MAX_V1_DEPTH
            && let Ok(entries) = std::fs::read_dir(&dir)
        {
            for e in entries.flatten() {
                if e.file_type().is_ok_and(|t| t.is_dir()) {
                    dirs.push((e.path(), depth + 1));
                }
            }
        }
    }
    pids.sort_unstable();
    pids.dedup();
    pids
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_cgroup2_mounts() {
        let text = "25 30 0:22 / /sys/fs/cgroup/unified rw,relatime shared:9 - cgroup2 cgroup2 rw\n\
                    26 30 0:23 / /sys/fs/cgroup/cpu rw,relatime shared:10 - cgroup cgroup rw,cpu\n";
        assert_eq!(
            cgroup2_mounts(text),
            vec![PathBuf::from("/sys/fs/cgroup/unified")]
        );
    }

    #[test]
    fn a_plain_directory_is_not_a_cgroup() {
        let dir = std::env::temp_dir();
        assert!(matches!(resolve(&dir), Err(CgroupError::NotACgroup { .. })));
    }
}
