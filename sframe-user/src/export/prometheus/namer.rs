//! Naming stacks off the profiler's event loop.
//!
//! The first time a stack reaches an object, the symbolizer opens and parses it
//! (symbol tables, DWARF line and inline information): milliseconds for a small
//! library, seconds for a compiler's hundreds of megabytes, and far more under
//! emulation or on a busy host. Done on the event loop, that held lifecycle events
//! back — a process that forked, executed and exited meanwhile was never read, and its
//! samples stayed without a table. The loop hands the addresses of new stacks to this
//! thread and picks the names up at a later update; the samples wait in the feed
//! meanwhile (bounded there).
//!
//! The thread has its own [`Symbolizer`] (blazesym's state is not `Send`), bounded
//! like every other; the loop's outputs (interval files, the final profile) keep theirs.

use std::{
    sync::mpsc::{self, Receiver, Sender, TryRecvError},
    thread,
};

use crate::{
    export::{Sleep, Stack},
    procfs::Mapping,
    symbolize::Symbolizer,
};

/// (pid, user stack, kernel stack, off-CPU sleep): what a name is made of.
pub(super) type NameKey = (u32, u64, i32, Option<Sleep>);

/// One stack to name: the addresses to symbolize, innermost first.
pub(super) struct Job {
    pub key: NameKey,
    /// [`crate::profiler::symbolization_addresses`] of the user stack.
    pub user: Vec<u64>,
    /// [`crate::profiler::kernel_symbolization_addresses`] of the kernel stack.
    pub kernel: Vec<u64>,
}

/// The new stacks of one process, with its mappings as the loop last read them.
pub(super) struct Batch {
    pub pid: u32,
    pub maps: Vec<Mapping>,
    pub jobs: Vec<Job>,
}

/// The naming thread and its two channels. Dropping it closes the job channel: the
/// thread ends after the batch it is naming.
pub(super) struct Namer {
    jobs: Sender<Vec<Batch>>,
    names: Receiver<Vec<(NameKey, String)>>,
}

impl Namer {
    pub fn spawn() -> std::io::Result<Self> {
        let (jobs, job_rx) = mpsc::channel::<Vec<Batch>>();
        let (name_tx, names) = mpsc::channel();
        thread::Builder::new()
            .name("sframe-namer".into())
            .spawn(move || {
                let mut symbolizer = Symbolizer::new();
                while let Ok(batches) = job_rx.recv() {
                    let named = name_batches(&mut symbolizer, batches);
                    if name_tx.send(named).is_err() {
                        break;
                    }
                }
            })?;
        Ok(Self { jobs, names })
    }

    /// Queues `batches` (the feed bounds how many stacks wait for names). False if
    /// the thread is gone.
    pub fn submit(&self, batches: Vec<Batch>) -> bool {
        batches.is_empty() || self.jobs.send(batches).is_ok()
    }

    /// The names made since the last call, without waiting.
    pub fn take_names(&self) -> Vec<(NameKey, String)> {
        let mut out = Vec::new();
        loop {
            match self.names.try_recv() {
                Ok(mut named) => out.append(&mut named),
                Err(TryRecvError::Empty | TryRecvError::Disconnected) => return out,
            }
        }
    }
}

/// Folded names (outermost first, `;` inside a name made `:`) of every job.
fn name_batches(s: &mut Symbolizer, batches: Vec<Batch>) -> Vec<(NameKey, String)> {
    let mut named = Vec::new();
    for batch in batches {
        for job in batch.jobs {
            let mut user = s.symbolize_user(batch.pid, &batch.maps, &job.user);
            user.reverse();
            let mut kernel = if job.kernel.is_empty() {
                Vec::new()
            } else {
                s.symbolize_kernel(&job.kernel)
            };
            kernel.reverse();
            let stack = Stack {
                tid: 0,
                thread: String::new(),
                user,
                kernel,
                count: 0,
                outcome: sframe_common::WalkOutcome::Complete,
                sleep: job.key.3,
            };
            let names: Vec<String> = stack.names().iter().map(|n| n.replace(';', ":")).collect();
            named.push((job.key, names.join(";")));
        }
    }
    s.end_round();
    named
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The loop's side never waits for the symbolizer: while the naming thread is
    /// held up (as by a first parse of a large object), submitting and collecting
    /// return at once, and the names come once it goes on.
    #[test]
    fn the_loop_does_not_wait_for_a_busy_symbolizer() {
        let namer = Namer::spawn().unwrap();
        // The naming thread's symbolizer waits for this to call into blazesym.
        let held = crate::symbolize::hold_blazesym();
        let key: NameKey = (std::process::id(), 7, -1, None);
        let addr = the_loop_does_not_wait_for_a_busy_symbolizer as *const () as u64;
        let maps = crate::procfs::read_maps(std::process::id()).unwrap();
        assert!(namer.submit(vec![Batch {
            pid: std::process::id(),
            maps,
            jobs: vec![Job {
                key,
                user: vec![addr],
                kernel: Vec::new(),
            }],
        }]));
        // Nothing can be named while the symbolizer is held; asking does not block.
        assert!(namer.take_names().is_empty());
        drop(held);
        // A guard against a hang only: the name comes as soon as the thread runs.
        let named = namer
            .names
            .recv_timeout(std::time::Duration::from_secs(60))
            .expect("no names from the naming thread");
        assert_eq!(named.len(), 1);
        assert_eq!(named[0].0, key);
        assert!(
            named[0]
                .1
                .contains("the_loop_does_not_wait_for_a_busy_symbolizer"),
            "{}",
            named[0].1
        );
    }
}
