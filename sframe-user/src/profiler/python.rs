//! The profiler's CPython processes: which processes run CPython (found by
//! [`crate::python::Finder`]), their entries in the kernel side's `PY_PROCESSES`, and
//! the namer each one's [`TargetInfo`] keeps.

use std::{
    collections::HashSet,
    sync::Arc,
    time::{Duration, Instant},
};

use aya::{
    Ebpf,
    maps::{HashMap, MapData},
};
use sframe_common::{names::maps, python::PyProcess};

use super::TargetInfo;
use crate::python::{Finder, Found, PyNamer};

/// How soon a process whose file the finder is reading is looked at again.
const RETRY: Duration = Duration::from_millis(20);
/// How often the stacks are drained while Python processes are profiled, so that the
/// code objects of their new stacks are read while they live (a script of a second
/// would otherwise exit before the once-a-second drain).
const DRAIN: Duration = Duration::from_millis(200);

/// Owns the kernel's `PY_PROCESSES` and the finder.
pub(super) struct PythonTargets {
    finder: Option<Finder>,
    map: Option<HashMap<MapData, u32, PyProcess>>,
    /// Processes whose candidate file the finder is reading (or that were seen before
    /// it started), and when to look at them again.
    pending: HashSet<u32>,
    retry_at: Option<Instant>,
    /// Processes with a kernel entry.
    installed: HashSet<u32>,
    /// The loop runs: the finder's thread may start (after `--drop-privileges`).
    may_start: bool,
    /// When the stacks were last drained for the Python processes.
    last_drain: Instant,
}

impl PythonTargets {
    /// Takes the kernel's map and starts the finder; without either, no process gets
    /// Python frames (logged).
    pub(super) fn new(ebpf: &mut Ebpf) -> Self {
        let map = crate::bpf::take_map(ebpf, maps::PY_PROCESSES)
            .map_err(|e| log::warn!("no Python frames: {e}"))
            .ok();
        Self {
            finder: None,
            map,
            pending: HashSet::new(),
            retry_at: None,
            installed: HashSet::new(),
            may_start: false,
            last_drain: Instant::now(),
        }
    }

    /// The loop runs: the finder's thread may start when a process needs it (threads
    /// start after `--drop-privileges`, so that none keeps the privileges the start
    /// needed).
    pub(super) fn start(&mut self) {
        self.may_start = true;
    }

    /// Looks at `info`'s mappings: a CPython process gets its kernel entry and, unless it
    /// has one, a namer; a process whose file is being read is asked again by
    /// [`PythonTargets::pending`].
    pub(super) fn install(&mut self, info: &mut TargetInfo) {
        let pid = info.pid;
        if self.map.is_none() {
            return;
        }
        if !crate::python::has_candidate(&info.maps) {
            self.forget(pid);
            return;
        }
        if self.finder.is_none() {
            if !self.may_start {
                // Before the loop runs: looked at once it does.
                self.pending.insert(pid);
                self.retry_at = Some(Instant::now());
                return;
            }
            // Started at the first process that may run CPython: a profiler of other
            // programs runs no thread for it.
            match Finder::spawn() {
                Ok(f) => self.finder = Some(f),
                Err(e) => {
                    log::warn!("no Python frames: cannot start the finder: {e}");
                    self.map = None;
                    return;
                }
            }
        }
        let (Some(finder), Some(map)) = (&mut self.finder, &mut self.map) else {
            return;
        };
        match finder.find(pid, &info.maps) {
            Found::Python {
                build,
                start,
                offset,
            } => {
                self.pending.remove(&pid);
                let pidns = info.ns_pid.and_then(|_| crate::python::pid_namespace(pid));
                let Some(entry) = build.process_entry(start, offset, pidns) else {
                    return;
                };
                match map.insert(pid, entry, 0) {
                    Ok(()) => {
                        self.installed.insert(pid);
                    }
                    Err(e) => log::debug!("pid {pid}: no Python frames: {e}"),
                }
                if info.python.is_none() {
                    info.python = Some(Arc::new(PyNamer::new(pid, &build)));
                }
            }
            Found::Pending => {
                self.pending.insert(pid);
                self.retry_at.get_or_insert_with(|| Instant::now() + RETRY);
            }
            Found::No => self.forget(pid),
        }
    }

    /// When the stacks are to be drained next for the Python processes (none: there
    /// are none).
    pub(super) fn next_drain(&self) -> Option<Instant> {
        (!self.installed.is_empty()).then(|| self.last_drain + DRAIN)
    }

    /// Whether the stacks are to be drained now (and, if so, the time noted).
    pub(super) fn drain_due(&mut self) -> bool {
        let due = self.next_drain().is_some_and(|at| at <= Instant::now());
        if due {
            self.last_drain = Instant::now();
        }
        due
    }

    /// When [`PythonTargets::due`] has processes to look at again.
    pub(super) fn next_retry(&self) -> Option<Instant> {
        self.retry_at
    }

    /// Processes to [`PythonTargets::install`] again (their file was being read), once
    /// their retry is due.
    pub(super) fn due(&mut self) -> Vec<u32> {
        match self.retry_at {
            Some(at) if at <= Instant::now() && self.may_start => {
                self.retry_at = None;
                self.pending.iter().copied().collect()
            }
            _ => Vec::new(),
        }
    }

    /// `pid` exited (or is no longer profiled): its kernel entry goes.
    pub(super) fn forget(&mut self, pid: u32) {
        self.pending.remove(&pid);
        if self.installed.remove(&pid)
            && let Some(map) = &mut self.map
        {
            let _ = map.remove(&pid);
        }
    }
}
