//! `tollgate-shim`, pid 1 inside each sandbox: reaps children, starts the agent, keeps the
//! gateway link and dies with it. This crate is reserved in the workspace by the foundation
//! issue; its code arrives with the supervisor issue (see docs/architecture.md), so it holds
//! no functionality yet and ships no binary.
#![forbid(unsafe_code)]
