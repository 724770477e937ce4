//! The profiler: `sframe-user --pid PID ...`.

use std::{
    io::{IsTerminal as _, Write as _},
    net::SocketAddr,
    path::{Path, PathBuf},
    time::{Duration, Instant, SystemTime},
};

use anyhow::{Context as _, Result, bail};
use clap::Args;
use sframe_user::{
    export::{
        self, Format, Profile,
        prometheus::{self, Feed, Metrics, server},
        snapshot_delta, timestamped_path,
    },
    profiler::{Profiler, ProfilerConfig, SampleProgram, Snapshot, TargetInfo, TargetSpec},
    symbolize::Symbolizer,
};
use tokio::io::{Interest, unix::AsyncFd};

/// How long the end of a profile waits for tables its deferred samples need.
const DEFERRED_FLUSH: Duration = Duration::from_secs(10);

/// `--walker`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Walker {
    Auto,
    BpfLoop,
    Bounded,
}

#[derive(Args, Debug)]
pub struct ProfileArgs {
    /// Process to profile, all its threads and its children (repeatable). Without
    /// --pid, --comm or --cgroup the whole system is profiled.
    #[arg(long = "pid", value_name = "PID")]
    pub pids: Vec<u32>,
    /// Profile every process (the default when no target is named).
    #[arg(long)]
    pub all: bool,
    /// Profile processes with this command name, now or when they exec (repeatable).
    #[arg(long = "comm", value_name = "NAME")]
    pub comms: Vec<String>,
    /// Profile the processes of this cgroup and its sub-cgroups (a container, a systemd
    /// unit), v2 or v1: an absolute directory, or relative to /sys/fs/cgroup (repeatable).
    #[arg(long = "cgroup", value_name = "PATH")]
    pub cgroups: Vec<PathBuf>,
    /// Kernel memory for unwind tables (rows and page entries), e.g. 64M or 1G. Tables of
    /// objects no running process maps are evicted, least recently used first, when it
    /// is full.
    #[arg(long, value_name = "BYTES", default_value = "20M", value_parser = parse_bytes)]
    pub max_table_memory: u64,
    /// CPU budget of the profiler in percent of each CPU (its BPF programs plus its
    /// own user-space work); above it the sampling frequency is lowered, and raised back
    /// when there is room. 0 turns the governor off.
    #[arg(long, value_name = "PERCENT", default_value_t = 1.0)]
    pub max_overhead: f64,
    /// Directory where flattened unwind tables are cached by a digest of what they are
    /// derived from (not by build-id), so that a restart loads known objects without
    /// parsing them again. It must be changeable only by this user or root.
    #[arg(long, value_name = "DIR", default_value = "/var/cache/sframe-user")]
    pub cache_dir: PathBuf,
    /// Do not read or write the table cache.
    #[arg(long)]
    pub no_cache: bool,
    /// A debuginfod server (repeatable; http:// or https://) for the debug files of
    /// objects without line tables of their own, fetched by build-id in the background
    /// into CACHE_DIR/debuginfod. Default: the servers of DEBUGINFOD_URLS.
    #[arg(long = "debuginfod", value_name = "URL")]
    pub debuginfod: Vec<String>,
    /// Fetch no debug files (DEBUGINFOD_URLS is ignored).
    #[arg(long, conflicts_with = "debuginfod")]
    pub no_debuginfod: bool,
    /// Bytes of debug files kept in CACHE_DIR/debuginfod at most (the least recently
    /// fetched are removed beyond it).
    #[arg(long, value_name = "BYTES", default_value = "2G", value_parser = parse_bytes)]
    pub debuginfod_cache_bytes: u64,
    /// Once the BPF programs are loaded and attached, keep only the capabilities the
    /// profiler still needs (CAP_PERFMON, CAP_BPF, CAP_SYS_PTRACE, CAP_DAC_READ_SEARCH,
    /// CAP_CHECKPOINT_RESTORE, CAP_SYSLOG), drop the rest from the bounding set and set
    /// no_new_privs. Everything then runs on one thread.
    #[arg(long)]
    pub drop_privileges: bool,
    /// Processes with unwind tables in the kernel at once (8 KiB of kernel memory
    /// each); samples of processes beyond it are unwound in user space, at more cost.
    #[arg(long, value_name = "N", default_value_t = sframe_common::budget::MAX_PROCESSES,
          value_parser = clap::value_parser!(u32).range(1..=1 << 20))]
    pub max_processes: u32,
    /// Distinct user stacks the kernel holds between two collections (2 KiB each);
    /// samples beyond it are counted as lost (stack_map_full).
    #[arg(long, value_name = "N", default_value_t = sframe_common::budget::MAX_STACKS,
          value_parser = clap::value_parser!(u32).range(16..=1 << 22))]
    pub max_stacks: u32,
    /// Distinct (thread, stacks, outcome) keys the kernel counts between two
    /// collections; samples beyond it are counted as lost (count_map_full).
    #[arg(long, value_name = "N", default_value_t = sframe_common::budget::MAX_COUNTS,
          value_parser = clap::value_parser!(u32).range(16..=1 << 24))]
    pub max_counts: u32,
    /// Distinct (thread, stack, outcome) counts kept for the whole profile (its memory
    /// bound), a sixteenth of them per process, with 16 frame words of stacks per count
    /// on average; beyond it a process's new stacks are counted at its root
    /// (count_folded).
    #[arg(long, value_name = "N", default_value_t = 131_072,
          value_parser = clap::value_parser!(u64).range(16..=1 << 24))]
    pub max_profile_counts: u64,
    /// Exited processes whose samples and mappings are kept for the report; beyond it
    /// the oldest are forgotten (bounds memory under endless process churn), and
    /// earlier when the counts kept near `--max-profile-counts` (running processes'
    /// new stacks come first).
    #[arg(long, value_name = "N", default_value_t = 10_000)]
    pub keep_exited: usize,
    /// Stop after this many seconds (default: run until Ctrl-C).
    #[arg(long, value_name = "SECS")]
    pub duration: Option<f64>,
    /// Sampling frequency in Hz (cpu-clock, every CPU).
    #[arg(long, default_value_t = 99, value_parser = clap::value_parser!(u64).range(1..=10_000))]
    pub frequency: u64,
    /// Also profile where threads sleep: each sleep of a target thread of at least
    /// --off-cpu-min is charged, in nanoseconds, to the user stack it slept in (walked
    /// when its system call returns). The off-CPU profile goes to --off-cpu-output, in
    /// the --format of the on-CPU one (with --no-on-cpu, to --output).
    #[arg(long)]
    pub off_cpu: bool,
    /// Sleeps shorter than this are not walked (only counted): 1ms, 500us, 0.2s.
    #[arg(long, value_name = "DURATION", default_value = "1ms", value_parser = parse_duration)]
    pub off_cpu_min: Duration,
    /// Where the off-CPU profile is written.
    #[arg(long, value_name = "PATH", requires = "off_cpu")]
    pub off_cpu_output: Option<PathBuf>,
    /// With --off-cpu: do not sample on CPU.
    #[arg(long, requires = "off_cpu")]
    pub no_on_cpu: bool,
    /// How the kernel side iterates a walk: `bpf-loop` (the `bpf_loop` helper, Linux
    /// 5.17), `bounded` (bounded loops of global-function calls, every supported
    /// kernel), or `auto`: `bpf-loop` where the kernel has it.
    #[arg(long, value_enum, default_value_t = Walker::Auto)]
    pub walker: Walker,
    /// Output format.
    #[arg(long, value_enum, default_value_t = Format::Top)]
    pub format: Format,
    /// Write the report here instead of standard output.
    #[arg(long, value_name = "PATH")]
    pub output: Option<PathBuf>,
    /// Write one file per interval of this many seconds, named after `--output` with
    /// the interval's start time (UTC) before the extension (`flame-20250102T030405Z.svg`).
    #[arg(long, value_name = "SECS", requires = "output")]
    pub interval: Option<f64>,
    /// What the first frame of folded and SVG stacks names: the process (its command
    /// name) or the thread (`NAME-PID/TID`, the thread's own name).
    #[arg(long, value_enum, default_value_t = export::GroupBy::Process)]
    pub group_by: export::GroupBy,
    /// Stacks shown by `--format top`.
    #[arg(long, default_value_t = 10)]
    pub top: usize,
    /// Serve Prometheus metrics (OpenMetrics text) on GET http://ADDR/metrics, e.g.
    /// 127.0.0.1:9464, and the gzip pprof of the next N seconds (1 to 300, default 30;
    /// two at once) on GET http://ADDR/debug/pprof/profile?seconds=N, as Go's
    /// net/http/pprof serves it (Parca, Grafana Alloy, `pprof` pull from it). Nothing
    /// listens unless this is given.
    #[arg(long, value_name = "ADDR")]
    pub prometheus: Option<SocketAddr>,
    /// Stack series on the host at most (on CPU and off CPU together): the host's flame
    /// graph per program over the last 5 minutes, pruned to its most significant frame
    /// paths; the rest of each kept path is summed in its `;[other]` series.
    #[arg(long, value_name = "N", default_value_t = prometheus::tree::DEFAULT_MAX_SERIES as u64,
          value_parser = clap::value_parser!(u64).range(2..=1_000_000))]
    pub prometheus_max_series: u64,
    /// Bytes of the stack series' lines in a scrape at most (on and off CPU together):
    /// the series budget in bytes, which long stacks reach before --prometheus-max-series.
    #[arg(long, value_name = "BYTES", default_value = "480000", value_parser = parse_bytes)]
    pub prometheus_max_bytes: u64,
    /// Bytes of a label value at most (Mimir and Cortex refuse series with longer ones
    /// by default); longer stacks keep their outermost and innermost frames.
    #[arg(long, value_name = "BYTES", default_value_t = prometheus::tree::DEFAULT_MAX_LABEL_BYTES as u64,
          value_parser = clap::value_parser!(u64).range(prometheus::tree::MIN_LABEL_BYTES as u64..=1 << 20))]
    pub prometheus_max_label_bytes: u64,
    /// Leave C++ parameter lists out of stack labels (`f`, not `f(int, char**) const`):
    /// deep C++ stacks take about a quarter fewer bytes, so more paths fit the byte
    /// budget; an overload whose label equals another's is not kept.
    #[arg(long)]
    pub prometheus_short_names: bool,
    /// Share of the host's samples (percent) a frame path needs to get series of its own.
    #[arg(long, value_name = "PERCENT", default_value_t = 0.01)]
    pub prometheus_min_share: f64,
    /// Label stack series with the process id: every process its own series (only for
    /// hosts with few, long-lived processes).
    #[arg(long)]
    pub prometheus_pid_label: bool,
    /// Label every stack series with its process's cgroup (`cgroup`) or container
    /// (`container_id`, absent for processes in no recognized container): each value
    /// is a program of its own within the series budget.
    #[arg(long, value_enum, value_name = "LABEL")]
    pub prometheus_group: Option<prometheus::GroupLabel>,
    /// Send the metrics to this Prometheus remote-write endpoint (remote write 1.0:
    /// snappy-compressed protobuf over http://, e.g. a central Prometheus's
    /// http://HOST:9090/api/v1/write, Mimir's /api/v1/push), every
    /// --prometheus-remote-write-interval; retried with backoff from a bounded queue,
    /// never delaying sampling. Works with or without --prometheus.
    #[arg(long, value_name = "URL")]
    pub prometheus_remote_write: Option<String>,
    /// Seconds between two remote-write requests.
    #[arg(long, value_name = "SECS", default_value_t = 15,
          value_parser = clap::value_parser!(u64).range(1..=3600))]
    pub prometheus_remote_write_interval: u64,
    /// A header for every remote-write request, `Name: value` (repeatable), e.g.
    /// `X-Scope-OrgID: tenant` or `Authorization: Bearer TOKEN`.
    #[arg(
        long = "prometheus-remote-write-header",
        value_name = "HEADER",
        requires = "prometheus_remote_write"
    )]
    pub prometheus_remote_write_headers: Vec<String>,
    /// A label added to every remote-written series, `name=value` (repeatable); the
    /// defaults are job=sframe and instance=HOSTNAME (a scraper adds its own instead).
    #[arg(
        long = "prometheus-external-label",
        value_name = "NAME=VALUE",
        requires = "prometheus_remote_write"
    )]
    pub prometheus_external_labels: Vec<String>,
    /// Replaced by --prometheus-max-series (refused with a note).
    #[arg(long, hide = true, value_name = "K")]
    pub prometheus_top_k: Option<String>,
    /// Replaced by --prometheus-max-series (refused with a note).
    #[arg(long, hide = true, value_name = "N")]
    pub prometheus_group_limit: Option<String>,
    /// With a command: run it as this user (name or uid), with its groups. Default: the
    /// user who ran sudo (SUDO_UID, SUDO_GID), else the profiler's own user.
    #[arg(long, value_name = "USER", requires = "command")]
    pub run_as: Option<String>,
    /// A command to start and profile from its first instruction, with its children,
    /// until it and they have exited; `sframe-user` then exits with its status (128 +
    /// signal when it was killed; 127 when it cannot be found, 126 when it cannot be
    /// run). Ctrl-C and SIGTERM are passed on to it first.
    #[arg(last = true, value_name = "CMD")]
    pub command: Vec<String>,
}

/// The Prometheus side of a run: the metrics, served (`--prometheus`), remote-written
/// (`--prometheus-remote-write`) or both.
struct Exporter {
    metrics: Metrics,
    feed: Feed,
    exposition: server::Exposition,
    server: Option<tokio::task::JoinHandle<()>>,
    remote: Option<Remote>,
}

/// `--prometheus-remote-write`: the sender and when it was last given an exposition.
struct Remote {
    writer: prometheus::remote_write::RemoteWriter,
    every: Duration,
    last: Option<Instant>,
}

/// The remote-write configuration of `args`, if any.
fn remote_write_config(args: &ProfileArgs) -> Result<Option<prometheus::remote_write::Config>> {
    let Some(url) = &args.prometheus_remote_write else {
        return Ok(None);
    };
    let mut config = prometheus::remote_write::Config::new(url.clone());
    for h in &args.prometheus_remote_write_headers {
        let Some((name, value)) = h.split_once(':') else {
            bail!("--prometheus-remote-write-header {h:?} is not `Name: value`");
        };
        config
            .headers
            .push((name.trim().to_owned(), value.trim().to_owned()));
    }
    for l in &args.prometheus_external_labels {
        let Some((name, value)) = l.split_once('=') else {
            bail!("--prometheus-external-label {l:?} is not `name=value`");
        };
        config
            .external_labels
            .push((name.trim().to_owned(), value.to_owned()));
    }
    let has = |config: &prometheus::remote_write::Config, name: &str| {
        config.external_labels.iter().any(|(n, _)| n == name)
    };
    if !has(&config, "job") {
        config
            .external_labels
            .push(("job".to_owned(), "sframe".to_owned()));
    }
    if !has(&config, "instance") {
        let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
            .map(|h| h.trim().to_owned())
            .unwrap_or_default();
        if !host.is_empty() {
            config.external_labels.push(("instance".to_owned(), host));
        }
    }
    Ok(Some(config))
}

/// The debuginfod client of `args` (`--debuginfod`, else `DEBUGINFOD_URLS`), if any
/// server is named and `--no-debuginfod` is not given.
fn debuginfod_client(
    args: &ProfileArgs,
) -> Result<Option<std::sync::Arc<sframe_user::symbolize::debuginfod::Debuginfod>>> {
    use sframe_user::symbolize::debuginfod::{Config, Debuginfod};
    if args.no_debuginfod {
        return Ok(None);
    }
    let urls = if args.debuginfod.is_empty() {
        Config::urls_from_env()
    } else {
        args.debuginfod.clone()
    };
    if urls.is_empty() {
        return Ok(None);
    }
    let client = Debuginfod::start(Config {
        urls: urls.clone(),
        dir: args.cache_dir.join("debuginfod"),
        max_cache_bytes: args.debuginfod_cache_bytes,
    })
    .context("debuginfod")?;
    eprintln!(
        "sframe-user: debug files of objects without line tables from {}",
        urls.join(" ")
    );
    Ok(Some(client))
}

/// One step of the profiler's loop ([`Profiler::step`]).
fn step(profiler: &mut Profiler) {
    for pid in profiler.step() {
        log::debug!("profiling process {pid}");
    }
}

/// Asks debuginfod for the debug files of the objects of processes loaded or reloaded
/// since the last call (`seen`: the table generation of each process then): at every
/// tick, so that a short process's frames are named in the report if the fetch is done
/// by then. A set lookup per process, and per mapping of those that changed.
fn prefetch_debug_files(
    profiler: &Profiler,
    client: &sframe_user::symbolize::debuginfod::Debuginfod,
    seen: &mut std::collections::HashMap<u32, u64>,
) {
    let mut now = std::collections::HashMap::with_capacity(seen.len());
    for (pid, generation) in profiler.target_generations() {
        if seen.get(&pid) != Some(&generation)
            && let Some(target) = profiler.target(pid)
        {
            client.prefetch(pid, &target.maps);
        }
        now.insert(pid, generation);
    }
    *seen = now;
}

/// A profile asked for on the pull endpoint, answered once due.
struct PendingProfile {
    due: Instant,
    started: Instant,
    started_at: SystemTime,
    /// The counts when it was asked for.
    base: Snapshot,
    /// The processes it keeps.
    filter: server::ProfileFilter,
    reply: tokio::sync::oneshot::Sender<Result<Vec<u8>, String>>,
}

/// The `--interval` state: the counts at the start of the current interval.
struct Intervals {
    every: Duration,
    base: PathBuf,
    started: Instant,
    started_at: SystemTime,
    previous: Snapshot,
}

pub async fn run(args: ProfileArgs) -> Result<()> {
    // Handlers first: a Ctrl-C or SIGTERM while the programs load and the targets'
    // tables are built ends the profile with its report instead of killing the process
    // (`tokio::signal::ctrl_c()` would install its handler only when first polled).
    use tokio::signal::unix::{SignalKind, signal};
    // Before any file is mapped (object tables, blazesym): a file its owner truncates
    // while mapped reads as zeros instead of killing the profiler.
    sframe_user::mapped::install_sigbus_guard();
    let mut sigint = signal(SignalKind::interrupt())?;
    let mut sigterm = signal(SignalKind::terminate())?;
    if args.output.is_none() && args.format.is_binary() && std::io::stdout().is_terminal() {
        bail!(
            "--format {} is binary: give --output PATH or redirect standard output",
            args.format.name()
        );
    }
    if args.off_cpu && !args.no_on_cpu && args.off_cpu_output.is_none() {
        bail!("--off-cpu needs --off-cpu-output PATH for the off-CPU profile (or --no-on-cpu)");
    }
    if args.prometheus_top_k.is_some() || args.prometheus_group_limit.is_some() {
        bail!(
            "--prometheus-top-k and --prometheus-group-limit are gone: stack series are now \
             bounded per host by --prometheus-max-series (default {}), processes of one \
             program share them, and --prometheus-pid-label brings the pid label back \
             (README, Prometheus)",
            prometheus::tree::DEFAULT_MAX_SERIES
        );
    }
    if !(args.prometheus_min_share >= 0.0 && args.prometheus_min_share <= 100.0) {
        bail!("--prometheus-min-share must be a percentage between 0 and 100");
    }
    let interval = match args.interval {
        Some(s) if !(s >= 1.0 && s.is_finite()) => bail!("--interval must be at least 1 second"),
        Some(s) => Some(Duration::from_secs_f64(s)),
        None => None,
    };
    let mut targets = TargetSpec {
        pids: args.pids.clone(),
        all: args.all,
        comms: args.comms.clone(),
        cgroups: args.cgroups.clone(),
    };
    let command_mode = !args.command.is_empty();
    let identity = if command_mode {
        super::command::identity(args.run_as.as_deref())?
    } else {
        None
    };
    // Nothing named: the whole system (a command names itself).
    targets.all |= targets.names_nothing() && !command_mode;
    let config = ProfilerConfig {
        frequency: args.frequency,
        targets,
        max_table_memory: Some(args.max_table_memory),
        max_exited: args.keep_exited,
        max_kept_counts: usize::try_from(args.max_profile_counts).ok(),
        cache_dir: (!args.no_cache).then(|| args.cache_dir.clone()),
        map_sizes: sframe_user::bpf::MapSizes {
            processes: Some(args.max_processes),
            stacks: Some(args.max_stacks),
            counts: Some(args.max_counts),
            kernel_stacks: None,
        },
        program: match args.walker {
            Walker::Auto => SampleProgram::Profile,
            Walker::BpfLoop if !sframe_user::bpf::has_bpf_loop() => {
                bail!("--walker bpf-loop: the kernel has no bpf_loop helper (Linux 5.17)")
            }
            Walker::BpfLoop => SampleProgram::Profile,
            Walker::Bounded => SampleProgram::Bounded,
        },
        on_cpu: !args.no_on_cpu,
        off_cpu_min: args.off_cpu.then_some(args.off_cpu_min),
    };
    let whole_system = config.targets.all;
    let mut profiler = Profiler::start_with(config).context("starting the profiler")?;
    // The loop runs on this thread (current-thread runtime or not, events are handled
    // here): let it preempt the CPU-bound processes it must load tables for.
    sframe_user::privileges::raise_event_loop_priority();
    // Before any privilege drop: enabling bpf_stats needs CAP_SYS_ADMIN.
    let mut governor = (args.max_overhead > 0.0)
        .then(|| sframe_user::governor::Governor::new(args.max_overhead, args.frequency));
    if args.drop_privileges {
        sframe_user::privileges::drop_privileges().context("--drop-privileges")?;
        log::info!("capabilities dropped to what profiling still needs");
    }
    // Its worker threads start after the drop: capabilities are per thread.
    let debuginfod = debuginfod_client(&args)?;
    if whole_system {
        eprintln!(
            "sframe-user: profiling every process (name targets with --pid, --comm, --cgroup)"
        );
    }
    // The command, held before its exec until it is a target.
    let mut command = if command_mode {
        match super::command::start(&args.command, identity.as_ref(), |pid| {
            profiler.watch_before_exec(pid)
        }) {
            Ok(started) => Some(started.child),
            Err(not) => {
                eprintln!("sframe-user: error: {:#}", not.error);
                std::process::exit(not.status);
            }
        }
    } else {
        None
    };
    let mut command_status: Option<std::process::ExitStatus> = None;
    let mut forwarded = false;
    let remote_config = remote_write_config(&args)?;
    // Profile requests of the pull endpoint (`/debug/pprof/profile`), answered below.
    let mut profile_requests = None;
    let mut exporter = match (args.prometheus, remote_config) {
        (None, None) => None,
        (addr, remote_config) => {
            let exposition = server::Exposition::default();
            let server = match addr {
                Some(addr) => {
                    let listener = server::bind(addr).await?;
                    let local = listener.local_addr().unwrap_or(addr);
                    eprintln!("sframe-user: serving metrics on http://{local}/metrics");
                    eprintln!(
                        "sframe-user: serving profiles on http://{local}{}?seconds=N",
                        server::PPROF_PATH
                    );
                    let (tx, rx) = tokio::sync::mpsc::channel(server::MAX_PROFILES);
                    profile_requests = Some(rx);
                    Some(tokio::spawn(server::serve_all(
                        listener,
                        exposition.clone(),
                        server::Limits::default(),
                        Some(tx),
                    )))
                }
                None => None,
            };
            let remote = match remote_config {
                Some(config) => {
                    let url = config.url.clone();
                    let writer = prometheus::remote_write::RemoteWriter::spawn(config)
                        .context("--prometheus-remote-write")?;
                    eprintln!("sframe-user: remote-writing metrics to {url}");
                    Some(Remote {
                        writer,
                        every: Duration::from_secs(args.prometheus_remote_write_interval),
                        last: None,
                    })
                }
                None => None,
            };
            let metrics = Metrics::new(prometheus::SeriesConfig {
                tree: prometheus::tree::Config {
                    max_series: usize::try_from(args.prometheus_max_series).unwrap_or(usize::MAX),
                    max_bytes: usize::try_from(args.prometheus_max_bytes).unwrap_or(usize::MAX),
                    max_label_bytes: usize::try_from(args.prometheus_max_label_bytes)
                        .unwrap_or(usize::MAX),
                    min_share: args.prometheus_min_share / 100.0,
                    short_names: args.prometheus_short_names,
                    ..prometheus::tree::Config::default()
                },
                off_cpu: args.off_cpu,
                pid_label: args.prometheus_pid_label,
                group: args.prometheus_group,
                remote_write: remote.is_some(),
            });
            exposition.set(metrics.render());
            Some(Exporter {
                server,
                metrics,
                feed: Feed::with_debuginfod(debuginfod.clone())?,
                exposition,
                remote,
            })
        }
    };
    let events = match profiler.events_fd() {
        // SAFETY: a duplicate of the ring buffer's fd, owned by the AsyncFd; the ring
        // buffer map outlives the loop.
        Some(fd) => Some(unsafe {
            AsyncFd::register_with_interest(fd.try_clone_to_owned()?, Interest::READABLE)
        }?),
        None => None,
    };
    let deferred = match profiler.deferred_fd() {
        // SAFETY: as above, for the deferred-sample ring buffer.
        Some(fd) => Some(unsafe {
            AsyncFd::register_with_interest(fd.try_clone_to_owned()?, Interest::READABLE)
        }?),
        None => None,
    };
    // For the interval files and the final profile (the exporter names its stacks
    // on its own thread).
    let mut symbolizer = Symbolizer::new();
    symbolizer.set_debuginfod(debuginfod.clone());
    let started = Instant::now();
    let started_at = SystemTime::now();
    let mut intervals = interval.map(|every| Intervals {
        every,
        base: args.output.clone().unwrap_or_default(),
        started,
        started_at,
        previous: Snapshot::default(),
    });
    let deadline = args
        .duration
        .map(|s| started + Duration::from_secs_f64(s.max(0.0)));
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let until_deadline = async {
        match deadline {
            Some(d) => tokio::time::sleep_until(d.into()).await,
            None => std::future::pending().await,
        }
    };
    tokio::pin!(until_deadline);
    let mut exited_reported = 0;
    let mut profiles_due: Vec<PendingProfile> = Vec::new();
    let mut debuginfod_seen = std::collections::HashMap::new();
    loop {
        tokio::select! {
            request = async { profile_requests.as_mut().expect("guarded").recv().await }, if profile_requests.is_some() => {
                match request {
                    // The counts so far are the profile's base; it is answered at the
                    // first tick after it is due.
                    Some(request) => profiles_due.push(PendingProfile {
                        due: Instant::now() + Duration::from_secs(request.seconds),
                        started: Instant::now(),
                        started_at: SystemTime::now(),
                        base: profiler.collect(),
                        filter: request.filter,
                        reply: request.reply,
                    }),
                    None => profile_requests = None,
                }
                continue;
            }
            _ = sigint.recv() => {
                if forward(&mut command, &mut forwarded, libc::SIGINT) {
                    continue;
                }
                break;
            }
            _ = sigterm.recv() => {
                if forward(&mut command, &mut forwarded, libc::SIGTERM) {
                    continue;
                }
                break;
            }
            _ = &mut until_deadline => break,
            ready = async { events.as_ref().expect("guarded").readable().await }, if events.is_some() => {
                // Lifecycle events: exec, fork, exit, dlopen, misses. Handled at once, so
                // a new process's tables are loaded before its first samples.
                if let Ok(mut guard) = ready {
                    guard.clear_ready();
                }
                step(&mut profiler);
                continue;
            }
            ready = async { deferred.as_ref().expect("guarded").readable().await }, if deferred.is_some() => {
                // Samples that found no tables: unwound here once they are loaded.
                if let Ok(mut guard) = ready {
                    guard.clear_ready();
                }
                step(&mut profiler);
                continue;
            }
            () = tokio::time::sleep_until(profiler.wake_at().into()), if !profiler.has_pending() => {
                // A throttled reload (new mappings of a process reloaded just before), or
                // the periodic work.
                step(&mut profiler);
                continue;
            }
            _ = tokio::task::yield_now(), if profiler.has_pending() => {
                step(&mut profiler);
                continue;
            }
            _ = tick.tick() => {}
        }
        if let Some(g) = &mut governor {
            g.tick(&mut profiler);
        }
        step(&mut profiler);
        if let Some(client) = &debuginfod {
            prefetch_debug_files(&profiler, client, &mut debuginfod_seen);
        }
        let snap = profiler.collect();
        if !profiler.open_ended() {
            let exited = profiler.target_count() - profiler.alive_targets();
            if exited > exited_reported {
                exited_reported = exited;
                eprintln!("sframe-user: {exited} target(s) exited; their samples are kept");
            }
        }
        if let Some(e) = &mut exporter {
            if let Some(r) = &e.remote {
                e.metrics.set_remote_write(r.writer.stats());
            }
            e.feed
                .update(&mut e.metrics, Instant::now(), &profiler, &snap);
            let text = e.metrics.render();
            if let Some(r) = &mut e.remote
                && r.last.is_none_or(|t| t.elapsed() >= r.every)
            {
                r.last = Some(Instant::now());
                r.writer.push(text.clone(), unix_ms());
            }
            e.exposition.set(text);
        }
        if profiles_due.iter().any(|p| p.due <= Instant::now()) {
            let targets = profiler.targets();
            let now = Instant::now();
            let (due, later): (Vec<_>, Vec<_>) =
                profiles_due.into_iter().partition(|p| p.due <= now);
            profiles_due = later;
            for p in due {
                let delta = snapshot_delta(&snap, &p.base);
                let span = (p.started_at, p.started.elapsed());
                let mut profile = profile_of(
                    false,
                    &profiler,
                    &delta,
                    &targets,
                    &mut symbolizer,
                    span,
                    &args,
                );
                profile.processes.retain(|process| {
                    p.filter
                        .keeps(process.pid, &process.comm, process.container_id.as_deref())
                });
                let mut pprof = Vec::new();
                let made = export::write(&profile, export::Format::Pprof, args.top, &mut pprof)
                    .map(|()| pprof)
                    .map_err(|e| e.to_string());
                // The client may have gone.
                let _ = p.reply.send(made);
            }
        }
        if let Some(iv) = &mut intervals
            && iv.started.elapsed() >= iv.every
        {
            // Copied only when written (every target with its mappings).
            let targets = profiler.targets();
            write_interval(iv, &profiler, &snap, &targets, &mut symbolizer, &args)?;
        }
        if let Some(child) = &mut command
            && command_status.is_none()
        {
            command_status = child.try_wait().ok().flatten();
        }
        if !profiler.open_ended()
            && profiler.alive_targets() == 0
            && (command.is_none() || command_status.is_some())
        {
            if command.is_none() {
                eprintln!("sframe-user: every target has exited");
            }
            break;
        }
    }
    profiler.handle_events();
    // Samples of short processes may still wait for a table being built (a large
    // library seen first on a cold cache): their stacks are what the profile is for.
    profiler.flush_deferred(DEFERRED_FLUSH);
    // Table cache files still queued are written before the process ends (command mode
    // ends with `exit`, which runs no destructor).
    if let Some(cache) = profiler.store().cache() {
        cache.flush();
    }
    let snap = profiler.collect();
    let targets = profiler.targets();
    if let Some((ns, runs)) = profiler.program_stats()
        && runs > 0
    {
        // Known while bpf_stats is enabled (the governor enables it).
        eprintln!(
            "sframe-user: profile program: {runs} runs, {:.1} ms",
            ns as f64 / 1e6
        );
    }
    if log::log_enabled!(log::Level::Debug) {
        let nonzero: Vec<String> = sframe_common::Counter::ALL
            .iter()
            .filter(|c| snap.counters[**c as usize] != 0)
            .map(|c| format!("{}={}", c.name(), snap.counters[*c as usize]))
            .collect();
        log::debug!("counters: {}", nonzero.join(" "));
    }
    if let Some(e) = exporter.take()
        && let Some(server) = e.server
    {
        server.abort();
    }
    if let Some(child) = &mut command
        && command_status.is_none()
    {
        command_status = child.try_wait().ok().flatten();
    }
    if let Some(iv) = &mut intervals {
        let written = write_interval(iv, &profiler, &snap, &targets, &mut symbolizer, &args);
        return exit_as_command(written, command_status);
    }
    let span = (started_at, started.elapsed());
    if let Some(path) = &args.off_cpu_output {
        let profile = profile_of(
            true,
            &profiler,
            &snap,
            &targets,
            &mut symbolizer,
            span,
            &args,
        );
        write_file(path, &profile, &args)?;
    }
    let profile = profile_of(
        args.no_on_cpu,
        &profiler,
        &snap,
        &targets,
        &mut symbolizer,
        span,
        &args,
    );
    let written = match &args.output {
        Some(path) => write_file(path, &profile, &args),
        None => (|| {
            let mut out = std::io::stdout().lock();
            export::write(&profile, args.format, args.top, &mut out)?;
            out.flush()?;
            Ok(())
        })(),
    };
    exit_as_command(written, command_status)
}

/// Now, in milliseconds since the Unix epoch.
fn unix_ms() -> i64 {
    SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

/// In command mode, once the profile is written, ends with the command's exit status.
fn exit_as_command(
    written: Result<()>,
    command_status: Option<std::process::ExitStatus>,
) -> Result<()> {
    written?;
    if let Some(status) = command_status {
        std::process::exit(super::command::exit_code(status));
    }
    Ok(())
}

/// Passes a stop signal on to the command while it runs (the first time only: a second
/// one stops the profile); true when it was passed on.
fn forward(command: &mut Option<std::process::Child>, forwarded: &mut bool, sig: i32) -> bool {
    let Some(child) = command else {
        return false;
    };
    if *forwarded || !matches!(child.try_wait(), Ok(None)) {
        return false;
    }
    *forwarded = true;
    // SAFETY: kill(2) of our own child, not reaped yet (its pid is still ours).
    unsafe { libc::kill(child.id() as i32, sig) };
    true
}

/// Writes the samples of the interval that ends now to its own file.
fn write_interval(
    iv: &mut Intervals,
    profiler: &Profiler,
    snap: &Snapshot,
    targets: &[TargetInfo],
    symbolizer: &mut Symbolizer,
    args: &ProfileArgs,
) -> Result<()> {
    let delta = snapshot_delta(snap, &iv.previous);
    let span = (iv.started_at, iv.started.elapsed());
    if let Some(base) = &args.off_cpu_output {
        let profile = profile_of(true, profiler, &delta, targets, symbolizer, span, args);
        let path = timestamped_path(base, iv.started_at);
        write_file(&path, &profile, args)?;
        eprintln!("sframe-user: wrote {}", path.display());
    }
    let profile = profile_of(
        args.no_on_cpu,
        profiler,
        &delta,
        targets,
        symbolizer,
        span,
        args,
    );
    let path = timestamped_path(&iv.base, iv.started_at);
    write_file(&path, &profile, args)?;
    eprintln!("sframe-user: wrote {}", path.display());
    iv.previous = snap.clone();
    iv.started = Instant::now();
    iv.started_at = SystemTime::now();
    Ok(())
}

/// The off-CPU (`off_cpu`) or on-CPU profile of `snap` over `span` (its start and
/// length), grouped as `--group-by` asks.
fn profile_of(
    off_cpu: bool,
    profiler: &Profiler,
    snap: &Snapshot,
    targets: &[TargetInfo],
    symbolizer: &mut Symbolizer,
    (start, duration): (SystemTime, Duration),
    args: &ProfileArgs,
) -> Profile {
    let mut profile = if off_cpu {
        Profile::build_off_cpu(profiler, snap, targets, symbolizer, start, duration)
    } else {
        Profile::build(
            profiler,
            snap,
            targets,
            symbolizer,
            start,
            duration,
            args.frequency,
        )
    };
    profile.group_by = args.group_by;
    profile
}

fn write_file(path: &Path, profile: &Profile, args: &ProfileArgs) -> Result<()> {
    let mut buf = Vec::new();
    export::write(profile, args.format, args.top, &mut buf)?;
    export::write_file_safely(path, &buf).with_context(|| format!("writing {}", path.display()))
}

/// Parses a duration: a number with a unit, ns, us, ms or s (`1ms`, `0.5s`).
fn parse_duration(text: &str) -> Result<Duration, String> {
    let t = text.trim();
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (number, unit) = t.split_at(split);
    let n: f64 = number
        .parse()
        .map_err(|_| format!("not a duration: {text:?} (e.g. 1ms, 500us, 0.2s)"))?;
    let scale = match unit {
        "ns" => 1e-9,
        "us" | "µs" => 1e-6,
        "ms" => 1e-3,
        "s" => 1.0,
        _ => return Err(format!("unknown unit in {text:?} (use ns, us, ms or s)")),
    };
    Duration::try_from_secs_f64(n * scale).map_err(|_| format!("{text:?} is out of range"))
}

/// Parses a byte count with an optional K, M or G suffix (powers of 1024).
fn parse_bytes(text: &str) -> Result<u64, String> {
    let t = text.trim();
    let (digits, unit) = match t.char_indices().find(|(_, c)| !c.is_ascii_digit()) {
        Some((i, _)) => t.split_at(i),
        None => (t, ""),
    };
    let n: u64 = digits
        .parse()
        .map_err(|_| format!("not a byte count: {text:?}"))?;
    let shift = match unit.to_ascii_uppercase().trim_end_matches(['B', 'I']) {
        "" => 0,
        "K" => 10,
        "M" => 20,
        "G" => 30,
        _ => return Err(format!("unknown unit in {text:?} (use K, M or G)")),
    };
    n.checked_mul(1 << shift)
        .ok_or_else(|| format!("{text:?} is too large"))
}

#[cfg(test)]
mod tests {
    #[test]
    fn parses_byte_counts() {
        assert_eq!(
            super::parse_duration("1ms"),
            Ok(std::time::Duration::from_millis(1))
        );
        assert_eq!(
            super::parse_duration("500us"),
            Ok(std::time::Duration::from_micros(500))
        );
        assert_eq!(
            super::parse_duration("0.25s"),
            Ok(std::time::Duration::from_millis(250))
        );
        assert_eq!(super::parse_duration("0ns"), Ok(std::time::Duration::ZERO));
        assert!(super::parse_duration("5").is_err());
        assert!(super::parse_duration("1h").is_err());
        assert!(super::parse_duration("-1ms").is_err());
        assert_eq!(super::parse_bytes("20M"), Ok(20 << 20));
        assert_eq!(super::parse_bytes("1G"), Ok(1 << 30));
        assert_eq!(super::parse_bytes("512k"), Ok(512 << 10));
        assert_eq!(super::parse_bytes("4096"), Ok(4096));
        assert_eq!(super::parse_bytes("2MiB"), Ok(2 << 20));
        assert!(super::parse_bytes("x").is_err());
        assert!(super::parse_bytes("3T").is_err());
    }
}
