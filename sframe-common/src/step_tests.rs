//! Host tests of the frame step and the walk: every branch of [`step_rule`] and
//! [`step_frame_pointer`] on hand-made rules and memory, and the walk's invariants on
//! host-side tables (the same code the eBPF program runs).

extern crate std;

use std::{collections::BTreeMap, vec, vec::Vec};

use super::*;
use crate::stack::frame_pc;

/// Stack memory: 8-byte words at their addresses; anything else faults.
struct Memory(BTreeMap<u64, u64>);

impl Memory {
    fn new(words: &[(u64, u64)]) -> Self {
        Self(words.iter().copied().collect())
    }
    fn reader(&self) -> impl FnMut(u64) -> Option<u64> + '_ {
        |a| self.0.get(&a).copied()
    }
}

fn rule(cfa_base: u8, cfa_offset: i32, ra: (u8, i16), fp: (u8, i16), flags: u8) -> RuleEntry {
    RuleEntry {
        cfa_offset,
        ra_offset: ra.1,
        fp_offset: fp.1,
        cfa_base,
        ra_kind: ra.0,
        fp_kind: fp.0,
        flags,
    }
}

/// x86-64 after `push %rbp; mov %rsp,%rbp`: CFA = FP + 16, RA at CFA − 8, FP at CFA − 16.
fn fp_frame() -> RuleEntry {
    rule(CFA_BASE_FP, 16, (REG_AT_CFA, -8), (REG_AT_CFA, -16), 0)
}

const SP: u64 = 0x7fff_0000;

fn regs(pc: u64, sp: u64, fp: u64) -> Regs {
    Regs { pc, sp, fp }
}

fn caller(regs: Regs, exact_pc: bool) -> Result<Step, WalkOutcome> {
    Ok(Step::Caller { regs, exact_pc })
}

#[test]
fn sp_and_fp_based_cfa() {
    let mem = Memory::new(&[
        (SP + 8, 0x4000),
        (SP + 0x20 - 8, 0x5000),
        (SP + 0x10, SP + 0x40),
    ]);
    // Leaf without a frame: CFA = SP + 8, RA at CFA − 8, FP unchanged.
    let leaf = rule(CFA_BASE_SP, 16, (REG_AT_CFA, -8), (REG_UNCHANGED, 0), 0);
    assert_eq!(
        step_rule(&leaf, &regs(1, SP, 77), None, &mut mem.reader()),
        caller(regs(0x4000, SP + 16, 77), false)
    );
    // Frame pointer based: CFA = FP + 16.
    assert_eq!(
        step_rule(
            &fp_frame(),
            &regs(1, SP, SP + 0x10),
            None,
            &mut mem.reader()
        ),
        caller(regs(0x5000, SP + 0x20, SP + 0x40), false)
    );
}

#[test]
fn cfa_dereference_and_missing_rule() {
    // CFA = *(SP + 8) (a realigned stack's saved CFA).
    let mem = Memory::new(&[(SP + 8, SP + 0x100), (SP + 0x100 - 8, 0x4242)]);
    let deref = rule(
        CFA_BASE_SP,
        8,
        (REG_AT_CFA, -8),
        (REG_UNCHANGED, 0),
        RULE_FLAG_CFA_DEREF,
    );
    assert_eq!(
        step_rule(&deref, &regs(1, SP, 0), None, &mut mem.reader()),
        caller(regs(0x4242, SP + 0x100, 0), false)
    );
    // The dereference faults.
    let empty = Memory::new(&[]);
    assert_eq!(
        step_rule(&deref, &regs(1, SP, 0), None, &mut empty.reader()),
        Err(WalkOutcome::ReadFault)
    );
    assert_eq!(
        step_rule(&RuleEntry::NONE, &regs(1, SP, 0), None, &mut empty.reader()),
        Err(WalkOutcome::NoRule)
    );
}

#[test]
fn register_based_cfa_is_top_frame_only() {
    let mut top = [0u64; TOP_REGS];
    top[10] = SP + 0x30; // e.g. a DRAP register
    let mem = Memory::new(&[(SP + 0x28, 0x6000)]);
    let r = rule(
        CFA_BASE_REG | 10,
        0,
        (REG_AT_CFA, -8),
        (REG_UNCHANGED, 0),
        0,
    );
    assert_eq!(
        step_rule(&r, &regs(1, SP, 5), Some(&top), &mut mem.reader()),
        caller(regs(0x6000, SP + 0x30, 5), false)
    );
    assert_eq!(
        step_rule(&r, &regs(1, SP, 5), None, &mut mem.reader()),
        Err(WalkOutcome::TopFrameOnlyRule)
    );
}

#[test]
fn outermost_frame_ends_the_walk_whatever_its_cfa() {
    let r = rule(CFA_BASE_SP, 0, (REG_UNDEFINED, 0), (REG_UNCHANGED, 0), 0);
    let empty = Memory::new(&[]);
    assert_eq!(
        step_rule(&r, &regs(1, SP, 0), None, &mut empty.reader()),
        Ok(Step::Outermost)
    );
}

#[test]
fn a_cfa_that_does_not_move_up_or_is_misaligned_is_no_progress() {
    let mem = Memory::new(&[(SP - 8, 1), (SP + 4, 1)]);
    let down = rule(CFA_BASE_SP, 0, (REG_AT_CFA, -8), (REG_UNCHANGED, 0), 0);
    assert_eq!(
        step_rule(&down, &regs(1, SP, 0), None, &mut mem.reader()),
        Err(WalkOutcome::NoProgress)
    );
    let odd = rule(CFA_BASE_SP, 12, (REG_AT_CFA, -8), (REG_UNCHANGED, 0), 0);
    assert_eq!(
        step_rule(&odd, &regs(1, SP, 0), None, &mut mem.reader()),
        Err(WalkOutcome::NoProgress)
    );
    // CFA arithmetic that overflows.
    let wrap = rule(CFA_BASE_SP, 16, (REG_AT_CFA, -8), (REG_UNCHANGED, 0), 0);
    assert_eq!(
        step_rule(&wrap, &regs(1, u64::MAX - 4, 0), None, &mut mem.reader()),
        Err(WalkOutcome::NoProgress)
    );
}

#[test]
fn a_signal_frame_may_move_down_and_gives_an_exact_pc() {
    // The kernel's signal frame: the interrupted context's SP can be anywhere.
    let mem = Memory::new(&[(SP + 0x10, 0x7777), (SP + 0x18, SP - 0x1000)]);
    let r = rule(
        CFA_BASE_SP,
        0,
        (REG_AT_CFA, 0x10),
        (REG_AT_CFA, 0x18),
        RULE_FLAG_SIGNAL,
    );
    assert_eq!(
        step_rule(&r, &regs(1, SP, 0), None, &mut mem.reader()),
        caller(regs(0x7777, SP, SP - 0x1000), true)
    );
}

#[test]
fn aarch64_leaf_return_address_in_the_link_register() {
    let mut top = [0u64; TOP_REGS];
    top[30] = 0x9000;
    let empty = Memory::new(&[]);
    // Nothing pushed yet: CFA = SP, RA still in x30.
    let leaf = rule(CFA_BASE_SP, 0, (REG_UNCHANGED, 0), (REG_UNCHANGED, 0), 0);
    assert_eq!(
        step_rule(&leaf, &regs(1, SP, 3), Some(&top), &mut empty.reader()),
        caller(regs(0x9000, SP, 3), false)
    );
    // Below the top frame the link register is gone, and a CFA at the SP is no progress.
    assert_eq!(
        step_rule(&leaf, &regs(1, SP, 3), None, &mut empty.reader()),
        Err(WalkOutcome::NoProgress)
    );
    // With a frame (CFA above the SP) but the RA rule "unchanged": top frame only.
    let framed = rule(CFA_BASE_SP, 16, (REG_UNCHANGED, 0), (REG_UNCHANGED, 0), 0);
    assert_eq!(
        step_rule(&framed, &regs(1, SP, 3), None, &mut empty.reader()),
        Err(WalkOutcome::TopFrameOnlyRule)
    );
}

#[test]
fn a_signed_return_address_is_kept_by_the_step() {
    // The step returns what it read; the walk cuts it to the process's address bits.
    let mem = Memory::new(&[(SP + 8, 0x002a_0000_1234_5678)]);
    let r = rule(
        CFA_BASE_SP,
        16,
        (REG_AT_CFA, -8),
        (REG_UNCHANGED, 0),
        RULE_FLAG_MANGLED_RA,
    );
    assert_eq!(
        step_rule(&r, &regs(1, SP, 0), None, &mut mem.reader()),
        caller(regs(0x002a_0000_1234_5678, SP + 16, 0), false)
    );
}

#[test]
fn signed_return_addresses_are_cut_to_the_process_address_bits() {
    // AArch64 pointer authentication: the code sits above the address bits, whichever
    // key signed it and whether a table or a frame record gave the address.
    let mut t = chain_tables();
    t.rules[2].flags |= RULE_FLAG_MANGLED_RA;
    let signed = |addr: u64, pac: u64| addr | (pac << 48);
    let mem = Memory::new(&[
        (SP + 8, signed(BASE + 0x150, 0x2a)),
        (SP + 24, signed(BASE + 0x50, 0x7f13)),
    ]);
    let mut st = WalkState::default();
    let start = regs(BASE + 0x210, SP, 0);
    t.addr_bits = addr_bits(true, BASE + 0x1000);
    assert_eq!(t.addr_bits, 48);
    assert_eq!(
        walk(&mut st, start, &mut t, &mut mem.reader()),
        WalkOutcome::Complete
    );
    assert_eq!(
        &st.stack.frames[..st.stack.len as usize],
        &[BASE + 0x210, BASE + 0x150, BASE + 0x50]
    );
    // x86-64 (no cut): the signed address is in no mapping.
    t.addr_bits = addr_bits(false, BASE + 0x1000);
    assert_eq!(
        walk(&mut st, start, &mut t, &mut mem.reader()),
        WalkOutcome::NoMapping
    );
    // Frame records hold signed addresses too (the frame-pointer fallback).
    t.addr_bits = 48;
    let fp = SP + 0x40;
    let mem = Memory::new(&[(fp, 0), (fp + 8, signed(BASE + 0x50, 0x55))]);
    let (outcome, st) = walk_from(&mut t, BASE + 0x310, SP, fp, &mem);
    assert_eq!(outcome, WalkOutcome::Complete);
    assert_eq!(st.stack.frames[1], BASE + 0x50);
    // A process with code above 2^48 (52-bit kernel): its bits are 52, and an address
    // above 2^48 survives the cut while its code in bits 52.. goes.
    const HIGH: u64 = 0x0003_0000_0000_0000;
    assert_eq!(addr_bits(true, HIGH + 0x1000), 52);
    assert_eq!(addr_mask(52) & (HIGH | 0x5 << 52 | 0x1234), HIGH | 0x1234);
    assert_eq!(addr_mask(0), u64::MAX);
}

#[test]
fn every_register_rule_kind() {
    let mut top = [0u64; TOP_REGS];
    top[6] = 0xfeed;
    let mem = Memory::new(&[
        (SP + 8, 0xa0),     // RA at CFA − 8
        (SP + 0x20, 0xb0),  // at SP + 0x20
        (SP + 0x100, 0xc0), // at FP + 0
    ]);
    let fp = SP + 0x100;
    let with = |fp_rule: (u8, i16)| rule(CFA_BASE_SP, 16, (REG_AT_CFA, -8), fp_rule, 0);
    let step = |r: RuleEntry, top: Option<&[u64; TOP_REGS]>| {
        step_rule(&r, &regs(1, SP, fp), top, &mut mem.reader())
    };
    let fp_of = |s: Result<Step, WalkOutcome>| match s {
        Ok(Step::Caller { regs, .. }) => Ok(regs.fp),
        Ok(Step::Outermost) => Ok(u64::MAX),
        Err(e) => Err(e),
    };
    assert_eq!(fp_of(step(with((REG_UNCHANGED, 0)), None)), Ok(fp));
    assert_eq!(fp_of(step(with((REG_AT_SP, 0x20)), None)), Ok(0xb0));
    assert_eq!(fp_of(step(with((REG_AT_FP, 0)), None)), Ok(0xc0));
    assert_eq!(fp_of(step(with((REG_VAL_CFA, -16)), None)), Ok(SP));
    assert_eq!(fp_of(step(with((REG_IN_REG, 6)), Some(&top))), Ok(0xfeed));
    assert_eq!(
        fp_of(step(with((REG_IN_REG, 6)), None)),
        Err(WalkOutcome::TopFrameOnlyRule)
    );
    assert_eq!(
        fp_of(step(with((REG_AT_SP, 0x28)), None)),
        Err(WalkOutcome::ReadFault)
    );
    assert_eq!(fp_of(step(with((0x55, 0)), None)), Err(WalkOutcome::NoRule));
}

#[test]
fn plt16_rules_move_the_cfa_after_the_push() {
    // `jmp *GOT` (6 bytes) then `push N`: from byte 6 of each 16-byte entry, CFA + 8.
    let r = rule(
        CFA_BASE_SP,
        8,
        (REG_AT_CFA, -8),
        (REG_UNCHANGED, 6),
        RULE_FLAG_PLT16,
    );
    assert_eq!(r.cfa_offset_at(0x1000), 8);
    assert_eq!(r.cfa_offset_at(0x1005), 8);
    assert_eq!(r.cfa_offset_at(0x1006), 16);
    assert_eq!(r.cfa_offset_at(0x101f), 16);
    assert_eq!(r.cfa_offset_at(0x1020), 8);
    let mem = Memory::new(&[(SP, 0x1), (SP + 8, 0x2)]);
    let ra = |pc| match step_rule(&r, &regs(pc, SP, 0), None, &mut mem.reader()) {
        Ok(Step::Caller { regs, .. }) => regs.pc,
        other => panic!("{other:?}"),
    };
    assert_eq!((ra(0x1000), ra(0x1008)), (0x1, 0x2));
}

#[test]
fn frame_pointer_step() {
    let fp = SP + 0x40;
    let mem = Memory::new(&[(fp, SP + 0x80), (fp + 8, 0x4444)]);
    assert_eq!(
        step_frame_pointer(&regs(1, SP, fp), &mut mem.reader()),
        caller(regs(0x4444, fp + 16, SP + 0x80), false)
    );
    for (fp, want) in [
        (0, WalkOutcome::FramePointerEnd),
        (SP - 16, WalkOutcome::NoProgress),
        (SP + 4, WalkOutcome::NoProgress),
        (SP + 0x100, WalkOutcome::ReadFault),
    ] {
        assert_eq!(
            step_frame_pointer(&regs(1, SP, fp), &mut mem.reader()),
            Err(want),
            "fp {fp:#x}"
        );
    }
}

/// Host tables: one object mapped at `0x40_0000` (bias 0), its rows and rules.
struct HostTables {
    mappings: Vec<MappingEntry>,
    object: ObjectEntry,
    pages: Vec<u32>,
    rows: Vec<RowEntry>,
    rules: Vec<RuleEntry>,
    addr_bits: u32,
}

impl Tables for HostTables {
    fn return_address_mask(&mut self) -> u64 {
        crate::layout::addr_mask(self.addr_bits)
    }
    fn mapping_count(&mut self) -> u32 {
        self.mappings.len() as u32
    }
    fn mapping(&mut self, index: u32) -> Option<MappingEntry> {
        self.mappings.get(index as usize).copied()
    }
    fn object(&mut self, id: u32) -> Option<ObjectEntry> {
        (id == 0).then_some(self.object)
    }
    fn page_entry(&mut self, index: u32) -> Option<u32> {
        self.pages.get(index as usize).copied()
    }
    fn row(&mut self, index: u32) -> Option<RowEntry> {
        self.rows.get(index as usize).copied()
    }
    fn rule(&mut self, index: u16) -> Option<RuleEntry> {
        self.rules.get(usize::from(index)).copied()
    }
}

const BASE: u64 = 0x40_0000;

/// Functions at BASE + 0x000 (`start`, outermost), + 0x100 (`main`), + 0x200 (`work`),
/// each with one rule over its 0x100 bytes, in one page.
fn chain_tables() -> HostTables {
    let outermost = rule(CFA_BASE_SP, 8, (REG_UNDEFINED, 0), (REG_UNCHANGED, 0), 0);
    let frame = rule(CFA_BASE_SP, 16, (REG_AT_CFA, -8), (REG_UNCHANGED, 0), 0);
    HostTables {
        mappings: vec![MappingEntry {
            start: BASE,
            end: BASE + 0x1000,
            bias: 0,
            object: 0,
            flags: 0,
        }],
        object: ObjectEntry {
            base: BASE,
            page_first: 0,
            page_count: 1,
            row_first: 0,
            page_shift: 16,
        },
        pages: vec![0, 4],
        rows: vec![
            RowEntry {
                addr_low: 0,
                rule: 1,
            },
            RowEntry {
                addr_low: 0x100,
                rule: 2,
            },
            RowEntry {
                addr_low: 0x200,
                rule: 2,
            },
            RowEntry {
                addr_low: 0x300,
                rule: 0,
            },
        ],
        rules: vec![RuleEntry::NONE, outermost, frame],
        addr_bits: 0,
    }
}

/// Walks from `pc`, `sp`, `fp` over `t` and `mem`: the outcome and the walk's state.
fn walk_from(
    t: &mut HostTables,
    pc: u64,
    sp: u64,
    fp: u64,
    mem: &Memory,
) -> (WalkOutcome, WalkState) {
    let mut st = WalkState::default();
    let outcome = walk(&mut st, regs(pc, sp, fp), t, &mut mem.reader());
    (outcome, st)
}

#[test]
fn a_chain_walks_to_its_outermost_frame() {
    let mut t = chain_tables();
    // work's frame: RA into main at SP + 8; main's frame: RA into start at SP + 24.
    let mem = Memory::new(&[(SP + 8, BASE + 0x150), (SP + 24, BASE + 0x50)]);
    let (outcome, st) = walk_from(&mut t, BASE + 0x210, SP, 0, &mem);
    assert_eq!(outcome, WalkOutcome::Complete);
    assert_eq!(
        &st.stack.frames[..st.stack.len as usize],
        &[BASE + 0x210, BASE + 0x150, BASE + 0x50]
    );
    assert_eq!(st.frames_from_table, 3);
    // A return address outside every mapping.
    let mem = Memory::new(&[(SP + 8, 0x10)]);
    assert_eq!(
        walk_from(&mut t, BASE + 0x210, SP, 0, &mem).0,
        WalkOutcome::NoMapping
    );
    // A return address of 0 ends the walk.
    let mem = Memory::new(&[(SP + 8, 0)]);
    assert_eq!(
        walk_from(&mut t, BASE + 0x210, SP, 0, &mem).0,
        WalkOutcome::ZeroReturnAddress
    );
    // Code past the last function: no rule, then the frame-pointer fallback.
    let fp = SP + 0x40;
    let mem = Memory::new(&[(fp, 0), (fp + 8, BASE + 0x50)]);
    let (outcome, st) = walk_from(&mut t, BASE + 0x310, SP, fp, &mem);
    assert_eq!(outcome, WalkOutcome::Complete);
    assert_eq!(st.frames_from_fp, 1);
}

#[test]
fn the_frame_after_a_signal_frame_is_marked_exact_and_looked_up_as_is() {
    let mut t = chain_tables();
    // `main` is a signal trampoline: its caller's PC is the interrupted one.
    t.rules[2] = rule(
        CFA_BASE_SP,
        16,
        (REG_AT_CFA, -8),
        (REG_UNCHANGED, 0),
        RULE_FLAG_SIGNAL,
    );
    t.rows[2].rule = 3;
    t.rules.push(rule(
        CFA_BASE_SP,
        16,
        (REG_AT_CFA, -8),
        (REG_UNCHANGED, 0),
        0,
    ));
    // The interrupted PC is `start`'s first byte: looked up at RA − 1 it would be in no
    // function (0x3f_ffff); as is, it is `start`, outermost.
    let mem = Memory::new(&[(SP + 8, BASE + 0x150), (SP + 24, BASE)]);
    let (outcome, st) = walk_from(&mut t, BASE + 0x210, SP, 0, &mem);
    assert_eq!(outcome, WalkOutcome::Complete);
    let frames = &st.stack.frames[..st.stack.len as usize];
    assert_eq!(frames, &[BASE + 0x210, BASE + 0x150, BASE | FRAME_EXACT]);
    let lookups: Vec<u64> = frames
        .iter()
        .enumerate()
        .map(|(i, &w)| lookup_address(i, w))
        .collect();
    assert_eq!(lookups, [BASE + 0x210, BASE + 0x14f, BASE]);
    assert_eq!(frame_pc(frames[2]), BASE);
}

#[test]
fn a_mapping_whose_table_is_being_built_stops_where_frame_pointers_fail() {
    let mut t = chain_tables();
    t.mappings[0].object = NO_OBJECT;
    t.mappings[0].flags = MAPPING_FLAG_BUILDING;
    // No frame pointer (0): as if the mapping were unknown, no frame-pointer frame.
    let mem = Memory::new(&[]);
    let (outcome, st) = walk_from(&mut t, BASE + 0x210, SP, 0, &mem);
    assert_eq!(outcome, WalkOutcome::NoMapping);
    assert_eq!(st.frames_from_fp, 0);
    // A garbage frame pointer (unreadable): the same.
    let (outcome, st) = walk_from(&mut t, BASE + 0x210, SP, SP + 0x100, &mem);
    assert_eq!(outcome, WalkOutcome::NoMapping);
    assert_eq!(st.frames_from_fp, 0);
    // Frame pointers that chain: walked meanwhile, to the end of the chain.
    let fp = SP + 0x40;
    let mem = Memory::new(&[(fp, 0), (fp + 8, BASE + 0x50)]);
    let (outcome, st) = walk_from(&mut t, BASE + 0x210, SP, fp, &mem);
    assert_eq!((st.frames_from_fp, st.frames_guessed), (0, 2));
    assert_eq!(
        &st.stack.frames[..st.stack.len as usize],
        &[BASE + 0x210, BASE + 0x50]
    );
    assert_eq!(outcome, WalkOutcome::FramePointerEnd, "the chain's end");
    // A frame pointer that points at readable words of no frame (a frameless
    // function's register): the guessed return address is in no mapping, and the walk
    // ends as one that needs the table, with no frame-pointer frame counted.
    let mem = Memory::new(&[(fp, SP + 0x80), (fp + 8, 0x1dc_0657)]);
    let (outcome, st) = walk_from(&mut t, BASE + 0x210, SP, fp, &mem);
    assert_eq!(outcome, WalkOutcome::NoMapping);
    assert_eq!((st.frames_from_fp, st.frames_guessed), (0, 1));
    // Without the flag: the frame-pointer fallback's own outcome.
    t.mappings[0].flags = 0;
    let mem = Memory::new(&[]);
    let (outcome, st) = walk_from(&mut t, BASE + 0x210, SP, 0, &mem);
    assert_eq!(outcome, WalkOutcome::FramePointerEnd);
    assert_eq!(st.frames_from_fp, 1);
}

#[test]
fn a_return_address_with_the_exact_bit_ends_the_walk() {
    let mut t = chain_tables();
    // A stack word that would pass for an exact mark on `main`.
    let mem = Memory::new(&[(SP + 8, (BASE + 0x150) | FRAME_EXACT)]);
    let (outcome, st) = walk_from(&mut t, BASE + 0x210, SP, 0, &mem);
    assert_eq!(outcome, WalkOutcome::NoMapping);
    assert_eq!(&st.stack.frames[..st.stack.len as usize], &[BASE + 0x210]);
}

use crate::test_rng::Rng;

/// On arbitrary rules and stack contents: every walk ends within `MAX_FRAMES` steps
/// with a valid outcome, and the stack pointer only moves up, except across a signal
/// frame (and once, staying equal, from a top-frame leaf whose RA is in the link
/// register).
#[test]
fn walks_of_random_tables_and_stacks_end_and_only_move_up() {
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    let kinds = [
        REG_UNCHANGED,
        REG_AT_CFA,
        REG_AT_SP,
        REG_AT_FP,
        REG_UNDEFINED,
        REG_VAL_CFA,
        REG_IN_REG,
        9,
    ];
    let bases = [CFA_BASE_SP, CFA_BASE_FP, CFA_BASE_NONE, CFA_BASE_REG | 7];
    for _ in 0..2000 {
        let mut t = chain_tables();
        t.rules = (0..4)
            .map(|i| {
                if i == 0 {
                    return RuleEntry::NONE;
                }
                RuleEntry {
                    cfa_offset: (rng.next() % 64) as i32 - 16,
                    ra_offset: (rng.next() % 64) as i16 - 32,
                    fp_offset: (rng.next() % 64) as i16 - 32,
                    cfa_base: rng.pick(&bases),
                    ra_kind: rng.pick(&kinds),
                    fp_kind: rng.pick(&kinds),
                    flags: (rng.next() & 0xf) as u8,
                }
            })
            .collect();
        for r in &mut t.rows {
            r.rule = (rng.next() % 4) as u16;
        }
        // A stack of return addresses into the object, frame pointers, junk.
        let words: Vec<(u64, u64)> = (0..64)
            .map(|i| {
                let v = match rng.next() % 4 {
                    0 => BASE + rng.next() % 0x400,
                    1 => SP + rng.next() % 0x200,
                    2 => 0,
                    _ => rng.next(),
                };
                (SP - 0x100 + 8 * i, v)
            })
            .collect();
        let mem = Memory::new(&words);
        let mut read = mem.reader();
        let mut st = WalkState {
            top: [SP + 0x40; TOP_REGS],
            ..WalkState::default()
        };
        st.start(regs(BASE + rng.next() % 0x400, SP, SP + rng.next() % 0x100));
        let mut steps = 0;
        loop {
            let before = st.regs.sp;
            let more = walk_step(&mut st, &mut t, &mut read);
            steps += 1;
            assert!(steps <= MAX_FRAMES + 1);
            if !more {
                break;
            }
            // Equal only once, from the top frame: an AArch64 leaf whose RA is still in
            // the link register.
            assert!(
                st.regs.sp > before || st.exact_pc != 0 || (steps == 1 && st.regs.sp == before),
                "sp {before:#x} -> {:#x} without a signal frame",
                st.regs.sp
            );
        }
        assert!(WalkOutcome::try_from(st.outcome).is_ok(), "{}", st.outcome);
        assert!(st.stack.len as usize <= MAX_FRAMES && st.stack.len >= 1);
    }
}

#[test]
fn search_narrow_finds_the_last_key_not_above() {
    let keys = [3u64, 3, 10, 20, 20, 20, 40, 1 << 63, u64::MAX];
    for x in [
        0,
        2,
        3,
        4,
        10,
        19,
        20,
        21,
        39,
        40,
        41,
        (1 << 63) - 1,
        1 << 63,
        u64::MAX,
    ] {
        let found = search_narrow::<8>(0, keys.len() as u32, x, |i| keys.get(i as usize).copied());
        // The last index whose key is ≤ x, or 0 (the candidate callers check).
        let want = keys.iter().rposition(|&k| k <= x).unwrap_or(0) as u32;
        assert_eq!(found, want, "x={x:#x}");
    }
    // A key that cannot be read counts as greater than x.
    let found = search_narrow::<8>(0, 8, u64::MAX, |i| (i < 5).then_some(1));
    assert_eq!(found, 4);
}
