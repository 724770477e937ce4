//! The folded format: `comm;outermost;...;leaf COUNT`, one line per distinct stack.

use std::{collections::BTreeMap, fmt::Write as _};

use super::Profile;

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
        let comm = p.comm.replace([';', ' '], "_");
        for s in &p.stacks {
            let mut line = comm.clone();
            for name in s.names() {
                line.push(';');
                line.push_str(&name.replace(';', ":"));
            }
            *lines.entry(line).or_default() += s.count;
        }
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
    fn empty_profile_is_empty() {
        assert_eq!(folded(&Profile::default()), "");
    }
}
