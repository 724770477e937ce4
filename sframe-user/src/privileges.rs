//! Can this process load BPF programs and open perf events?
//!
//! Tests that need BPF call [`require_bpf`]: in CI (`CI` set to a non-empty value other
//! than `false`/`0`) a missing privilege is a failure; elsewhere the test prints that it
//! was skipped and why.

/// True when running under CI, where BPF tests must not be skipped.
pub fn in_ci() -> bool {
    std::env::var("CI").is_ok_and(|v| !v.is_empty() && v != "false" && v != "0")
}

/// Capability bits from the kernel's capability.h.
const CAP_SYS_ADMIN: u32 = 21;
const CAP_PERFMON: u32 = 38;
const CAP_BPF: u32 = 39;

fn effective_caps() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let hex = status.lines().find_map(|l| l.strip_prefix("CapEff:"))?;
    u64::from_str_radix(hex.trim(), 16).ok()
}

/// Why this process may not load BPF programs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum PrivilegeError {
    /// `/proc/self/status` has no readable `CapEff` line.
    #[error("cannot read CapEff from /proc/self/status")]
    Unreadable,
    /// Neither CAP_SYS_ADMIN nor both CAP_BPF and CAP_PERFMON are effective.
    #[error("needs root or CAP_BPF+CAP_PERFMON (effective capabilities: {effective:#x})")]
    Missing { effective: u64 },
}

/// `Ok(())` when the process has CAP_SYS_ADMIN, or CAP_BPF and CAP_PERFMON; otherwise
/// the reason.
pub fn bpf_privileges() -> Result<(), PrivilegeError> {
    let caps = effective_caps().ok_or(PrivilegeError::Unreadable)?;
    let has = |cap: u32| caps & (1u64 << cap) != 0;
    if has(CAP_SYS_ADMIN) || (has(CAP_BPF) && has(CAP_PERFMON)) {
        Ok(())
    } else {
        Err(PrivilegeError::Missing { effective: caps })
    }
}

/// For tests: returns `true` when the test may go on. Without privileges it prints a
/// skip notice and returns `false`, except under CI where it panics.
pub fn require_bpf(test: &str) -> bool {
    match bpf_privileges() {
        Ok(()) => true,
        Err(why) if in_ci() => panic!("{test}: BPF test cannot run in CI: {why}"),
        Err(why) => {
            eprintln!("SKIPPED {test}: {why} (set CI=true to make this a failure)");
            false
        }
    }
}

/// Nice value of the profiler's event loop: it must run as soon as a process execs or
/// maps a library, ahead of the CPU-bound processes it profiles, or their first samples
/// find no tables. Its CPU use is small (and bounded by `--max-overhead`).
pub const EVENT_LOOP_NICE: i32 = -10;

/// Gives the calling thread `EVENT_LOOP_NICE` (needs CAP_SYS_NICE; without it the
/// thread keeps its priority, logged).
pub fn raise_event_loop_priority() {
    // SAFETY: gettid and setpriority on the calling thread.
    let tid = unsafe { libc::gettid() };
    let ret = unsafe { libc::setpriority(libc::PRIO_PROCESS, tid as libc::id_t, EVENT_LOOP_NICE) };
    if ret != 0 {
        log::info!(
            "event loop keeps its priority: {}",
            std::io::Error::last_os_error()
        );
    }
}

/// Logs go through `tracing` to standard error (records of the `log` crate, from this
/// crate, aya and the BPF programs' aya-log, are forwarded); `RUST_LOG` filters,
/// default `warn`.
pub fn init_logging() {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn"));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .try_init();
}

/// Capabilities the profiler keeps after `--drop-privileges`: what it needs once the BPF
/// programs are loaded and attached and the maps are open.
pub const KEPT_CAPABILITIES: &[(u32, &str)] = &[
    // Re-attaching the perf events when the governor changes the frequency.
    (CAP_PERFMON, "CAP_PERFMON"),
    (CAP_BPF, "CAP_BPF"),
    // Reading other processes' /proc/PID/mem (the vDSO) and maps.
    (CAP_SYS_PTRACE, "CAP_SYS_PTRACE"),
    // Reading files of any owner through /proc/PID/root.
    (CAP_DAC_READ_SEARCH, "CAP_DAC_READ_SEARCH"),
    // Opening /proc/PID/map_files/ entries.
    (CAP_CHECKPOINT_RESTORE, "CAP_CHECKPOINT_RESTORE"),
    // Kernel addresses in /proc/kallsyms for kernel frames.
    (CAP_SYSLOG, "CAP_SYSLOG"),
];

const CAP_DAC_READ_SEARCH: u32 = 2;
const CAP_SYS_PTRACE: u32 = 19;
const CAP_SYSLOG: u32 = 34;
const CAP_CHECKPOINT_RESTORE: u32 = 40;
const CAP_LAST: u32 = 40;

#[derive(Debug, thiserror::Error)]
pub enum DropError {
    #[error(
        "{0} threads run: capabilities are per thread, so they must be dropped before any other thread starts"
    )]
    Threads(usize),
    #[error("{what}: {source}")]
    Syscall {
        what: &'static str,
        #[source]
        source: std::io::Error,
    },
}

/// Keeps only `KEPT_CAPABILITIES` (effective, permitted; inheritable and ambient
/// cleared), removes every other capability from the bounding set, and sets
/// `no_new_privs`. Must run while this is the only thread of the process.
pub fn drop_privileges() -> Result<(), DropError> {
    let threads = std::fs::read_dir("/proc/self/task").map_or(1, |d| d.count());
    if threads != 1 {
        return Err(DropError::Threads(threads));
    }
    let sys = |what: &'static str, ret: libc::c_long| {
        if ret < 0 {
            Err(DropError::Syscall {
                what,
                source: std::io::Error::last_os_error(),
            })
        } else {
            Ok(())
        }
    };
    let keep: u64 = KEPT_CAPABILITIES.iter().map(|&(c, _)| 1u64 << c).sum();
    for cap in 0..=CAP_LAST {
        if keep & (1 << cap) == 0 {
            // SAFETY: prctl with integer arguments. EINVAL for caps unknown to an older
            // kernel is fine.
            unsafe { libc::prctl(libc::PR_CAPBSET_DROP, cap as libc::c_ulong, 0, 0, 0) };
        }
    }
    // SAFETY: prctl with integer arguments.
    sys("clearing ambient capabilities", unsafe {
        libc::prctl(
            libc::PR_CAP_AMBIENT,
            libc::PR_CAP_AMBIENT_CLEAR_ALL,
            0,
            0,
            0,
        ) as libc::c_long
    })?;
    #[repr(C)]
    struct Header {
        version: u32,
        pid: i32,
    }
    #[repr(C)]
    #[derive(Clone, Copy, Default)]
    struct Data {
        effective: u32,
        permitted: u32,
        inheritable: u32,
    }
    let mut header = Header {
        version: 0x2008_0522, // _LINUX_CAPABILITY_VERSION_3
        pid: 0,
    };
    let data = [
        Data {
            effective: keep as u32,
            permitted: keep as u32,
            inheritable: 0,
        },
        Data {
            effective: (keep >> 32) as u32,
            permitted: (keep >> 32) as u32,
            inheritable: 0,
        },
    ];
    // SAFETY: capset with a valid header and two data structs (version 3).
    sys("capset", unsafe {
        libc::syscall(libc::SYS_capset, &mut header as *mut Header, data.as_ptr())
    })?;
    // SAFETY: prctl with integer arguments.
    sys("no_new_privs", unsafe {
        libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) as libc::c_long
    })?;
    Ok(())
}
