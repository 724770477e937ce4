//! The raw sampler: the `sample_raw` perf-event program and its ring buffer.
//!
//! Each sample of a target process carries the user registers (from the interrupt frame,
//! or the task's saved user registers when the sample hit kernel mode) and the word at
//! the user stack pointer.

use aya::{
    Ebpf,
    maps::{HashMap, MapData, RingBuf},
    programs::perf_event::{PerfEventConfig, PerfEventScope, SamplePolicy, SoftwareEvent},
};
use sframe_common::RawSample;
use sframe_common::names::{maps, programs};

use crate::bpf::{self, LoadError};

const PROGRAM: &str = programs::SAMPLE_RAW;

/// A loaded raw-sample program.
pub struct RawSampler {
    ebpf: Ebpf,
    ring: RingBuf<MapData>,
}

/// Which tasks a perf event covers.
#[derive(Clone, Copy, Debug)]
pub enum Scope {
    /// One process (thread-group leader; with `inherit`, its later children too).
    Process { pid: u32 },
    /// Every task on every online CPU; the target map filters.
    AllCpus,
}

impl RawSampler {
    /// Loads the object and the program (not yet attached).
    pub fn load() -> Result<Self, LoadError> {
        let mut ebpf = bpf::load()?;
        bpf::spawn_logger(&mut ebpf);
        bpf::load_perf_event(&mut ebpf, PROGRAM)?;
        let ring = bpf::take_map(&mut ebpf, maps::RAW_SAMPLES)?;
        Ok(Self { ebpf, ring })
    }

    /// Adds a thread-group id to the targets.
    pub fn add_target(&mut self, pid: u32) -> Result<(), LoadError> {
        let map = self
            .ebpf
            .map_mut(maps::TARGET_TGIDS)
            .ok_or(LoadError::MissingMap {
                name: maps::TARGET_TGIDS,
            })?;
        let mut targets: HashMap<_, u32, u8> =
            HashMap::try_from(map).map_err(|source| LoadError::Map {
                name: maps::TARGET_TGIDS,
                source,
            })?;
        targets.insert(pid, 1, 0).map_err(|source| LoadError::Map {
            name: maps::TARGET_TGIDS,
            source,
        })
    }

    /// Attaches cpu-clock sampling at `frequency` Hz.
    pub fn attach(&mut self, scope: Scope, frequency: u64) -> Result<(), LoadError> {
        match scope {
            Scope::Process { pid } => {
                bpf::perf_event(&mut self.ebpf, PROGRAM)?
                    .attach(
                        PerfEventConfig::Software(SoftwareEvent::CpuClock),
                        PerfEventScope::OneProcess { pid, cpu: None },
                        SamplePolicy::Frequency(frequency),
                        true,
                    )
                    .map_err(|source| LoadError::Attach {
                        what: format!("cpu-clock to pid {pid}"),
                        source,
                    })?;
            }
            Scope::AllCpus => {
                bpf::attach_cpu_clock_all_cpus(&mut self.ebpf, PROGRAM, frequency)?;
            }
        }
        Ok(())
    }

    /// Moves every sample waiting in the ring buffer into `out`; returns how many.
    pub fn drain(&mut self, out: &mut Vec<RawSample>) -> usize {
        let mut n = 0;
        while let Some(item) = self.ring.next() {
            if item.len() >= core::mem::size_of::<RawSample>() {
                // SAFETY: the kernel wrote a RawSample (repr(C), any bit pattern valid);
                // read_unaligned copes with the ring's 8-byte alignment.
                let sample = unsafe { (item.as_ptr() as *const RawSample).read_unaligned() };
                out.push(sample);
                n += 1;
            }
        }
        n
    }

    /// The ring buffer's file descriptor, for polling.
    pub fn ring(&self) -> &RingBuf<MapData> {
        &self.ring
    }
}
