//! Opening files on behalf of processes the profiler does not trust.
//!
//! The profiler runs as root and opens the files that other users' processes map. A
//! path from `/proc/PID/maps` is the process's to choose: it may be a symlink to a file of
//! the host (an absolute symlink resolved from `/proc/PID/root` lands on the host's
//! root), a FIFO (opening one for reading blocks until a writer comes), or a device.
//! Every such open goes through here:
//! - `O_NONBLOCK | O_NOCTTY | O_CLOEXEC`, then `fstat`: only regular files are used;
//! - a path in the process's root is resolved with `openat2(RESOLVE_IN_ROOT |
//!   RESOLVE_NO_MAGICLINKS)`: every component, symlinks included, stays inside that
//!   root (an absolute symlink is taken relative to it), and `/proc` magic links are
//!   refused.

use std::{
    ffi::CString,
    fs::{File, Metadata},
    os::fd::{AsRawFd as _, FromRawFd as _, OwnedFd},
    os::unix::fs::OpenOptionsExt as _,
    path::{Path, PathBuf},
};

/// Why a file was not opened.
#[derive(Debug, thiserror::Error)]
pub enum OpenError {
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}: not a regular file")]
    NotRegular { path: PathBuf },
    #[error("{path}: a path with a NUL byte")]
    BadPath { path: PathBuf },
}

const FLAGS: i32 = libc::O_NONBLOCK | libc::O_NOCTTY | libc::O_CLOEXEC;

/// `struct open_how` of openat2(2) (libc's is non-exhaustive).
#[repr(C)]
struct OpenHow {
    flags: u64,
    mode: u64,
    resolve: u64,
}

fn checked(file: File, path: &Path) -> Result<(File, Metadata), OpenError> {
    let meta = file.metadata().map_err(|source| OpenError::Io {
        path: path.to_owned(),
        source,
    })?;
    if !meta.is_file() {
        return Err(OpenError::NotRegular {
            path: path.to_owned(),
        });
    }
    Ok((file, meta))
}

/// Opens `path` read-only if it is a regular file, without blocking on a FIFO or taking
/// a terminal. For paths the profiler trusts to resolve (`/proc/PID/map_files/...`, a
/// magic link to the mapped file itself).
pub fn open_regular(path: &Path) -> Result<(File, Metadata), OpenError> {
    let file = File::options()
        .read(true)
        .custom_flags(FLAGS)
        .open(path)
        .map_err(|source| OpenError::Io {
            path: path.to_owned(),
            source,
        })?;
    checked(file, path)
}

/// Opens `path` — absolute, as the process with root directory `root` sees it —
/// resolving it entirely inside `root`; regular files only.
pub fn open_in_root(root: &Path, path: &str) -> Result<(File, Metadata), OpenError> {
    let (file, shown) = openat2_in_root(root, path, libc::O_RDONLY | FLAGS)?;
    checked(file, &shown)
}

/// The metadata of `path` resolved inside `root` as [`open_in_root`] does, through an
/// `O_PATH` descriptor: nothing is opened for reading, so a FIFO or a device cannot
/// block or be triggered. Regular files only.
pub fn stat_in_root(root: &Path, path: &str) -> Result<Metadata, OpenError> {
    let (file, shown) = openat2_in_root(root, path, libc::O_PATH | libc::O_CLOEXEC)?;
    checked(file, &shown).map(|(_, meta)| meta)
}

fn openat2_in_root(root: &Path, path: &str, flags: i32) -> Result<(File, PathBuf), OpenError> {
    let shown = root.join(path.trim_start_matches('/'));
    let bad = || OpenError::BadPath {
        path: shown.clone(),
    };
    let c_root = CString::new(root.as_os_str().as_encoded_bytes()).map_err(|_| bad())?;
    let c_path = CString::new(path.trim_start_matches('/')).map_err(|_| bad())?;
    let io = |source| OpenError::Io {
        path: shown.clone(),
        source,
    };
    // SAFETY: open(2) of a NUL-terminated path; the descriptor is owned below.
    let dir = unsafe {
        libc::open(
            c_root.as_ptr(),
            libc::O_PATH | libc::O_DIRECTORY | libc::O_CLOEXEC,
        )
    };
    if dir < 0 {
        return Err(io(std::io::Error::last_os_error()));
    }
    // SAFETY: `dir` is a descriptor we own.
    let dir = unsafe { OwnedFd::from_raw_fd(dir) };
    let how = OpenHow {
        flags: flags as u64,
        mode: 0,
        resolve: libc::RESOLVE_IN_ROOT | libc::RESOLVE_NO_MAGICLINKS,
    };
    // SAFETY: openat2(2) with a valid directory descriptor, a NUL-terminated path and an
    // initialized open_how of the size passed.
    let fd = unsafe {
        libc::syscall(
            libc::SYS_openat2,
            dir.as_raw_fd(),
            c_path.as_ptr(),
            &how as *const OpenHow,
            std::mem::size_of::<OpenHow>(),
        )
    };
    if fd < 0 {
        return Err(io(std::io::Error::last_os_error()));
    }
    // SAFETY: a new descriptor we own.
    Ok((unsafe { File::from_raw_fd(fd as i32) }, shown))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::symlink;

    fn tmp(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("safe-open-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    fn mkfifo(p: &Path) {
        let c = CString::new(p.as_os_str().as_encoded_bytes()).unwrap();
        // SAFETY: mkfifo(3) of a NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
    }

    #[test]
    fn a_fifo_is_refused_without_blocking() {
        let d = tmp("fifo");
        let fifo = d.join("lib.so");
        mkfifo(&fifo);
        assert!(matches!(
            open_regular(&fifo),
            Err(OpenError::NotRegular { .. })
        ));
        assert!(matches!(
            open_in_root(&d, "/lib.so"),
            Err(OpenError::NotRegular { .. })
        ));
        assert!(matches!(
            open_regular(Path::new("/dev/null")),
            Err(OpenError::NotRegular { .. })
        ));
    }

    #[test]
    fn symlinks_resolve_inside_the_root() {
        // A "process root" whose lib.so is an absolute symlink to a host FIFO and to a
        // host file: both resolve inside the root, where they do not exist.
        let host = tmp("host");
        let host_fifo = host.join("fifo");
        mkfifo(&host_fifo);
        std::fs::write(host.join("secret"), b"host").unwrap();
        let root = tmp("root");
        symlink(&host_fifo, root.join("lib.so")).unwrap();
        symlink(host.join("secret"), root.join("secret.so")).unwrap();
        symlink("/../../../../etc/passwd", root.join("up.so")).unwrap();
        for p in ["/lib.so", "/secret.so", "/up.so"] {
            match open_in_root(&root, p) {
                Err(OpenError::Io { source, .. }) => {
                    assert_eq!(source.kind(), std::io::ErrorKind::NotFound, "{p}")
                }
                other => panic!("{p}: {other:?}"),
            }
        }
        // A relative symlink inside the root, and a plain file, are fine.
        std::fs::write(root.join("real.so"), b"\x7fELF").unwrap();
        symlink("real.so", root.join("rel.so")).unwrap();
        assert!(open_in_root(&root, "/rel.so").is_ok());
        assert!(open_in_root(&root, "real.so").is_ok());
        // /proc magic links are refused.
        assert!(open_in_root(Path::new("/"), "/proc/self/exe").is_err());
        // The stat-only path resolves the same way, and refuses a FIFO without opening it.
        assert!(stat_in_root(&root, "/rel.so").is_ok_and(|m| m.len() == 4));
        assert!(stat_in_root(&root, "/secret.so").is_err());
        let fifo_root = tmp("fifo-root");
        mkfifo(&fifo_root.join("f.so"));
        assert!(matches!(
            stat_in_root(&fifo_root, "/f.so"),
            Err(OpenError::NotRegular { .. })
        ));
    }
}
