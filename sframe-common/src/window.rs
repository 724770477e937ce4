//! A window of user stack copied in one read, which serves the walk's 8-byte reads.
//!
//! In the kernel each `bpf_probe_read_user` costs about 100 ns, whatever its size (a
//! helper call, user-access toggling, fault handling set-up); a walk reads two or three
//! words per frame, mostly just above the previous frame's. The window copies up to
//! [`WINDOW_BYTES`] of the stack at once and answers the reads that fall inside it.
//!
//! It changes no result: a window never crosses a page boundary, and it always holds the
//! page of the address that caused it to be filled, so it is read exactly when that
//! address could be read (user memory is mapped, readable or present page by page).
//! Unaligned reads, which may straddle two pages, bypass the window.

/// Bytes one refill copies at most (a power of two, at most a page).
pub const WINDOW_BYTES: usize = 1024;
/// Words in the window.
pub const WINDOW_WORDS: usize = WINDOW_BYTES / 8;
/// The unit of user memory mapping (the smallest page size of the supported targets).
pub const USER_PAGE: u64 = 4096;
/// A refill starts this far below the address that missed (within its page): the walk
/// reads a frame's RA before its saved FP, which lies just below it.
pub const WINDOW_SLACK: u64 = 64;

/// The window and the user address of its first byte. `len == 0`: empty.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct StackWindow {
    /// User address of the window's first byte.
    pub start: u64,
    /// Bytes held (0: empty).
    pub len: u64,
    /// The bytes copied, as 8-byte words; the first `len / 8` are valid.
    pub words: [u64; WINDOW_WORDS],
}

impl Default for StackWindow {
    fn default() -> Self {
        Self {
            start: 0,
            len: 0,
            words: [0; WINDOW_WORDS],
        }
    }
}

/// Where a refill for `addr` (8-aligned) starts and how many bytes it copies: from a
/// little below `addr` (not below its page) to the end of its page, at most
/// [`WINDOW_BYTES`]. Always covers `[addr, addr + 8)`.
#[inline(always)]
pub fn refill_range(addr: u64) -> (u64, u64) {
    let page = addr & !(USER_PAGE - 1);
    let below = addr & (USER_PAGE - 1);
    let slack = if below < WINDOW_SLACK {
        below
    } else {
        WINDOW_SLACK
    };
    let start = addr - slack;
    let to_end = USER_PAGE - (start - page);
    let len = if to_end < WINDOW_BYTES as u64 {
        to_end
    } else {
        WINDOW_BYTES as u64
    };
    (start, len)
}

impl StackWindow {
    /// Forgets the contents (a new sample).
    #[inline(always)]
    pub fn clear(&mut self) {
        self.len = 0;
    }

    /// The word at `addr`, from the window when it holds it, else after a refill through
    /// `fill(window, start, len)` (true on success: `len` bytes from `start` copied into
    /// `window.words`). `read` serves unaligned addresses.
    #[inline(always)]
    pub fn read(
        &mut self,
        addr: u64,
        fill: impl FnOnce(&mut Self, u64, u64) -> bool,
        read: impl FnOnce(u64) -> Option<u64>,
    ) -> Option<u64> {
        if addr & 7 != 0 {
            return read(addr);
        }
        let off = addr.wrapping_sub(self.start);
        if off < self.len {
            return Some(self.word(off));
        }
        let (start, len) = refill_range(addr);
        if !fill(self, start, len) {
            self.len = 0;
            return None;
        }
        self.start = start;
        self.len = len;
        Some(self.word(addr - start))
    }

    /// The word at byte offset `off` of the window (masked into it).
    #[inline(always)]
    fn word(&self, off: u64) -> u64 {
        // LLVM drops the mask where it can prove the offset small (after a refill it is
        // the slack, at most 64), and keeps the proof in a register the verifier of
        // older kernels (6.1) does not connect to the spilled copy it then loads: the
        // access is rejected as unbounded. An opaque copy makes LLVM emit the mask
        // right before the access, where every verifier sees it.
        let i = crate::bounded((off >> 3) as usize, WINDOW_WORDS);
        self.words[i]
    }
}

const _: () = assert!(WINDOW_BYTES.is_power_of_two() && WINDOW_BYTES as u64 <= USER_PAGE);
const _: () = assert!(WINDOW_SLACK.is_multiple_of(8) && WINDOW_SLACK + 8 <= WINDOW_BYTES as u64);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refill_stays_in_the_page_and_covers_the_address() {
        for addr in (0x7fff_0000u64..0x7fff_3000).step_by(8) {
            let (start, len) = refill_range(addr);
            assert!(start <= addr && addr + 8 <= start + len, "{addr:#x}");
            assert_eq!(
                start / USER_PAGE,
                (start + len - 1) / USER_PAGE,
                "{addr:#x}"
            );
            assert!(len <= WINDOW_BYTES as u64 && len % 8 == 0);
        }
    }

    /// User memory mapped page by page: a read succeeds when all its bytes are in mapped
    /// pages; a word's value is a function of its address.
    struct Pages {
        mapped: [bool; 8],
    }

    const BASE: u64 = 0x7ffd_0000_0000;

    impl Pages {
        fn byte(&self, addr: u64) -> Option<u8> {
            let page = addr.checked_sub(BASE)? / USER_PAGE;
            let ok = *self.mapped.get(page as usize)?;
            ok.then(|| (addr.wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 56) as u8)
        }
        fn read(&self, addr: u64, len: u64) -> Option<[u8; 8]> {
            let mut out = [0; 8];
            for i in 0..len {
                let b = self.byte(addr + i)?;
                if i < 8 {
                    out[i as usize] = b;
                }
            }
            Some(out)
        }
        fn word(&self, addr: u64) -> Option<u64> {
            self.read(addr, 8).map(u64::from_le_bytes)
        }
    }

    #[test]
    fn windowed_reads_equal_direct_reads() {
        let mut seed = 0x2545_f491_4f6c_dd1du64;
        let mut next = move || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed
        };
        for round in 0..200 {
            let r = next();
            let pages = Pages {
                mapped: core::array::from_fn(|i| (r >> i) & 1 == 1 || i == 0),
            };
            let mut w = StackWindow::default();
            let mut addr = (BASE + next() % 4096) & !7;
            for _ in 0..400 {
                // Mostly upward by small aligned steps, sometimes anywhere, sometimes
                // unaligned, sometimes just below the last read.
                addr = match next() % 16 {
                    0 => BASE + next() % (8 * USER_PAGE + 64),
                    1 => addr.wrapping_sub(8 * (next() % 12)),
                    2 => addr + 1 + next() % 7,
                    _ => (addr & !7) + 8 * (next() % 40),
                };
                let direct = pages.word(addr);
                let fill = |w: &mut StackWindow, start: u64, len: u64| {
                    if pages.read(start, len).is_none() {
                        return false;
                    }
                    for i in 0..len / 8 {
                        w.words[i as usize] = pages.word(start + 8 * i).unwrap();
                    }
                    true
                };
                let got = w.read(addr, fill, |a| pages.word(a));
                assert_eq!(got, direct, "round {round} addr {addr:#x}");
            }
        }
    }
}
