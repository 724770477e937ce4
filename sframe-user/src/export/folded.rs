//! The folded format: `GROUP;outermost;...;leaf COUNT`, one line per distinct stack, where
//! GROUP is the process's `comm` (`--group-by process`) or `THREAD-PID/TID`
//! (`--group-by thread`, the convention of `stackcollapse-perf.pl --tid`).

use std::{collections::BTreeMap, fmt::Write as _};

use super::{GroupBy, ProcessProfile, Profile, Stack};

/// The first frame of `s` of process `p`: names sanitized, `;` and spaces replaced.
pub(super) fn group_frame(group_by: GroupBy, p: &ProcessProfile, s: &Stack) -> String {
    let clean = |n: &str| n.replace([';', ' '], "_");
    match group_by {
        GroupBy::Process => clean(&p.comm),
        GroupBy::Thread => {
            let name = if s.thread.is_empty() {
                &p.comm
            } else {
                &s.thread
            };
            format!("{}-{}/{}", clean(name), p.pid, s.tid)
        }
        GroupBy::Cgroup => p.cgroup.as_deref().map_or("[no cgroup]".to_owned(), clean),
        GroupBy::Container => p
            .container_id
            .as_deref()
            .map_or("[host]".to_owned(), |id| id.chars().take(12).collect()),
    }
}

/// The folded lines of `profile`, sorted, identical stacks merged. `;` inside a name
/// becomes `:` and spaces in the comm `_`, so every line splits unambiguously.
pub fn folded(profile: &Profile) -> String {
    let mut out = String::new();
    for (line, count) in folded_lines(profile) {
        let _ = writeln!(out, "{line} {count}");
    }
    out
}

/// `(stack, count)` pairs, sorted by stack.
pub(super) fn folded_lines(profile: &Profile) -> BTreeMap<String, u64> {
    let mut lines: BTreeMap<String, u64> = BTreeMap::new();
    for p in &profile.processes {
        for s in &p.stacks {
            let mut line = group_frame(profile.group_by, p, s);
            for name in s.names() {
                line.push(';');
                line.push_str(&name.replace(';', ":"));
            }
            *lines.entry(line).or_default() += s.count;
        }
    }
    if profile.off_cpu {
        // Off CPU: microseconds, as bcc's offcputime folds them.
        lines.retain(|_, ns| {
            *ns = (*ns + 500) / 1000;
            *ns > 0
        });
    }
    lines
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::export::tests::sample_profile;

    #[test]
    fn folded_contract() {
        let mut p = sample_profile();
        // A second thread's copy of the first stack merges into the same line.
        let dup = p.processes[0].stacks[0].clone();
        p.processes[0].stacks.push(dup);
        assert_eq!(
            folded(&p),
            "my_prog;_start;main;helper;[libc.so.6+0x2a3f0];do_syscall_64_[k] 3\n\
             my_prog;_start;main;helper;leaf:fn 14\n\
             other;[[anon]+0x10] 1\n"
        );
    }

    #[test]
    fn grouped_by_thread() {
        let mut p = sample_profile();
        p.group_by = GroupBy::Thread;
        let mut other_thread = p.processes[0].stacks[0].clone();
        other_thread.tid = 43;
        other_thread.thread = "worker;1".to_owned();
        p.processes[0].stacks.push(other_thread);
        let text = folded(&p);
        assert!(
            text.contains("my_prog-42/0;_start;main;helper;leaf:fn 7\n"),
            "{text}"
        );
        assert!(
            text.contains("worker_1-42/43;_start;main;helper;leaf:fn 7\n"),
            "{text}"
        );
    }

    #[test]
    fn empty_profile_is_empty() {
        assert_eq!(folded(&Profile::default()), "");
    }
}
