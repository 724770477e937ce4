//! Command mode: `sframe-user [OPTIONS] -- CMD [ARGS…]`, as `perf record -- CMD`.
//!
//! The command is forked and held before its exec until the profiler has registered it
//! as a target: its exec is then a target's exec, whose lifecycle event loads the new
//! image's tables, so its first samples already unwind (or wait, deferred, for those
//! tables). The child reports its pid through a pipe and waits on another for the go;
//! both are close-on-exec. Before the exec it takes the identity of `--run-as USER`
//! (default: the user who ran `sudo`, from `SUDO_UID`/`SUDO_GID`, else the profiler's
//! own): a user's command never runs as root by surprise.

use std::{
    ffi::CString,
    io,
    os::{fd::AsRawFd as _, unix::process::CommandExt as _},
    process::{Child, Command, ExitStatus},
    sync::mpsc,
    time::Duration,
};

use anyhow::{Context as _, Result, bail};

/// Who the command runs as.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Identity {
    pub uid: u32,
    pub gid: u32,
    pub groups: Vec<u32>,
}

/// The identity for `--run-as` (a user name or a numeric uid), else the `sudo` caller's,
/// else `None` (the profiler's own).
pub fn identity(run_as: Option<&str>) -> Result<Option<Identity>> {
    if let Some(user) = run_as {
        return user_identity(user).map(Some);
    }
    let env = |k: &str| std::env::var(k).ok().and_then(|v| v.parse::<u32>().ok());
    match (env("SUDO_UID"), env("SUDO_GID")) {
        (Some(uid), Some(gid)) => {
            let groups = passwd_by_uid(uid)
                .map(|(name, _)| group_list(&name, gid))
                .unwrap_or_else(|| vec![gid]);
            Ok(Some(Identity { uid, gid, groups }))
        }
        _ => Ok(None),
    }
}

fn user_identity(user: &str) -> Result<Identity> {
    let (name, uid, gid) = match user.parse::<u32>() {
        Ok(uid) => match passwd_by_uid(uid) {
            Some((name, gid)) => (name, uid, gid),
            // A uid without an account: its own group id, no supplementary groups.
            None => (String::new(), uid, uid),
        },
        Err(_) => {
            let c = CString::new(user).context("--run-as: a name with a NUL byte")?;
            // SAFETY: getpwnam(3) with a NUL-terminated name; the fields are copied out
            // at once, on this thread, before any other passwd call.
            let pw = unsafe { libc::getpwnam(c.as_ptr()) };
            if pw.is_null() {
                bail!("--run-as {user}: no such user");
            }
            // SAFETY: a non-null passwd entry from getpwnam.
            let (uid, gid) = unsafe { ((*pw).pw_uid, (*pw).pw_gid) };
            (user.to_owned(), uid, gid)
        }
    };
    let groups = if name.is_empty() {
        vec![gid]
    } else {
        group_list(&name, gid)
    };
    Ok(Identity { uid, gid, groups })
}

/// The account name and primary group of `uid`, if it has an account.
fn passwd_by_uid(uid: u32) -> Option<(String, u32)> {
    // SAFETY: getpwuid(3); the fields are copied out at once, before any other call.
    let pw = unsafe { libc::getpwuid(uid) };
    if pw.is_null() {
        return None;
    }
    // SAFETY: a non-null passwd entry with a NUL-terminated name.
    unsafe {
        let name = std::ffi::CStr::from_ptr((*pw).pw_name)
            .to_string_lossy()
            .into_owned();
        Some((name, (*pw).pw_gid))
    }
}

/// The groups of user `name` (primary `gid` included), from getgrouplist(3).
fn group_list(name: &str, gid: u32) -> Vec<u32> {
    let Ok(c) = CString::new(name) else {
        return vec![gid];
    };
    let mut n: libc::c_int = 64;
    loop {
        let mut groups = vec![0 as libc::gid_t; n as usize];
        let asked = n;
        // SAFETY: getgrouplist(3) with a NUL-terminated name, a buffer of `n` entries
        // and its length, which it updates.
        let r = unsafe { libc::getgrouplist(c.as_ptr(), gid, groups.as_mut_ptr(), &mut n) };
        if r >= 0 {
            groups.truncate(n.max(0) as usize);
            return groups;
        }
        if n <= asked || n > 65536 {
            return vec![gid];
        }
    }
}

/// A command started and held before its exec.
pub struct Started {
    pub child: Child,
}

/// Why the command did not start, with the exit status `sframe-user` then ends with
/// (127: not found, 126: found but not executable, as shells do).
pub struct NotStarted {
    pub status: i32,
    pub error: anyhow::Error,
}

fn pipe() -> io::Result<(std::os::fd::OwnedFd, std::os::fd::OwnedFd)> {
    use std::os::fd::FromRawFd as _;
    let mut fds = [0; 2];
    // SAFETY: pipe2(2) fills two descriptors we then own.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: both are new descriptors, owned from here on.
    Ok(unsafe {
        (
            std::os::fd::OwnedFd::from_raw_fd(fds[0]),
            std::os::fd::OwnedFd::from_raw_fd(fds[1]),
        )
    })
}

/// Forks `argv`, calls `register(pid)` while the child waits before its exec, then lets
/// it exec as `identity`.
pub fn start(
    argv: &[String],
    identity: Option<&Identity>,
    register: impl FnOnce(u32),
) -> std::result::Result<Started, NotStarted> {
    let not_started = |status, error| NotStarted { status, error };
    let Some((program, args)) = argv.split_first() else {
        return Err(not_started(2, anyhow::anyhow!("no command after --")));
    };
    let (pid_r, pid_w) = pipe().map_err(|e| not_started(1, e.into()))?;
    let (gate_r, gate_w) = pipe().map_err(|e| not_started(1, e.into()))?;
    let mut cmd = Command::new(program);
    cmd.args(args);
    let (pid_wfd, gate_rfd) = (pid_w.as_raw_fd(), gate_r.as_raw_fd());
    let id = identity.cloned();
    // SAFETY: the closure runs in the forked child before exec and makes only
    // async-signal-safe system calls (getpid, write, read, setgroups, setgid, setuid) on
    // values prepared before the fork; it allocates nothing.
    unsafe {
        cmd.pre_exec(move || {
            let pid = libc::getpid();
            let bytes = pid.to_ne_bytes();
            if libc::write(pid_wfd, bytes.as_ptr().cast(), bytes.len()) != bytes.len() as isize {
                return Err(io::Error::last_os_error());
            }
            let mut go = [0u8; 1];
            loop {
                let n = libc::read(gate_rfd, go.as_mut_ptr().cast(), 1);
                if n == 1 {
                    break;
                }
                if n < 0 && *libc::__errno_location() == libc::EINTR {
                    continue;
                }
                // The profiler went away before letting it run.
                return Err(io::Error::from(io::ErrorKind::BrokenPipe));
            }
            if let Some(id) = &id
                && (libc::setgroups(id.groups.len(), id.groups.as_ptr()) != 0
                    || libc::setgid(id.gid) != 0
                    || libc::setuid(id.uid) != 0)
            {
                return Err(io::Error::last_os_error());
            }
            Ok(())
        });
    }
    // `spawn` returns only once the child has exec'd (or failed to): run it on its own
    // thread while this one registers the child and opens the gate.
    let (tx, rx) = mpsc::channel();
    let spawner = std::thread::spawn(move || {
        let _ = tx.send(cmd.spawn());
    });
    let mut pid_bytes = [0u8; 4];
    let mut got = 0;
    let mut result = None;
    while got < pid_bytes.len() {
        let mut fds = libc::pollfd {
            fd: pid_r.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd.
        let ready = unsafe { libc::poll(&mut fds, 1, 100) };
        if ready > 0 {
            // SAFETY: read(2) into the rest of a stack buffer.
            let n = unsafe {
                libc::read(
                    pid_r.as_raw_fd(),
                    pid_bytes[got..].as_mut_ptr().cast(),
                    pid_bytes.len() - got,
                )
            };
            if n > 0 {
                got += n as usize;
                continue;
            }
        }
        // No pid (yet): the spawn may have failed before the fork.
        if let Ok(r) = rx.recv_timeout(Duration::from_millis(1)) {
            result = Some(r);
            break;
        }
    }
    if got == pid_bytes.len() {
        register(i32::from_ne_bytes(pid_bytes) as u32);
        // SAFETY: write(2) of one byte to the gate we own.
        let _ = unsafe { libc::write(gate_w.as_raw_fd(), [1u8].as_ptr().cast(), 1) };
    }
    drop(gate_w);
    let result = match result {
        Some(r) => r,
        None => rx
            .recv()
            .unwrap_or_else(|_| Err(io::Error::other("the spawning thread died"))),
    };
    let _ = spawner.join();
    drop((pid_r, pid_w, gate_r));
    result.map(|child| Started { child }).map_err(|e| {
        let status = match e.kind() {
            io::ErrorKind::NotFound => 127,
            io::ErrorKind::PermissionDenied => 126,
            _ => 126,
        };
        not_started(
            status,
            anyhow::Error::new(e).context(format!("cannot run {program}")),
        )
    })
}

/// The exit status `sframe-user` ends with for the command's: its code, or 128 + the
/// signal that killed it (as shells and `perf record` report it).
pub fn exit_code(status: ExitStatus) -> i32 {
    use std::os::unix::process::ExitStatusExt as _;
    status
        .code()
        .or_else(|| status.signal().map(|s| 128 + s))
        .unwrap_or(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn runs_held_until_registered_and_reports_status() {
        let mut registered = None;
        let started = start(&["sh".into(), "-c".into(), "exit 7".into()], None, |pid| {
            registered = Some(pid)
        })
        .ok()
        .expect("started");
        let mut child = started.child;
        assert_eq!(registered, Some(child.id()));
        assert_eq!(exit_code(child.wait().unwrap()), 7);
        let killed = start(
            &["sh".into(), "-c".into(), "kill -TERM $$".into()],
            None,
            |_| {},
        )
        .ok()
        .expect("started");
        let mut child = killed.child;
        assert_eq!(exit_code(child.wait().unwrap()), 143);
    }

    #[test]
    fn a_missing_command_is_127_and_a_directory_126() {
        let missing = start(&["/nonexistent/sframe-cmd".into()], None, |_| {});
        let e = missing.err().expect("not started");
        assert_eq!(e.status, 127);
        assert!(format!("{:#}", e.error).contains("/nonexistent/sframe-cmd"));
        let dir = start(&["/".into()], None, |_| {});
        assert_eq!(dir.err().expect("not started").status, 126);
    }

    #[test]
    fn identities_from_names_uids_and_sudo() {
        let root = user_identity("root").unwrap();
        assert_eq!((root.uid, root.gid), (0, 0));
        assert_eq!(user_identity("0").unwrap().uid, 0);
        assert!(user_identity("no-such-user-sframe").is_err());
    }
}
