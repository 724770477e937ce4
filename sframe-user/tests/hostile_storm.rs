//! An unprivileged process with thousands of executable mappings that maps and unmaps
//! one more about a thousand times a second (issue 18, attack 4) cannot take the
//! profiler's CPU: reloads of a process are coalesced and throttled in proportion to
//! their cost, and a reload re-reads only what changed. Against a baseline run of the
//! same profiler on the victim alone, in the same test: the profiler's CPU stays within
//! a fixed margin, and the victim keeps its samples and complete stacks.

mod support;

use support::{
    KillOnDrop, bpf_or_skip, compile_c,
    hostile::{self, VICTIM, VICTIM_CHAIN, as_nobody},
};

const STORM: &str = r#"
#include <fcntl.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>
volatile unsigned long sink;
int main(int argc, char **argv) {
    int fd = open(argv[0], O_RDONLY);
    if (fd < 0) return 1;
    /* 3000 executable mappings of its own first page, none adjacent to another. */
    for (int i = 0; i < 3000; i++) {
        char *p = mmap(0, 8192, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (p == MAP_FAILED) return 2;
        if (mmap(p, 4096, PROT_READ | PROT_EXEC, MAP_PRIVATE | MAP_FIXED, fd, 0) == MAP_FAILED) return 3;
    }
    /* One more mapped and unmapped about every millisecond, forever. */
    struct timespec ms = {0, 1000000};
    for (;;) {
        void *p = mmap(0, 4096, PROT_READ | PROT_EXEC, MAP_PRIVATE, fd, 0);
        if (p == MAP_FAILED) return 4;
        sink += *(volatile char *)p;
        munmap(p, 4096);
        nanosleep(&ms, 0);
    }
}
"#;

#[test]
fn an_exec_mmap_storm_does_not_take_the_profilers_cpu() {
    if !bpf_or_skip("an_exec_mmap_storm_does_not_take_the_profilers_cpu") {
        return;
    }
    let victim_exe = compile_c("victim-storm", VICTIM, &["-O2"]);
    let storm_exe = compile_c("storm", STORM, &["-O2"]);
    let victim = KillOnDrop::spawn(&mut as_nobody(&victim_exe));
    let out = victim_exe.parent().expect("fixture dir");

    let alone = ["--pid".to_owned(), victim.pid().to_string()];
    let baseline = hostile::profile(&alone, victim.pid(), 2.0, out);

    let storm = KillOnDrop::spawn(&mut as_nobody(&storm_exe));
    // Its mappings are in place once it sleeps between storms.
    let start = std::time::Instant::now();
    loop {
        let maps =
            std::fs::read_to_string(format!("/proc/{}/maps", storm.pid())).unwrap_or_default();
        if maps.lines().filter(|l| l.contains("storm")).count() > 3000 {
            break;
        }
        assert!(
            std::path::Path::new(&format!("/proc/{}/stat", storm.pid())).exists(),
            "the storm exited"
        );
        assert!(start.elapsed().as_secs() < 300, "the storm never mapped");
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let both = [
        "--pid".to_owned(),
        victim.pid().to_string(),
        "--pid".to_owned(),
        storm.pid().to_string(),
    ];
    let storm_cpu_before = hostile::cpu_seconds(storm.pid());
    let attacked = hostile::profile(&both, victim.pid(), 2.0, out);
    let storm_cpu = hostile::cpu_seconds(storm.pid()) - storm_cpu_before;

    let (complete_before, before) =
        hostile::complete(&baseline.folded, "victim-storm", VICTIM_CHAIN);
    let (complete, after) = hostile::complete(&attacked.folded, "victim-storm", VICTIM_CHAIN);
    eprintln!(
        "profiler CPU: {:.2} s alone ({:.1} s), {:.2} s beside the storm ({:.1} s); victim \
         samples {before} ({complete_before} complete) alone, {after} ({complete} complete) \
         beside it",
        baseline.cpu, baseline.wall, attacked.cpu, attacked.wall
    );
    // The storm's reloads are throttled to a tenth of one CPU (RELOAD_SHARE) for as long
    // as it runs beside the profiler: that share of the run's wall time (longer on a busy
    // machine, where the victim's CPU budget takes longer), twice over for its events,
    // beyond the baseline's own CPU doubled and half a second (the first load of 3,000
    // mappings, and the start's variance: the baseline is mostly the BPF load).
    let allowed = 2.0 * baseline.cpu + 0.5 + 0.2 * attacked.wall;
    assert!(
        attacked.cpu <= allowed,
        "profiler CPU {:.2} s beside the storm ({:.1} s), {:.2} s without: more than {allowed:.2} s",
        attacked.cpu,
        attacked.wall,
        baseline.cpu
    );
    // The same victim CPU budget: not fewer samples than half the baseline's (the
    // budget includes each profiler's start, whose length varies), as complete.
    assert!(
        before > 0 && after * 2 >= before,
        "{after} samples vs {before}"
    );
    // The storm's own stacks are complete too: its 3,000 copies of one page push
    // neither its C library out of what is read of its maps nor out of its table.
    let storm_stacks: Vec<&str> = attacked
        .folded
        .lines()
        .filter(|l| l.starts_with("storm;"))
        .collect();
    // At the default 99 Hz, 0.15 s of its CPU give it about 15 samples (at least 8
    // measured from that rate on 6.18): then some must be there (the check below is
    // not vacuous).
    assert!(
        storm_cpu < 0.15 || !storm_stacks.is_empty(),
        "no sample of the storm in {storm_cpu:.3} s of its CPU"
    );
    assert!(
        storm_stacks
            .iter()
            .all(|l| l.starts_with("storm;_start;__libc_start_main")),
        "incomplete stacks of the storm:\n{}",
        storm_stacks.join("\n")
    );
    assert!(
        complete * 100 >= after * 95,
        "{complete} of {after} victim samples complete:\n{}",
        attacked.folded
    );
}
