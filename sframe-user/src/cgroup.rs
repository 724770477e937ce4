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
    let first = if path.is_absolute() {
        path.to_owned()
    } else {
        Path::new("/sys/fs/cgroup").join(path)
    };
    let unified = (!path.is_absolute()).then(|| Path::new("/sys/fs/cgroup/unified").join(path));
    let path = std::iter::once(&first)
        .chain(&unified)
        .find(|p| p.is_dir())
        .unwrap_or(&first);
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

/// The cgroup v2 path of process `pid` (the `0::PATH` line of `/proc/PID/cgroup`), if
/// it has one. Read with a bound: the file is the kernel's, the path the cgroup's
/// creator's to choose.
pub fn process_cgroup(pid: u32) -> Option<String> {
    use std::io::Read as _;
    let file = std::fs::File::open(format!("/proc/{pid}/cgroup")).ok()?;
    let mut bytes = Vec::new();
    file.take(64 * 1024).read_to_end(&mut bytes).ok()?;
    v2_path(&String::from_utf8_lossy(&bytes)).map(str::to_owned)
}

/// The v2 path in the text of a `/proc/PID/cgroup`.
fn v2_path(text: &str) -> Option<&str> {
    text.lines().find_map(|l| l.strip_prefix("0::"))
}

/// Container runtimes recognized in cgroup paths: (scope prefix, runtime). A component
/// `PREFIX<64 hex>.scope` (systemd driver) or, under a parent named after the runtime,
/// a bare `<64 hex>` (cgroupfs driver) names a container.
const RUNTIMES: &[(&str, &str)] = &[
    ("docker-", "docker"),
    ("cri-containerd-", "containerd"),
    ("crio-", "cri-o"),
    ("libpod-", "podman"),
];

/// Parents under which a bare 64-hex component is a container (cgroupfs drivers).
const CGROUPFS_PARENTS: &[(&str, &str)] = &[
    ("docker", "docker"),
    ("kubepods", "kubernetes"),
    ("besteffort", "kubernetes"),
    ("burstable", "kubernetes"),
    ("libpod_parent", "podman"),
];

/// A container named by a cgroup path.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Container {
    /// The 64-hex container id.
    pub id: String,
    pub runtime: &'static str,
    /// The Kubernetes pod UID, when a `pod<UID>` component names one.
    pub pod_uid: Option<String>,
}

fn is_id(s: &str) -> bool {
    s.len() == 64
        && s.bytes()
            .all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase())
}

/// The container a cgroup v2 path names, if it names one (innermost component wins).
pub fn container(path: &str) -> Option<Container> {
    let parts: Vec<&str> = path.split('/').filter(|p| !p.is_empty()).collect();
    let pod_uid = parts.iter().find_map(|p| {
        let rest = p
            .strip_prefix("kubepods-besteffort-pod")
            .or_else(|| p.strip_prefix("kubepods-burstable-pod"))
            .or_else(|| p.strip_prefix("kubepods-pod"))
            .or_else(|| p.strip_prefix("pod"))?;
        let uid = rest
            .strip_suffix(".slice")
            .unwrap_or(rest)
            .replace('_', "-");
        (uid.len() == 36 && uid.bytes().all(|b| b.is_ascii_hexdigit() || b == b'-')).then_some(uid)
    });
    for (i, part) in parts.iter().enumerate().rev() {
        let scope = part.strip_suffix(".scope").unwrap_or(part);
        for (prefix, runtime) in RUNTIMES {
            if let Some(id) = scope.strip_prefix(prefix)
                && is_id(id)
            {
                return Some(Container {
                    id: id.to_owned(),
                    runtime,
                    pod_uid,
                });
            }
        }
        if is_id(part)
            && let Some(&parent) = i.checked_sub(1).and_then(|j| parts.get(j))
        {
            let parent = parent.strip_prefix("pod").map_or(parent, |_| "kubepods");
            if let Some((_, runtime)) = CGROUPFS_PARENTS.iter().find(|(p, _)| *p == parent) {
                return Some(Container {
                    id: (*part).to_owned(),
                    runtime,
                    pod_uid,
                });
            }
        }
    }
    None
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
    fn containers_of_each_runtime_are_recognized() {
        let id = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";
        let uid = "1b2c3d4e-0000-4a5b-8c9d-0123456789ab";
        let uid_ = uid.replace('-', "_");
        for (path, runtime, pod) in [
            (format!("/system.slice/docker-{id}.scope"), "docker", false),
            (format!("/docker/{id}"), "docker", false),
            (
                format!(
                    "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{uid_}.slice/cri-containerd-{id}.scope"
                ),
                "containerd",
                true,
            ),
            (
                format!("/kubepods/burstable/pod{uid}/{id}"),
                "kubernetes",
                true,
            ),
            (format!("/kubepods/pod{uid}/{id}"), "kubernetes", true),
            (
                format!("/kubepods.slice/kubepods-pod{uid_}.slice/crio-{id}.scope"),
                "cri-o",
                true,
            ),
            (
                format!("/machine.slice/libpod-{id}.scope/container"),
                "podman",
                false,
            ),
            (format!("/libpod_parent/{id}"), "podman", false),
        ] {
            let c = container(&path).unwrap_or_else(|| panic!("{path}"));
            assert_eq!(c.id, id, "{path}");
            assert_eq!(c.runtime, runtime, "{path}");
            assert_eq!(c.pod_uid.as_deref(), pod.then_some(uid), "{path}");
        }
        for path in [
            "/",
            "/user.slice/user-1000.slice/session-2.scope",
            "/system.slice/ssh.service",
            &format!("/mine/{id}"),
            &format!("/system.slice/docker-{}.scope", &id[1..]),
            &format!("/system.slice/docker-{}.scope", id.to_uppercase()),
        ] {
            assert_eq!(container(path), None, "{path}");
        }
        assert_eq!(v2_path("1:cpu:/\n0::/a/b\n"), Some("/a/b"));
        assert_eq!(v2_path("1:cpu:/x\n"), None);
        assert!(process_cgroup(std::process::id()).is_some());
    }

    #[test]
    fn a_plain_directory_is_not_a_cgroup() {
        let dir = std::env::temp_dir();
        assert!(matches!(resolve(&dir), Err(CgroupError::NotACgroup { .. })));
    }
}
