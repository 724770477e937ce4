//! Flattened unwind tables cached on disk, keyed by the object's content digest
//! ([`crate::objects::content_digest`], never by its build-id, which any user can forge),
//! so that a restart (or a profiler on another host sharing the directory) loads a
//! known object without parsing and deriving it again.
//!
//! One file per object, `DIR/<digest hex>.sftab`:
//!
//! ```text
//! "SFTC" u32 format | u16 len, tool identity | u16 len, digest
//! u8 source kind, u8 SFrame version | u64 table rows, unencodable, unexpanded | u64 base
//! u32 n, n × rule (i32 cfa off, i16 ra off, i16 fp off, u8 cfa base, ra kind, fp kind, flags)
//! u32 n, n × u32 page entry | u32 n, n × (u16 addr_low, u16 local rule)
//! u32 CRC-32 of everything before
//! ```
//!
//! Rules are stored by value and re-interned into this run's dictionary on load. The
//! tool identity (version, size and modification time of the profiler's executable)
//! makes another build of the profiler ignore the file. Files are untrusted: every
//! count is checked against the bytes left before anything is allocated, and a bad
//! file is a miss (counted, and the file removed), never a panic. Files are opened
//! `O_NOFOLLOW | O_NONBLOCK` and must be regular (a FIFO never blocks a load). Writes go
//! to a fresh temporary file (`O_EXCL | O_NOFOLLOW`, mode 0644) renamed into place; once
//! the event loop runs, on a thread of their own: the loop that builds a table never
//! waits for the disk (on a busy host a flush can take longer than a short process
//! lives, and every process starting meanwhile would lose its first samples). They are
//! not flushed to the disk: a file torn by a crash fails its checksum and is rebuilt.
//!
//! The directory must be one only the profiler's user can change: it and every
//! directory above it owned by that user or root, and not writable by others (an
//! ancestor may be world-writable only with the sticky bit, like `/tmp`). A directory
//! the profiler's user owns but others may write is repaired (mode 0755); anything else
//! is refused with an error naming the directory, and the profiler runs without a
//! cache.

use std::{
    fs,
    io::Write as _,
    os::unix::fs::{DirBuilderExt as _, MetadataExt as _, OpenOptionsExt as _},
    path::{Path, PathBuf},
};

use sframe_common::{
    budget::{MAX_PAGE_SHIFT, MIN_PAGE_SHIFT},
    layout::{RowEntry, RuleEntry},
};

use crate::{
    flatten::{FlatObject, RuleDict},
    table::Source,
};

const MAGIC: &[u8; 4] = b"SFTC";
/// 3: pages of a size per object (the page shift after the base); 2: keyed by content
/// digest (1 was keyed by build-id).
const FORMAT: u32 = 3;
/// Cache files larger than this are not read.
pub const MAX_FILE_BYTES: u64 = 256 << 20;

/// What a cached object holds besides its rows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CachedMeta {
    pub source: Source,
    pub table_rows: u64,
}

/// What is wrong with a cache file's contents.
#[derive(Clone, Debug, thiserror::Error, PartialEq, Eq)]
pub enum Corruption {
    #[error("not a regular file of at most {MAX_FILE_BYTES} bytes")]
    NotARegularFile,
    #[error("shorter than its checksum")]
    NoChecksum,
    #[error("checksum mismatch")]
    Checksum,
    #[error("not a table cache file of this format")]
    Format,
    #[error("another object's digest")]
    OtherDigest,
    #[error("truncated in {what} at byte {at}")]
    Truncated { what: &'static str, at: usize },
    #[error("{what}: {n} entries do not fit in the file")]
    TooMany { what: &'static str, n: usize },
    #[error("unknown source kind {0}")]
    SourceKind(u8),
    #[error("the rules do not fit the rule dictionary")]
    Rules(#[source] crate::flatten::FlattenError),
    #[error("row refers to rule {rule} of {rules}")]
    RuleIndex { rule: usize, rules: usize },
    #[error("{0} bytes after the rows")]
    Trailing(usize),
    #[error("page entries out of order or past the rows")]
    Pages,
    #[error("page shift {0} out of range")]
    PageShift(u32),
}

/// Why the cache or one of its files could not be used.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum CacheError {
    #[error("{path}: {what}")]
    Corrupt { path: PathBuf, what: Corruption },
    #[error("{path}: written by another build of the profiler")]
    OtherTool { path: PathBuf },
    #[error("{path}: {message}")]
    Io { path: PathBuf, message: String },
    #[error(
        "{path}: {why}; not used as the table cache (it must be a directory that only the profiler's user or root can change)"
    )]
    Unsafe { path: PathBuf, why: String },
}

/// What the cache did since it was opened.
#[derive(Clone, Copy, Debug, Default)]
pub struct CacheStats {
    pub hits: u64,
    pub misses: u64,
    pub stores: u64,
    /// Stores dropped because the writer thread's queue was full.
    pub stores_dropped: u64,
    /// Files that were present but unusable (corrupt, truncated, other tool).
    pub rejected: u64,
}

pub struct TableCache {
    dir: PathBuf,
    tool: String,
    pub stats: CacheStats,
    /// Started at the first store after [`TableCache::write_in_background`], not before:
    /// `--drop-privileges` drops capabilities while the profiler has one thread (they
    /// are per thread), after the start's loads.
    writer: Option<Writer>,
    /// Stores may go to the writer thread (else they are written inline).
    background: bool,
    /// The thread could not be started: files are written inline.
    writer_failed: bool,
}

/// Files written at most waiting for the writer thread (beyond, a store is dropped and
/// counted: the table is built again at the next start).
const MAX_QUEUED_WRITES: usize = 8;

enum WriteJob {
    File {
        tmp: PathBuf,
        path: PathBuf,
        bytes: Vec<u8>,
    },
    /// Answered once every job queued before it is done.
    Barrier(std::sync::mpsc::SyncSender<()>),
}

/// The thread that writes cache files.
struct Writer {
    jobs: std::sync::mpsc::SyncSender<WriteJob>,
    thread: std::thread::JoinHandle<()>,
}

impl Writer {
    fn spawn() -> Option<Self> {
        let (jobs, rx) = std::sync::mpsc::sync_channel::<WriteJob>(MAX_QUEUED_WRITES);
        let thread = std::thread::Builder::new()
            .name("sframe-cache".into())
            .spawn(move || {
                for job in rx {
                    match job {
                        WriteJob::File { tmp, path, bytes } => {
                            if let Err(e) = write_file(&tmp, &path, &bytes) {
                                log::info!("table cache: {}: {e}", tmp.display());
                            }
                        }
                        WriteJob::Barrier(done) => {
                            let _ = done.send(());
                        }
                    }
                }
            })
            .map_err(|e| log::warn!("no cache writer thread, cache files written inline: {e}"))
            .ok()?;
        Some(Self { jobs, thread })
    }
}

impl Drop for TableCache {
    /// Files queued are written before the cache goes (at most `MAX_QUEUED_WRITES`).
    fn drop(&mut self) {
        if let Some(w) = self.writer.take() {
            drop(w.jobs);
            let _ = w.thread.join();
        }
    }
}

/// Writes `bytes` to the new file `tmp` (`O_EXCL | O_NOFOLLOW`, mode 0644), then renames
/// it to `path`.
fn write_file(tmp: &Path, path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let mut file = fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o644)
        .custom_flags(libc::O_NOFOLLOW)
        .open(tmp)?;
    let written = file.write_all(bytes);
    drop(file);
    let result = written.and_then(|()| fs::rename(tmp, path));
    if result.is_err() {
        let _ = fs::remove_file(tmp);
    }
    result
}

impl TableCache {
    /// A cache in `dir` (created, mode 0755, when missing), if it is safe: see the
    /// module's documentation.
    pub fn open(dir: &Path) -> Result<Self, CacheError> {
        let io = |e: std::io::Error| CacheError::Io {
            path: dir.to_owned(),
            message: e.to_string(),
        };
        if fs::symlink_metadata(dir).is_err() {
            fs::DirBuilder::new()
                .recursive(true)
                .mode(0o755)
                .create(dir)
                .map_err(io)?;
        }
        check_owned(dir)?;
        Ok(Self {
            dir: dir.to_owned(),
            tool: tool_identity(),
            stats: CacheStats::default(),
            writer: None,
            background: false,
            writer_failed: false,
        })
    }

    fn path(&self, key: &[u8]) -> PathBuf {
        let hex: String = key.iter().map(|b| format!("{b:02x}")).collect();
        self.dir.join(format!("{hex}.sftab"))
    }

    /// Whether a file for `key` exists (it may still be rejected when read).
    pub fn contains(&self, key: &[u8]) -> bool {
        fs::symlink_metadata(self.path(key)).is_ok_and(|m| m.is_file())
    }

    /// The cached table of `key`, its rules interned into `dict`; `None` when absent or
    /// unusable (an unusable file is removed).
    pub fn load(&mut self, key: &[u8], dict: &mut RuleDict) -> Option<(FlatObject, CachedMeta)> {
        let path = self.path(key);
        let bytes = match read_bounded(&path) {
            Ok(Some(b)) => b,
            Ok(None) => {
                self.stats.misses += 1;
                return None;
            }
            Err(err) => {
                log::info!("table cache: {err}; removed");
                self.stats.rejected += 1;
                let _ = fs::remove_file(&path);
                return None;
            }
        };
        match decode(&bytes, &self.tool, key, dict) {
            Ok(v) => {
                self.stats.hits += 1;
                Some(v)
            }
            Err(what) => {
                let err = match what {
                    Decoded::OtherTool => CacheError::OtherTool { path },
                    Decoded::Corrupt(what) => CacheError::Corrupt { path, what },
                };
                log::info!("table cache: {err}; removed");
                self.stats.rejected += 1;
                let _ = fs::remove_file(self.path(key));
                None
            }
        }
    }

    /// Writes `flat` (rules resolved through `dict`) for `key`: after
    /// [`TableCache::write_in_background`], queued for the writer thread (dropped and
    /// counted when its queue is full); before, or without that thread, written here.
    pub fn store(
        &mut self,
        key: &[u8],
        meta: CachedMeta,
        flat: &FlatObject,
        dict: &RuleDict,
    ) -> Result<(), CacheError> {
        let path = self.path(key);
        let bytes = encode(&self.tool, key, meta, flat, dict);
        let tmp = self
            .dir
            .join(format!(".tmp-{}-{}", std::process::id(), self.stats.stores));
        self.stats.stores += 1;
        if self.background && self.writer.is_none() && !self.writer_failed {
            self.writer = Writer::spawn();
            self.writer_failed = self.writer.is_none();
        }
        match &self.writer {
            Some(w) => match w.jobs.try_send(WriteJob::File { tmp, path, bytes }) {
                Ok(()) => Ok(()),
                Err(_) => {
                    self.stats.stores_dropped += 1;
                    Ok(())
                }
            },
            None => write_file(&tmp, &path, &bytes).map_err(|e| CacheError::Io {
                path: tmp.clone(),
                message: e.to_string(),
            }),
        }
    }

    /// From now on, stores are written by a thread of their own (started at the first
    /// one): the caller is the event loop, which must never wait for the disk.
    pub fn write_in_background(&mut self) {
        self.background = true;
    }

    /// Waits until every file stored so far is written (tests; the profile's end).
    pub fn flush(&self) {
        if let Some(w) = &self.writer {
            let (done, wait) = std::sync::mpsc::sync_channel(1);
            if w.jobs.send(WriteJob::Barrier(done)).is_ok() {
                let _ = wait.recv();
            }
        }
    }
}

/// The profiler build: its version and the size and modification time of its
/// executable (another build derives tables with other code).
fn tool_identity() -> String {
    let exe = fs::metadata("/proc/self/exe").ok();
    format!(
        "sframe-user {} {} {}.{}",
        env!("CARGO_PKG_VERSION"),
        exe.as_ref().map_or(0, |m| m.size()),
        exe.as_ref().map_or(0, |m| m.mtime()),
        exe.as_ref().map_or(0, |m| m.mtime_nsec()),
    )
}

fn read_bounded(path: &Path) -> Result<Option<Vec<u8>>, CacheError> {
    let io = |e: std::io::Error| CacheError::Io {
        path: path.to_owned(),
        message: e.to_string(),
    };
    let file = match fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_NOCTTY)
        .open(path)
    {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(io(e)),
    };
    let meta = file.metadata().map_err(io)?;
    if !meta.is_file() || meta.len() > MAX_FILE_BYTES {
        return Err(CacheError::Corrupt {
            path: path.to_owned(),
            what: Corruption::NotARegularFile,
        });
    }
    let mut bytes = Vec::with_capacity(meta.len() as usize);
    use std::io::Read as _;
    file.take(MAX_FILE_BYTES)
        .read_to_end(&mut bytes)
        .map_err(io)?;
    Ok(Some(bytes))
}

/// Checks that `dir` and every directory above it can be changed only by the
/// profiler's user or root; repairs a directory of the profiler's user that others may
/// write.
pub(crate) fn check_owned(dir: &Path) -> Result<(), CacheError> {
    use std::os::unix::fs::PermissionsExt as _;
    let unsafe_dir = |path: &Path, why: String| CacheError::Unsafe {
        path: path.to_owned(),
        why,
    };
    // SAFETY: geteuid(2) cannot fail.
    let me = unsafe { libc::geteuid() };
    let meta = fs::symlink_metadata(dir).map_err(|e| unsafe_dir(dir, e.to_string()))?;
    if meta.file_type().is_symlink() || !meta.is_dir() {
        return Err(unsafe_dir(dir, "not a directory (or a symlink)".into()));
    }
    if meta.uid() != me {
        return Err(unsafe_dir(dir, format!("owned by uid {}", meta.uid())));
    }
    if meta.mode() & 0o022 != 0 {
        fs::set_permissions(dir, fs::Permissions::from_mode(0o755))
            .map_err(|e| unsafe_dir(dir, format!("writable by others, and chmod failed: {e}")))?;
        log::warn!(
            "table cache {}: was writable by others (mode {:o}); made 0755",
            dir.display(),
            meta.mode() & 0o7777
        );
    }
    let canonical = fs::canonicalize(dir).map_err(|e| unsafe_dir(dir, e.to_string()))?;
    for ancestor in canonical.ancestors().skip(1) {
        let m = fs::metadata(ancestor).map_err(|e| unsafe_dir(ancestor, e.to_string()))?;
        if m.uid() != me && m.uid() != 0 {
            return Err(unsafe_dir(
                dir,
                format!("{} is owned by uid {}", ancestor.display(), m.uid()),
            ));
        }
        let sticky = m.mode() & 0o1000 != 0;
        if m.mode() & 0o022 != 0 && !sticky {
            return Err(unsafe_dir(
                dir,
                format!("{} is writable by others", ancestor.display()),
            ));
        }
    }
    Ok(())
}

fn source_code(s: Source) -> (u8, u8) {
    match s {
        Source::SFrame { version } => (1, version),
        Source::EhFrame => (2, 0),
        Source::DebugFrame => (3, 0),
        Source::Synthesized => (4, 0),
    }
}

fn encode(tool: &str, key: &[u8], meta: CachedMeta, flat: &FlatObject, dict: &RuleDict) -> Vec<u8> {
    // Rules used by this object, by first use; rows refer to them by local index.
    let mut local: std::collections::HashMap<u16, u16> = std::collections::HashMap::new();
    let mut rules: Vec<RuleEntry> = Vec::new();
    let all = dict.rules();
    let rows: Vec<RowEntry> = flat
        .rows
        .iter()
        .map(|r| {
            let l = *local.entry(r.rule).or_insert_with(|| {
                rules.push(
                    all.get(usize::from(r.rule))
                        .copied()
                        .unwrap_or(RuleEntry::NONE),
                );
                (rules.len() - 1) as u16
            });
            RowEntry {
                addr_low: r.addr_low,
                rule: l,
            }
        })
        .collect();
    let mut out = Vec::with_capacity(64 + rules.len() * 12 + flat.pages.len() * 4 + rows.len() * 4);
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(&FORMAT.to_le_bytes());
    for s in [tool.as_bytes(), key] {
        out.extend_from_slice(&(s.len() as u16).to_le_bytes());
        out.extend_from_slice(s);
    }
    let (kind, version) = source_code(meta.source);
    out.extend_from_slice(&[kind, version]);
    for v in [
        meta.table_rows,
        flat.unencodable_rows,
        flat.unexpanded_pcmask,
        flat.base,
    ] {
        out.extend_from_slice(&v.to_le_bytes());
    }
    out.extend_from_slice(&flat.page_shift.to_le_bytes());
    out.extend_from_slice(&(rules.len() as u32).to_le_bytes());
    for r in &rules {
        out.extend_from_slice(&r.cfa_offset.to_le_bytes());
        out.extend_from_slice(&r.ra_offset.to_le_bytes());
        out.extend_from_slice(&r.fp_offset.to_le_bytes());
        out.extend_from_slice(&[r.cfa_base, r.ra_kind, r.fp_kind, r.flags]);
    }
    out.extend_from_slice(&(flat.pages.len() as u32).to_le_bytes());
    for p in &flat.pages {
        out.extend_from_slice(&p.to_le_bytes());
    }
    out.extend_from_slice(&(rows.len() as u32).to_le_bytes());
    for r in &rows {
        out.extend_from_slice(&r.addr_low.to_le_bytes());
        out.extend_from_slice(&r.rule.to_le_bytes());
    }
    let crc = crc32fast::hash(&out);
    out.extend_from_slice(&crc.to_le_bytes());
    out
}

/// A cursor over untrusted bytes.
struct Reader<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize, what: &'static str) -> Result<&'a [u8], Corruption> {
        let end = self.at.checked_add(n);
        let Some((s, end)) = end.and_then(|e| Some((self.bytes.get(self.at..e)?, e))) else {
            return Err(Corruption::Truncated { what, at: self.at });
        };
        self.at = end;
        Ok(s)
    }
    fn array<const N: usize>(&mut self, what: &'static str) -> Result<[u8; N], Corruption> {
        let at = self.at;
        <[u8; N]>::try_from(self.take(N, what)?).map_err(|_| Corruption::Truncated { what, at })
    }
    fn u8(&mut self, what: &'static str) -> Result<u8, Corruption> {
        self.array::<1>(what).map(|[b]| b)
    }
    fn u16(&mut self, what: &'static str) -> Result<u16, Corruption> {
        self.array(what).map(u16::from_le_bytes)
    }
    fn u32(&mut self, what: &'static str) -> Result<u32, Corruption> {
        self.array(what).map(u32::from_le_bytes)
    }
    fn u64(&mut self, what: &'static str) -> Result<u64, Corruption> {
        self.array(what).map(u64::from_le_bytes)
    }
    /// A count of `size`-byte items that must fit in the bytes left.
    fn count(&mut self, size: usize, what: &'static str) -> Result<usize, Corruption> {
        let n = self.u32(what)? as usize;
        if n.saturating_mul(size) > self.bytes.len() - self.at {
            return Err(Corruption::TooMany { what, n });
        }
        Ok(n)
    }
}

/// Why a cache file's contents were not used.
#[derive(Debug, PartialEq, Eq)]
enum Decoded {
    /// Written by another build of the profiler.
    OtherTool,
    Corrupt(Corruption),
}

impl From<Corruption> for Decoded {
    fn from(c: Corruption) -> Self {
        Decoded::Corrupt(c)
    }
}

fn decode(
    bytes: &[u8],
    tool: &str,
    key: &[u8],
    dict: &mut RuleDict,
) -> Result<(FlatObject, CachedMeta), Decoded> {
    let Some((body, crc)) = bytes.split_last_chunk::<4>() else {
        return Err(Corruption::NoChecksum.into());
    };
    if crc32fast::hash(body) != u32::from_le_bytes(*crc) {
        return Err(Corruption::Checksum.into());
    }
    let mut r = Reader { bytes: body, at: 0 };
    if r.take(4, "magic")? != MAGIC || r.u32("format")? != FORMAT {
        return Err(Corruption::Format.into());
    }
    let n = usize::from(r.u16("tool")?);
    if r.take(n, "tool")? != tool.as_bytes() {
        return Err(Decoded::OtherTool);
    }
    let n = usize::from(r.u16("digest")?);
    if r.take(n, "digest")? != key {
        return Err(Corruption::OtherDigest.into());
    }
    let source = match (r.u8("source")?, r.u8("source version")?) {
        (1, version) => Source::SFrame { version },
        (2, _) => Source::EhFrame,
        (3, _) => Source::DebugFrame,
        (4, _) => Source::Synthesized,
        (k, _) => return Err(Corruption::SourceKind(k).into()),
    };
    let table_rows = r.u64("table rows")?;
    let unencodable_rows = r.u64("unencodable rows")?;
    let unexpanded_pcmask = r.u64("unexpanded")?;
    let base = r.u64("base")?;
    let page_shift = r.u32("page shift")?;
    if !(MIN_PAGE_SHIFT..=MAX_PAGE_SHIFT).contains(&page_shift) {
        return Err(Corruption::PageShift(page_shift).into());
    }
    let n = r.count(12, "rules")?;
    let mut global = Vec::with_capacity(n);
    for _ in 0..n {
        let [
            c0,
            c1,
            c2,
            c3,
            r0,
            r1,
            f0,
            f1,
            cfa_base,
            ra_kind,
            fp_kind,
            flags,
        ] = r.array::<12>("rule")?;
        let rule = RuleEntry {
            cfa_offset: i32::from_le_bytes([c0, c1, c2, c3]),
            ra_offset: i16::from_le_bytes([r0, r1]),
            fp_offset: i16::from_le_bytes([f0, f1]),
            cfa_base,
            ra_kind,
            fp_kind,
            flags,
        };
        global.push(dict.intern(rule).map_err(Corruption::Rules)?);
    }
    let n = r.count(4, "pages")?;
    let mut pages = Vec::with_capacity(n);
    for _ in 0..n {
        pages.push(r.u32("page")?);
    }
    let n = r.count(4, "rows")?;
    let mut rows = Vec::with_capacity(n);
    for _ in 0..n {
        let addr_low = r.u16("row")?;
        let local = usize::from(r.u16("row")?);
        let rule = *global.get(local).ok_or(Corruption::RuleIndex {
            rule: local,
            rules: global.len(),
        })?;
        rows.push(RowEntry { addr_low, rule });
    }
    if r.at != body.len() {
        return Err(Corruption::Trailing(body.len() - r.at).into());
    }
    // The kernel side relies on pages pointing into the rows, in order.
    if pages.windows(2).any(|w| matches!(w, [a, b] if a > b))
        || pages.last().is_some_and(|&l| l as usize > rows.len())
    {
        return Err(Corruption::Pages.into());
    }
    Ok((
        FlatObject {
            base,
            page_shift,
            pages,
            rows,
            unencodable_rows,
            unexpanded_pcmask,
        },
        CachedMeta { source, table_rows },
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(dict: &mut RuleDict) -> FlatObject {
        let a = dict
            .intern(RuleEntry {
                cfa_offset: 16,
                ra_offset: -8,
                cfa_base: 1,
                ra_kind: 1,
                ..RuleEntry::NONE
            })
            .unwrap();
        let b = dict
            .intern(RuleEntry {
                cfa_offset: 8,
                ra_offset: -8,
                cfa_base: 1,
                ra_kind: 1,
                ..RuleEntry::NONE
            })
            .unwrap();
        FlatObject {
            base: 0x1000,
            page_shift: 12,
            pages: vec![0, 3],
            rows: vec![
                RowEntry {
                    addr_low: 0,
                    rule: b,
                },
                RowEntry {
                    addr_low: 4,
                    rule: a,
                },
                RowEntry {
                    addr_low: 40,
                    rule: 0,
                },
            ],
            unencodable_rows: 2,
            unexpanded_pcmask: 0,
        }
    }

    fn rules_of(flat: &FlatObject, dict: &RuleDict) -> Vec<(u16, RuleEntry)> {
        flat.rows
            .iter()
            .map(|r| (r.addr_low, dict.rules()[usize::from(r.rule)]))
            .collect()
    }

    #[test]
    fn round_trip_into_another_dictionary() {
        let mut d1 = RuleDict::default();
        let flat = sample(&mut d1);
        let meta = CachedMeta {
            source: Source::EhFrame,
            table_rows: 7,
        };
        let bytes = encode("t", b"\x01\x02", meta, &flat, &d1);
        let mut d2 = RuleDict::default();
        // A rule already in the new dictionary shifts the indices.
        d2.intern(RuleEntry {
            cfa_offset: 99,
            ..RuleEntry::NONE
        })
        .unwrap();
        let (back, m) = decode(&bytes, "t", b"\x01\x02", &mut d2).unwrap();
        assert_eq!(m, meta);
        assert_eq!(back.pages, flat.pages);
        assert_eq!(back.base, flat.base);
        assert_eq!(back.page_shift, flat.page_shift);
        assert_eq!(back.unencodable_rows, 2);
        assert_eq!(rules_of(&back, &d2), rules_of(&flat, &d1));
    }

    #[test]
    fn damaged_files_are_rejected() {
        let mut d = RuleDict::default();
        let flat = sample(&mut d);
        let meta = CachedMeta {
            source: Source::SFrame { version: 2 },
            table_rows: 3,
        };
        let bytes = encode("t", b"id", meta, &flat, &d);
        assert!(decode(&bytes, "t", b"id", &mut d).is_ok());
        assert_eq!(
            decode(&bytes, "u", b"id", &mut d).unwrap_err(),
            Decoded::OtherTool
        );
        assert!(decode(&bytes, "t", b"other", &mut d).is_err());
        // Every single-byte change and every truncation is caught.
        for i in 0..bytes.len() {
            let mut bad = bytes.clone();
            bad[i] ^= 0x40;
            assert!(decode(&bad, "t", b"id", &mut d).is_err(), "byte {i}");
            assert!(
                decode(&bytes[..i], "t", b"id", &mut d).is_err(),
                "length {i}"
            );
        }
    }

    #[test]
    fn huge_counts_with_a_valid_checksum_allocate_nothing() {
        let mut d = RuleDict::default();
        let mut body = Vec::new();
        body.extend_from_slice(MAGIC);
        body.extend_from_slice(&FORMAT.to_le_bytes());
        body.extend_from_slice(&1u16.to_le_bytes());
        body.push(b't');
        body.extend_from_slice(&0u16.to_le_bytes());
        body.extend_from_slice(&[2, 0]);
        body.extend_from_slice(&[0u8; 32]);
        body.extend_from_slice(&12u32.to_le_bytes());
        body.extend_from_slice(&u32::MAX.to_le_bytes());
        let crc = crc32fast::hash(&body);
        body.extend_from_slice(&crc.to_le_bytes());
        let err = decode(&body, "t", b"", &mut d).unwrap_err();
        assert_eq!(
            err,
            Decoded::Corrupt(Corruption::TooMany {
                what: "rules",
                n: u32::MAX as usize
            })
        );
    }

    #[test]
    fn a_page_shift_out_of_range_is_rejected() {
        let mut d = RuleDict::default();
        let meta = CachedMeta {
            source: Source::EhFrame,
            table_rows: 3,
        };
        for (shift, ok) in [(7, false), (8, true), (16, true), (17, false), (64, false)] {
            let flat = FlatObject {
                page_shift: shift,
                ..sample(&mut d)
            };
            let got = decode(&encode("t", b"id", meta, &flat, &d), "t", b"id", &mut d);
            match got {
                Ok((back, _)) => {
                    assert!(ok, "shift {shift}");
                    assert_eq!(back.page_shift, shift);
                }
                Err(e) => {
                    assert!(!ok, "shift {shift}: {e:?}");
                    assert_eq!(e, Decoded::Corrupt(Corruption::PageShift(shift)));
                }
            }
        }
    }

    #[test]
    fn store_then_load_through_files() {
        let dir = std::env::temp_dir().join(format!("sframe-cache-test-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        let mut cache = TableCache::open(&dir).unwrap();
        cache.write_in_background();
        let mut d = RuleDict::default();
        let flat = sample(&mut d);
        let meta = CachedMeta {
            source: Source::EhFrame,
            table_rows: 3,
        };
        assert!(cache.load(b"\xab\xcd", &mut d).is_none());
        cache.store(b"\xab\xcd", meta, &flat, &d).unwrap();
        cache.flush();
        let path = dir.join("abcd.sftab");
        assert_eq!(fs::metadata(&path).unwrap().mode() & 0o777, 0o644);
        let (back, _) = cache.load(b"\xab\xcd", &mut d).unwrap();
        assert_eq!(back.rows, flat.rows);
        // A second store replaces the file (no temporary left behind).
        cache.store(b"\xab\xcd", meta, &flat, &d).unwrap();
        cache.flush();
        let names: Vec<_> = fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names.len(), 1, "{names:?}");
        // A corrupted file is a counted rejection, not an error.
        let mut bytes = fs::read(&path).unwrap();
        let last = bytes.len() - 10;
        bytes[last] ^= 1;
        fs::write(&path, bytes).unwrap();
        assert!(cache.load(b"\xab\xcd", &mut d).is_none());
        assert_eq!(
            (
                cache.stats.hits,
                cache.stats.misses,
                cache.stats.rejected,
                cache.stats.stores
            ),
            (1, 1, 1, 2)
        );
        // ...and the bad file is gone.
        assert!(!path.exists());
        // A FIFO named like an entry is a rejection at once, never a wait for a writer.
        let c = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()).unwrap();
        // SAFETY: mkfifo(3) of a NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o644) }, 0);
        assert!(cache.load(b"\xab\xcd", &mut d).is_none());
        assert_eq!(cache.stats.rejected, 2);
        fs::remove_dir_all(&dir).unwrap();
    }

    /// Runs only as root (chown to another user); says so otherwise.
    fn as_root(test: &str) -> bool {
        // SAFETY: geteuid(2) cannot fail.
        let root = unsafe { libc::geteuid() } == 0;
        if !root {
            eprintln!("{test}: skipped, needs root to chown a directory to nobody");
        }
        root
    }

    #[test]
    fn directories_others_can_change_are_refused_or_repaired() {
        use std::os::unix::fs::PermissionsExt as _;
        if !as_root("directories_others_can_change_are_refused_or_repaired") {
            return;
        }
        let base = std::env::temp_dir().join(format!("sframe-cache-own-{}", std::process::id()));
        let _ = fs::remove_dir_all(&base);
        fs::create_dir_all(&base).unwrap();
        fs::set_permissions(&base, fs::Permissions::from_mode(0o755)).unwrap();
        // Owned by nobody: refused.
        let theirs = base.join("theirs");
        fs::create_dir(&theirs).unwrap();
        std::os::unix::fs::chown(&theirs, Some(65534), Some(65534)).unwrap();
        let err = TableCache::open(&theirs).err().expect("refused");
        assert!(err.to_string().contains("owned by uid 65534"), "{err}");
        // Inside a directory nobody owns: refused (it could be swapped under us).
        let below = theirs.join("cache");
        fs::create_dir(&below).unwrap();
        let err = TableCache::open(&below).err().expect("refused");
        assert!(err.to_string().contains("is owned by uid 65534"), "{err}");
        // Ours but mode 0777: repaired to 0755.
        let open = base.join("open");
        fs::create_dir(&open).unwrap();
        fs::set_permissions(&open, fs::Permissions::from_mode(0o777)).unwrap();
        TableCache::open(&open).expect("repaired");
        assert_eq!(fs::metadata(&open).unwrap().mode() & 0o7777, 0o755);
        // A symlink to a directory: refused.
        let link = base.join("link");
        std::os::unix::fs::symlink(&open, &link).unwrap();
        assert!(TableCache::open(&link).is_err());
        // Inside a world-writable directory without the sticky bit: refused.
        let shared = base.join("shared");
        fs::create_dir(&shared).unwrap();
        fs::set_permissions(&shared, fs::Permissions::from_mode(0o777)).unwrap();
        fs::create_dir(shared.join("cache")).unwrap();
        let err = TableCache::open(&shared.join("cache"))
            .err()
            .expect("refused");
        assert!(err.to_string().contains("writable by others"), "{err}");
        fs::remove_dir_all(&base).unwrap();
    }
}
