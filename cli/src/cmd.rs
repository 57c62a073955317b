//! One module per command group, as mini-redis keeps its `cmd/`: receipts, operators,
//! supervisors and keys talk to the authority; runs to the supervisor; audit reads log files;
//! local runs nothing remote; quickstart tours throwaway daemons.

pub(crate) mod approvals;
pub mod audit;
pub(crate) mod copy;
pub(crate) mod doctor;
pub(crate) mod keys;
pub(crate) mod local;
pub(crate) mod operators;
pub(crate) mod pki;
pub(crate) mod profiles;
pub(crate) mod quickstart;
pub(crate) mod receipts;
pub(crate) mod rootfs;
pub(crate) mod runs;
pub(crate) mod supervisors;
