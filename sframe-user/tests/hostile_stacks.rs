//! A hostile unprivileged process cannot make the profiler keep more of its stacks than
//! its share, nor take another process's: one that lands every sample in a new stack
//! (recursing to a random depth) is folded to its root past its share of
//! `--max-profile-counts`, with every sample still counted; a victim profiled beside it
//! keeps its complete stacks.

mod support;

use support::{
    KillOnDrop, bpf_or_skip, compile_c,
    hostile::{self, VICTIM, VICTIM_CHAIN, as_nobody},
};

/// Every call of `rec` goes to a new random depth below 200: nearly every sample is in
/// a stack not seen before.
const STACK_MAKER: &str = r#"
volatile unsigned long sink;
__attribute__((noinline)) void maker_leaf(void) { for (int i = 0; i < 20000; i++) sink += i; }
__attribute__((noinline)) int rec(int n) {
    if (n == 0) { maker_leaf(); return 0; }
    int r = rec(n - 1);
    sink += r;
    return r + 1;
}
int main(void) {
    unsigned x = 1;
    for (;;) { x = x * 1103515245u + 12345u; rec((x >> 16) % 200); }
}
"#;

/// The bound of the test: 128 count keys per process (a sixteenth), room for the
/// victim's stacks (one per PC sampled in its loop) and far less than the stack maker's.
const MAX_PROFILE_COUNTS: u64 = 2048;

#[test]
fn a_process_making_new_stacks_is_folded_at_its_share_and_the_victim_keeps_its_own() {
    if !bpf_or_skip(
        "a_process_making_new_stacks_is_folded_at_its_share_and_the_victim_keeps_its_own",
    ) {
        return;
    }
    let victim_exe = compile_c("victim-stacks", VICTIM, &["-O2"]);
    let maker_exe = compile_c("stackmaker", STACK_MAKER, &["-O2", "-fomit-frame-pointer"]);
    let victim = KillOnDrop::spawn(&mut as_nobody(&victim_exe));
    let maker = KillOnDrop::spawn(&mut as_nobody(&maker_exe));
    let out = victim_exe.parent().expect("fixture dir");
    let args = [
        "--pid".to_owned(),
        victim.pid().to_string(),
        "--pid".to_owned(),
        maker.pid().to_string(),
        "--frequency".to_owned(),
        "499".to_owned(),
        "--max-profile-counts".to_owned(),
        MAX_PROFILE_COUNTS.to_string(),
    ];
    // 2 s of the stack maker's CPU at 499 Hz: about 1,000 samples, nearly all in
    // distinct stacks, eight times its share.
    let run = hostile::profile(&args, maker.pid(), 2.0, out);

    let (complete, all) = hostile::complete(&run.folded, "victim-stacks", VICTIM_CHAIN);
    assert!(all > 0, "no samples of the victim:\n{}", run.folded);
    assert!(
        complete * 100 >= all * 95,
        "{complete} of {all} victim samples complete:\n{}",
        run.folded
    );
    let (mut maker_stacks, mut maker_samples, mut at_root) = (0u64, 0u64, 0u64);
    for line in run.folded.lines() {
        let (stack, count) = line.rsplit_once(' ').expect("a count");
        let count: u64 = count.parse().expect("a count");
        assert!(
            !stack.starts_with("victim") || stack.contains(';'),
            "victim samples folded: {line}"
        );
        if !stack.starts_with("stackmaker") {
            continue;
        }
        maker_samples += count;
        if stack.contains(';') {
            maker_stacks += 1;
        } else {
            // Folded: the process alone, without its stack.
            at_root += count;
        }
    }
    let share = MAX_PROFILE_COUNTS / 16;
    assert!(
        maker_stacks <= share,
        "{maker_stacks} distinct stacks kept of the stack maker, its share is {share}"
    );
    assert!(
        at_root * 2 >= maker_samples && maker_samples >= 200,
        "{at_root} of {maker_samples} samples of the stack maker folded to its root"
    );
    eprintln!(
        "victim {complete}/{all} complete; stack maker: {maker_samples} samples, \
         {maker_stacks} stacks kept, {at_root} at its root; peak RSS {} kB",
        run.peak_rss_kb
    );
}
