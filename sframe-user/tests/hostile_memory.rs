//! A hostile unprivileged process cannot make the profiler's memory or CPU grow with
//! what it maps (issue 18, attack 1): three sparse 1 GiB files mapped executable (8 KB
//! on disk), `/dev/zero` mapped executable, and a sparse file just over the 1 GiB limit.
//! Against a baseline run of the same profiler on the victim alone, in the same test:
//! the profiler's peak RSS and CPU stay within fixed margins, and a victim profiled
//! alongside keeps complete stacks.

mod support;

use support::{
    KillOnDrop, bpf_or_skip, compile_c,
    hostile::{self, VICTIM, VICTIM_CHAIN, as_nobody, nobody_dir},
};

const HOARDER: &str = r#"
#include <fcntl.h>
#include <stdio.h>
#include <sys/mman.h>
#include <unistd.h>
volatile unsigned long sink;
__attribute__((noinline)) void hoarder_spin(void) { for (;;) for (int i = 0; i < 1000; i++) sink += i; }
static int map_sparse(const char *dir, int i, long size) {
    char p[4096];
    snprintf(p, sizeof p, "%s/sparse%d.so", dir, i);
    int fd = open(p, O_RDWR | O_CREAT | O_TRUNC, 0644);
    if (fd < 0 || ftruncate(fd, size)) return 1;
    if (mmap(0, size, PROT_READ | PROT_EXEC, MAP_PRIVATE, fd, 0) == MAP_FAILED) return 1;
    return close(fd);
}
int main(int argc, char **argv) {
    if (argc < 2) return 2;
    for (int i = 0; i < 3; i++)
        if (map_sparse(argv[1], i, 1L << 30)) return 3;
    if (map_sparse(argv[1], 3, (1L << 30) + 4096)) return 3;
    int z = open("/dev/zero", O_RDONLY);
    if (z < 0 || mmap(0, 1L << 30, PROT_READ | PROT_EXEC, MAP_PRIVATE, z, 0) == MAP_FAILED) return 4;
    hoarder_spin();
}
"#;

/// Margin over the baseline's peak RSS: what a few more processes' tables and
/// bookkeeping may cost (the attack cost gigabytes before).
const RSS_MARGIN_KB: u64 = 32 * 1024;

#[test]
fn huge_sparse_and_device_mappings_cost_no_memory() {
    if !bpf_or_skip("huge_sparse_and_device_mappings_cost_no_memory") {
        return;
    }
    let victim_exe = compile_c("victim-mem", VICTIM, &["-O2"]);
    let hoarder_exe = compile_c("hoarder", HOARDER, &["-O2"]);
    let files = nobody_dir("hoarder-files");
    let victim = KillOnDrop::spawn(&mut as_nobody(&victim_exe));
    let out = victim_exe.parent().expect("fixture dir");

    let alone = ["--pid".to_owned(), victim.pid().to_string()];
    let baseline = hostile::profile(&alone, victim.pid(), 2.0, out);

    let hoarder = KillOnDrop::spawn(as_nobody(&hoarder_exe).arg(&files));
    // Its mappings are in place once it spins (it exits with a status otherwise).
    let start = std::time::Instant::now();
    while hostile::cpu_seconds(hoarder.pid()) < 0.05 {
        assert!(
            std::path::Path::new(&format!("/proc/{}/stat", hoarder.pid())).exists(),
            "the hoarder exited"
        );
        assert!(start.elapsed().as_secs() < 300, "the hoarder never ran");
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let maps = std::fs::read_to_string(format!("/proc/{}/maps", hoarder.pid())).unwrap();
    assert!(
        maps.contains("sparse2.so") && maps.contains("/dev/zero"),
        "{maps}"
    );
    let both = [
        "--pid".to_owned(),
        victim.pid().to_string(),
        "--pid".to_owned(),
        hoarder.pid().to_string(),
    ];
    let attacked = hostile::profile(&both, victim.pid(), 2.0, out);

    eprintln!(
        "peak RSS: {} kB alone, {} kB attacked; CPU: {:.2} s alone, {:.2} s attacked",
        baseline.peak_rss_kb, attacked.peak_rss_kb, baseline.cpu, attacked.cpu
    );
    assert!(
        attacked.peak_rss_kb <= baseline.peak_rss_kb + RSS_MARGIN_KB,
        "peak RSS {} kB under attack, {} kB without",
        attacked.peak_rss_kb,
        baseline.peak_rss_kb
    );
    // CPU: the same victim budget; the attack may add the hoarder's own samples and a
    // few files' headers, not the reading of gigabytes.
    assert!(
        attacked.cpu <= 2.0 * baseline.cpu + 0.5,
        "profiler CPU {:.2} s under attack, {:.2} s without",
        attacked.cpu,
        baseline.cpu
    );
    for run in [&baseline, &attacked] {
        let (complete, all) = hostile::complete(&run.folded, "victim-mem", VICTIM_CHAIN);
        assert!(all > 0, "no samples of the victim:\n{}", run.folded);
        assert!(
            complete * 100 >= all * 95,
            "{complete} of {all} victim samples complete:\n{}",
            run.folded
        );
    }
    assert!(
        attacked.folded.contains("hoarder_spin"),
        "{}",
        attacked.folded
    );
}
