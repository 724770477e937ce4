//! `BPF_MAP_TYPE_TASK_STORAGE` (Linux 5.11 and later for tracing programs): a value
//! kept in the task itself, found from the task pointer without hashing, created on
//! first use and freed with the task. aya-ebpf 0.2.1 defines the other local-storage
//! maps (cgroup, inode, socket) but not this one; this is the same BTF map definition
//! (the kernel wants BTF for the key and value of a local-storage map, which only a
//! `.maps` definition carries).

use core::ptr;

use aya_ebpf::{
    bindings::{BPF_F_NO_PREALLOC, BPF_LOCAL_STORAGE_GET_F_CREATE, task_struct},
    helpers::generated::bpf_task_storage_get,
};

/// A task-storage map of `T` (libbpf's BTF map layout: each field's type encodes one
/// attribute; nothing is stored in it).
#[repr(C)]
pub struct TaskStorage<T> {
    r#type: *const [i32; aya_ebpf::bindings::bpf_map_type::BPF_MAP_TYPE_TASK_STORAGE as usize],
    key: *const i32,
    value: *const T,
    max_entries: *const [i32; 0],
    map_flags: *const [i32; BPF_F_NO_PREALLOC as usize],
}

// SAFETY: the fields are placeholders the loader reads from BTF; never dereferenced.
unsafe impl<T> Sync for TaskStorage<T> {}

impl<T> TaskStorage<T> {
    pub const fn new() -> Self {
        Self {
            r#type: ptr::null(),
            key: ptr::null(),
            value: ptr::null(),
            max_entries: ptr::null(),
            map_flags: ptr::null(),
        }
    }

    #[inline(always)]
    fn get_ptr(&self, task: *mut task_struct, flags: u64) -> Option<*mut T> {
        // SAFETY: `self` is the map; the verifier checks that `task` is a typed task
        // pointer; a null value asks for a zeroed new one.
        let p = unsafe {
            bpf_task_storage_get(
                ptr::from_ref(self).cast_mut().cast(),
                task,
                ptr::null_mut(),
                flags,
            )
        };
        (!p.is_null()).then_some(p.cast())
    }

    /// The task's value, if it has one.
    #[inline(always)]
    pub fn get(&self, task: *mut task_struct) -> Option<*mut T> {
        self.get_ptr(task, 0)
    }

    /// The task's value, created zeroed if it has none (`None`: no memory).
    #[inline(always)]
    pub fn get_or_create(&self, task: *mut task_struct) -> Option<*mut T> {
        self.get_ptr(task, u64::from(BPF_LOCAL_STORAGE_GET_F_CREATE))
    }
}
