//! The off-CPU programs' attachment and settings: which program walks woken threads,
//! their links (detached while the governor pauses them), and the `OFF_CPU_CONTROL`
//! slots (sampling, observation window, pause factor).

use aya::{
    Ebpf,
    maps::{Array, MapData, PerCpuArray, PerCpuValues},
    programs::{
        BtfTracePoint, FExit, RawTracePoint, fexit::FExitLinkId,
        raw_trace_point::RawTracePointLinkId, tp_btf::BtfTracePointLinkId,
    },
};
use sframe_common::{
    names::{maps, programs},
    offcpu::{
        MAX_OFF_CPU_EVERY, MAX_OFF_CPU_PAUSE, OFF_CPU_CONTROL_EVERY, OFF_CPU_CONTROL_PAUSE,
        OFF_CPU_CONTROL_WINDOW, OffCpuDue,
    },
};

use super::LoadError;
use crate::bpf;

/// The link of the program that walks woken threads.
enum WalkerLink {
    /// Fexit of `schedule()`.
    Wake(FExitLinkId),
    /// Raw tracepoint `sys_exit` (where the fexit cannot attach).
    Return(RawTracePointLinkId),
}

/// The attached off-CPU programs and the governor's settings for them.
pub(super) struct OffCpu {
    /// `OFF_CPU_WAKE` or `OFF_CPU_RETURN`.
    walker: &'static str,
    /// `None` while paused.
    links: Option<(BtfTracePointLinkId, WalkerLink)>,
    every: u32,
    pause: u32,
    generation: u32,
}

impl OffCpu {
    /// Attaches the programs: the walk runs as the woken thread leaves `schedule()`
    /// where the kernel can trace that function (once per sleep), else at every system
    /// call's return (arm64 before Linux 6.4 has no fexit on ftrace-managed functions).
    pub(super) fn attach(ebpf: &mut Ebpf) -> Result<Self, LoadError> {
        let (walker, walker_link) =
            match bpf::attach_fexit(ebpf, programs::OFF_CPU_WAKE, "schedule") {
                Ok(link) => {
                    log::info!("off-CPU: walking woken threads as schedule() returns (fexit)");
                    (programs::OFF_CPU_WAKE, WalkerLink::Wake(link))
                }
                Err(err) => {
                    log::info!(
                        "off-CPU: no fexit on schedule() ({err}); walking at system call returns"
                    );
                    let link =
                        bpf::attach_raw_tracepoint(ebpf, programs::OFF_CPU_RETURN, "sys_exit")
                            .map_err(|source| LoadError::Program {
                                name: programs::OFF_CPU_RETURN,
                                source,
                            })?;
                    (programs::OFF_CPU_RETURN, WalkerLink::Return(link))
                }
            };
        let switch = bpf::attach_btf_tracepoint(ebpf, programs::OFF_CPU_SWITCH, "sched_switch")
            .map_err(|source| LoadError::Program {
                name: programs::OFF_CPU_SWITCH,
                source,
            })?;
        Ok(Self {
            walker,
            links: Some((switch, walker_link)),
            every: 1,
            pause: 1,
            generation: 0,
        })
    }

    pub(super) fn walker(&self) -> &'static str {
        self.walker
    }

    pub(super) fn every(&self) -> u32 {
        self.every
    }

    pub(super) fn pause(&self) -> u32 {
        self.pause
    }

    pub(super) fn attached(&self) -> bool {
        self.links.is_some()
    }

    /// 1 in `every` sleeps timed, clamped to 1..=`MAX_OFF_CPU_EVERY`.
    pub(super) fn set_every(&mut self, ebpf: &mut Ebpf, every: u32) -> Result<(), LoadError> {
        update_control(
            ebpf,
            OFF_CPU_CONTROL_EVERY,
            every.clamp(1, MAX_OFF_CPU_EVERY),
            &mut self.every,
        )
    }

    /// The pause factor, clamped to 1..=`MAX_OFF_CPU_PAUSE`: sleeps that start from
    /// now on count for that many (the caller detaches the programs for the rest).
    pub(super) fn set_pause(&mut self, ebpf: &mut Ebpf, pause: u32) -> Result<(), LoadError> {
        update_control(
            ebpf,
            OFF_CPU_CONTROL_PAUSE,
            pause.clamp(1, MAX_OFF_CPU_PAUSE),
            &mut self.pause,
        )
    }

    /// Detaches both programs (no cost at all until [`OffCpu::resume`]).
    pub(super) fn suspend(&mut self, ebpf: &mut Ebpf) -> Result<(), LoadError> {
        let Some((switch, walker)) = self.links.take() else {
            return Ok(());
        };
        let program: &mut BtfTracePoint = program_mut(ebpf, programs::OFF_CPU_SWITCH)?;
        program
            .detach(switch)
            .map_err(|source| LoadError::Program {
                name: programs::OFF_CPU_SWITCH,
                source,
            })?;
        match walker {
            WalkerLink::Wake(link) => {
                let program: &mut FExit = program_mut(ebpf, programs::OFF_CPU_WAKE)?;
                program.detach(link)
            }
            WalkerLink::Return(link) => {
                let program: &mut RawTracePoint = program_mut(ebpf, programs::OFF_CPU_RETURN)?;
                program.detach(link)
            }
        }
        .map_err(|source| LoadError::Program {
            name: self.walker,
            source,
        })
    }

    /// Attaches both programs again, in a new observation window: sleeps that began
    /// before are not charged, and no CPU keeps a sleep due from before.
    pub(super) fn resume(&mut self, ebpf: &mut Ebpf) -> Result<(), LoadError> {
        if self.links.is_some() {
            return Ok(());
        }
        self.generation = self.generation.wrapping_add(1);
        set_control(ebpf, OFF_CPU_CONTROL_WINDOW, self.generation)?;
        clear_due(ebpf)?;
        // The walker first: every sleep the switch program hands over finds it.
        let walker = match self.walker {
            programs::OFF_CPU_WAKE => {
                let program: &mut FExit = program_mut(ebpf, programs::OFF_CPU_WAKE)?;
                program.attach().map(WalkerLink::Wake)
            }
            _ => {
                let program: &mut RawTracePoint = program_mut(ebpf, programs::OFF_CPU_RETURN)?;
                program.attach("sys_exit").map(WalkerLink::Return)
            }
        }
        .map_err(|source| LoadError::Program {
            name: self.walker,
            source,
        })?;
        let program: &mut BtfTracePoint = program_mut(ebpf, programs::OFF_CPU_SWITCH)?;
        let switch = program.attach().map_err(|source| LoadError::Program {
            name: programs::OFF_CPU_SWITCH,
            source,
        })?;
        self.links = Some((switch, walker));
        Ok(())
    }
}

fn program_mut<'a, P>(ebpf: &'a mut Ebpf, name: &'static str) -> Result<&'a mut P, LoadError>
where
    &'a mut P: TryFrom<&'a mut aya::programs::Program, Error = aya::programs::ProgramError>,
{
    ebpf.program_mut(name)
        .ok_or(LoadError::Program {
            name,
            source: aya::programs::ProgramError::NotLoaded,
        })?
        .try_into()
        .map_err(|source| LoadError::Program { name, source })
}

/// Writes `value` into control slot `slot` when it differs from `current` (what the
/// slot holds), and records it there.
fn update_control(
    ebpf: &mut Ebpf,
    slot: u32,
    value: u32,
    current: &mut u32,
) -> Result<(), LoadError> {
    if value != *current {
        set_control(ebpf, slot, value)?;
        *current = value;
    }
    Ok(())
}

fn set_control(ebpf: &mut Ebpf, slot: u32, value: u32) -> Result<(), LoadError> {
    let name = maps::OFF_CPU_CONTROL;
    let map = ebpf.map_mut(name).ok_or(LoadError::MissingMap { name })?;
    let mut array: Array<&mut MapData, u32> =
        Array::try_from(map).map_err(|source| LoadError::Map { name, source })?;
    array
        .set(slot, value, 0)
        .map_err(|source| LoadError::Map { name, source })
}

fn clear_due(ebpf: &mut Ebpf) -> Result<(), LoadError> {
    let name = maps::OFF_CPU_DUE;
    let cpus = aya::util::nr_cpus().map_err(|(_, source)| LoadError::Map {
        name,
        source: aya::maps::MapError::IoError(source),
    })?;
    let map = ebpf.map_mut(name).ok_or(LoadError::MissingMap { name })?;
    let mut array: PerCpuArray<&mut MapData, OffCpuDue> =
        PerCpuArray::try_from(map).map_err(|source| LoadError::Map { name, source })?;
    let zeros = PerCpuValues::try_from(vec![OffCpuDue::default(); cpus]).map_err(|source| {
        LoadError::Map {
            name,
            source: aya::maps::MapError::IoError(source),
        }
    })?;
    array
        .set(0, zeros, 0)
        .map_err(|source| LoadError::Map { name, source })
}
