//! The loader mounts tracefs when none is mounted, so the lifecycle tracepoints attach
//! on machines without systemd's automount (as CI's fresh machines are).

mod support;

use std::path::Path;

use sframe_user::bpf::{ensure_tracefs, tracepoint_format};
use support::bpf_or_skip;

const TRACEFS: &str = "/sys/kernel/tracing";

fn has_events(root: &str) -> bool {
    Path::new(root).join("events").is_dir()
}

/// Tracefs is reachable where the loader looks (its own mount, or debugfs's).
fn mounted() -> bool {
    has_events(TRACEFS) || has_events("/sys/kernel/debug/tracing")
}

#[test]
fn tracefs_is_mounted_when_missing() {
    if !bpf_or_skip("tracefs_is_mounted_when_missing") {
        return;
    }
    // Under CI (a throwaway machine, nothing else running) take it away first, so that
    // the mount itself is what is tested; elsewhere only check it is left alone.
    if sframe_user::privileges::in_ci()
        && has_events(TRACEFS)
        && !has_events("/sys/kernel/debug/tracing")
    {
        let path = std::ffi::CString::new(TRACEFS).unwrap();
        // SAFETY: a NUL-terminated path that outlives the call.
        let ret = unsafe { libc::umount2(path.as_ptr(), 0) };
        assert_eq!(
            ret,
            0,
            "umount {TRACEFS}: {}",
            std::io::Error::last_os_error()
        );
        assert!(!mounted(), "{TRACEFS} still has events after umount");
    }
    ensure_tracefs();
    assert!(mounted(), "no tracefs on {TRACEFS} after ensure_tracefs");
    let format = tracepoint_format("sched/sched_process_exec").expect("exec tracepoint format");
    assert!(format.contains("field:"), "{format}");
    // Idempotent: a second call with tracefs mounted changes nothing.
    ensure_tracefs();
    assert!(mounted());
}
