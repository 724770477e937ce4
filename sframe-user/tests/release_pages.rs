//! `release_shared_file_pages` (what the symbolizer does after each round) drops the
//! resident pages of shared read-only file mappings and of nothing else, and every
//! byte reads back unchanged. Its own test binary: the function's contract forbids
//! other threads unmapping shared file mappings meanwhile, which tests running in
//! parallel in one process could do: the tests here take [`ONE_AT_A_TIME`].

mod support;

use std::{fs::File, io::Write as _, sync::Mutex};

use sframe_user::mapped::{ObjectBytes, release_read, release_shared_file_pages};

/// Held by each test: one maps or unmaps files while another releases pages otherwise.
static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

/// Resident kB of the mapping that contains `addr` (`/proc/self/smaps`).
fn resident_kb(addr: usize) -> u64 {
    let smaps = std::fs::read_to_string("/proc/self/smaps").unwrap();
    let mut inside = false;
    for line in smaps.lines() {
        if let Some((range, _)) = line.split_once(' ')
            && let Some((lo, hi)) = range.split_once('-')
            && let (Ok(lo), Ok(hi)) = (usize::from_str_radix(lo, 16), usize::from_str_radix(hi, 16))
        {
            inside = (lo..hi).contains(&addr);
        } else if inside && let Some(kb) = line.strip_prefix("Rss:") {
            return kb.trim().trim_end_matches(" kB").trim().parse().unwrap();
        }
    }
    panic!("no mapping at {addr:#x}");
}

fn sum(b: &[u8]) -> u64 {
    b.iter().map(|&x| u64::from(x)).sum()
}

fn temp_file(name: &str, content: &[u8]) -> (std::path::PathBuf, File) {
    let path = std::env::temp_dir().join(format!("release-{name}-{}", std::process::id()));
    File::create(&path).unwrap().write_all(content).unwrap();
    let file = File::open(&path).unwrap();
    (path, file)
}

#[test]
fn only_shared_read_only_file_pages_leave_and_every_byte_reads_back() {
    let _one = ONE_AT_A_TIME
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    const LEN: usize = 8 << 20;
    let content: Vec<u8> = (0..LEN as u32).map(|i| (i % 251) as u8).collect();
    let expected = sum(&content);

    // What blazesym makes: a shared read-only mapping of an object file.
    let (shared_path, shared_file) = temp_file("shared", &content);
    // SAFETY: a read-only mapping of a file this test owns and does not change.
    let shared = unsafe { memmap2::Mmap::map(&shared_file) }.unwrap();
    // What the table builder makes: a private mapping.
    let (private_path, private_file) = temp_file("private", &content);
    let meta = private_file.metadata().unwrap();
    let private = ObjectBytes::map(private_file, &meta).unwrap();
    // Shared anonymous memory (`/dev/zero (deleted)`), written, then made read-only:
    // its pages have no file to come back from.
    // SAFETY: a new mapping of LEN bytes, written in full here, then made read-only;
    // unmapped at the end, after its last use.
    let anon: &[u8] = unsafe {
        let p = libc::mmap(
            std::ptr::null_mut(),
            LEN,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED | libc::MAP_ANONYMOUS,
            -1,
            0,
        );
        assert_ne!(p, libc::MAP_FAILED);
        std::ptr::copy_nonoverlapping(content.as_ptr(), p.cast::<u8>(), LEN);
        assert_eq!(libc::mprotect(p, LEN, libc::PROT_READ), 0);
        std::slice::from_raw_parts(p.cast::<u8>(), LEN)
    };

    assert_eq!(sum(&shared), expected);
    assert_eq!(sum(&private), expected);
    assert_eq!(sum(anon), expected);
    let kb = (LEN >> 10) as u64;
    for (what, addr) in [
        ("shared", shared.as_ptr() as usize),
        ("private", private.as_ptr() as usize),
        ("anonymous", anon.as_ptr() as usize),
    ] {
        assert!(resident_kb(addr) >= kb, "{what}: {} kB", resident_kb(addr));
    }

    // SAFETY: this test's only thread that maps or unmaps files.
    let released = unsafe { release_shared_file_pages() };
    assert!(released >= LEN as u64, "{released} bytes released");
    assert_eq!(resident_kb(shared.as_ptr() as usize), 0);
    assert!(resident_kb(private.as_ptr() as usize) >= kb);
    assert!(resident_kb(anon.as_ptr() as usize) >= kb);

    // Read again: from the page cache, unchanged.
    assert_eq!(sum(&shared), expected);
    assert_eq!(sum(&private), expected);
    assert_eq!(sum(anon), expected);
    assert!(resident_kb(shared.as_ptr() as usize) >= kb);

    // SAFETY: the mapping made above; `anon` is not used after this.
    unsafe { libc::munmap(anon.as_ptr() as *mut libc::c_void, LEN) };
    std::fs::remove_file(shared_path).unwrap();
    std::fs::remove_file(private_path).unwrap();
}

/// The mapping that broke a first attempt (which advised every read-only file mapping):
/// a BPF ring buffer's producer and data pages are a shared read-only mapping of an
/// `anon_inode:bpf-map` file, whose pages have no file to come back from (the ring then
/// read as zeros). Made here as libbpf makes it: the consumer page read-write, the
/// producer page and the data twice read-only.
#[test]
fn a_bpf_ring_buffer_mapping_keeps_its_pages() {
    if !support::bpf_or_skip("a_bpf_ring_buffer_mapping_keeps_its_pages") {
        return;
    }
    let _one = ONE_AT_A_TIME
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    const SIZE: usize = 1 << 20;
    const PAGE: usize = 4096;
    // union bpf_attr for BPF_MAP_CREATE: map_type, key_size, value_size, max_entries.
    let mut attr = [0u32; 32];
    attr[0] = 27; // BPF_MAP_TYPE_RINGBUF
    attr[3] = SIZE as u32;
    // SAFETY: BPF_MAP_CREATE (0) with a zeroed attribute of the size given.
    let fd = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            0,
            attr.as_mut_ptr(),
            std::mem::size_of_val(&attr),
        )
    };
    assert!(
        fd >= 0,
        "BPF_MAP_CREATE (ring buffer): {}",
        std::io::Error::last_os_error()
    );
    let fd = fd as libc::c_int;
    // SAFETY: mappings of the ring's descriptor as the kernel lays them out; both
    // unmapped below, after their last use.
    let (consumer, producer) = unsafe {
        let consumer = libc::mmap(
            std::ptr::null_mut(),
            PAGE,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED,
            fd,
            0,
        );
        assert_ne!(
            consumer,
            libc::MAP_FAILED,
            "{}",
            std::io::Error::last_os_error()
        );
        let producer = libc::mmap(
            std::ptr::null_mut(),
            PAGE + 2 * SIZE,
            libc::PROT_READ,
            libc::MAP_SHARED,
            fd,
            PAGE as libc::off_t,
        );
        assert_ne!(
            producer,
            libc::MAP_FAILED,
            "{}",
            std::io::Error::last_os_error()
        );
        (consumer, producer)
    };
    let bytes =
        // SAFETY: the read-only mapping made above, PAGE + 2 × SIZE bytes.
        unsafe { std::slice::from_raw_parts(producer.cast::<u8>(), PAGE + 2 * SIZE) };
    // Every page read (the kernel maps them all at mmap time for a ring buffer).
    assert_eq!(sum(bytes), 0);
    let before = resident_kb(producer as usize);
    assert!(before >= (SIZE >> 10) as u64, "{before} kB");
    let listed = std::fs::read_to_string("/proc/self/maps").unwrap();
    assert!(
        listed.contains("r--s 00001000") && listed.contains("anon_inode:bpf-map"),
        "{listed}"
    );
    // SAFETY: this test's only thread that maps or unmaps files (ONE_AT_A_TIME held).
    unsafe { release_shared_file_pages() };
    assert_eq!(resident_kb(producer as usize), before);
    // SAFETY: the mappings and descriptor made above, not used after this.
    unsafe {
        libc::munmap(producer, PAGE + 2 * SIZE);
        libc::munmap(consumer, PAGE);
        libc::close(fd);
    }
}

/// What a derivation reads once leaves the RSS as it goes (`release_read` inside
/// `ObjectBytes::releasing`), and reads back unchanged.
#[test]
fn pages_read_in_a_derivation_are_released_and_read_again_unchanged() {
    let _one = ONE_AT_A_TIME
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let path = std::env::temp_dir().join(format!("mapped-r-{}", std::process::id()));
    let content: Vec<u8> = (0..8u32 << 20).map(|i| (i % 251) as u8).collect();
    std::fs::write(&path, &content).unwrap();
    let file = File::open(&path).unwrap();
    let meta = file.metadata().unwrap();
    let bytes = ObjectBytes::map(file, &meta).unwrap();
    let addr = bytes.as_ptr() as usize;
    let sum = |b: &[u8]| b.iter().map(|&x| u64::from(x)).sum::<u64>();
    let expected = sum(&content);
    // Outside `releasing`, nothing is dropped.
    assert_eq!(sum(&bytes), expected);
    let before = resident_kb(addr);
    release_read(&bytes);
    assert_eq!(resident_kb(addr), before);
    assert!(before >= 8 << 10, "{before} kB resident");
    bytes.releasing(|| release_read(&bytes[4096..]));
    // The first page stays; the rest left.
    assert!(resident_kb(addr) <= 8, "{} kB resident", resident_kb(addr));
    assert_eq!(sum(&bytes), expected);
    // A heap copy is never touched.
    let heap = ObjectBytes::Heap(content.clone());
    heap.releasing(|| release_read(&heap));
    assert_eq!(sum(&heap), expected);
    std::fs::remove_file(&path).unwrap();
}
