//! pprof output: gzip-compressed `profile.proto` (github.com/google/pprof, proto3).
//!
//! Frames are already symbolized, so every location carries its function and line:
//! readers never need the binaries. A location's address is the file offset in its
//! object, and each object's mapping starts at 0 with file offset 0, so that
//! `address - memory_start + file_offset` is the file offset, as pprof expects.

use std::{collections::HashMap, io::Write as _};

use flate2::{Compression, write::GzEncoder};
use prost::Message as _;

use super::Profile;
use crate::symbolize::{Frame, SourceLocation};

/// The messages of `profile.proto` this writer uses (field numbers from the proto).
pub mod proto {
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Profile {
        #[prost(message, repeated, tag = "1")]
        pub sample_type: Vec<ValueType>,
        #[prost(message, repeated, tag = "2")]
        pub sample: Vec<Sample>,
        #[prost(message, repeated, tag = "3")]
        pub mapping: Vec<Mapping>,
        #[prost(message, repeated, tag = "4")]
        pub location: Vec<Location>,
        #[prost(message, repeated, tag = "5")]
        pub function: Vec<Function>,
        #[prost(string, repeated, tag = "6")]
        pub string_table: Vec<String>,
        #[prost(int64, tag = "9")]
        pub time_nanos: i64,
        #[prost(int64, tag = "10")]
        pub duration_nanos: i64,
        #[prost(message, optional, tag = "11")]
        pub period_type: Option<ValueType>,
        #[prost(int64, tag = "12")]
        pub period: i64,
        #[prost(int64, repeated, tag = "13")]
        pub comment: Vec<i64>,
        #[prost(int64, tag = "14")]
        pub default_sample_type: i64,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct ValueType {
        #[prost(int64, tag = "1")]
        pub r#type: i64,
        #[prost(int64, tag = "2")]
        pub unit: i64,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Sample {
        /// Leaf first.
        #[prost(uint64, repeated, tag = "1")]
        pub location_id: Vec<u64>,
        #[prost(int64, repeated, tag = "2")]
        pub value: Vec<i64>,
        #[prost(message, repeated, tag = "3")]
        pub label: Vec<Label>,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Label {
        #[prost(int64, tag = "1")]
        pub key: i64,
        #[prost(int64, tag = "2")]
        pub str: i64,
        #[prost(int64, tag = "3")]
        pub num: i64,
        #[prost(int64, tag = "4")]
        pub num_unit: i64,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Mapping {
        #[prost(uint64, tag = "1")]
        pub id: u64,
        #[prost(uint64, tag = "2")]
        pub memory_start: u64,
        #[prost(uint64, tag = "3")]
        pub memory_limit: u64,
        #[prost(uint64, tag = "4")]
        pub file_offset: u64,
        #[prost(int64, tag = "5")]
        pub filename: i64,
        #[prost(int64, tag = "6")]
        pub build_id: i64,
        #[prost(bool, tag = "7")]
        pub has_functions: bool,
        #[prost(bool, tag = "8")]
        pub has_filenames: bool,
        #[prost(bool, tag = "9")]
        pub has_line_numbers: bool,
        #[prost(bool, tag = "10")]
        pub has_inline_frames: bool,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Location {
        #[prost(uint64, tag = "1")]
        pub id: u64,
        #[prost(uint64, tag = "2")]
        pub mapping_id: u64,
        #[prost(uint64, tag = "3")]
        pub address: u64,
        /// Innermost inlined function first, the function containing the code last.
        #[prost(message, repeated, tag = "4")]
        pub line: Vec<Line>,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Line {
        #[prost(uint64, tag = "1")]
        pub function_id: u64,
        #[prost(int64, tag = "2")]
        pub line: i64,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Function {
        #[prost(uint64, tag = "1")]
        pub id: u64,
        #[prost(int64, tag = "2")]
        pub name: i64,
        #[prost(int64, tag = "3")]
        pub system_name: i64,
        #[prost(int64, tag = "4")]
        pub filename: i64,
    }
}

/// The gzip-compressed `profile.proto` of `profile`.
pub fn pprof_bytes(profile: &Profile) -> Vec<u8> {
    let encoded = encode(profile).encode_to_vec();
    let mut gz = GzEncoder::new(Vec::new(), Compression::default());
    // Writing into a Vec cannot fail.
    let _ = gz.write_all(&encoded);
    gz.finish().unwrap_or_default()
}

/// Builds the message; ids are indices + 1 (0 means "none" in profile.proto).
pub fn encode(profile: &Profile) -> proto::Profile {
    let mut b = Builder::default();
    b.string(""); // string_table[0] must be "".
    let samples = b.string("samples");
    let count = b.string("count");
    let cpu = b.string("cpu");
    let nanoseconds = b.string("nanoseconds");
    let (key_pid, key_comm, key_outcome) = (b.string("pid"), b.string("comm"), b.string("outcome"));
    let (key_tid, key_thread) = (b.string("thread_id"), b.string("thread_name"));
    let (key_cgroup, key_container) = (b.string("cgroup"), b.string("container_id"));
    let period = profile.period_ns() as i64;
    // Off CPU: one value, nanoseconds asleep (`off_cpu`, as Parca and Pyroscope name
    // it), in a profile of its own: a sample's value is time, not a count of periods.
    let (sample_type, period_type, period, default_sample_type) = if profile.off_cpu {
        let off_cpu = b.string("off_cpu");
        let t = proto::ValueType {
            r#type: off_cpu,
            unit: nanoseconds,
        };
        (vec![t.clone()], t, 1, off_cpu)
    } else {
        (
            vec![
                proto::ValueType {
                    r#type: samples,
                    unit: count,
                },
                proto::ValueType {
                    r#type: cpu,
                    unit: nanoseconds,
                },
            ],
            proto::ValueType {
                r#type: cpu,
                unit: nanoseconds,
            },
            period,
            cpu,
        )
    };
    let mut out = proto::Profile {
        sample_type,
        period_type: Some(period_type),
        period,
        default_sample_type,
        duration_nanos: i64::try_from(profile.duration.as_nanos()).unwrap_or(i64::MAX),
        time_nanos: profile
            .start
            .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
            .and_then(|d| i64::try_from(d.as_nanos()).ok())
            .unwrap_or(0),
        ..Default::default()
    };
    let comment = b.string(&format!("sframe-user: {}", profile.title()));
    out.comment.push(comment);
    for p in &profile.processes {
        let comm = b.string(&p.comm);
        let cgroup = p.cgroup.as_deref().map(|c| b.string(c));
        let container = p.container_id.as_deref().map(|c| b.string(c));
        for s in &p.stacks {
            let count = i64::try_from(s.count).unwrap_or(i64::MAX);
            let outcome = b.string(s.outcome.name());
            let state = s
                .sleep
                .map(|sleep| (b.string("state"), b.string(sleep.letter())));
            let thread = (!s.thread.is_empty()).then(|| b.string(&s.thread));
            // Leaf first: kernel frames innermost first, then user frames.
            let location_id = s
                .kernel
                .iter()
                .rev()
                .chain(s.user.iter().rev())
                .map(|f| b.location(f))
                .collect();
            out.sample.push(proto::Sample {
                location_id,
                value: if profile.off_cpu {
                    vec![count]
                } else {
                    vec![count, count.saturating_mul(period)]
                },
                label: vec![
                    proto::Label {
                        key: key_pid,
                        num: i64::from(p.pid),
                        ..Default::default()
                    },
                    proto::Label {
                        key: key_comm,
                        str: comm,
                        ..Default::default()
                    },
                    proto::Label {
                        key: key_outcome,
                        str: outcome,
                        ..Default::default()
                    },
                ]
                .into_iter()
                .chain((s.tid != 0).then_some(proto::Label {
                    key: key_tid,
                    num: i64::from(s.tid),
                    ..Default::default()
                }))
                .chain(thread.map(|str| proto::Label {
                    key: key_thread,
                    str,
                    ..Default::default()
                }))
                .chain(cgroup.map(|str| proto::Label {
                    key: key_cgroup,
                    str,
                    ..Default::default()
                }))
                .chain(container.map(|str| proto::Label {
                    key: key_container,
                    str,
                    ..Default::default()
                }))
                .chain(state.map(|(key, str)| proto::Label {
                    key,
                    str,
                    ..Default::default()
                }))
                .collect(),
            });
        }
    }
    out.mapping = b.mappings;
    out.location = b.locations;
    out.function = b.functions;
    out.string_table = b.strings;
    out
}

#[derive(Default)]
struct Builder {
    strings: Vec<String>,
    string_ids: HashMap<String, i64>,
    mappings: Vec<proto::Mapping>,
    /// (object, build-id) → mapping index.
    mapping_ids: HashMap<(String, Option<String>), usize>,
    functions: Vec<proto::Function>,
    /// (name, file) → function id.
    function_ids: HashMap<(String, Option<String>), u64>,
    locations: Vec<proto::Location>,
    /// (mapping id, file offset) → location id. One address has one symbolization.
    location_ids: HashMap<(u64, u64), u64>,
}

impl Builder {
    fn string(&mut self, s: &str) -> i64 {
        if let Some(&id) = self.string_ids.get(s) {
            return id;
        }
        let id = self.strings.len() as i64;
        self.strings.push(s.to_owned());
        self.string_ids.insert(s.to_owned(), id);
        id
    }

    fn mapping(&mut self, frame: &Frame) -> u64 {
        let key = (frame.object.clone(), frame.build_id.clone());
        let index = match self.mapping_ids.get(&key) {
            Some(&i) => i,
            None => {
                let filename = self.string(&frame.object);
                let build_id = frame.build_id.as_deref().map_or(0, |b| self.string(b));
                self.mappings.push(proto::Mapping {
                    id: self.mappings.len() as u64 + 1,
                    filename,
                    build_id,
                    has_functions: true,
                    ..Default::default()
                });
                self.mapping_ids.insert(key, self.mappings.len() - 1);
                self.mappings.len() - 1
            }
        };
        let Some(m) = self.mappings.get_mut(index) else {
            return 0; // (the index was taken from `mappings` just above)
        };
        m.memory_limit = m.memory_limit.max(frame.file_offset.saturating_add(1));
        if frame.location.is_some() {
            m.has_filenames = true;
            m.has_line_numbers = true;
        }
        if !frame.inlined.is_empty() {
            m.has_inline_frames = true;
        }
        m.id
    }

    fn function(&mut self, name: &str, location: Option<&SourceLocation>) -> u64 {
        let key = (name.to_owned(), location.map(|l| l.file.clone()));
        if let Some(&id) = self.function_ids.get(&key) {
            return id;
        }
        let name = self.string(name);
        let filename = location.map_or(0, |l| self.string(&l.file));
        let id = self.functions.len() as u64 + 1;
        self.functions.push(proto::Function {
            id,
            name,
            system_name: name,
            filename,
        });
        self.function_ids.insert(key, id);
        id
    }

    fn location(&mut self, frame: &Frame) -> u64 {
        let mapping_id = self.mapping(frame);
        if let Some(&id) = self.location_ids.get(&(mapping_id, frame.file_offset)) {
            return id;
        }
        let line_of = |l: Option<&SourceLocation>| l.and_then(|l| l.line).map_or(0, i64::from);
        let mut line = Vec::with_capacity(1 + frame.inlined.len());
        if frame.name.is_some() {
            for f in frame.inlined.iter().rev() {
                let function_id = self.function(&f.name, f.location.as_ref());
                line.push(proto::Line {
                    function_id,
                    line: line_of(f.location.as_ref()),
                });
            }
        }
        // Unknown functions are named `[object+0xOFFSET]`, as in the folded output, so
        // that readers do not try to symbolize them again.
        let function_id = self.function(&frame.folded_name(), frame.location.as_ref());
        line.push(proto::Line {
            function_id,
            line: line_of(frame.location.as_ref()),
        });
        let id = self.locations.len() as u64 + 1;
        self.locations.push(proto::Location {
            id,
            mapping_id,
            address: frame.file_offset,
            line,
        });
        self.location_ids
            .insert((mapping_id, frame.file_offset), id);
        id
    }
}

#[cfg(test)]
mod tests {
    use std::io::Read as _;

    use super::*;
    use crate::export::tests::sample_profile;

    fn decode(bytes: &[u8]) -> proto::Profile {
        let mut raw = Vec::new();
        flate2::read::GzDecoder::new(bytes)
            .read_to_end(&mut raw)
            .unwrap();
        proto::Profile::decode(raw.as_slice()).unwrap()
    }

    #[test]
    fn decodes_back_with_types_mappings_build_ids_and_lines() {
        let p = decode(&pprof_bytes(&sample_profile()));
        let s = |i: i64| p.string_table[i as usize].as_str();
        assert_eq!(s(0), "");
        let types: Vec<(&str, &str)> = p
            .sample_type
            .iter()
            .map(|t| (s(t.r#type), s(t.unit)))
            .collect();
        assert_eq!(types, [("samples", "count"), ("cpu", "nanoseconds")]);
        let period_type = p.period_type.clone().unwrap();
        assert_eq!(
            (s(period_type.r#type), s(period_type.unit)),
            ("cpu", "nanoseconds")
        );
        assert_eq!(p.period, 10_000_000);
        assert_eq!(p.duration_nanos, 2_500_000_000);
        assert_eq!(p.time_nanos, 1_700_000_000_000_000_000);
        assert_eq!(p.sample.len(), 3);
        assert_eq!(p.sample[0].value, [7, 70_000_000]);
        assert_eq!(p.sample[2].value, [1, 10_000_000]);

        // Mappings: one per object, build-id when known, ids 1..
        let maps: Vec<(&str, &str)> = p
            .mapping
            .iter()
            .map(|m| (s(m.filename), s(m.build_id)))
            .collect();
        assert_eq!(
            maps,
            [
                ("prog", "abcdef0123"),
                ("[kernel.kallsyms]", ""),
                ("libc.so.6", ""),
                ("[anon]", "")
            ]
        );
        for (i, m) in p.mapping.iter().enumerate() {
            assert_eq!(m.id, i as u64 + 1);
            assert_eq!((m.memory_start, m.file_offset), (0, 0));
        }
        assert!(p.mapping[0].has_line_numbers && p.mapping[0].has_inline_frames);

        // First sample, leaf first: leaf (line 20), main with helper inlined, _start.
        let frames: Vec<Vec<(String, i64)>> = p.sample[0]
            .location_id
            .iter()
            .map(|&id| {
                let loc = &p.location[id as usize - 1];
                assert_eq!(loc.id, id);
                loc.line
                    .iter()
                    .map(|l| {
                        let f = &p.function[l.function_id as usize - 1];
                        (s(f.name).to_owned(), l.line)
                    })
                    .collect()
            })
            .collect();
        assert_eq!(
            frames,
            [
                vec![("leaf;fn".to_owned(), 20)],
                vec![("helper".to_owned(), 3), ("main".to_owned(), 10)],
                vec![("_start".to_owned(), 0)],
            ]
        );
        let leaf = &p.location[p.sample[0].location_id[0] as usize - 1];
        assert_eq!((leaf.address, leaf.mapping_id), (0x1200, 1));
        let f = &p.function[leaf.line[0].function_id as usize - 1];
        assert_eq!(s(f.filename), "/src/prog.c");

        // Second sample: the kernel frame is the leaf; unknown frames are named.
        let names: Vec<&str> = p.sample[1]
            .location_id
            .iter()
            .map(|&id| {
                let loc = &p.location[id as usize - 1];
                s(p.function[loc.line.last().unwrap().function_id as usize - 1].name)
            })
            .collect();
        assert_eq!(
            names,
            ["do_syscall_64", "[libc.so.6+0x2a3f0]", "main", "_start"]
        );

        // Labels.
        let labels: Vec<(&str, &str, i64)> = p.sample[2]
            .label
            .iter()
            .map(|l| (s(l.key), s(l.str), l.num))
            .collect();
        assert_eq!(
            labels,
            [
                ("pid", "", 43),
                ("comm", "other", 0),
                ("outcome", "no_mapping", 0)
            ]
        );
    }

    #[test]
    fn threads_are_labelled() {
        let mut profile = crate::export::tests::sample_profile();
        profile.processes[0].stacks[0].tid = 4242;
        profile.processes[0].stacks[0].thread = "worker".to_owned();
        profile.processes[0].cgroup = Some("/system.slice/docker-x.scope".to_owned());
        profile.processes[0].container_id = Some("ab".repeat(32));
        let p = decode(&pprof_bytes(&profile));
        let s = |i: i64| p.string_table[i as usize].as_str();
        let labels: Vec<(&str, &str, i64)> = p.sample[0]
            .label
            .iter()
            .map(|l| (s(l.key), s(l.str), l.num))
            .collect();
        assert!(labels.contains(&("thread_id", "", 4242)), "{labels:?}");
        assert!(labels.contains(&("thread_name", "worker", 0)), "{labels:?}");
        assert!(
            labels.contains(&("cgroup", "/system.slice/docker-x.scope", 0)),
            "{labels:?}"
        );
        let id = "ab".repeat(32);
        assert!(
            labels.contains(&("container_id", id.as_str(), 0)),
            "{labels:?}"
        );
    }

    #[test]
    fn empty_profile_is_valid() {
        let p = decode(&pprof_bytes(&super::Profile::default()));
        assert!(p.sample.is_empty() && p.mapping.is_empty());
        assert_eq!(p.period, 1_000_000_000);
    }
}
