//! `sframe-user check-kernel`: loads every BPF program into the running kernel without
//! attaching it and prints what the verifier said of each.

/// Prints one line per program (`NAME KIND INSTRUCTIONS`, `NAME KIND FAILED` and the
/// verifier's log, or `NAME KIND UNAVAILABLE` for a program with a fallback) and returns
/// the exit code: 0 when every program without a fallback loaded.
pub fn run() -> i32 {
    let release = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    println!("kernel {}", release.trim());
    let checks = match sframe_user::bpf::check_kernel() {
        Ok(c) => c,
        Err(err) => {
            eprintln!("sframe-user: error: {err}");
            return 1;
        }
    };
    let walker = sframe_user::profiler::SampleProgram::Profile.resolve();
    println!(
        "walker {} ({})",
        walker.name(),
        if walker == sframe_user::profiler::SampleProgram::Profile {
            "the kernel has bpf_loop"
        } else {
            "the kernel has no bpf_loop (Linux 5.17): bounded loops of global-function calls"
        }
    );
    if sframe_user::bpf::has_task_regs_helpers() {
        println!("kernel-mode samples: user registers from bpf_task_pt_regs");
    } else {
        println!(
            "kernel-mode samples: no user registers (the kernel has no \
             bpf_get_current_task_btf, Linux 5.11, or bpf_task_pt_regs, 5.15): \
             counted no_user_regs"
        );
    }
    match sframe_user::bpf::off_cpu_support() {
        Ok(()) => println!("off-cpu available"),
        Err(why) => println!("off-cpu refused: {why}"),
    }
    let mut failed = 0;
    let mut unavailable = 0;
    for c in &checks {
        match &c.verified_instructions {
            Ok(Some(n)) => println!("program {} {} {n}", c.name, c.kind),
            Ok(None) => println!("program {} {} loaded", c.name, c.kind),
            Err(log) if c.optional => {
                unavailable += 1;
                println!("program {} {} UNAVAILABLE", c.name, c.kind);
                eprintln!(
                    "sframe-user: {} is not available here (a fallback is used):\n{log}",
                    c.name
                );
            }
            Err(log) => {
                failed += 1;
                println!("program {} {} FAILED", c.name, c.kind);
                eprintln!("sframe-user: {} was rejected:\n{log}", c.name);
            }
        }
    }
    println!(
        "{} of {} programs loaded (verifier limit: 1000000 instructions each)",
        checks.len() - failed - unavailable,
        checks.len()
    );
    if unavailable > 0 {
        println!("{unavailable} optional program(s) unavailable (their fallbacks are used)");
    }
    i32::from(failed > 0)
}
