//! A process that maps a file and makes its path, as the profiler's fallback resolves
//! it, a symlink to a root-only FIFO (issue 18, attack 2). It runs as `nobody` chrooted
//! in a user namespace (`unshare -Ur chroot JAIL`), mapping and unmapping `/lib.so` in
//! a loop, so that `/proc/PID/map_files` races and the profiler falls back to the path
//! `/proc/PID/maps` shows (`JAIL/lib.so`, the host's view) inside the process's root:
//! there, `JAIL/JAIL/lib.so` is the attacker's symlink to a root-only FIFO of the host.
//! The profiler resolves it inside that root (where it leads nowhere), never opens a
//! FIFO, stops on time, and a victim profiled alongside keeps complete stacks.

mod support;

use std::os::unix::fs::PermissionsExt as _;

use support::{
    KillOnDrop, bpf_or_skip, compile_c, fixture_dir,
    hostile::{self, VICTIM, VICTIM_CHAIN, as_nobody, nobody_dir},
};

const SWAPPER: &str = r#"
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>
volatile unsigned long sink;
int main(void) {
    int fd = open("/lib.so", O_RDONLY);
    if (fd < 0) return 3;
    for (;;) {
        void *p = mmap(0, 4096, PROT_READ | PROT_EXEC, MAP_PRIVATE, fd, 0);
        if (p == MAP_FAILED) return 5;
        for (int i = 0; i < 2000; i++) sink += i;
        munmap(p, 4096);
        for (int i = 0; i < 2000; i++) sink += i;
    }
}
"#;

#[test]
fn a_symlink_to_a_root_only_fifo_never_blocks_the_profiler() {
    if !bpf_or_skip("a_symlink_to_a_root_only_fifo_never_blocks_the_profiler") {
        return;
    }
    let victim_exe = compile_c("victim-fifo", VICTIM, &["-O2"]);
    let swapper_exe = compile_c("swapper", SWAPPER, &["-O2", "-static"]);
    // A FIFO only root can reach.
    let secret = fixture_dir("root-only");
    std::fs::set_permissions(&secret, std::fs::Permissions::from_mode(0o700)).unwrap();
    let fifo = secret.join("fifo");
    let c = std::ffi::CString::new(fifo.as_os_str().as_encoded_bytes()).unwrap();
    // SAFETY: mkfifo(3) of a NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
    // The jail: the program, the file it maps, and under the jail's own path (what the
    // fallback resolves inside the process's root) a symlink to the host's FIFO.
    let jail = nobody_dir("jail");
    std::fs::copy(&swapper_exe, jail.join("swapper")).unwrap();
    std::fs::copy(&swapper_exe, jail.join("lib.so")).unwrap();
    let nested = jail.join(jail.strip_prefix("/").unwrap());
    std::fs::create_dir_all(&nested).unwrap();
    std::os::unix::fs::symlink(&fifo, nested.join("lib.so")).unwrap();
    let victim = KillOnDrop::spawn(&mut as_nobody(&victim_exe));
    let mut jailed = as_nobody(std::path::Path::new("unshare"));
    jailed.args(["-Ur", "chroot"]).arg(&jail).arg("/swapper");
    let swapper = KillOnDrop::spawn(&mut jailed);
    let start = std::time::Instant::now();
    while hostile::cpu_seconds(swapper.pid()) < 0.05 {
        assert!(
            std::path::Path::new(&format!("/proc/{}", swapper.pid())).exists(),
            "the jailed swapper exited (are unprivileged user namespaces enabled?)"
        );
        assert!(start.elapsed().as_secs() < 300, "the swapper never ran");
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let out = victim_exe.parent().expect("fixture dir");
    let args = [
        "--pid".to_owned(),
        victim.pid().to_string(),
        "--pid".to_owned(),
        swapper.pid().to_string(),
    ];
    // `profile` fails if the profiler does not stop within its limit after SIGTERM.
    let run = hostile::profile(&args, victim.pid(), 2.0, out);
    assert!(
        std::path::Path::new(&format!("/proc/{}", swapper.pid())).exists(),
        "the swapper stopped (it must have kept racing throughout)"
    );
    let (complete, all) = hostile::complete(&run.folded, "victim-fifo", VICTIM_CHAIN);
    assert!(
        all > 0 && complete * 100 >= all * 95,
        "{complete} of {all} victim samples complete:\n{}",
        run.folded
    );
    eprintln!("profiler CPU {:.2} s, stopping included", run.cpu);
}
