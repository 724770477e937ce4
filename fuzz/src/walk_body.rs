//! Body of the `walk` fuzz target, shared with a plain test in `sframe-user`
//! (`tests/walk_fuzz_body.rs`) so it is compiled and exercised on stable too.
//!
//! Input: kernel tables (rules, rows, page entries of one object mapped at
//! `0x40_0000`), the interrupted registers and the stack's words, all taken from the
//! bytes as they come (no sorting, no validation: the walk must hold on any table).
//! Runs the eBPF program's walk ([`sframe_common::step::walk_step`]) frame by frame.
//! Properties: nothing panics; the walk ends within `MAX_FRAMES` steps with a valid
//! outcome and at most `MAX_FRAMES` frames; the stack pointer only moves up, except
//! across a signal frame (and once, staying equal, from a top-frame leaf whose return
//! address is still in the link register).

use sframe_common::{
    WalkOutcome,
    budget::MAX_FRAMES,
    layout::{MappingEntry, ObjectEntry, RowEntry, RuleEntry},
    step::{Regs, TOP_REGS, Tables, WalkState, walk_step},
};

const BASE: u64 = 0x40_0000;
const SP: u64 = 0x7fff_0000;

struct Input<'a>(&'a [u8]);

impl Input<'_> {
    fn bytes<const N: usize>(&mut self) -> [u8; N] {
        let mut out = [0; N];
        let n = N.min(self.0.len());
        out[..n].copy_from_slice(&self.0[..n]);
        self.0 = &self.0[n..];
        out
    }
    fn u8(&mut self) -> u8 {
        self.bytes::<1>()[0]
    }
    fn u16(&mut self) -> u16 {
        u16::from_le_bytes(self.bytes())
    }
    fn u32(&mut self) -> u32 {
        u32::from_le_bytes(self.bytes())
    }
    fn u64(&mut self) -> u64 {
        u64::from_le_bytes(self.bytes())
    }
}

struct FuzzTables {
    object: ObjectEntry,
    pages: Vec<u32>,
    rows: Vec<RowEntry>,
    rules: Vec<RuleEntry>,
}

impl Tables for FuzzTables {
    fn return_address_mask(&mut self) -> u64 {
        // AArch64's default: the fuzzed rules include signed return addresses.
        sframe_common::layout::addr_mask(48)
    }
    fn mapping_count(&mut self) -> u32 {
        1
    }
    fn mapping(&mut self, index: u32) -> Option<MappingEntry> {
        (index == 0).then_some(MappingEntry {
            start: BASE,
            end: BASE + 0x4_0000,
            bias: 0,
            object: 0,
            flags: 0,
        })
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

pub fn run(data: &[u8]) {
    let mut input = Input(data);
    let rule_count = usize::from(input.u8() % 8) + 1;
    let mut rules = vec![RuleEntry::NONE];
    for _ in 0..rule_count {
        rules.push(RuleEntry {
            cfa_offset: input.u32() as i32,
            ra_offset: input.u16() as i16,
            fp_offset: input.u16() as i16,
            cfa_base: input.u8(),
            ra_kind: input.u8() % 8,
            fp_kind: input.u8() % 8,
            flags: input.u8(),
        });
    }
    let row_count = usize::from(input.u8() % 32) + 1;
    let rows: Vec<RowEntry> = (0..row_count)
        .map(|_| RowEntry {
            addr_low: input.u16(),
            rule: input.u16() % (rules.len() as u16 + 1),
        })
        .collect();
    let page_count = u32::from(input.u8() % 4) + 1;
    let pages: Vec<u32> = (0..=page_count).map(|_| input.u32() % 40).collect();
    let mut t = FuzzTables {
        object: ObjectEntry {
            base: BASE,
            page_first: 0,
            page_count,
            row_first: 0,
            // Any shift, the kernel's 8..=16 or not: the walk stays safe.
            page_shift: u32::from(input.u8()),
        },
        pages,
        rows,
        rules,
    };
    let pc = BASE + input.u64() % 0x5_0000;
    let fp = SP.wrapping_add(input.u64() % 0x400).wrapping_sub(0x100);
    let mut top = [0u64; TOP_REGS];
    for r in top.iter_mut().take(8) {
        *r = input.u64();
    }
    top[30] = input.u64();
    // The rest: the stack's words from SP − 0x100 up.
    let stack: Vec<u64> = input
        .0
        .chunks(8)
        .map(|c| {
            let mut w = [0u8; 8];
            w[..c.len()].copy_from_slice(c);
            u64::from_le_bytes(w)
        })
        .collect();
    let mut read = |a: u64| {
        let i = a.checked_sub(SP - 0x100)?;
        (i % 8 == 0).then(|| stack.get((i / 8) as usize).copied())?
    };
    let mut st = WalkState {
        top,
        ..WalkState::default()
    };
    st.start(Regs { pc, sp: SP, fp });
    let mut steps = 0;
    loop {
        let before = st.regs.sp;
        let more = walk_step(&mut st, &mut t, &mut read);
        steps += 1;
        assert!(steps <= MAX_FRAMES + 1, "the walk did not end");
        if !more {
            break;
        }
        assert!(
            st.regs.sp > before || st.exact_pc != 0 || (steps == 1 && st.regs.sp == before),
            "sp {before:#x} -> {:#x} without a signal frame",
            st.regs.sp
        );
    }
    assert!(WalkOutcome::try_from(st.outcome).is_ok(), "{}", st.outcome);
    assert!((1..=MAX_FRAMES).contains(&(st.stack.len as usize)));
}
