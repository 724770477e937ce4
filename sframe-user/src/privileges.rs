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

/// `Ok(())` when the process has CAP_SYS_ADMIN, or CAP_BPF and CAP_PERFMON; otherwise
/// the reason.
pub fn bpf_privileges() -> Result<(), String> {
    let caps = effective_caps().ok_or("cannot read CapEff from /proc/self/status")?;
    let has = |cap: u32| caps & (1u64 << cap) != 0;
    if has(CAP_SYS_ADMIN) || (has(CAP_BPF) && has(CAP_PERFMON)) {
        Ok(())
    } else {
        Err(format!(
            "needs root or CAP_BPF+CAP_PERFMON (effective capabilities: {caps:#x})"
        ))
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
