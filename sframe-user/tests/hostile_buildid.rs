//! A build-id is a cache key, never a proof (issue 18, attack 3): an unprivileged user
//! links a program with the build-id of a victim program and runs it first. The victim
//! keeps complete stacks, in that run and in the next one (which finds the disk cache
//! filled while the impostor ran), because tables are shared and cached by a digest of
//! what they are derived from, not by build-id.

mod support;

use support::{
    KillOnDrop, bpf_or_skip, compile_c, fixture_dir,
    hostile::{self, VICTIM, VICTIM_CHAIN, as_nobody},
};

/// The victim's build-id, and the impostor's.
const BUILD_ID: &str = "--build-id=0x5fc1a2b3c4d5e6f708192a3b4c5d6e7f80910203";

/// Other code with other frames at the victim's addresses (a function with a 5 KB frame
/// where the victim's leaf is), under the same build-id.
const IMPOSTOR: &str = r#"
volatile unsigned long sink;
void big_b(void);
__attribute__((noinline)) void big_a(void) {
    volatile char buf[5000];
    for (int i = 0; i < 64; i++) buf[i * 64] = i;
    big_b();
    sink += buf[0] + buf[64] + buf[128] + buf[192] + buf[256] + buf[320] + buf[384];
}
__attribute__((noinline)) void impostor_spin(void) { for (int i = 0; i < 100000; i++) sink += i; }
__attribute__((noinline)) void big_b(void) { volatile char buf[3000]; buf[0] = 1; for (;;) impostor_spin(); }
int main(void) { volatile char pad[700]; pad[0] = 3; big_a(); return pad[0]; }
"#;

fn build_id_of(exe: &std::path::Path) -> String {
    let out = std::process::Command::new("readelf")
        .arg("-n")
        .arg(exe)
        .output()
        .expect("readelf");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    text.lines()
        .find_map(|l| l.trim().strip_prefix("Build ID: "))
        .expect("a build-id")
        .to_owned()
}

#[test]
fn a_forged_build_id_cannot_poison_another_programs_stacks() {
    if !bpf_or_skip("a_forged_build_id_cannot_poison_another_programs_stacks") {
        return;
    }
    let flag = format!("-Wl,{BUILD_ID}");
    let victim_exe = compile_c("victim-bid", VICTIM, &["-O2", &flag]);
    let impostor_exe = compile_c("impostor", IMPOSTOR, &["-O2", &flag]);
    assert_eq!(build_id_of(&victim_exe), build_id_of(&impostor_exe));
    let cache = fixture_dir("buildid-cache");
    let out = victim_exe.parent().expect("fixture dir");

    // The impostor runs first, then the victim; one profiler for both.
    let impostor = KillOnDrop::spawn(&mut as_nobody(&impostor_exe));
    while hostile::cpu_seconds(impostor.pid()) < 0.05 {
        assert!(
            std::path::Path::new(&format!("/proc/{}", impostor.pid())).exists(),
            "the impostor exited"
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let victim = KillOnDrop::spawn(&mut as_nobody(&victim_exe));
    let cache_args = ["--cache-dir".to_owned(), cache.display().to_string()];
    let both: Vec<String> = [
        "--pid".to_owned(),
        impostor.pid().to_string(),
        "--pid".to_owned(),
        victim.pid().to_string(),
    ]
    .into_iter()
    .chain(cache_args.clone())
    .collect();
    let first = hostile::profile(&both, victim.pid(), 2.0, out);
    let (complete, all) = hostile::complete(&first.folded, "victim-bid", VICTIM_CHAIN);
    assert!(all > 0, "no victim samples:\n{}", first.folded);
    assert!(
        complete * 100 >= all * 95,
        "victim: {complete} of {all} samples complete beside the impostor:\n{}",
        first.folded
    );
    let (complete, all) =
        hostile::complete(&first.folded, "impostor", ";main;big_a;big_b;impostor_spin");
    assert!(
        all > 0 && complete * 100 >= all * 95,
        "impostor: {complete} of {all} complete:\n{}",
        first.folded
    );
    drop(impostor);

    // The next run, with what the first left in the disk cache.
    let alone: Vec<String> = ["--pid".to_owned(), victim.pid().to_string()]
        .into_iter()
        .chain(cache_args)
        .collect();
    let second = hostile::profile(&alone, victim.pid(), 2.0, out);
    let (complete, all) = hostile::complete(&second.folded, "victim-bid", VICTIM_CHAIN);
    assert!(
        all > 0 && complete * 100 >= all * 95,
        "victim: {complete} of {all} samples complete from the cache:\n{}",
        second.folded
    );
}
