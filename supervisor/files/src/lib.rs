//! Files beneath a granted path — resolved without leaving the grant or following a link,
//! replaced atomically — and the snapshots of what a gateway call changed. The supervisor's
//! gateway changes files through it; `tollgate restore` puts them back through it, so the CLI
//! links this and no sandbox code.

// Audited `unsafe` blocks (open_tree in `beneath`, clone and mount_setattr in `idmap`) are allowed where they stand, each with its
// `// SAFETY:` line.
#![deny(unsafe_code)]

pub mod archive;
pub mod beneath;
pub mod idmap;
pub mod reach;
pub mod snapshot;
