//! Library target of the eBPF crate: empty on purpose. `sframe-user` lists this crate as a
//! build dependency so that cargo re-runs its build script (which builds the BPF binary
//! through aya-build) whenever this crate or `sframe-common` changes.
#![no_std]
