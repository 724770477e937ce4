//! Stack series within a per-host budget: the host's flame graph per program, pruned to
//! its significant nodes.
//!
//! Every sample is a path `program; frame; …; frame` (outermost first). The tree of
//! those paths over a sliding window (5 minutes) is pruned to a set of *kept* nodes,
//! closed under ancestors, chosen by their share of the window's samples within the
//! series budget. A kept node has up to two series:
//!
//! - its own (`stack="main;work"`): samples whose stack ends exactly there;
//! - its remainder (`stack="main;work;[other]"`): samples that go on into a child that
//!   is not kept.
//!
//! A program node's own series is `stack="[no frames]"`, its remainder `stack="[other]"`;
//! programs that are not kept go to `comm="[other]",stack="[other]"`. So every sample
//! is counted in exactly one series (sums over series equal the samples taken), and the
//! total of a kept node is the sum of the series whose stack starts with its path:
//! **exact** for every kept node while the set does not change.
//!
//! The set changes slowly: it is planned again every [`Config::replan`] (more often in
//! the first minute), and a kept node stays while its score, doubled
//! ([`Config::hysteresis`]), still wins its place, so series are not created and dropped
//! at every scrape. Between plans a new program's samples go to `comm="[other]"`, a new
//! stack's to its closest kept ancestor's remainder.
//!
//! Bounded whatever the input: the tree holds at most [`Config::max_nodes`] nodes and
//! [`Config::max_name_bytes`] of frame names (a path that finds no room is cut where it
//! is, its samples counted in the remainder of that node), label values are at most [`Config::max_label_bytes`] (a longer stack
//! keeps its outermost and innermost frames and names what it left out with a digest
//! of the whole path, so distinct stacks stay distinct; a label that would still equal
//! another's is not kept), and series never exceed [`Config::max_series`] nor their
//! lines in the exposition [`Config::max_bytes`].

use std::{
    cmp::Ordering,
    collections::{BinaryHeap, VecDeque},
    sync::Arc,
    time::{Duration, Instant},
};

use super::{FastMap, FastSet};

/// The `stack` of a remainder series, and the `comm` of the programs not kept.
pub const OTHER: &str = "[other]";
/// The `stack` of a program's samples that have no frames.
pub const NO_FRAMES: &str = "[no frames]";

/// Bounds and policy of the tree.
#[derive(Clone, Debug)]
pub struct Config {
    /// Series at most (all of this tree's series, the host remainder included).
    pub max_series: usize,
    /// Bytes of these series' lines in the exposition at most (the scrape's size).
    pub max_bytes: usize,
    /// Bytes of a label value at most (Mimir's and Cortex's default is 2,048).
    pub max_label_bytes: usize,
    /// Window over which node shares are measured.
    pub window: Duration,
    /// How often the kept set is chosen again, once the tree is a minute old.
    pub replan: Duration,
    /// A node enters the set only with at least this share of the window's samples.
    pub min_share: f64,
    /// A kept node's score is multiplied by this when the set is chosen again.
    pub hysteresis: f64,
    /// Nodes the tree holds at most.
    pub max_nodes: usize,
    /// Bytes of frame names the tree holds at most (names are up to 1,024 characters:
    /// without it, 65,536 nodes of a user's long distinct symbols would hold 256 MB).
    pub max_name_bytes: usize,
    /// Whether labels leave out C++ parameter lists (`f` for `f(int, char**) const`):
    /// more paths fit the byte budget, and an overload whose label equals another's is
    /// not kept.
    pub short_names: bool,
}

/// Default `--prometheus-max-series`.
pub const DEFAULT_MAX_SERIES: usize = 1000;
/// Default `--prometheus-max-bytes`: with the exporter's other metrics (about 25 KB),
/// a scrape stays under 512 KB.
pub const DEFAULT_MAX_BYTES: usize = 480_000;
/// Default `--prometheus-max-label-bytes`.
pub const DEFAULT_MAX_LABEL_BYTES: usize = 2048;
/// The smallest label bound accepted (room for a few frames and the digest marker).
pub const MIN_LABEL_BYTES: usize = 128;

impl Default for Config {
    fn default() -> Self {
        Self {
            max_series: DEFAULT_MAX_SERIES,
            max_bytes: DEFAULT_MAX_BYTES,
            max_label_bytes: DEFAULT_MAX_LABEL_BYTES,
            window: Duration::from_secs(300),
            replan: Duration::from_secs(60),
            min_share: 1e-4,
            hysteresis: 2.0,
            max_nodes: 65_536,
            max_name_bytes: 8 << 20,
            short_names: false,
        }
    }
}

/// What keys a program's subtree: its labels.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Program {
    pub comm: Arc<str>,
    /// With the opt-in `pid` label.
    pub pid: Option<u32>,
    /// The `--prometheus-group` label's value.
    pub group: Option<Arc<str>>,
}

/// One exported series, borrowed from the tree.
#[derive(Clone, Copy, Debug)]
pub struct SeriesRef<'a> {
    pub comm: &'a str,
    pub pid: Option<u32>,
    pub group: Option<&'a str>,
    pub stack: &'a str,
    pub value: u64,
}

/// Figures of the tree, for the exporter's own metrics and the tests.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Figures {
    /// Series now.
    pub series: usize,
    /// Bytes of their lines in the exposition (an estimate: values counted as 12 bytes).
    pub bytes: usize,
    /// Series created since the start (a series that returns is created again).
    pub created: u64,
    /// Nodes in the tree now, and kept.
    pub nodes: usize,
    pub kept: usize,
    /// Samples whose path was cut because the tree was full.
    pub cut: u64,
    /// Samples counted in an ancestor's remainder because their series did not exist
    /// and the budget had no room to create it.
    pub over_budget: u64,
}

const ROOT: u32 = 0;
const NONE: u32 = u32::MAX;
/// Window slots: the window slides by this much.
const SLOTS: u32 = 30;

#[derive(Debug, Default)]
struct Node {
    parent: u32,
    /// Frame id (program nodes: none).
    frame: u32,
    depth: u32,
    /// Samples through this node in the window, and ending here.
    total: u64,
    own: u64,
    kept: bool,
    /// Cumulative values of the node's series, when they exist.
    own_series: Option<u64>,
    other_series: Option<u64>,
    /// The `stack` labels of the two series (kept nodes; programs have fixed ones).
    own_label: Option<Box<str>>,
    other_label: Option<Box<str>>,
    /// Bytes of the two series' lines (kept nodes).
    own_cost: u32,
    other_cost: u32,
    free: bool,
    /// While planning: whether it is chosen, and its remainder's samples.
    plan_keep: bool,
    plan_other: u64,
}

impl Node {
    const EMPTY: Self = Self {
        parent: NONE,
        frame: NONE,
        depth: 0,
        total: 0,
        own: 0,
        kept: false,
        own_series: None,
        other_series: None,
        own_label: None,
        other_label: None,
        own_cost: 0,
        other_cost: 0,
        free: false,
        plan_keep: false,
        plan_other: 0,
    };
}

/// One slot of the window: increments per (node, ends there).
#[derive(Debug)]
struct Slot {
    start: Instant,
    adds: FastMap<(u32, bool), u64>,
}

/// The tree and its series. Time is passed in by the caller.
#[derive(Debug)]
pub struct SeriesTree {
    config: Config,
    nodes: Vec<Node>,
    free: Vec<u32>,
    /// (parent, frame id) → child.
    edges: FastMap<(u32, u32), u32>,
    /// Program nodes by their labels, and back.
    programs: FastMap<Program, u32>,
    program_of: FastMap<u32, Program>,
    /// Interned frame names: id → (name, nodes naming it).
    frame_ids: FastMap<Arc<str>, u32>,
    frame_names: Vec<(Arc<str>, u32)>,
    free_frames: Vec<u32>,
    /// Bytes of the interned names (bounded by [`Config::max_name_bytes`]).
    name_bytes: usize,
    /// Stacks seen since the last plan, per program node → the node their path ends at.
    resolved: FastMap<u32, FastMap<Arc<str>, u32>>,
    resolved_len: usize,
    slots: VecDeque<Slot>,
    pending: Vec<(Program, Arc<str>, u64)>,
    started: Option<Instant>,
    last_plan: Option<Instant>,
    figures: Figures,
}

impl SeriesTree {
    pub fn new(config: Config) -> Self {
        let mut tree = Self {
            config,
            nodes: Vec::new(),
            free: Vec::new(),
            edges: FastMap::default(),
            programs: FastMap::default(),
            program_of: FastMap::default(),
            frame_ids: FastMap::default(),
            frame_names: Vec::new(),
            free_frames: Vec::new(),
            name_bytes: 0,
            resolved: FastMap::default(),
            resolved_len: 0,
            slots: VecDeque::new(),
            pending: Vec::new(),
            started: None,
            last_plan: None,
            figures: Figures::default(),
        };
        tree.nodes.push(Node {
            parent: NONE,
            frame: NONE,
            other_series: Some(0),
            kept: true,
            ..Node::default()
        });
        tree.figures.series = 1;
        tree.figures.bytes = line_cost(OTHER, None, None, OTHER);
        tree.figures.created = 1;
        tree
    }

    pub fn config(&self) -> &Config {
        &self.config
    }

    /// Records `delta` samples of `stack` (folded: frames outermost first, joined by
    /// `;`, empty for none) of `program`. Applied at the next [`Self::update`].
    pub fn record(&mut self, program: Program, stack: impl Into<Arc<str>>, delta: u64) {
        if delta > 0 {
            self.pending.push((program, stack.into(), delta));
        }
    }

    /// Applies what was recorded at `now`: slides the window, chooses the kept set
    /// when it is time, and adds each increment to its series.
    pub fn update(&mut self, now: Instant) {
        let started = *self.started.get_or_insert(now);
        self.slide(now);
        if self.plan_due(now, started) {
            self.plan();
            self.last_plan = Some(now);
        }
        for (program, stack, delta) in std::mem::take(&mut self.pending) {
            self.add(program, &stack, delta);
        }
    }

    /// Replans at 1, 2, 4, … seconds after the start, then every `replan`.
    fn plan_due(&self, now: Instant, started: Instant) -> bool {
        let Some(last) = self.last_plan else {
            return true;
        };
        let since = now.saturating_duration_since(last);
        let every = last
            .saturating_duration_since(started)
            .max(Duration::from_secs(1))
            .min(self.config.replan);
        since >= every
    }

    fn slot_len(&self) -> Duration {
        (self.config.window / SLOTS).max(Duration::from_millis(1))
    }

    /// Expires the slots that left the window and opens a new one when due.
    fn slide(&mut self, now: Instant) {
        while let Some(front) = self.slots.front() {
            if now.saturating_duration_since(front.start) < self.config.window {
                break;
            }
            let Some(slot) = self.slots.pop_front() else {
                break;
            };
            for ((node, ends), delta) in slot.adds {
                self.subtract(node, ends, delta);
            }
        }
        let open = self
            .slots
            .back()
            .is_some_and(|s| now.saturating_duration_since(s.start) < self.slot_len());
        if !open {
            self.slots.push_back(Slot {
                start: now,
                adds: FastMap::default(),
            });
        }
    }

    fn subtract(&mut self, node: u32, ends: bool, delta: u64) {
        if ends && let Some(n) = self.nodes.get_mut(node as usize) {
            n.own = n.own.saturating_sub(delta);
        }
        let mut at = node;
        while let Some(n) = self.nodes.get_mut(at as usize) {
            n.total = n.total.saturating_sub(delta);
            at = n.parent;
        }
    }

    fn frame_id(&mut self, name: &str) -> u32 {
        if let Some(&id) = self.frame_ids.get(name) {
            return id;
        }
        self.name_bytes = self.name_bytes.saturating_add(name.len());
        let name: Arc<str> = Arc::from(name);
        let reused = self.free_frames.pop().and_then(|id| {
            *self.frame_names.get_mut(id as usize)? = (name.clone(), 0);
            Some(id)
        });
        let id = match reused {
            Some(id) => id,
            None => {
                self.frame_names.push((name.clone(), 0));
                (self.frame_names.len() - 1) as u32
            }
        };
        self.frame_ids.insert(name, id);
        id
    }

    fn new_node(&mut self, parent: u32, frame: u32) -> Option<u32> {
        let live = self.nodes.len() - self.free.len();
        if live >= self.config.max_nodes.max(1) {
            return None;
        }
        let depth = self.nodes.get(parent as usize)?.depth + 1;
        let node = Node {
            parent,
            frame,
            depth,
            ..Node::default()
        };
        let id = match self.free.pop() {
            Some(id) => {
                *self.nodes.get_mut(id as usize)? = node;
                id
            }
            None => {
                self.nodes.push(node);
                (self.nodes.len() - 1) as u32
            }
        };
        if let Some(f) = self.frame_names.get_mut(frame as usize) {
            f.1 += 1;
            self.edges.insert((parent, frame), id);
        }
        Some(id)
    }

    /// The node `stack`'s path in `program` ends at, created as needed, and whether
    /// the whole path is there (else it was cut where the tree was full).
    fn resolve(&mut self, program: Program, stack: &Arc<str>) -> (u32, bool) {
        let prog = match self.programs.get(&program) {
            Some(&p) => p,
            None => match self.new_node(ROOT, NONE) {
                Some(p) => {
                    self.programs.insert(program.clone(), p);
                    self.program_of.insert(p, program);
                    p
                }
                None => return (ROOT, false),
            },
        };
        if let Some(&node) = self.resolved.get(&prog).and_then(|m| m.get(&**stack)) {
            return (node, true);
        }
        let mut at = prog;
        let mut whole = true;
        if !stack.is_empty() {
            for frame in stack.split(';') {
                // A name is interned only when a node can be made for it: a full tree
                // does not grow its names either.
                let known = self.frame_ids.get(frame).copied();
                let full = self.nodes.len() - self.free.len() >= self.config.max_nodes.max(1)
                    || self.name_bytes.saturating_add(frame.len()) > self.config.max_name_bytes;
                let id = match known {
                    Some(id) => id,
                    None if !full => self.frame_id(frame),
                    None => {
                        whole = false;
                        break;
                    }
                };
                at = match self.edges.get(&(at, id)) {
                    Some(&child) => child,
                    None => match self.new_node(at, id) {
                        Some(child) => child,
                        None => {
                            whole = false;
                            break;
                        }
                    },
                };
            }
        }
        if whole {
            if self.resolved_len >= self.config.max_nodes {
                self.resolved.clear();
                self.resolved_len = 0;
            }
            self.resolved
                .entry(prog)
                .or_default()
                .insert(Arc::clone(stack), at);
            self.resolved_len += 1;
        }
        (at, whole)
    }

    fn add(&mut self, program: Program, stack: &Arc<str>, delta: u64) {
        let (node, whole) = self.resolve(program, stack);
        if !whole {
            self.figures.cut = self.figures.cut.saturating_add(delta);
        }
        if whole && let Some(n) = self.nodes.get_mut(node as usize) {
            n.own = n.own.saturating_add(delta);
        }
        // Window totals along the path, and the deepest kept node on it (the kept set
        // is closed under ancestors: the first kept node from the end).
        let mut deepest = None;
        let mut at = node;
        while let Some(n) = self.nodes.get_mut(at as usize) {
            n.total = n.total.saturating_add(delta);
            if deepest.is_none() && n.kept {
                deepest = Some(at);
            }
            at = n.parent;
        }
        // `update` slid the window first: there is an open slot.
        if let Some(slot) = self.slots.back_mut() {
            *slot.adds.entry((node, whole)).or_default() += delta;
        }
        let deepest = deepest.unwrap_or(ROOT);
        let own = whole && deepest == node && node != ROOT;
        self.count(deepest, own, delta);
    }

    /// Adds `delta` to the own (or remainder) series of kept node `node`, creating the
    /// series if the budget has room, else to the closest remainder that exists.
    fn count(&mut self, node: u32, own: bool, delta: u64) {
        let (series, bytes) = (self.figures.series, self.figures.bytes);
        let (max_series, max_bytes) = (self.config.max_series.max(1), self.config.max_bytes);
        let Some(n) = self.nodes.get_mut(node as usize) else {
            return;
        };
        let (slot, cost) = if own {
            (&mut n.own_series, n.own_cost as usize)
        } else {
            (&mut n.other_series, n.other_cost as usize)
        };
        let room = series < max_series && bytes.saturating_add(cost) <= max_bytes && cost > 0;
        match slot {
            Some(v) => {
                *v = v.saturating_add(delta);
                return;
            }
            None if room => {
                *slot = Some(delta);
                self.figures.series += 1;
                self.figures.bytes += cost;
                self.figures.created += 1;
                return;
            }
            None => {}
        }
        self.figures.over_budget = self.figures.over_budget.saturating_add(delta);
        let mut at = if own { node } else { n.parent };
        while let Some(a) = self.nodes.get_mut(at as usize) {
            if let Some(v) = &mut a.other_series {
                *v = v.saturating_add(delta);
                return;
            }
            at = a.parent;
        }
    }

    /// The frames of `node`'s path below its program, outermost first.
    fn frames(&self, node: u32) -> Vec<&str> {
        let mut out = Vec::new();
        let mut at = node;
        while let Some(n) = self.nodes.get(at as usize) {
            if n.depth < 2 {
                break;
            }
            if let Some((name, _)) = self.frame_names.get(n.frame as usize) {
                out.push(&**name);
            }
            at = n.parent;
        }
        out.reverse();
        out
    }

    /// The program node above `node` (itself for a program).
    fn program_node(&self, node: u32) -> u32 {
        let mut at = node;
        while let Some(n) = self.nodes.get(at as usize) {
            if n.depth <= 1 {
                return at;
            }
            at = n.parent;
        }
        ROOT
    }

    /// Chooses the kept set: greedily by score (window samples, the kept ones' times
    /// the hysteresis), a child only after its parent, within the budget less a
    /// twentieth kept for series that appear between plans; then drops what left, and
    /// frees nodes that left the window.
    fn plan(&mut self) {
        let total = self.root().total;
        let floor_in = ((self.config.min_share * total as f64).ceil() as u64).max(1);
        let floor_kept = ((floor_in as f64 / self.config.hysteresis.max(1.0)).ceil() as u64).max(1);
        let max = self.config.max_series.max(1);
        let budget = max - (max / 20).min(max - 1);
        let byte_budget = self.config.max_bytes - self.config.max_bytes / 20;
        let programs: FastMap<u32, (&str, Option<u32>, Option<&str>)> = self
            .program_of
            .iter()
            .map(|(&id, p)| (id, (&*p.comm, p.pid, p.group.as_deref())))
            .collect();
        let mut children: Vec<Vec<u32>> = vec![Vec::new(); self.nodes.len()];
        for (id, n) in self.nodes.iter_mut().enumerate() {
            n.plan_keep = id as u32 == ROOT;
            n.plan_other = if id as u32 == ROOT { total } else { 0 };
            if !n.free
                && n.total > 0
                && let Some(c) = children.get_mut(n.parent as usize)
            {
                c.push(id as u32);
            }
        }
        // The host remainder always exists.
        let mut series = 1usize;
        let mut bytes = line_cost(OTHER, None, None, OTHER);
        let mut closed = false;
        let mut labels: FastSet<(u32, Box<str>)> = FastSet::default();
        let mut heap = BinaryHeap::new();
        let hysteresis = self.config.hysteresis.max(1.0);
        let score = |n: &Node| n.total as f64 * if n.kept { hysteresis } else { 1.0 };
        let push = |heap: &mut BinaryHeap<Candidate>, nodes: &[Node], of: u32| {
            for &c in children.get(of as usize).map_or(&[][..], Vec::as_slice) {
                if let Some(n) = nodes.get(c as usize) {
                    heap.push(Candidate(score(n), c));
                }
            }
        };
        push(&mut heap, &self.nodes, ROOT);
        while let Some(Candidate(_, id)) = heap.pop() {
            let Some(n) = self.nodes.get(id as usize) else {
                continue;
            };
            let floor = if n.kept { floor_kept } else { floor_in };
            if n.total < floor {
                continue;
            }
            let (parent, node_total) = (n.parent, n.total);
            let rest = n.total - n.own.min(n.total);
            // A node that stays kept keeps the series it has, with or without samples
            // in the window: a series that went and came back would be created again.
            let own_need = n.own > 0 || (n.kept && n.own_series.is_some());
            let other_need = rest > 0 || (n.kept && n.other_series.is_some());
            let delta = usize::from(own_need) + usize::from(other_need);
            let (parent_other, parent_other_cost, parent_keeps_other) =
                self.nodes.get(parent as usize).map_or((0, 0, true), |p| {
                    (
                        p.plan_other,
                        p.other_cost as usize,
                        p.kept && p.other_series.is_some(),
                    )
                });
            let parent_loses_other =
                parent != ROOT && parent_other == node_total && !parent_keeps_other;
            // Once a new node found no room, no later (lower-scoring) new node takes
            // what room is left: which small nodes would fill it changes from plan to
            // plan, and each change creates series. Kept nodes still keep their place.
            if closed && !n.kept {
                continue;
            }
            if series + delta - usize::from(parent_loses_other) > budget {
                closed |= !n.kept;
                continue;
            }
            let prog = self.program_node(id);
            let Some(&(comm, pid, group)) = programs.get(&prog) else {
                continue;
            };
            // Labels: programs' are fixed; deeper nodes' are unique within the program.
            let mut new_labels = None;
            let (own_cost, other_cost) = if n.depth >= 2 {
                let (own, other) = match (&n.own_label, &n.other_label) {
                    (Some(a), Some(b)) => (a.clone(), b.clone()),
                    _ => {
                        let short = self.config.short_names;
                        let names: Vec<std::borrow::Cow<'_, str>> = self
                            .frames(id)
                            .into_iter()
                            .map(|f| reserved_safe(if short { without_parameters(f) } else { f }))
                            .collect();
                        let frames: Vec<&str> = names.iter().map(|f| &**f).collect();
                        let max = self.config.max_label_bytes;
                        (
                            stack_label(&frames, None, max).into(),
                            stack_label(&frames, Some(OTHER), max).into(),
                        )
                    }
                };
                let keys = ((prog, own.clone()), (prog, other.clone()));
                if labels.contains(&keys.0) || labels.contains(&keys.1) {
                    continue;
                }
                labels.insert(keys.0);
                labels.insert(keys.1);
                let line = (
                    line_cost(comm, pid, group, &own),
                    line_cost(comm, pid, group, &other),
                );
                new_labels = Some((own, other));
                line
            } else {
                (
                    line_cost(comm, pid, group, NO_FRAMES),
                    line_cost(comm, pid, group, OTHER),
                )
            };
            let added =
                if own_need { own_cost } else { 0 } + if other_need { other_cost } else { 0 };
            let freed = if parent_loses_other {
                parent_other_cost
            } else {
                0
            };
            if (bytes + added).saturating_sub(freed) > byte_budget {
                closed |= !n.kept;
                continue;
            }
            bytes = (bytes + added).saturating_sub(freed);
            series = series + delta - usize::from(parent_loses_other);
            if let Some(p) = self.nodes.get_mut(parent as usize) {
                p.plan_other = p.plan_other.saturating_sub(node_total);
            }
            if let Some(n) = self.nodes.get_mut(id as usize) {
                n.plan_keep = true;
                n.plan_other = rest;
                n.own_cost = own_cost as u32;
                n.other_cost = other_cost as u32;
                if let Some((own, other)) = new_labels {
                    n.own_label = Some(own);
                    n.other_label = Some(other);
                }
            }
            push(&mut heap, &self.nodes, id);
        }
        // Apply: series of kept nodes exist where they have samples in the window.
        let mut count = 0usize;
        let mut count_bytes = line_cost(OTHER, None, None, OTHER);
        let mut kept_nodes = 0usize;
        for (id, n) in self.nodes.iter_mut().enumerate() {
            if n.free {
                continue;
            }
            let stays = n.kept && n.plan_keep;
            n.kept = n.plan_keep;
            if id as u32 == ROOT {
                count += 1;
                continue;
            }
            kept_nodes += usize::from(n.kept);
            let want_own = n.kept && (n.own > 0 || (stays && n.own_series.is_some()));
            let want_other = n.kept && (n.plan_other > 0 || (stays && n.other_series.is_some()));
            for (slot, want, cost) in [
                (&mut n.own_series, want_own, n.own_cost),
                (&mut n.other_series, want_other, n.other_cost),
            ] {
                match (slot.is_some(), want) {
                    (false, true) => {
                        *slot = Some(0);
                        self.figures.created += 1;
                    }
                    (true, false) => *slot = None,
                    _ => {}
                }
                count += usize::from(want);
                if want {
                    count_bytes += cost as usize;
                }
            }
            if !n.kept {
                n.own_label = None;
                n.other_label = None;
            }
        }
        self.figures.series = count;
        self.figures.bytes = count_bytes;
        self.figures.kept = kept_nodes;
        self.collect_garbage();
        self.figures.nodes = self.nodes.len() - self.free.len();
    }

    /// The root node (always there).
    fn root(&self) -> &Node {
        const EMPTY: &Node = &Node::EMPTY;
        self.nodes.get(ROOT as usize).unwrap_or(EMPTY)
    }

    /// Frees the nodes no sample in the window passes through (not kept, no series),
    /// and the frame names no node uses.
    fn collect_garbage(&mut self) {
        let mut freed = false;
        for (id, n) in self.nodes.iter_mut().enumerate().skip(1) {
            if n.free || n.total > 0 || n.kept {
                continue;
            }
            let (parent, frame) = (n.parent, n.frame);
            *n = Node {
                free: true,
                ..Node::default()
            };
            self.free.push(id as u32);
            freed = true;
            if let Some(f) = self.frame_names.get_mut(frame as usize) {
                self.edges.remove(&(parent, frame));
                f.1 = f.1.saturating_sub(1);
            } else if let Some(p) = self.program_of.remove(&(id as u32)) {
                self.programs.remove(&p);
            }
        }
        // Names interned for paths that were cut, or whose nodes were freed.
        for (id, (name, users)) in self.frame_names.iter_mut().enumerate() {
            if *users == 0 && !name.is_empty() {
                self.name_bytes = self.name_bytes.saturating_sub(name.len());
                self.frame_ids.remove(&**name);
                *name = Arc::from("");
                self.free_frames.push(id as u32);
                freed = true;
            }
        }
        if freed {
            self.resolved.clear();
            self.resolved_len = 0;
        }
    }

    /// Calls `f` with each series, in a stable order (by program, then stack).
    pub fn for_each_series<E>(
        &self,
        mut f: impl FnMut(SeriesRef<'_>) -> Result<(), E>,
    ) -> Result<(), E> {
        let root = self.root();
        f(SeriesRef {
            comm: OTHER,
            pid: None,
            group: None,
            stack: OTHER,
            value: root.other_series.unwrap_or(0),
        })?;
        let mut out: Vec<(&Program, &str, u64)> = Vec::with_capacity(self.figures.series);
        for (id, n) in self.nodes.iter().enumerate().skip(1) {
            if n.free || (n.own_series.is_none() && n.other_series.is_none()) {
                continue;
            }
            let Some(program) = self.program_of.get(&self.program_node(id as u32)) else {
                continue;
            };
            let (own, other) = if n.depth == 1 {
                (NO_FRAMES, OTHER)
            } else {
                (
                    n.own_label.as_deref().unwrap_or(OTHER),
                    n.other_label.as_deref().unwrap_or(OTHER),
                )
            };
            if let Some(v) = n.own_series {
                out.push((program, own, v));
            }
            if let Some(v) = n.other_series {
                out.push((program, other, v));
            }
        }
        out.sort_unstable_by(|a, b| a.0.cmp(b.0).then_with(|| a.1.cmp(b.1)));
        for (p, stack, value) in out {
            f(SeriesRef {
                comm: &p.comm,
                pid: p.pid,
                group: p.group.as_deref(),
                stack,
                value,
            })?;
        }
        Ok(())
    }

    /// Figures now.
    pub fn figures(&self) -> Figures {
        self.figures
    }
}

/// The bytes of a series' line in the exposition: the metric's name (the longer of
/// the two), its labels escaped, and 12 bytes of value.
fn line_cost(comm: &str, pid: Option<u32>, group: Option<&str>, stack: &str) -> usize {
    let escaped = |s: &str| {
        s.len()
            + s.bytes()
                .filter(|b| matches!(b, b'"' | b'\\' | b'\n'))
                .count()
    };
    let base = "sframe_off_cpu_seconds_total{comm=\"\",stack=\"\"} \n".len() + 12;
    base + escaped(comm)
        + escaped(stack)
        + pid.map_or(0, |_| ",pid=\"\"".len() + 10)
        + group.map_or(0, |g| ",container_id=\"\"".len() + escaped(g))
}

/// Orders candidates by score, then by id (older nodes, usually shallower, first).
struct Candidate(f64, u32);

impl PartialEq for Candidate {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}
impl Eq for Candidate {}
impl PartialOrd for Candidate {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Candidate {
    fn cmp(&self, other: &Self) -> Ordering {
        self.0
            .total_cmp(&other.0)
            .then_with(|| other.1.cmp(&self.1))
    }
}

/// A frame name that is one of the labels' own markers gets a `_` so that no frame
/// reads as a remainder or an elision.
fn reserved_safe(name: &str) -> std::borrow::Cow<'_, str> {
    if name == OTHER || name == NO_FRAMES || name.starts_with("[…") {
        std::borrow::Cow::Owned(format!("{name}_"))
    } else {
        std::borrow::Cow::Borrowed(name)
    }
}

/// A demangled C++ name without its parameter list and the qualifiers after it:
/// `ns::f<int>(char const*, int) const` → `ns::f<int>`, `operator()(int)` →
/// `operator()`, `(anonymous namespace)::g(int)` → `(anonymous namespace)::g`. Other
/// names (C, Rust, `[object+0x…]`, kernel frames) are returned as they are.
pub fn without_parameters(name: &str) -> &str {
    let bytes = name.as_bytes();
    if !name.ends_with(')') && !name.ends_with(" const") && !name.ends_with('&') {
        return name;
    }
    // The last top-level `(`: depth counted over (), <> and {} from the end.
    let (mut depth, mut end) = (0i32, bytes.len());
    // Qualifiers after the list.
    for q in [" const", " volatile", " &&", " &"] {
        if let Some(rest) = name.get(..end).and_then(|n| n.strip_suffix(q)) {
            end = rest.len();
        }
    }
    if !name.get(..end).is_some_and(|n| n.ends_with(')')) {
        return name;
    }
    let mut i = end;
    while i > 0 {
        i -= 1;
        match bytes.get(i) {
            Some(b')' | b'>' | b'}') => depth += 1,
            Some(b'(' | b'<' | b'{') => {
                depth -= 1;
                if depth == 0 {
                    // `operator()(…)`: the list is the last group, `operator()` stays.
                    return name.get(..i).filter(|n| !n.is_empty()).unwrap_or(name);
                }
            }
            _ => {}
        }
    }
    name
}

/// A short digest of `text` (SHA-256, 12 hex digits): the same on every host, so
/// shortened labels compare across a fleet.
fn digest(text: &str) -> String {
    use sha2::Digest as _;
    let d = sha2::Sha256::digest(text.as_bytes());
    d.iter().take(6).map(|b| format!("{b:02x}")).collect()
}

/// `text` cut to at most `max` bytes at a character boundary, ending with `…` when cut.
fn cut(text: &str, max: usize) -> String {
    if text.len() <= max {
        return text.to_owned();
    }
    let mut end = max.saturating_sub('…'.len_utf8());
    while end > 0 && !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", text.get(..end).unwrap_or_default())
}

/// A label value for a value that may be too long (a cgroup path): as it is when it
/// fits in `max` bytes, else cut with a digest of the whole.
pub fn bounded_value(value: &str, max: usize) -> std::borrow::Cow<'_, str> {
    if value.len() <= max {
        return std::borrow::Cow::Borrowed(value);
    }
    let tag = format!("[…{}]", digest(value));
    std::borrow::Cow::Owned(format!(
        "{}{tag}",
        cut(value, max.saturating_sub(tag.len()))
    ))
}

/// The `stack` label of `frames` (outermost first) with `suffix` as a last element,
/// at most `max` bytes: as it is when it fits; else the outermost frames (up to a
/// quarter of the room), `[…N frames DIGEST]` naming what was left out (DIGEST of the
/// whole path), and as many innermost frames as fit. Frames too long on their own
/// are cut.
pub fn stack_label(frames: &[&str], suffix: Option<&str>, max: usize) -> String {
    let full_len: usize =
        frames.iter().map(|f| f.len() + 1).sum::<usize>() + suffix.map_or(0, |s| s.len() + 1);
    let join = |parts: &mut dyn Iterator<Item = &str>| {
        let mut s = String::new();
        for p in parts {
            if !s.is_empty() {
                s.push(';');
            }
            s.push_str(p);
        }
        s
    };
    if full_len.saturating_sub(1) <= max {
        return join(&mut frames.iter().copied().chain(suffix));
    }
    let whole = join(&mut frames.iter().copied());
    let tag_of = |n: usize| format!("[…{n} frames {}]", digest(&whole));
    // Room without the marker (its count has at most 3 digits: 256 frames at most,
    // more only from a hostile path, which then gets a shorter tail).
    let tag_room = tag_of(999).len() + 1;
    let suffix_room = suffix.map_or(0, |s| s.len() + 1);
    let room = max.saturating_sub(tag_room + suffix_room);
    let frame_max = (room / 4).max(16);
    let frame = |f: &str| cut(f, frame_max);
    let mut head = Vec::new();
    let mut used = 0;
    for f in frames {
        let f = frame(f);
        if used + f.len() + 1 > room / 4 {
            break;
        }
        used += f.len() + 1;
        head.push(f);
    }
    let mut tail = Vec::new();
    for f in frames.iter().skip(head.len()).rev() {
        let f = frame(f);
        if used + f.len() + 1 > room {
            break;
        }
        used += f.len() + 1;
        tail.push(f);
    }
    tail.reverse();
    let elided = frames.len() - head.len() - tail.len();
    let tag = tag_of(elided);
    let parts = head
        .iter()
        .map(String::as_str)
        .chain(std::iter::once(tag.as_str()))
        .chain(tail.iter().map(String::as_str))
        .chain(suffix);
    let label = join(&mut parts.into_iter());
    if label.len() <= max {
        label
    } else {
        // Only with a bound below MIN_LABEL_BYTES: the digest alone.
        cut(&tag, max)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn prog(comm: &str) -> Program {
        Program {
            comm: Arc::from(comm),
            pid: None,
            group: None,
        }
    }

    fn series(t: &SeriesTree) -> Vec<(String, String, u64)> {
        let mut out = Vec::new();
        let _ = t.for_each_series(|s| {
            out.push((s.comm.to_owned(), s.stack.to_owned(), s.value));
            Ok::<(), ()>(())
        });
        out
    }

    fn sum(t: &SeriesTree) -> u64 {
        series(t).iter().map(|s| s.2).sum()
    }

    /// The total of the node `comm;path` rebuilt from the series, as a query would:
    /// the series whose stack starts with its path.
    fn rebuilt(t: &SeriesTree, comm: &str, path: &str) -> u64 {
        series(t)
            .iter()
            .filter(|(c, s, _)| {
                c == comm && (path.is_empty() || s == path || s.starts_with(&format!("{path};")))
            })
            .map(|s| s.2)
            .sum()
    }

    fn config(max_series: usize) -> Config {
        Config {
            max_series,
            ..Config::default()
        }
    }

    #[test]
    fn every_sample_is_in_one_series_and_kept_nodes_are_exact() {
        let mut t = SeriesTree::new(config(1000));
        let t0 = Instant::now();
        t.record(prog("p"), "main;a;x", 50);
        t.record(prog("p"), "main;a;y", 30);
        t.record(prog("p"), "main;b", 20);
        t.record(prog("q"), "", 5);
        t.update(t0);
        // First plan at the first update, before its samples: all in the remainder.
        assert_eq!(series(&t), [("[other]".into(), "[other]".into(), 105)]);
        t.record(prog("p"), "main;a;x", 50);
        t.record(prog("p"), "main;a;y", 30);
        t.record(prog("p"), "main;b", 20);
        t.record(prog("q"), "", 5);
        t.update(t0 + Duration::from_secs(1));
        assert_eq!(sum(&t), 210);
        let s = series(&t);
        for (comm, stack, value) in [
            ("p", "main;a;x", 50),
            ("p", "main;a;y", 30),
            ("p", "main;b", 20),
            ("q", NO_FRAMES, 5),
        ] {
            assert!(s.contains(&(comm.into(), stack.into(), value)), "{s:?}");
        }
        assert_eq!(rebuilt(&t, "p", "main;a"), 80);
        assert_eq!(rebuilt(&t, "p", ""), 100);
        // No empty remainders: every kept node's children are kept here.
        assert!(
            !s.iter()
                .any(|(_, st, _)| st.ends_with(OTHER) && st != OTHER),
            "{s:?}"
        );
    }

    #[test]
    fn the_budget_holds_and_the_rest_goes_to_the_closest_kept_ancestor() {
        let mut t = SeriesTree::new(config(8));
        let t0 = Instant::now();
        for i in 0..100u64 {
            t.record(prog("p"), format!("main;hot;leaf{i}"), 1);
        }
        t.record(prog("p"), "main;hot", 1000);
        t.update(t0);
        for i in 0..100u64 {
            t.record(prog("p"), format!("main;hot;leaf{i}"), 1);
        }
        t.record(prog("p"), "main;hot", 1000);
        t.update(t0 + Duration::from_secs(1));
        let s = series(&t);
        assert!(s.len() <= 8, "{s:?}");
        assert_eq!(sum(&t), 2200);
        assert!(s.contains(&("p".into(), "main;hot".into(), 1000)), "{s:?}");
        assert!(s.iter().any(|x| x.1 == "main;hot;[other]"), "{s:?}");
        assert_eq!(rebuilt(&t, "p", "main;hot"), 1100);
    }

    #[test]
    fn churn_of_programs_does_not_grow_the_series() {
        let mut t = SeriesTree::new(config(50));
        let t0 = Instant::now();
        let mut max_series = 0;
        for sec in 0..600u64 {
            // A steady program, and a new short-lived one every second with its own
            // stacks; both under one comm each.
            t.record(prog("steady"), "main;loop", 100);
            t.record(
                prog(&format!("job{sec}")),
                format!("main;step{}", sec % 7),
                3,
            );
            t.update(t0 + Duration::from_secs(sec));
            max_series = max_series.max(t.figures().series);
        }
        assert!(max_series <= 50, "{max_series}");
        let f = t.figures();
        // Planned every minute after the first: few series created.
        assert!(f.created < 60, "{f:?}");
        assert!(series(&t).contains(&("steady".into(), "main;loop".into(), 100 * 599)));
        // The window forgets: the tree holds what 5 minutes hold, not 10.
        // (300 jobs of 3 nodes in the window, and up to a minute more before a plan.)
        assert!(f.nodes < 1200, "{f:?}");
    }

    #[test]
    fn hysteresis_keeps_a_node_that_falls_a_little_behind() {
        let mut t = SeriesTree::new(config(3));
        let t0 = Instant::now();
        // Room for the host remainder, p's remainder (c is never kept) and one stack.
        let mut at = t0;
        for sec in 0..120u64 {
            at = t0 + Duration::from_secs(sec);
            t.record(prog("p"), "a", 10);
            t.record(prog("p"), "b", 9);
            t.record(prog("p"), "c", 1);
            t.update(at);
        }
        let has = |t: &SeriesTree, s: &str| series(t).iter().any(|x| x.1 == s);
        assert!(has(&t, "a") && !has(&t, "b"), "{:?}", series(&t));
        // b overtakes a by less than the hysteresis: a stays.
        for sec in 120..400u64 {
            at = t0 + Duration::from_secs(sec);
            t.record(prog("p"), "a", 10);
            t.record(prog("p"), "b", 15);
            t.record(prog("p"), "c", 1);
            t.update(at);
        }
        assert!(has(&t, "a") && !has(&t, "b"), "{:?}", series(&t));
        // By more: b takes its place at the next plan.
        for sec in 400..800u64 {
            at = t0 + Duration::from_secs(sec);
            t.record(prog("p"), "a", 1);
            t.record(prog("p"), "b", 15);
            t.record(prog("p"), "c", 1);
            t.update(at);
        }
        assert!(has(&t, "b") && !has(&t, "a"), "{:?}", series(&t));
        let _ = at;
    }

    /// Long stacks reach the byte budget before the series budget: the exposition's
    /// lines stay within it, and every sample is still counted.
    #[test]
    fn the_byte_budget_holds() {
        let mut t = SeriesTree::new(Config {
            max_bytes: 20_000,
            ..config(1000)
        });
        let t0 = Instant::now();
        let stack = |i: u64| {
            let mut f: Vec<String> = (0..40)
                .map(|d| format!("namespace::frame_{d}(int, char**)"))
                .collect();
            f.push(format!("leaf_{i}"));
            f.join(";")
        };
        for sec in 0..5 {
            for i in 0..200u64 {
                t.record(prog("p\"q"), stack(i), 1 + i % 7);
            }
            t.update(t0 + Duration::from_secs(sec));
            let mut bytes = 0;
            let _ = t.for_each_series(|s| {
                let esc = |v: &str| v.replace('\\', "\\\\").replace('"', "\\\"");
                bytes += format!(
                    "sframe_stack_samples_total{{comm=\"{}\",stack=\"{}\"}} {}\n",
                    esc(s.comm),
                    esc(s.stack),
                    s.value
                )
                .len();
                Ok::<(), ()>(())
            });
            assert!(bytes <= 20_000, "{bytes}");
            assert!(t.figures().bytes >= bytes, "{:?} {bytes}", t.figures());
        }
        assert!(t.figures().kept > 10, "{:?}", t.figures());
        let expected: u64 = (0..200u64).map(|i| 1 + i % 7).sum::<u64>() * 5;
        assert_eq!(sum(&t), expected);
    }

    #[test]
    fn the_node_bound_cuts_paths_and_keeps_counting() {
        let mut t = SeriesTree::new(Config {
            max_nodes: 10,
            ..config(100)
        });
        let t0 = Instant::now();
        for round in 0..3u64 {
            for i in 0..50 {
                t.record(prog("p"), format!("main;f{i};g{i}"), 1);
            }
            t.update(t0 + Duration::from_secs(round));
        }
        assert_eq!(sum(&t), 150);
        let f = t.figures();
        assert!(f.nodes <= 10, "{f:?}");
        assert!(f.cut > 0, "{f:?}");
        // Names are interned for nodes only: 100 distinct frames, at most 10 names.
        assert!(t.frame_ids.len() <= 10, "{}", t.frame_ids.len());
        // And their bytes are bounded: distinct 1,000-byte frames, room for 20 KB.
        let mut t = SeriesTree::new(Config {
            max_name_bytes: 20_000,
            ..config(100)
        });
        for round in 0..3u64 {
            for i in 0..200 {
                t.record(prog("p"), format!("main;{}{i}", "x".repeat(1000)), 1);
            }
            t.update(t0 + Duration::from_secs(round));
        }
        assert_eq!(sum(&t), 600);
        assert!(t.name_bytes <= 20_000, "{}", t.name_bytes);
        assert!(t.figures().cut > 0);
    }

    #[test]
    fn labels_are_bounded_and_stay_distinct() {
        let long: Vec<String> = (0..300)
            .map(|i| format!("namespace::function_{i}"))
            .collect();
        let frames: Vec<&str> = long.iter().map(String::as_str).collect();
        let a = stack_label(&frames, None, 2048);
        let b = stack_label(&frames[..299], None, 2048);
        let c = stack_label(&frames, Some(OTHER), 2048);
        for l in [&a, &b, &c] {
            assert!(l.len() <= 2048, "{}", l.len());
            assert!(l.starts_with("namespace::function_0;"), "{l}");
            assert!(l.contains("[…"), "{l}");
        }
        assert!(a.ends_with("namespace::function_299"), "{a}");
        assert!(c.ends_with(";[other]"), "{c}");
        assert_ne!(a, b);
        assert_ne!(a, c);
        // One huge frame.
        let huge = "x".repeat(10_000);
        let l = stack_label(&["main", &huge, "leaf"], None, 256);
        assert!(l.len() <= 256 && l.ends_with("leaf"), "{l}");
        // Short stacks stay as they are.
        assert_eq!(
            stack_label(&["main", "work"], Some(OTHER), 2048),
            "main;work;[other]"
        );
        let long = "/a".repeat(2000);
        let v = bounded_value(&long, 2048);
        assert!(v.len() <= 2048 && v.ends_with(']'), "{v}");
    }

    #[test]
    fn parameter_lists_are_left_out() {
        for (full, short) in [
            ("ns::f<int>(char const*, int) const", "ns::f<int>"),
            ("operator()(int)", "operator()"),
            ("(anonymous namespace)::g(int)", "(anonymous namespace)::g"),
            ("A::B::run(std::function<void (int)>) &&", "A::B::run"),
            ("toplev::main(int, char**)", "toplev::main"),
            ("main", "main"),
            ("<T as core::ops::Fn>::call", "<T as core::ops::Fn>::call"),
            ("[cc1+0x7edb8f]", "[cc1+0x7edb8f]"),
            ("do_syscall_64_[k]", "do_syscall_64_[k]"),
            ("(", "("),
            (")", ")"),
            ("x)", "x)"),
        ] {
            assert_eq!(without_parameters(full), short, "{full}");
        }
        // Two overloads: one label, so only one of them has series; every sample is
        // still counted.
        let mut t = SeriesTree::new(Config {
            short_names: true,
            ..config(100)
        });
        let t0 = Instant::now();
        for sec in 0..3 {
            t.record(prog("p"), "main;f(int)", 10);
            t.record(prog("p"), "main;f(double)", 5);
            t.update(t0 + Duration::from_secs(sec));
        }
        let s = series(&t);
        assert_eq!(s.iter().filter(|x| x.1 == "main;f").count(), 1, "{s:?}");
        assert_eq!(sum(&t), 45);
    }

    #[test]
    fn frames_named_like_markers_do_not_collide() {
        let mut t = SeriesTree::new(config(100));
        let t0 = Instant::now();
        for sec in 0..3 {
            t.record(prog("p"), "main;[other]", 10);
            t.record(prog("p"), "main;x", 10);
            t.record(prog("p"), "main", 10);
            t.update(t0 + Duration::from_secs(sec));
        }
        let s = series(&t);
        let mut labels: Vec<_> = s.iter().map(|(c, st, _)| (c, st)).collect();
        let n = labels.len();
        labels.sort();
        labels.dedup();
        assert_eq!(labels.len(), n, "{s:?}");
        assert!(s.iter().any(|x| x.1 == "main;[other]_"), "{s:?}");
        // The frame stays one node through plans that free others (x leaves the window,
        // which clears the resolved paths): root, p, main and [other]. A name interned
        // under another key than it is looked up by made a new node each time.
        for sec in 3..400 {
            t.record(prog("p"), "main;[other]", 10);
            t.update(t0 + Duration::from_secs(sec));
        }
        assert_eq!(t.figures().nodes, 4, "{:?}", t.figures());
        assert_eq!(t.frame_ids.len(), 2, "{:?}", t.frame_ids);
    }

    #[test]
    fn long_stacks_with_one_label_keep_separate_series() {
        // Two 400-frame stacks that differ only in the middle: their labels differ
        // by the digest.
        let mut t = SeriesTree::new(config(100));
        let t0 = Instant::now();
        let stack = |mid: &str| {
            let mut f: Vec<String> = (0..400).map(|i| format!("frame_number_{i:03}")).collect();
            f[200] = mid.to_owned();
            f.join(";")
        };
        for sec in 0..3 {
            t.record(prog("p"), stack("left"), 10);
            t.record(prog("p"), stack("right"), 10);
            t.update(t0 + Duration::from_secs(sec));
        }
        let s = series(&t);
        assert!(s.iter().all(|x| x.1.len() <= 2048));
        let mut labels: Vec<_> = s.iter().map(|x| &x.1).collect();
        let n = labels.len();
        labels.sort();
        labels.dedup();
        assert_eq!(labels.len(), n);
        assert_eq!(sum(&t), 60);
    }
}
