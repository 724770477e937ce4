//! A `newc` cpio archive writer: the initramfs format the kernel unpacks (see the
//! kernel's `Documentation/driver-api/early-userspace/buffer-format.rst`). Small enough
//! to write here rather than depend on a `cpio` binary being installed.

use std::{collections::BTreeSet, path::Path};

use anyhow::{Context as _, Result, bail};

/// An archive being built in memory; parent directories are added as needed.
#[derive(Default)]
pub struct Cpio {
    out: Vec<u8>,
    dirs: BTreeSet<String>,
    files: BTreeSet<String>,
    ino: u32,
}

const S_IFDIR: u32 = 0o040000;
const S_IFREG: u32 = 0o100000;

impl Cpio {
    fn entry(&mut self, name: &str, mode: u32, data: &[u8]) {
        self.ino += 1;
        let name_z = name.len() + 1;
        let header = format!(
            "070701{:08x}{:08x}{:08x}{:08x}{:08x}{:08x}{:08x}{:08x}{:08x}{:08x}{:08x}{:08x}{:08x}",
            self.ino,
            mode,
            0, // uid
            0, // gid
            1, // nlink
            0, // mtime
            data.len(),
            0,
            0,
            0,
            0,
            name_z,
            0, // check
        );
        self.out.extend_from_slice(header.as_bytes());
        self.out.extend_from_slice(name.as_bytes());
        self.out.push(0);
        self.pad();
        self.out.extend_from_slice(data);
        self.pad();
    }

    fn pad(&mut self) {
        while !self.out.len().is_multiple_of(4) {
            self.out.push(0);
        }
    }

    fn parents(&mut self, path: &str) {
        let mut prefix = String::new();
        let parts: Vec<&str> = path.split('/').filter(|p| !p.is_empty()).collect();
        for part in &parts[..parts.len().saturating_sub(1)] {
            if !prefix.is_empty() {
                prefix.push('/');
            }
            prefix.push_str(part);
            if self.dirs.insert(prefix.clone()) {
                let p = prefix.clone();
                self.entry(&p, S_IFDIR | 0o755, &[]);
            }
        }
    }

    fn key(path: &str) -> Result<String> {
        let key = path.trim_start_matches('/').to_owned();
        if key.is_empty() || key.split('/').any(|p| p == "..") {
            bail!("bad archive path {path:?}");
        }
        Ok(key)
    }

    /// A directory (and its parents).
    pub fn dir(&mut self, path: &str) -> Result<()> {
        let key = Self::key(path)?;
        self.parents(&key);
        if self.dirs.insert(key.clone()) {
            self.entry(&key, S_IFDIR | 0o755, &[]);
        }
        Ok(())
    }

    /// A regular file with these bytes; a path added twice keeps the first.
    pub fn file(&mut self, path: &str, mode: u32, data: &[u8]) -> Result<()> {
        let key = Self::key(path)?;
        if !self.files.insert(key.clone()) {
            return Ok(());
        }
        self.parents(&key);
        self.entry(&key, S_IFREG | (mode & 0o7777), data);
        Ok(())
    }

    /// A copy of host file `src` at `path` (its mode kept, symlinks followed).
    pub fn copy(&mut self, path: &str, src: &Path) -> Result<()> {
        use std::os::unix::fs::PermissionsExt as _;
        // Every ELF lists libc again: read each file once.
        if self.files.contains(&Self::key(path)?) {
            return Ok(());
        }
        let data = std::fs::read(src).with_context(|| format!("reading {}", src.display()))?;
        let mode = std::fs::metadata(src)?.permissions().mode();
        self.file(path, mode, &data)
    }

    /// The archive's bytes, with its trailer.
    pub fn finish(mut self) -> Vec<u8> {
        self.entry("TRAILER!!!", 0, &[]);
        while !self.out.len().is_multiple_of(512) {
            self.out.push(0);
        }
        self.out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_are_aligned_and_parents_come_first() {
        let mut c = Cpio::default();
        c.file("/a/b/c", 0o755, b"hello").unwrap();
        let out = c.finish();
        let text = String::from_utf8_lossy(&out);
        let a = text.find("a\0").unwrap();
        let ab = text.find("a/b\0").unwrap();
        let abc = text.find("a/b/c\0").unwrap();
        assert!(a < ab && ab < abc);
        assert!(text.contains("hello"));
        assert!(text.contains("TRAILER!!!"));
        assert_eq!(out.len() % 512, 0);
        assert!(Cpio::default().file("../x", 0o644, b"").is_err());
    }
}
