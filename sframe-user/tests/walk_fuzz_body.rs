//! Runs the `walk` fuzz target's body (fuzz/src/walk_body.rs) on stable: thousands of
//! pseudo-random inputs of every size the body reads, from tables alone to long stacks.

#[path = "../../fuzz/src/walk_body.rs"]
mod body;

#[test]
fn fuzz_body_on_random_tables_and_stacks() {
    let mut state = 0x2545_f491_4f6c_dd1du64;
    let mut next = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    };
    for i in 0..5000 {
        let len = match i % 4 {
            0 => (next() % 64) as usize,
            1 => 200 + (next() % 200) as usize,
            _ => 400 + (next() % 4000) as usize,
        };
        let mut data: Vec<u8> = (0..len).map(|_| next() as u8).collect();
        // Every other input: stack words that look like return addresses into the
        // object and frame pointers into the stack, so walks go deep.
        if i % 2 == 0 {
            for w in data.chunks_exact_mut(8).skip(40) {
                let v = match next() % 3 {
                    0 => 0x40_0000 + next() % 0x4_0000,
                    1 => 0x7fff_0000 + next() % 0x800,
                    _ => next(),
                };
                w.copy_from_slice(&v.to_le_bytes());
            }
        }
        body::run(&data);
    }
}
