//! Profile outputs: a symbolized profile built once from the profiler's counts, and its
//! writers (`top`, `folded`, `svg` flame graph, gzip-compressed pprof `profile.proto`),
//! plus the Prometheus exporter ([`prometheus`]).
//!
//! The model keeps what every output needs and nothing kernel-specific: processes (pid,
//! comm), their distinct stacks (symbolized frames, outermost first) with sample counts
//! and walk outcome, the duration and the sampling frequency. Building it does
//! symbolization work proportional to distinct stacks, not samples.

#[cfg(feature = "profiler")]
mod build;
mod folded;
pub mod pprof;
pub mod prometheus;
mod svg;
mod top;

use std::{
    io::Write,
    path::{Path, PathBuf},
    time::{Duration, SystemTime},
};

use sframe_common::{Counter, WalkOutcome};

#[cfg(feature = "profiler")]
pub use self::build::snapshot_delta;
pub use self::{folded::folded, pprof::pprof_bytes, svg::svg, top::top};
use crate::symbolize::Frame;

/// Why an output could not be written.
#[derive(Debug, thiserror::Error)]
pub enum ExportError {
    #[error("writing the {format} output")]
    Write {
        format: &'static str,
        #[source]
        source: std::io::Error,
    },
    #[error("rendering the flame graph")]
    FlameGraph {
        #[source]
        source: std::io::Error,
    },
}

/// Output formats of the profiler.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Format {
    /// The hottest stacks, symbolized, with totals per walk outcome.
    Top,
    /// One line per distinct stack: `comm;outermost;...;leaf COUNT` (flame graph input).
    Folded,
    /// An interactive flame graph (SVG).
    Svg,
    /// gzip-compressed pprof `profile.proto` (`pprof`, Pyroscope, Parca).
    Pprof,
}

impl Format {
    pub fn name(self) -> &'static str {
        match self {
            Self::Top => "top",
            Self::Folded => "folded",
            Self::Svg => "svg",
            Self::Pprof => "pprof",
        }
    }

    /// File name extension for `--interval` files.
    pub fn extension(self) -> &'static str {
        match self {
            Self::Top => "txt",
            Self::Folded => "folded",
            Self::Svg => "svg",
            Self::Pprof => "pb.gz",
        }
    }

    /// Binary formats are not written to a terminal.
    pub fn is_binary(self) -> bool {
        matches!(self, Self::Pprof)
    }
}

/// What the first frame of a folded or flame-graph stack names.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum GroupBy {
    /// The process: its command name (`comm`).
    #[default]
    Process,
    /// The thread: `NAME-PID/TID` (the thread's own name, its process and thread ids).
    Thread,
    /// The cgroup v2 path (`[no cgroup]` when unknown).
    Cgroup,
    /// The container: the first 12 hex digits of its id, as `docker ps` shows it
    /// (`[host]` for processes in no recognized container).
    Container,
}

/// A symbolized profile.
#[derive(Clone, Debug, Default)]
pub struct Profile {
    /// How folded and flame-graph stacks are grouped.
    pub group_by: GroupBy,
    /// Processes by pid.
    pub processes: Vec<ProcessProfile>,
    /// When sampling started.
    pub start: Option<SystemTime>,
    pub duration: Duration,
    /// Sampling frequency (Hz); one sample stands for `1e9 / frequency` ns of CPU.
    pub frequency: u64,
    /// Samples per walk outcome (every sample of a target, including lost ones).
    pub outcomes: [u64; WalkOutcome::COUNT],
    pub counters: [u64; Counter::COUNT],
    /// An off-CPU profile: each stack's `count` is nanoseconds asleep, not samples.
    pub off_cpu: bool,
}

/// How an off-CPU stack's thread slept.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Sleep {
    /// Interruptible (state S: locks, sleeps, waits for input or a child).
    Interruptible,
    /// Uninterruptible (state D: most often disk I/O).
    Uninterruptible,
}

impl Sleep {
    /// The sleep of an off-CPU count key's `outcome` (`sframe_common::offcpu`).
    pub fn of_outcome(outcome: u32) -> Self {
        if outcome & sframe_common::offcpu::OFF_CPU_UNINTERRUPTIBLE != 0 {
            Self::Uninterruptible
        } else {
            Self::Interruptible
        }
    }

    /// The pseudo-frame added under the stack's leaf in folded stacks and flame graphs.
    pub fn frame(self) -> &'static str {
        match self {
            Self::Interruptible => "[sleep S]",
            Self::Uninterruptible => "[sleep D]",
        }
    }

    /// The `ps` state letter.
    pub fn letter(self) -> &'static str {
        match self {
            Self::Interruptible => "S",
            Self::Uninterruptible => "D",
        }
    }
}

/// One profiled process.
#[derive(Clone, Debug, Default)]
pub struct ProcessProfile {
    pub pid: u32,
    /// Its pid in its own PID namespace (a container), when different.
    pub ns_pid: Option<u32>,
    pub comm: String,
    /// Its cgroup v2 path (sanitized), when known.
    pub cgroup: Option<String>,
    /// The container its cgroup names (`crate::cgroup::container`), when it names one.
    pub container_id: Option<String>,
    /// Distinct stacks, most samples first.
    pub stacks: Vec<Stack>,
    /// Its samples walked in user space (taken before its tables were loaded).
    pub deferred: crate::profiler::DeferredWalks,
}

/// One distinct stack of one thread of a process, with its sample count.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Stack {
    /// The thread (0 when not known, e.g. in the metrics feed, which merges threads).
    pub tid: u32,
    /// Its name (`comm` of the thread), sanitized; empty when not known.
    pub thread: String,
    /// User frames, outermost first.
    pub user: Vec<Frame>,
    /// Kernel frames, outermost first (they are above the user frames).
    pub kernel: Vec<Frame>,
    pub count: u64,
    pub outcome: WalkOutcome,
    /// Off-CPU stacks: how the thread slept.
    pub sleep: Option<Sleep>,
}

impl Stack {
    /// Frame names outermost first: inlined functions as their own frames, unknown
    /// frames as `[object+0xOFFSET]`, kernel frames with a `_[k]` suffix.
    pub fn names(&self) -> Vec<String> {
        let mut names: Vec<String> = self.user.iter().flat_map(Frame::folded_names).collect();
        names.extend(
            self.kernel
                .iter()
                .map(|f| format!("{}_[k]", f.folded_name())),
        );
        if let Some(sleep) = self.sleep {
            names.push(sleep.frame().to_owned());
        }
        names
    }
}

impl Profile {
    /// Nanoseconds of CPU one sample stands for.
    pub fn period_ns(&self) -> u64 {
        1_000_000_000 / self.frequency.max(1)
    }

    /// Samples in stacks.
    pub fn total_samples(&self) -> u64 {
        self.processes
            .iter()
            .flat_map(|p| &p.stacks)
            .map(|s| s.count)
            .sum()
    }

    /// `comm (pid N), ... — S s`, for titles.
    pub fn title(&self) -> String {
        let targets: Vec<String> = self
            .processes
            .iter()
            .map(|p| format!("{} (pid {})", p.comm, p.pid))
            .collect();
        let targets = if targets.is_empty() {
            "no process".to_owned()
        } else {
            targets.join(", ")
        };
        format!("{targets}, {:.1} s", self.duration.as_secs_f64())
    }
}

/// Writes `profile` in `format` to `out`.
pub fn write(
    profile: &Profile,
    format: Format,
    top_stacks: usize,
    out: &mut dyn Write,
) -> Result<(), ExportError> {
    let io = |source| ExportError::Write {
        format: format.name(),
        source,
    };
    match format {
        Format::Top => out
            .write_all(top(profile, top_stacks).as_bytes())
            .map_err(io),
        Format::Folded => out.write_all(folded(profile).as_bytes()).map_err(io),
        Format::Svg => svg(profile, out),
        Format::Pprof => out.write_all(&pprof_bytes(profile)).map_err(io),
    }
}

/// `base` with a UTC timestamp before its extension: `out/flame.svg` →
/// `out/flame-20250102T030405Z.svg` (the file of one `--interval`).
pub fn timestamped_path(base: &Path, at: SystemTime) -> PathBuf {
    let stamp = utc_stamp(at);
    let name = base
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| "profile".to_owned());
    // Keep multi-part extensions (`.pb.gz`) after the stamp.
    let (stem, ext) = match name.find('.') {
        Some(0) | None => (name.as_str(), ""),
        Some(i) => name.split_at(i),
    };
    base.with_file_name(format!("{stem}-{stamp}{ext}"))
}

/// `YYYYMMDDTHHMMSSZ`.
fn utc_stamp(at: SystemTime) -> String {
    let secs = at
        .duration_since(SystemTime::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    let days = (secs / 86_400) as i64;
    let rem = secs % 86_400;
    // Civil date from days since 1970-01-01 (Howard Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}{month:02}{day:02}T{:02}{:02}{:02}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::symbolize::{InlinedFrame, SourceLocation};

    pub fn frame(name: Option<&str>, object: &str, offset: u64, line: Option<u32>) -> Frame {
        Frame {
            name: name.map(str::to_owned),
            object: object.to_owned(),
            file_offset: offset,
            build_id: (object == "prog").then(|| "abcdef0123".to_owned()),
            location: line.map(|l| SourceLocation {
                file: "/src/prog.c".to_owned(),
                line: Some(l),
            }),
            inlined: Vec::new(),
            reason: name.is_none().then(|| "stripped".to_owned()),
        }
    }

    /// Two processes; one stack with an inlined frame, an unknown frame and kernel
    /// frames.
    pub fn sample_profile() -> Profile {
        let mut main = frame(Some("main"), "prog", 0x1100, Some(10));
        main.inlined.push(InlinedFrame {
            name: "helper".to_owned(),
            location: Some(SourceLocation {
                file: "/src/helper.h".to_owned(),
                line: Some(3),
            }),
        });
        let start = frame(Some("_start"), "prog", 0x1000, None);
        let leaf = frame(Some("leaf;fn"), "prog", 0x1200, Some(20));
        let unknown = frame(None, "libc.so.6", 0x2a3f0, None);
        let sys = frame(
            Some("do_syscall_64"),
            crate::symbolize::KERNEL_OBJECT,
            0xffff_ffff_8100_0000,
            None,
        );
        Profile {
            group_by: GroupBy::Process,
            processes: vec![
                ProcessProfile {
                    deferred: Default::default(),
                    ns_pid: None,
                    cgroup: None,
                    container_id: None,
                    pid: 42,
                    comm: "my prog".to_owned(),
                    stacks: vec![
                        Stack {
                            tid: 0,
                            thread: String::new(),
                            user: vec![start.clone(), main.clone(), leaf],
                            kernel: vec![],
                            count: 7,
                            outcome: WalkOutcome::Complete,
                            sleep: None,
                        },
                        Stack {
                            tid: 0,
                            thread: String::new(),
                            user: vec![start, main, unknown],
                            kernel: vec![sys],
                            count: 3,
                            outcome: WalkOutcome::Complete,
                            sleep: None,
                        },
                    ],
                },
                ProcessProfile {
                    deferred: Default::default(),
                    ns_pid: None,
                    cgroup: None,
                    container_id: None,
                    pid: 43,
                    comm: "other".to_owned(),
                    stacks: vec![Stack {
                        tid: 0,
                        thread: String::new(),
                        user: vec![frame(None, "[anon]", 0x10, None)],
                        kernel: vec![],
                        count: 1,
                        outcome: WalkOutcome::NoMapping,
                        sleep: None,
                    }],
                },
            ],
            start: Some(SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000)),
            duration: Duration::from_millis(2500),
            frequency: 100,
            outcomes: [0; WalkOutcome::COUNT],
            counters: [0; Counter::COUNT],
            off_cpu: false,
        }
    }

    #[test]
    fn title_names_targets_and_duration() {
        assert_eq!(
            sample_profile().title(),
            "my prog (pid 42), other (pid 43), 2.5 s"
        );
        assert_eq!(Profile::default().title(), "no process, 0.0 s");
    }

    #[test]
    fn period_and_totals() {
        let p = sample_profile();
        assert_eq!(p.period_ns(), 10_000_000);
        assert_eq!(p.total_samples(), 11);
    }

    #[test]
    fn timestamped_paths() {
        let at = SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000);
        assert_eq!(utc_stamp(at), "20231114T221320Z");
        assert_eq!(utc_stamp(SystemTime::UNIX_EPOCH), "19700101T000000Z");
        assert_eq!(
            timestamped_path(Path::new("out/flame.svg"), at),
            Path::new("out/flame-20231114T221320Z.svg")
        );
        assert_eq!(
            timestamped_path(Path::new("p.pb.gz"), at),
            Path::new("p-20231114T221320Z.pb.gz")
        );
        assert_eq!(
            timestamped_path(Path::new("/tmp/prof"), at),
            Path::new("/tmp/prof-20231114T221320Z")
        );
        assert_eq!(
            timestamped_path(Path::new(".hidden"), at),
            Path::new(".hidden-20231114T221320Z")
        );
    }
}

/// Writes `bytes` to `path` without following a symlink planted there: into a new file
/// (`O_EXCL | O_NOFOLLOW`, mode 0600: profiles name processes and functions) in the same
/// directory, renamed over `path` (a symlink at `path` is replaced, its target left
/// alone). Readers never see a partial file.
pub fn write_file_safely(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    use std::{
        io::Write as _,
        os::unix::fs::OpenOptionsExt as _,
        sync::atomic::{AtomicU64, Ordering},
    };
    static SEQ: AtomicU64 = AtomicU64::new(0);
    let dir = path
        .parent()
        .filter(|d| !d.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    let name = path
        .file_name()
        .ok_or_else(|| std::io::Error::new(std::io::ErrorKind::InvalidInput, "no file name"))?;
    let tmp = dir.join(format!(
        ".{}.tmp-{}-{}",
        name.to_string_lossy(),
        std::process::id(),
        SEQ.fetch_add(1, Ordering::Relaxed)
    ));
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW)
        .open(&tmp)?;
    let result = file
        .write_all(bytes)
        .and_then(|()| file.sync_data())
        .and_then(|()| std::fs::rename(&tmp, path));
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    result
}

#[cfg(test)]
mod safe_write_tests {
    use std::os::unix::fs::{MetadataExt as _, symlink};

    #[test]
    fn a_planted_symlink_is_replaced_not_followed() {
        let dir = std::env::temp_dir().join(format!("sframe-safe-write-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let victim = dir.join("victim");
        std::fs::write(&victim, b"keep me").unwrap();
        let out = dir.join("profile.svg");
        symlink(&victim, &out).unwrap();
        super::write_file_safely(&out, b"<svg/>").unwrap();
        assert_eq!(std::fs::read(&victim).unwrap(), b"keep me");
        let meta = std::fs::symlink_metadata(&out).unwrap();
        assert!(meta.file_type().is_file());
        assert_eq!(meta.mode() & 0o777, 0o600);
        assert_eq!(std::fs::read(&out).unwrap(), b"<svg/>");
        // Overwriting an existing file works too, and leaves no temporary behind.
        super::write_file_safely(&out, b"<svg></svg>").unwrap();
        assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 2);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
