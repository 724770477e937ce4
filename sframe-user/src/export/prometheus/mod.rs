//! The Prometheus exporter: stack sample counts and unwinder health in the OpenMetrics
//! text format, served on `GET /metrics`.
//!
//! The profiler's loop feeds [`Metrics`] (about once a second) and renders the
//! exposition into a shared buffer; the HTTP server ([`server`]) only copies that
//! buffer out, so a slow or stuck scraper never holds anything the sampling side needs.

#[cfg(feature = "profiler")]
mod feed;
#[cfg(feature = "profiler")]
mod namer;
#[cfg(feature = "profiler")]
pub mod remote_write;
pub mod server;
pub mod text_format;
pub mod tree;

use std::{
    sync::{Arc, Mutex, MutexGuard, PoisonError, atomic::AtomicU64},
    time::Instant,
};

use prometheus_client::{
    collector::Collector,
    encoding::{
        DescriptorEncoder, EncodeLabel, EncodeLabelSet, LabelSetEncoder, NoLabelSet, text::encode,
    },
    metrics::{
        MetricType,
        counter::Counter,
        family::Family,
        gauge::Gauge,
        histogram::{Histogram, exponential_buckets},
    },
    registry::{Registry, Unit},
};
use sframe_common::{Counter as Event, WalkOutcome};

#[cfg(feature = "profiler")]
pub use self::feed::Feed;
pub use self::tree::{NO_FRAMES, OTHER, Program, SeriesRef, SeriesTree};

/// Maps hashed for every sample or update (stack names, count keys): a seeded fast
/// hash (foldhash; SipHash over stack labels was a tenth of the profiler's CPU on a
/// busy host, BENCHMARKS §6). Seeded per map, so keys a user shapes (symbol names)
/// cannot be made to collide ahead of time.
type FastMap<K, V> = std::collections::HashMap<K, V, foldhash::quality::RandomState>;
type FastSet<K> = std::collections::HashSet<K, foldhash::quality::RandomState>;

/// Suggested `--prometheus` address.
pub const DEFAULT_ADDR: &str = "127.0.0.1:9464";
/// The labels of one stack series, borrowed from its tree.
struct StackLabels<'a> {
    series: SeriesRef<'a>,
    /// `cgroup` or `container_id` with `--prometheus-group`.
    group: Option<GroupLabel>,
}

impl EncodeLabelSet for StackLabels<'_> {
    fn encode(&self, encoder: &mut LabelSetEncoder) -> Result<(), std::fmt::Error> {
        let s = &self.series;
        ("comm", s.comm).encode(encoder.encode_label())?;
        if let Some(pid) = s.pid {
            ("pid", pid).encode(encoder.encode_label())?;
        }
        ("stack", s.stack).encode(encoder.encode_label())?;
        if let Some((label, value)) = self.group.zip(s.group) {
            (label.key(), value).encode(encoder.encode_label())?;
        }
        Ok(())
    }
}

const STACKS_HELP: &str = "Samples per stack (folded, outermost first) of the host's flame graph per program over a sliding window, pruned to its significant nodes within the series budget: a stack ending in [other] sums the samples that went on into frames not kept, comm [other] the programs not kept";
const OFF_CPU_HELP: &str = "Time threads slept per stack (folded, outermost first, ending with [sleep S] or [sleep D]) of the host's off-CPU flame graph per program, with --off-cpu, pruned like sframe_stack_samples";

/// The stack trees, on CPU and off CPU, and the group label they are exported with.
#[derive(Debug)]
struct Windows {
    on_cpu: SeriesTree,
    /// Off CPU (`--off-cpu`): nanoseconds asleep per stack.
    off_cpu: SeriesTree,
    group: Option<GroupLabel>,
}

/// How stack series are exported: the budget and the labels.
#[derive(Clone, Debug, Default)]
pub struct SeriesConfig {
    /// The on-CPU tree's bounds; with `off_cpu`, the budget is split in half between
    /// the two trees.
    pub tree: tree::Config,
    /// Whether the off-CPU tree has series.
    pub off_cpu: bool,
    /// The opt-in `pid` label: every process its own program (its own series).
    pub pid_label: bool,
    /// The opt-in `cgroup` or `container_id` label.
    pub group: Option<GroupLabel>,
    /// Whether the remote-write sender's own metrics are registered.
    pub remote_write: bool,
}

const PROFILES: [&str; 2] = ["cpu", "off_cpu"];

/// A metric of the stack trees' own: name, help, type, and its value in a tree's figures.
type TreeMetric = (
    &'static str,
    &'static str,
    MetricType,
    fn(&tree::Figures) -> u64,
);

/// The stack series, encoded straight from the windows when the exposition is
/// rendered: no per-series label copies or hashing per update (a registered
/// `Family` rebuilt each second cost a tenth of the profiler's CPU on a busy host).
/// The mutex is only ever taken by the profiler's loop (update and render).
#[derive(Debug, Clone)]
struct StackSeries(Arc<Mutex<Windows>>);

impl StackSeries {
    fn lock(&self) -> MutexGuard<'_, Windows> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl Collector for StackSeries {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let w = self.lock();
        let group = w.group;
        {
            let mut metric = encoder.encode_descriptor(
                "sframe_stack_samples",
                STACKS_HELP,
                None,
                MetricType::Counter,
            )?;
            w.on_cpu.for_each_series(|series| {
                metric
                    .encode_family(&StackLabels { series, group })?
                    .encode_counter::<NoLabelSet, _, u64>(&series.value, None)
            })?;
        }
        if w.off_cpu.config().max_series > 0 {
            let mut metric = encoder.encode_descriptor(
                "sframe_off_cpu",
                OFF_CPU_HELP,
                Some(&Unit::Seconds),
                MetricType::Counter,
            )?;
            w.off_cpu.for_each_series(|series| {
                let seconds = series.value as f64 / 1e9;
                metric
                    .encode_family(&StackLabels { series, group })?
                    .encode_counter::<NoLabelSet, _, u64>(&seconds, None)
            })?;
        }
        let trees = [&w.on_cpu, &w.off_cpu];
        let figures = trees.map(SeriesTree::figures);
        let on = trees.map(|t| t.config().max_series > 0);
        let family = |f: fn(&tree::Figures) -> u64| {
            PROFILES
                .iter()
                .zip(&figures)
                .zip(on)
                .filter(|(_, on)| *on)
                .map(move |((profile, fig), _)| (*profile, f(fig)))
        };
        let metrics: [TreeMetric; 6] = [
            (
                "sframe_stack_series",
                "Stack series exported now (at most --prometheus-max-series on the host)",
                MetricType::Gauge,
                |f| f.series as u64,
            ),
            (
                "sframe_stack_series_created",
                "Stack series created since the start (one that leaves the kept set and returns is created again)",
                MetricType::Counter,
                |f| f.created,
            ),
            (
                "sframe_stack_tree_nodes",
                "Frame-path nodes of the stack tree in memory (the samples of the window)",
                MetricType::Gauge,
                |f| f.nodes as u64,
            ),
            (
                "sframe_stack_tree_kept_nodes",
                "Frame-path nodes with series: their totals are exact",
                MetricType::Gauge,
                |f| f.kept as u64,
            ),
            (
                "sframe_stack_paths_cut",
                "Samples (off CPU: nanoseconds) whose frame path was cut because the stack tree was full, counted in the remainder of the node where it was cut",
                MetricType::Counter,
                |f| f.cut,
            ),
            (
                "sframe_stack_series_over_budget",
                "Samples (off CPU: nanoseconds) counted in an ancestor's remainder because their series did not exist and the budget left no room to create it",
                MetricType::Counter,
                |f| f.over_budget,
            ),
        ];
        for (name, help, kind, value) in metrics {
            let mut metric = encoder.encode_descriptor(name, help, None, kind)?;
            for (profile, v) in family(value) {
                let labels = [("profile", profile)];
                let mut m = metric.encode_family(&labels)?;
                match kind {
                    MetricType::Counter => m.encode_counter::<NoLabelSet, _, u64>(&v, None)?,
                    _ => m.encode_gauge(&v)?,
                }
            }
        }
        Ok(())
    }
}

/// The one per-process label `--prometheus-group` adds to the stack series.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum GroupLabel {
    /// `cgroup`: the process's cgroup v2 path.
    Cgroup,
    /// `container_id`: the full id of the container its cgroup names (no label for
    /// processes in no recognized container).
    Container,
}

impl GroupLabel {
    /// The label key.
    pub fn key(self) -> &'static str {
        match self {
            Self::Cgroup => "cgroup",
            Self::Container => "container_id",
        }
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct OutcomeLabels {
    outcome: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ResultLabels {
    result: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct SourceLabels {
    source: &'static str,
}

/// Where an object's table came from, as the `source` label of
/// `sframe_objects_by_source` names it (indexed like [`Health::objects_by_source`], by
/// [`crate::objects::source_index`]).
pub const TABLE_SOURCES: [&str; 4] = ["sframe", "eh_frame", "debug_frame", "plt_only"];

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct EventLabels {
    event: &'static str,
}

/// Unwinder and profiler state, as absolute values (counters are cumulative).
#[derive(Clone, Debug, Default)]
pub struct Health {
    pub outcomes: [u64; WalkOutcome::COUNT],
    pub counters: [u64; Event::COUNT],
    /// Objects with a table in the kernel, and objects whose table failed.
    pub objects_loaded: u64,
    pub objects_failed: u64,
    /// Loaded objects by the source of their table ([`TABLE_SOURCES`]).
    pub objects_by_source: [u64; 4],
    pub rows_in_use: u64,
    pub row_capacity: u64,
    /// Kernel table memory in use (rows, pages, objects, rules).
    pub table_bytes: u64,
    /// `profile` program run time (ns) and run count (`kernel.bpf_stats_enabled`).
    pub bpf_program: Option<(u64, u64)>,
    pub bpf_stats_enabled: Option<bool>,
    /// Cumulative process-lifecycle and table events (name, count).
    pub fleet: Vec<(&'static str, u64)>,
    /// Processes being profiled now.
    pub processes: u64,
    /// Sampling frequency now (Hz; the overhead governor may lower it).
    pub frequency: u64,
    /// CPU seconds spent loading tables so far (all threads).
    pub load_cpu: f64,
    /// User-space CPU seconds spent collecting samples so far.
    pub collect_cpu: f64,
    /// Seconds lifecycle events waited for the event loop, summed, and the longest.
    pub event_lag: f64,
    pub event_lag_max: f64,
    /// Stacks whose samples wait for the naming thread, and samples (or off-CPU
    /// nanoseconds) dropped because too many did.
    pub naming_waiting: u64,
    pub naming_dropped: u64,
    /// Heap bytes the naming thread's symbolizer keeps, and the times it dropped its
    /// state for being over a bound.
    pub naming_state_bytes: u64,
    pub naming_evictions: u64,
}

/// The registry and the aggregation behind it.
pub struct Metrics {
    registry: Registry,
    /// The stack windows (also registered: encoded from there).
    stacks: StackSeries,
    outcomes: Family<OutcomeLabels, Counter>,
    events: Family<EventLabels, Counter>,
    frames: Histogram,
    objects_loaded: Gauge,
    objects_failed: Gauge,
    objects_by_source: Family<SourceLabels, Gauge>,
    rows_in_use: Gauge,
    row_capacity: Gauge,
    table_bytes: Gauge,
    bpf_run_time: Counter<f64, AtomicU64>,
    bpf_run_count: Counter,
    bpf_stats_enabled: Gauge,
    cpu: Counter<f64, AtomicU64>,
    load_cpu: Counter<f64, AtomicU64>,
    collect_cpu: Counter<f64, AtomicU64>,
    rss: Gauge,
    fleet: Family<EventLabels, Counter>,
    event_lag: Counter<f64, AtomicU64>,
    event_lag_max: Gauge<f64, AtomicU64>,
    naming_waiting: Gauge,
    naming_dropped: Counter,
    naming_state: Gauge,
    naming_evictions: Counter,
    processes: Gauge,
    frequency: Gauge,
    config: SeriesConfig,
    remote_write: Family<ResultLabels, Counter>,
    remote_write_samples: Counter,
    remote_write_queued: Gauge,
    remote_write_last: Gauge,
    last_remote: remote_write::Stats,
    /// Last absolute values, to turn them into counter increments.
    last: Health,
    last_cpu: f64,
    /// Length of the last exposition: the next is written into one allocation of
    /// about that size (one string of megabytes with thousands of stack series, which
    /// grown by doubling left the heap with a copy of each size every second).
    last_render: std::sync::atomic::AtomicUsize,
}

impl Metrics {
    pub fn new(config: SeriesConfig) -> Self {
        let mut registry = Registry::default();
        let mut on_cpu = config.tree.clone();
        let mut off_cpu = config.tree.clone();
        if config.off_cpu {
            off_cpu.max_series = on_cpu.max_series / 2;
            on_cpu.max_series -= off_cpu.max_series;
            off_cpu.max_bytes = on_cpu.max_bytes / 2;
            on_cpu.max_bytes -= off_cpu.max_bytes;
        } else {
            off_cpu.max_series = 0;
            off_cpu.max_bytes = 0;
        }
        let stacks = StackSeries(Arc::new(Mutex::new(Windows {
            on_cpu: SeriesTree::new(on_cpu),
            off_cpu: SeriesTree::new(off_cpu),
            group: config.group,
        })));
        registry.register_collector(Box::new(stacks.clone()));
        let outcomes = Family::<OutcomeLabels, Counter>::default();
        registry.register(
            "sframe_walk_outcomes",
            "Samples of target processes per stack walk outcome",
            outcomes.clone(),
        );
        let events = Family::<EventLabels, Counter>::default();
        registry.register(
            "sframe_events",
            "Events counted by the unwinder",
            events.clone(),
        );
        let frames = Histogram::new(exponential_buckets(1.0, 2.0, 9));
        registry.register(
            "sframe_stack_frames",
            "User frames per sampled stack",
            frames.clone(),
        );
        let gauge = |registry: &mut Registry, name: &str, help: &str| {
            let g = Gauge::default();
            registry.register(name, help, g.clone());
            g
        };
        let objects_loaded = gauge(
            &mut registry,
            "sframe_objects_loaded",
            "Objects with unwind tables in the kernel",
        );
        let objects_failed = gauge(
            &mut registry,
            "sframe_objects_failed",
            "Objects whose table could not be built or loaded",
        );
        let objects_by_source = Family::<SourceLabels, Gauge>::default();
        registry.register(
            "sframe_objects_by_source",
            "Objects with unwind tables in the kernel, by where the table came from: their .sframe, rows derived from .eh_frame or .debug_frame, or synthesized PLT rows only",
            objects_by_source.clone(),
        );
        let rows_in_use = gauge(
            &mut registry,
            "sframe_table_rows",
            "Unwind rows in the kernel tables",
        );
        let row_capacity = gauge(
            &mut registry,
            "sframe_table_rows_capacity",
            "Capacity of the kernel row table",
        );
        let table_bytes = Gauge::default();
        registry.register_with_unit(
            "sframe_table",
            "Kernel unwind table memory in use",
            Unit::Bytes,
            table_bytes.clone(),
        );
        let bpf_run_time = Counter::<f64, AtomicU64>::default();
        registry.register_with_unit(
            "sframe_bpf_run_time",
            "Run time of the profile BPF program (needs kernel.bpf_stats_enabled=1)",
            Unit::Seconds,
            bpf_run_time.clone(),
        );
        let bpf_run_count = Counter::default();
        registry.register(
            "sframe_bpf_runs",
            "Runs of the profile BPF program (needs kernel.bpf_stats_enabled=1)",
            bpf_run_count.clone(),
        );
        let bpf_stats_enabled = gauge(
            &mut registry,
            "sframe_bpf_stats_enabled",
            "Whether kernel.bpf_stats_enabled is 1 (-1: unknown)",
        );
        let cpu = Counter::<f64, AtomicU64>::default();
        registry.register_with_unit(
            "sframe_process_cpu",
            "CPU time of the profiler itself (user + system)",
            Unit::Seconds,
            cpu.clone(),
        );
        let load_cpu = Counter::<f64, AtomicU64>::default();
        registry.register_with_unit(
            "sframe_table_load_cpu",
            "CPU time the profiler spent loading unwind tables (maps, files, derivation, kernel copies), part of sframe_process_cpu; the overhead governor budgets the rest",
            Unit::Seconds,
            load_cpu.clone(),
        );
        let collect_cpu = Counter::<f64, AtomicU64>::default();
        registry.register_with_unit(
            "sframe_collection_cpu",
            "CPU time the profiler spent collecting samples (kernel maps read and emptied, deferred samples unwound), part of sframe_process_cpu; with sframe_bpf_run_time, what the overhead governor budgets",
            Unit::Seconds,
            collect_cpu.clone(),
        );
        let rss = Gauge::default();
        registry.register_with_unit(
            "sframe_process_resident_memory",
            "Resident memory of the profiler itself",
            Unit::Bytes,
            rss.clone(),
        );
        let fleet = Family::<EventLabels, Counter>::default();
        registry.register(
            "sframe_fleet_events",
            "Process lifecycle events (exec, exit, fork, mmap, miss), process table loads and failures, object table loads, evictions and loads refused for lack of room, mapped files found rewritten, processes refused by a full process map",
            fleet.clone(),
        );
        let event_lag = Counter::<f64, AtomicU64>::default();
        registry.register_with_unit(
            "sframe_event_lag",
            "Time process lifecycle events waited between the kernel sending them and the event loop handling them, summed (divided by the increase of sframe_fleet_events_total for exec, exit, fork, mmap and miss: the mean wait); a busy host's loop falling behind shows here first",
            Unit::Seconds,
            event_lag.clone(),
        );
        let event_lag_max = Gauge::<f64, AtomicU64>::default();
        registry.register_with_unit(
            "sframe_event_lag_max",
            "Longest time a process lifecycle event waited for the event loop since the start",
            Unit::Seconds,
            event_lag_max.clone(),
        );
        let naming_waiting = gauge(
            &mut registry,
            "sframe_stacks_waiting_for_names",
            "New stacks whose samples wait for the naming thread (symbolization off the event loop) before they are exported",
        );
        let naming_dropped = Counter::default();
        registry.register(
            "sframe_unnamed_samples_dropped",
            "Samples (off CPU: nanoseconds asleep) of new stacks not exported: too many stacks (or processes' batches) were waiting for names, or the profiler had forgotten their process (exited) before they were named",
            naming_dropped.clone(),
        );
        let naming_state = Gauge::default();
        registry.register_with_unit(
            "sframe_symbolizer_state",
            "Heap the naming thread's symbolizer keeps (parsed symbol tables, decompressed debug information, kallsyms, cached frames); over its bound it drops the least recently used objects",
            Unit::Bytes,
            naming_state.clone(),
        );
        let naming_evictions = Counter::default();
        registry.register(
            "sframe_symbolizer_evictions",
            "Objects the naming thread's symbolizer dropped with their parsed state and frames, least recently used first, to stay within its bounds (objects, frames or bytes; the kernel's symbols and the vDSO's count as one); one used again is parsed again",
            naming_evictions.clone(),
        );
        let processes = gauge(
            &mut registry,
            "sframe_processes",
            "Processes being profiled now",
        );
        let frequency = gauge(
            &mut registry,
            "sframe_sampling_frequency_hz",
            "Sampling frequency per CPU now (the overhead governor lowers it under load)",
        );
        let remote_write = Family::<ResultLabels, Counter>::default();
        let remote_write_samples = Counter::default();
        let remote_write_queued = Gauge::default();
        let remote_write_last = Gauge::default();
        if config.remote_write {
            registry.register(
                "sframe_remote_write_requests",
                "Remote-write requests by result: sent (taken), failed (attempts without a 2xx), retried, rejected (refused for good, 4xx), dropped (queue full, never sent)",
                remote_write.clone(),
            );
            registry.register(
                "sframe_remote_write_samples",
                "Samples in the remote-write requests the endpoint took",
                remote_write_samples.clone(),
            );
            registry.register(
                "sframe_remote_write_queued",
                "Expositions waiting to be remote-written",
                remote_write_queued.clone(),
            );
            registry.register_with_unit(
                "sframe_remote_write_last_success_timestamp",
                "When the endpoint last took a request (Unix time; 0: never)",
                Unit::Seconds,
                remote_write_last.clone(),
            );
            for result in ["sent", "failed", "retried", "rejected", "dropped"] {
                let _ = remote_write.get_or_create(&ResultLabels { result });
            }
        }
        for o in WalkOutcome::ALL {
            let _ = outcomes.get_or_create(&OutcomeLabels { outcome: o.name() });
        }
        for e in Event::ALL {
            let _ = events.get_or_create(&EventLabels { event: e.name() });
        }
        Self {
            registry,
            stacks,
            outcomes,
            events,
            frames,
            objects_loaded,
            objects_failed,
            objects_by_source,
            rows_in_use,
            row_capacity,
            table_bytes,
            bpf_run_time,
            bpf_run_count,
            bpf_stats_enabled,
            cpu,
            load_cpu,
            collect_cpu,
            rss,
            fleet,
            event_lag,
            event_lag_max,
            naming_waiting,
            naming_dropped,
            naming_state,
            naming_evictions,
            processes,
            frequency,
            config,
            remote_write,
            remote_write_samples,
            remote_write_queued,
            remote_write_last,
            last_remote: remote_write::Stats::default(),
            last: Health::default(),
            last_cpu: 0.0,
            last_render: std::sync::atomic::AtomicUsize::new(0),
        }
    }

    /// The remote-write sender's figures now (cumulative).
    pub fn set_remote_write(&mut self, stats: remote_write::Stats) {
        let last = self.last_remote;
        for (result, now, before) in [
            ("sent", stats.requests_sent, last.requests_sent),
            ("failed", stats.requests_failed, last.requests_failed),
            ("retried", stats.requests_retried, last.requests_retried),
            ("rejected", stats.requests_rejected, last.requests_rejected),
            (
                "dropped",
                stats.requests_dropped_queue_full,
                last.requests_dropped_queue_full,
            ),
        ] {
            self.remote_write
                .get_or_create(&ResultLabels { result })
                .inc_by(now.saturating_sub(before));
        }
        self.remote_write_samples
            .inc_by(stats.samples_sent.saturating_sub(last.samples_sent));
        self.remote_write_queued
            .set(i64::try_from(stats.queued).unwrap_or(i64::MAX));
        self.remote_write_last
            .set(i64::try_from(stats.last_success_unix_ms / 1000).unwrap_or(i64::MAX));
        self.last_remote = stats;
    }

    /// The group label, if any.
    pub fn group(&self) -> Option<GroupLabel> {
        self.config.group
    }

    /// The tree key of process `pid`'s samples: its program.
    fn program(&self, pid: u32, comm: &str, group: Option<&str>) -> Program {
        let max = self.config.tree.max_label_bytes;
        Program {
            comm: Arc::from(tree::bounded_value(comm, max)),
            pid: self.config.pid_label.then_some(pid),
            group: self
                .config
                .group
                .and(group)
                .map(|g| Arc::from(tree::bounded_value(g, max))),
        }
    }

    /// Records `delta` new samples of `stack` (folded, outermost first) with
    /// `frames` user frames, in process `pid` of group `group` (its value of the
    /// [`GroupLabel`], when grouping and known). Applied at the next [`Self::update`].
    pub fn record(
        &mut self,
        pid: u32,
        comm: &str,
        group: Option<&str>,
        stack: impl Into<Arc<str>>,
        frames: usize,
        delta: u64,
    ) {
        let program = self.program(pid, comm, group);
        self.stacks.lock().on_cpu.record(program, stack, delta);
        // Bounded: the samples of one update interval.
        for _ in 0..delta.min(100_000) {
            self.frames.observe(frames as f64);
        }
    }

    /// Records `ns` nanoseconds asleep in `stack` (folded, outermost first) of process
    /// `pid` (off CPU). Applied at the next [`Self::update`].
    pub fn record_off_cpu(
        &mut self,
        pid: u32,
        comm: &str,
        group: Option<&str>,
        stack: impl Into<Arc<str>>,
        ns: u64,
    ) {
        if !self.config.off_cpu {
            return;
        }
        let program = self.program(pid, comm, group);
        self.stacks.lock().off_cpu.record(program, stack, ns);
    }

    /// Applies what was recorded and the new health values.
    pub fn update(&mut self, now: Instant, health: &Health) {
        {
            let mut w = self.stacks.lock();
            w.on_cpu.update(now);
            w.off_cpu.update(now);
        }
        let at = |values: &[u64], i: usize| values.get(i).copied().unwrap_or(0);
        for o in WalkOutcome::ALL {
            let i = o as usize;
            let delta = at(&health.outcomes, i).saturating_sub(at(&self.last.outcomes, i));
            self.outcomes
                .get_or_create(&OutcomeLabels { outcome: o.name() })
                .inc_by(delta);
        }
        for e in Event::ALL {
            let i = e as usize;
            let delta = at(&health.counters, i).saturating_sub(at(&self.last.counters, i));
            self.events
                .get_or_create(&EventLabels { event: e.name() })
                .inc_by(delta);
        }
        let as_i64 = |v: u64| i64::try_from(v).unwrap_or(i64::MAX);
        self.objects_loaded.set(as_i64(health.objects_loaded));
        self.objects_failed.set(as_i64(health.objects_failed));
        for (source, n) in TABLE_SOURCES.iter().zip(health.objects_by_source) {
            self.objects_by_source
                .get_or_create(&SourceLabels { source })
                .set(as_i64(n));
        }
        self.rows_in_use.set(as_i64(health.rows_in_use));
        self.row_capacity.set(as_i64(health.row_capacity));
        self.table_bytes.set(as_i64(health.table_bytes));
        if let Some((ns, runs)) = health.bpf_program {
            let (last_ns, last_runs) = self.last.bpf_program.unwrap_or((0, 0));
            self.bpf_run_time
                .inc_by(ns.saturating_sub(last_ns) as f64 / 1e9);
            self.bpf_run_count.inc_by(runs.saturating_sub(last_runs));
        }
        self.bpf_stats_enabled
            .set(health.bpf_stats_enabled.map_or(-1, i64::from));
        for &(event, value) in &health.fleet {
            let last = self
                .last
                .fleet
                .iter()
                .find(|(e, _)| *e == event)
                .map_or(0, |&(_, v)| v);
            self.fleet
                .get_or_create(&EventLabels { event })
                .inc_by(value.saturating_sub(last));
        }
        self.processes.set(as_i64(health.processes));
        self.frequency.set(as_i64(health.frequency));
        if let Some(cpu) = crate::cputime::process_seconds()
            && cpu > self.last_cpu
        {
            self.cpu.inc_by(cpu - self.last_cpu);
            self.last_cpu = cpu;
        }
        if health.load_cpu > self.last.load_cpu {
            self.load_cpu.inc_by(health.load_cpu - self.last.load_cpu);
        }
        if health.event_lag > self.last.event_lag {
            self.event_lag
                .inc_by(health.event_lag - self.last.event_lag);
        }
        self.event_lag_max.set(health.event_lag_max);
        self.naming_waiting.set(as_i64(health.naming_waiting));
        self.naming_dropped.inc_by(
            health
                .naming_dropped
                .saturating_sub(self.last.naming_dropped),
        );
        self.naming_state.set(as_i64(health.naming_state_bytes));
        self.naming_evictions.inc_by(
            health
                .naming_evictions
                .saturating_sub(self.last.naming_evictions),
        );
        if health.collect_cpu > self.last.collect_cpu {
            self.collect_cpu
                .inc_by(health.collect_cpu - self.last.collect_cpu);
        }
        if let Some(rss) = own_rss_bytes() {
            self.rss.set(as_i64(rss));
        }
        self.last = health.clone();
    }

    /// The OpenMetrics text exposition (ends with `# EOF`).
    pub fn render(&self) -> String {
        use std::sync::atomic::Ordering::Relaxed;
        let last = self.last_render.load(Relaxed);
        let mut out = String::with_capacity(last.saturating_add(last / 16));
        // Writing into a String cannot fail.
        let _ = encode(&mut out, &self.registry);
        self.last_render.store(out.len(), Relaxed);
        out
    }
}

/// Percent-encodes a URL query value (a PromQL expression for a query API).
pub fn url_encode(s: &str) -> String {
    let mut out = String::with_capacity(s.len() * 2);
    for b in s.bytes() {
        match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                out.push(b as char);
            }
            _ => out.push_str(&format!("%{b:02X}")),
        }
    }
    out
}

/// `kernel.bpf_stats_enabled`, when readable.
pub fn bpf_stats_enabled() -> Option<bool> {
    let s = std::fs::read_to_string("/proc/sys/kernel/bpf_stats_enabled").ok()?;
    Some(s.trim() == "1")
}

fn own_rss_bytes() -> Option<u64> {
    let statm = std::fs::read_to_string("/proc/self/statm").ok()?;
    let pages: u64 = statm.split_whitespace().nth(1)?.parse().ok()?;
    // SAFETY: sysconf has no preconditions.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    Some(pages * u64::try_from(page).ok()?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exposition_has_stacks_outcomes_and_health() {
        let mut m = Metrics::new(SeriesConfig {
            off_cpu: true,
            ..SeriesConfig::default()
        });
        m.record(7, "prog", None, "main;work", 2, 5);
        m.record(7, "prog", None, "main;idle", 2, 1);
        m.record_off_cpu(7, "prog", None, "main;wait;[sleep S]", 1_500_000_000);
        let mut health = Health {
            objects_loaded: 3,
            objects_by_source: [1, 2, 0, 0],
            rows_in_use: 1000,
            row_capacity: 4000,
            table_bytes: 4096,
            bpf_program: Some((2_000_000_000, 10)),
            bpf_stats_enabled: Some(true),
            fleet: vec![("exec", 4), ("table_eviction", 1)],
            processes: 2,
            frequency: 49,
            naming_state_bytes: 25 << 20,
            naming_evictions: 1,
            ..Health::default()
        };
        health.outcomes[WalkOutcome::Complete as usize] = 6;
        health.counters[Event::Samples as usize] = 6;
        let now = Instant::now();
        m.update(now, &health);
        // The first update's samples come before any plan: in the host remainder.
        m.record(7, "prog", None, "main;work", 2, 5);
        m.record(7, "prog", None, "main;idle", 2, 1);
        m.record_off_cpu(7, "prog", None, "main;wait;[sleep S]", 1_500_000_000);
        m.update(now + std::time::Duration::from_secs(1), &health);
        let text = m.render();
        for line in [
            "sframe_stack_samples_total{comm=\"[other]\",stack=\"[other]\"} 6",
            "sframe_stack_samples_total{comm=\"prog\",stack=\"main;work\"} 5",
            "sframe_stack_samples_total{comm=\"prog\",stack=\"main;idle\"} 1",
            "sframe_off_cpu_seconds_total{comm=\"[other]\",stack=\"[other]\"} 1.5",
            "sframe_off_cpu_seconds_total{comm=\"prog\",stack=\"main;wait;[sleep S]\"} 1.5",
            "sframe_stack_series{profile=\"cpu\"} 3",
            "sframe_stack_series{profile=\"off_cpu\"} 2",
            "# TYPE sframe_stack_samples counter",
            "# TYPE sframe_off_cpu_seconds counter",
            "# UNIT sframe_off_cpu_seconds seconds",
            "sframe_walk_outcomes_total{outcome=\"complete\"} 6",
            "sframe_fleet_events_total{event=\"exec\"} 4",
            "sframe_fleet_events_total{event=\"table_eviction\"} 1",
            "sframe_processes 2",
            "sframe_sampling_frequency_hz 49",
            "sframe_walk_outcomes_total{outcome=\"no_rule\"} 0",
            "sframe_events_total{event=\"samples\"} 6",
            "sframe_stack_frames_count 12",
            "sframe_objects_loaded 3",
            "sframe_objects_by_source{source=\"sframe\"} 1",
            "sframe_objects_by_source{source=\"eh_frame\"} 2",
            "sframe_objects_by_source{source=\"plt_only\"} 0",
            "sframe_table_rows 1000",
            "sframe_table_bytes 4096",
            "sframe_bpf_run_time_seconds_total 2.0",
            "sframe_bpf_runs_total 10",
            "sframe_bpf_stats_enabled 1",
            "sframe_symbolizer_state_bytes 26214400",
            "sframe_symbolizer_evictions_total 1",
        ] {
            assert!(text.lines().any(|l| l == line), "{line} missing in\n{text}");
        }
        assert!(text.contains("sframe_process_cpu_seconds_total "), "{text}");
        assert!(
            text.contains("sframe_table_load_cpu_seconds_total "),
            "{text}"
        );
        assert!(
            text.contains("sframe_process_resident_memory_bytes "),
            "{text}"
        );
        assert!(text.ends_with("# EOF\n"), "{text}");
        // Counters follow absolute values; stacks leave with the window.
        health.outcomes[WalkOutcome::Complete as usize] = 9;
        m.update(now + std::time::Duration::from_secs(400), &health);
        let text = m.render();
        assert!(text.contains("sframe_walk_outcomes_total{outcome=\"complete\"} 9"));
        assert!(!text.contains("comm=\"prog\""), "{text}");
        assert!(
            text.contains("sframe_stack_series{profile=\"cpu\"} 1"),
            "{text}"
        );
    }

    /// prometheus-client writes HELP verbatim; OpenMetrics allows no `"`, `\\` or newline
    /// there unescaped.
    #[test]
    fn help_texts_need_no_escaping() {
        let mut m = Metrics::new(SeriesConfig::default());
        m.record(1, "p", None, "main", 1, 1);
        m.update(Instant::now(), &Health::default());
        let text = m.render();
        let helps: Vec<&str> = text.lines().filter(|l| l.starts_with("# HELP ")).collect();
        assert!(helps.len() >= 10, "{text}");
        for help in helps {
            assert!(!help.contains(['"', '\\']), "{help}");
        }
    }

    /// The text format keeps every sample of the OpenMetrics exposition.
    #[test]
    fn text_format_keeps_every_sample() {
        let mut m = Metrics::new(SeriesConfig::default());
        m.record(1, "p", None, "main;work", 3, 7);
        m.update(Instant::now(), &Health::default());
        let om = m.render();
        let text = text_format::from_openmetrics(&om);
        let samples = |s: &str| -> Vec<String> {
            s.lines()
                .filter(|l| !l.starts_with('#') && !l.is_empty())
                .map(str::to_owned)
                .collect()
        };
        assert_eq!(samples(&om), samples(&text));
        assert!(
            text.contains("# TYPE sframe_stack_samples_total counter\n"),
            "{text}"
        );
        assert!(
            !text.contains("# EOF") && !text.contains("# UNIT"),
            "{text}"
        );
    }

    #[test]
    fn label_values_are_escaped() {
        let mut m = Metrics::new(SeriesConfig {
            pid_label: true,
            ..SeriesConfig::default()
        });
        let now = Instant::now();
        m.update(now, &Health::default());
        m.record(1, "a\"b", None, "x\\y;\"z\"", 1, 1);
        m.update(now + std::time::Duration::from_secs(1), &Health::default());
        m.record(1, "a\"b", None, "x\\y;\"z\"", 1, 1);
        m.update(now + std::time::Duration::from_secs(2), &Health::default());
        let text = m.render();
        assert!(
            text.contains(
                r#"sframe_stack_samples_total{comm="a\"b",pid="1",stack="x\\y;\"z\""} 1"#
            ),
            "{text}"
        );
    }

    #[test]
    fn group_label_makes_programs_of_their_own() {
        let mut m = Metrics::new(SeriesConfig {
            group: Some(GroupLabel::Container),
            ..SeriesConfig::default()
        });
        let now = Instant::now();
        m.update(now, &Health::default());
        m.record(1, "p", Some("ab12"), "main", 1, 2);
        m.record(2, "p", Some("cd34"), "main", 1, 3);
        m.record(3, "p", None, "main", 1, 4);
        m.update(now + std::time::Duration::from_secs(1), &Health::default());
        m.record(1, "p", Some("ab12"), "main", 1, 2);
        m.record(2, "p", Some("cd34"), "main", 1, 3);
        m.record(3, "p", None, "main", 1, 4);
        m.update(now + std::time::Duration::from_secs(2), &Health::default());
        let text = m.render();
        for line in [
            r#"sframe_stack_samples_total{comm="p",stack="main",container_id="ab12"} 2"#,
            r#"sframe_stack_samples_total{comm="p",stack="main",container_id="cd34"} 3"#,
            r#"sframe_stack_samples_total{comm="p",stack="main"} 4"#,
        ] {
            assert!(text.lines().any(|l| l == line), "{line} missing in\n{text}");
        }
        // Without --prometheus-group, a group passed in is not exported.
        let mut m = Metrics::new(SeriesConfig::default());
        m.record(1, "p", Some("ab12"), "main", 1, 2);
        m.update(Instant::now(), &Health::default());
        assert!(!m.render().contains("container_id="));
    }
}
