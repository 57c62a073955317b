//! The supervisor turns one receipt into one sandbox. This crate starts with receipt
//! admission, the first step of every run; sandboxing, the daemon and teardown arrive with
//! the supervisor issue.

#![forbid(unsafe_code)]

pub mod admission;
pub mod cgroup;
