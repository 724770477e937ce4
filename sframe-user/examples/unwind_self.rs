//! Unwinds this program's own stack with the library alone (no BPF, no symbolizer):
//! captures its registers and stack bytes, adds the executable file mappings of
//! `/proc/self/maps` to an [`Unwinder`], and prints the frames.
//!
//! ```text
//! cargo run -p sframe-user --no-default-features --example unwind_self
//! ```
//!
//! Exits with status 1 unless the walk is complete (it reached `_start`) and passed
//! through `main`'s frames.

use std::process::ExitCode;

use sframe_user::{
    procfs,
    unwinder::{Registers, Stack, Unwinder, WalkOutcome},
};

/// The registers at a point inside this function, and a copy of the stack from there to
/// the stack's top.
#[inline(never)]
fn capture() -> (Registers, Vec<u8>) {
    let (pc, sp, fp): (u64, u64, u64);
    #[cfg(target_arch = "x86_64")]
    let regs = {
        // SAFETY: reads three registers, writes nothing else.
        unsafe {
            std::arch::asm!("lea {pc}, [rip]", "mov {sp}, rsp", "mov {fp}, rbp",
                pc = out(reg) pc, sp = out(reg) sp, fp = out(reg) fp);
        }
        Registers::new(pc, sp, fp)
    };
    #[cfg(target_arch = "aarch64")]
    let regs = {
        let lr: u64;
        // SAFETY: reads four registers, writes nothing else.
        unsafe {
            std::arch::asm!("adr {pc}, .", "mov {sp}, sp", "mov {fp}, x29", "mov {lr}, x30",
                pc = out(reg) pc, sp = out(reg) sp, fp = out(reg) fp, lr = out(reg) lr);
        }
        Registers::new(pc, sp, fp).with(sframe_common::dwarf::AARCH64.ra, lr)
    };
    // The main thread's stack mapping ends where the stack starts.
    let maps = procfs::read_maps(std::process::id()).expect("/proc/self/maps");
    let top = maps
        .iter()
        .find(|m| m.start <= sp && sp < m.end)
        .expect("the stack is mapped")
        .end;
    let len = (top - sp).min(1 << 20) as usize;
    // SAFETY: [sp, sp + len) is this thread's mapped stack, above the current frame's
    // stack pointer; it is read, not written.
    let bytes = unsafe { std::slice::from_raw_parts(sp as *const u8, len) }.to_vec();
    (regs, bytes)
}

#[inline(never)]
fn deeper(n: u32) -> (Registers, Vec<u8>) {
    if n == 0 {
        capture()
    } else {
        let r = deeper(n - 1);
        std::hint::black_box(r)
    }
}

fn main() -> ExitCode {
    let (regs, stack) = deeper(3);
    let mut unwinder = Unwinder::new();
    let mut paths = Vec::new();
    for m in procfs::read_executable_maps(std::process::id()).expect("/proc/self/maps") {
        if !m.path.starts_with('/') {
            continue; // the vDSO, anonymous code
        }
        let Ok(elf) = std::fs::read(&m.path) else {
            continue;
        };
        match unwinder.add_mapping(&elf, m.start, m.end, m.offset) {
            Ok(id) => paths.push((id, m.path.clone())),
            Err(e) => eprintln!("{}: {e}", m.path),
        }
    }
    let unwound = unwinder.unwind(&regs, &Stack::new(regs.sp, &stack));
    let name = |id| {
        paths
            .iter()
            .find(|(i, _)| *i == id)
            .map_or("?", |(_, p)| p.as_str())
    };
    for (i, f) in unwound.frames.iter().enumerate() {
        match f.object {
            Some((id, vaddr)) => println!("#{i:<2} {:#014x} {}+{vaddr:#x}", f.pc, name(id)),
            None => println!("#{i:<2} {:#014x} ?", f.pc),
        }
    }
    println!(
        "{:?}: {} frames ({} from tables, {} from frame pointers)",
        unwound.outcome,
        unwound.frames.len(),
        unwound.frames_from_table,
        unwound.frames_from_fp
    );
    // capture, deeper ×4 (the three inner ones return to the same call), main, and the
    // runtime's frames below them.
    let f = &unwound.frames;
    let recursion = f.len() >= 7 && f[2].pc == f[3].pc && f[3].pc == f[4].pc && f[1].pc != f[2].pc;
    let complete = unwound.outcome == WalkOutcome::Complete && recursion;
    if complete {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}
