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
    os::fd::{AsFd as _, AsRawFd as _, BorrowedFd, FromRawFd as _, OwnedFd},
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
    #[error("{path}: not the file that was mapped")]
    NotMapped { path: PathBuf },
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
pub fn open_in_root(root: &Path, path: &[u8]) -> Result<(File, Metadata), OpenError> {
    let (file, shown) = openat2_in_root(root, path, libc::O_RDONLY | FLAGS)?;
    checked(file, &shown)
}

/// The metadata of `path` resolved inside `root` as [`open_in_root`] does, through an
/// `O_PATH` descriptor: nothing is opened for reading, so a FIFO or a device cannot
/// block or be triggered. Regular files only.
pub fn stat_in_root(root: &Path, path: &[u8]) -> Result<Metadata, OpenError> {
    let (file, shown) = openat2_in_root(root, path, libc::O_PATH | libc::O_CLOEXEC)?;
    checked(file, &shown).map(|(_, meta)| meta)
}

/// Opens `path` (resolved in the profiler's own mount namespace, symlinks followed) only
/// if it is the regular file with device `dev` (major, minor as `/proc/PID/maps` shows
/// it) and inode `inode`: a file a process mapped, found by the path it mapped it from
/// after the process is gone. The path is first resolved with `O_PATH` (nothing opened:
/// a FIFO or a device is neither blocked on nor triggered), its inode checked, and the
/// file then reopened through that very descriptor, so a name swapped in between
/// changes nothing.
pub fn open_if_inode(
    path: &[u8],
    dev: (u32, u32),
    inode: u64,
) -> Result<(File, Metadata), OpenError> {
    use std::os::unix::{ffi::OsStrExt as _, fs::MetadataExt as _};
    let shown = PathBuf::from(std::ffi::OsStr::from_bytes(path));
    let handle = File::options()
        .read(true)
        .custom_flags(libc::O_PATH | libc::O_CLOEXEC)
        .open(&shown)
        .map_err(|source| OpenError::Io {
            path: shown.clone(),
            source,
        })?;
    let (handle, meta) = checked(handle, &shown)?;
    if crate::procfs::dev_major_minor(meta.dev()) != dev || meta.ino() != inode {
        return Err(OpenError::NotMapped { path: shown });
    }
    let reopen = PathBuf::from(format!("/proc/self/fd/{}", handle.as_raw_fd()));
    let (file, meta) = open_regular(&reopen)?;
    if crate::procfs::dev_major_minor(meta.dev()) != dev || meta.ino() != inode {
        return Err(OpenError::NotMapped { path: shown });
    }
    Ok((file, meta))
}

fn openat2_in_root(root: &Path, path: &[u8], flags: i32) -> Result<(File, PathBuf), OpenError> {
    use std::os::unix::ffi::OsStrExt as _;
    let relative = path
        .iter()
        .position(|&b| b != b'/')
        .and_then(|i| path.get(i..))
        .unwrap_or_default();
    let shown = root.join(std::ffi::OsStr::from_bytes(relative));
    let bad = || OpenError::BadPath {
        path: shown.clone(),
    };
    let c_root = CString::new(root.as_os_str().as_encoded_bytes()).map_err(|_| bad())?;
    let c_path = CString::new(relative).map_err(|_| bad())?;
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
    let file = openat2(
        dir.as_fd(),
        &c_path,
        flags,
        libc::RESOLVE_IN_ROOT | libc::RESOLVE_NO_MAGICLINKS,
    )
    .map_err(io)?;
    Ok((file, shown))
}

/// openat2(2) of `path` relative to `dir` with `flags` and `resolve`.
fn openat2(dir: BorrowedFd<'_>, path: &CString, flags: i32, resolve: u64) -> std::io::Result<File> {
    let how = OpenHow {
        flags: flags as u64,
        mode: 0,
        resolve,
    };
    // SAFETY: openat2(2) with a valid directory descriptor, a NUL-terminated path and an
    // initialized open_how of the size passed.
    let fd = unsafe {
        libc::syscall(
            libc::SYS_openat2,
            dir.as_raw_fd(),
            path.as_ptr(),
            &how as *const OpenHow,
            std::mem::size_of::<OpenHow>(),
        )
    };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: a new descriptor we own.
    Ok(unsafe { File::from_raw_fd(fd as i32) })
}

/// A process's root directory (`/proc/PID/root`), held open (`O_PATH`) so that files
/// of that process's mount namespace can be opened after it exits.
pub fn open_process_root(pid: u32) -> Result<OwnedFd, OpenError> {
    let path = PathBuf::from(format!("/proc/{pid}/root"));
    let dir = File::options()
        .read(true)
        .custom_flags(libc::O_PATH | libc::O_DIRECTORY | libc::O_CLOEXEC)
        .open(&path)
        .map_err(|source| OpenError::Io {
            path: path.clone(),
            source,
        })?;
    Ok(OwnedFd::from(dir))
}

/// Opens `path` (absolute as a process with root directory `root` sees it) read-only,
/// resolved entirely inside `root` and following no symlink at all (nor `/proc` magic
/// link), without blocking on a FIFO; regular files only. `shown` names it in errors.
pub fn open_in_root_no_links(
    root: BorrowedFd<'_>,
    path: &str,
    shown: &Path,
) -> Result<(File, Metadata), OpenError> {
    let relative = path.trim_start_matches('/');
    let c_path = CString::new(relative).map_err(|_| OpenError::BadPath {
        path: shown.to_owned(),
    })?;
    let file = openat2(
        root,
        &c_path,
        libc::O_RDONLY | libc::O_NOFOLLOW | FLAGS,
        libc::RESOLVE_IN_ROOT | libc::RESOLVE_NO_MAGICLINKS | libc::RESOLVE_NO_SYMLINKS,
    )
    .map_err(|source| OpenError::Io {
        path: shown.to_owned(),
        source,
    })?;
    checked(file, shown)
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
            open_in_root(&d, b"/lib.so"),
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
            match open_in_root(&root, p.as_bytes()) {
                Err(OpenError::Io { source, .. }) => {
                    assert_eq!(source.kind(), std::io::ErrorKind::NotFound, "{p}")
                }
                other => panic!("{p}: {other:?}"),
            }
        }
        // A relative symlink inside the root, and a plain file, are fine.
        std::fs::write(root.join("real.so"), b"\x7fELF").unwrap();
        symlink("real.so", root.join("rel.so")).unwrap();
        assert!(open_in_root(&root, b"/rel.so").is_ok());
        assert!(open_in_root(&root, b"real.so").is_ok());
        // /proc magic links are refused.
        assert!(open_in_root(Path::new("/"), b"/proc/self/exe").is_err());
        // The stat-only path resolves the same way, and refuses a FIFO without opening it.
        assert!(stat_in_root(&root, b"/rel.so").is_ok_and(|m| m.len() == 4));
        assert!(stat_in_root(&root, b"/secret.so").is_err());
        let fifo_root = tmp("fifo-root");
        mkfifo(&fifo_root.join("f.so"));
        assert!(matches!(
            stat_in_root(&fifo_root, b"/f.so"),
            Err(OpenError::NotRegular { .. })
        ));
    }

    #[test]
    fn a_host_path_is_opened_only_if_it_is_the_mapped_inode() {
        use std::os::unix::fs::MetadataExt as _;
        let d = tmp("inode");
        let real = d.join("lib.so");
        std::fs::write(&real, b"\x7fELF").unwrap();
        let meta = std::fs::metadata(&real).unwrap();
        let dev = crate::procfs::dev_major_minor(meta.dev());
        let bytes = real.as_os_str().as_encoded_bytes();
        assert!(open_if_inode(bytes, dev, meta.ino()).is_ok());
        assert!(matches!(
            open_if_inode(bytes, dev, meta.ino() + 1),
            Err(OpenError::NotMapped { .. })
        ));
        // A FIFO (or a device) under the name is never opened for reading.
        let fifo = d.join("fifo.so");
        mkfifo(&fifo);
        let fifo_ino = std::fs::metadata(&fifo).unwrap().ino();
        assert!(matches!(
            open_if_inode(fifo.as_os_str().as_encoded_bytes(), dev, fifo_ino),
            Err(OpenError::NotRegular { .. })
        ));
        let null = std::fs::metadata("/dev/null").unwrap();
        assert!(matches!(
            open_if_inode(
                b"/dev/null",
                crate::procfs::dev_major_minor(null.dev()),
                null.ino()
            ),
            Err(OpenError::NotRegular { .. })
        ));
    }
}
