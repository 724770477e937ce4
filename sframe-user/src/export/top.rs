//! The `top` report: totals per walk outcome and the hottest stacks.

use std::{collections::HashMap, fmt::Write as _};

use sframe_common::{Counter, WalkOutcome};

use super::{ProcessProfile, Profile};

/// Processes whose samples walked in user space the report lists, at most.
const MAX_DEFERRED_LINES: usize = 32;

/// The report: samples, outcomes, frame sources, then the `n` hottest stacks of all
/// processes, innermost frame first.
pub fn top(profile: &Profile, n: usize) -> String {
    let total = profile.total_samples();
    let mut out = String::new();
    let c = |k: Counter| profile.counters.get(k as usize).copied().unwrap_or(0);
    if profile.off_cpu {
        let _ = writeln!(
            out,
            "off CPU: {:.3} s asleep in {:.1} s ({} sleeps walked, {} shorter than the threshold, {} lost, {} not timed by sampling, {} across a pause)",
            total as f64 / 1e9,
            profile.duration.as_secs_f64(),
            c(Counter::OffCpuWalks),
            c(Counter::OffCpuShort),
            c(Counter::OffCpuLost) + c(Counter::OffCpuMapFull),
            c(Counter::OffCpuUnsampled),
            c(Counter::OffCpuPaused),
        );
    } else {
        let _ = writeln!(
            out,
            "{total} samples in {:.1} s ({} in kernel mode)",
            profile.duration.as_secs_f64(),
            c(Counter::SamplesInKernel)
        );
    }
    // The outcome and frame counts are the on-CPU samples'.
    if !profile.off_cpu {
        let _ = writeln!(out, "\nwalk outcomes:");
        for o in WalkOutcome::ALL {
            let count = profile.outcomes.get(o as usize).copied().unwrap_or(0);
            if count > 0 {
                let pct = 100.0 * count as f64 / total.max(1) as f64;
                let _ = writeln!(out, "  {:<22} {count:>8}  {pct:5.1}%", o.name());
            }
        }
        let _ = writeln!(
            out,
            "frames: {} from tables, {} from frame pointers",
            c(Counter::FramesFromTable),
            c(Counter::FramesFromFramePointer)
        );
        // Per process, the samples taken before its tables were loaded (walked here):
        // the busiest first.
        let mut deferred: Vec<&ProcessProfile> = profile
            .processes
            .iter()
            .filter(|p| p.deferred.samples > 0)
            .collect();
        deferred.sort_by_key(|p| std::cmp::Reverse(p.deferred.samples));
        for p in deferred.iter().take(MAX_DEFERRED_LINES) {
            let _ = writeln!(
                out,
                "walked in user space: pid {} {}: {} samples, {} complete",
                p.pid, p.comm, p.deferred.samples, p.deferred.complete
            );
        }
    }
    // Stacks that differ only in addresses inside the same functions are one line here.
    let mut merged: HashMap<(u32, Vec<String>, WalkOutcome), (&ProcessProfile, u64)> =
        HashMap::new();
    for p in &profile.processes {
        for s in &p.stacks {
            merged
                .entry((p.pid, s.names(), s.outcome))
                .or_insert((p, 0))
                .1 += s.count;
        }
    }
    let mut stacks: Vec<(&ProcessProfile, u64, WalkOutcome, Vec<String>)> = merged
        .into_iter()
        .map(|((_, names, outcome), (p, count))| (p, count, outcome, names))
        .collect();
    stacks.sort_by(|a, b| {
        b.1.cmp(&a.1)
            .then_with(|| a.0.pid.cmp(&b.0.pid))
            .then_with(|| a.3.cmp(&b.3))
    });
    for (i, (p, count, outcome, names)) in stacks.iter().take(n).enumerate() {
        let pct = 100.0 * *count as f64 / total.max(1) as f64;
        let ns = p
            .ns_pid
            .map(|n| format!(" (pid {n} in its namespace)"))
            .unwrap_or_default();
        let amount = if profile.off_cpu {
            format!("{:.1} ms", *count as f64 / 1e6)
        } else {
            format!("{count} samples")
        };
        let _ = writeln!(
            out,
            "\n#{} {amount} ({pct:.1}%) {} pid {}{ns} [{}]",
            i + 1,
            p.comm,
            p.pid,
            outcome.name()
        );
        for f in names.iter().rev() {
            let _ = writeln!(out, "    {f}");
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::export::tests::sample_profile;

    #[test]
    fn hottest_first_innermost_first() {
        let mut p = sample_profile();
        p.outcomes[WalkOutcome::Complete as usize] = 10;
        let text = top(&p, 1);
        assert!(
            text.starts_with("11 samples in 2.5 s (0 in kernel mode)\n"),
            "{text}"
        );
        assert!(
            text.contains("  complete                     10   90.9%\n"),
            "{text}"
        );
        assert!(
            text.ends_with(
                "#1 7 samples (63.6%) my prog pid 42 [complete]\n    leaf;fn\n    helper\n    main\n    _start\n"
            ),
            "{text}"
        );
    }
}
