//! Tollgate's tamper-evident, append-only audit log.
//!
//! Every Tollgate daemon appends what it decided and did to a log under `<data-dir>/audit/`.
//! Each entry carries the hash of the one before it (optionally keyed with HMAC), and a signed
//! checkpoint of (entry count, head hash) is written beside the log, so a verifier catches
//! edited, reordered, inserted or deleted entries, and truncation up to the last checkpoint.
//! Entries carry metadata (ids, decisions, reasons), never secrets or file contents; a
//! [`Redactor`] scrubs free text before it is hashed.
//!
//! # On disk
//!
//! ```text
//! <dir>/                       mode 0700
//!   log-000001.jsonl           mode 0600, one entry per line, at most max_file_bytes
//!   log-000002.jsonl           the chain continues across files
//!   checkpoints.jsonl          one signed checkpoint per line
//!   checkpoint.pub             "<hex Ed25519 public key> <key id>" per line
//!   log-000002.jsonl.torn-<unix-seconds>   bytes of a torn final line, moved aside on recovery
//! ```
//!
//! Files are numbered from 1 without gaps; a file is started ("rotated") before the append that
//! would take the current one past `max_file_bytes` (default 10 MiB). The next file's first
//! entry continues the chain of the previous file's last entry.
//!
//! # Entries
//!
//! One JSON object per line (terminated by `\n`), with exactly these fields in this order:
//!
//! ```json
//! {"seq":1,"time":"2025-01-02T03:04:05.678Z","component":"authority","kind":"receipt_minted",
//!  "receipt_id":"0190…","run_id":null,"call_id":null,"decision":"allow","reason":null,
//!  "metadata":{"subject":"summarizer","ttl_seconds":600},
//!  "prev_hash":"0000…0000","hash":"9f2c…"}
//! ```
//!
//! (shown wrapped; on disk it is one line.)
//!
//! * `seq` counts from 1 without gaps; `time` is RFC 3339 UTC with milliseconds.
//! * `kind` is one of [`EntryKind`]'s snake_case names; `decision` is `"allow"`, `"deny"` or
//!   `null`; the ids and `reason` are strings or `null`.
//! * `metadata` is an object with keys sorted bytewise; values are strings, integers (i64),
//!   booleans, `null`, or arrays of those. There are no floats and no nested objects, so the
//!   bytes of an entry are a function of its value.
//! * Serialization is compact JSON as `serde_json` writes it: no whitespace, non-ASCII as raw
//!   UTF-8; only `"` and `\` and the characters below U+0020 are escaped, as `\"`, `\\`,
//!   `\b`, `\f`, `\n`, `\r`, `\t` or else `\u00xx` (lowercase hex). Hashes are lowercase hex.
//! * A line is valid only if it is byte for byte the canonical serialization of what it parses
//!   to, so a changed byte is caught even where it would parse to the same value.
//!
//! # Hashing rule
//!
//! ```text
//! body = the canonical line without its "hash" field: {"seq":…, …, "prev_hash":"…"}
//! hash = hex(SHA-256("tollgate-audit-entry-v1\n" || body))               without a key
//! hash = hex(HMAC-SHA-256(key, "tollgate-audit-entry-v1\n" || body))     with an audit key
//! ```
//!
//! `prev_hash` of entry 1 is 64 zeros; every later entry's `prev_hash` is the previous entry's
//! `hash`. Which algorithm was used is not recorded: the verifier is told whether a key is in use.
//! Without a key the chain proves order and integrity against accidents and against anyone who
//! cannot rewrite the whole tail; with a key (see [`AuditKey`]) nobody without it can forge or
//! re-hash entries, and a keyed verifier rejects entries re-hashed with plain SHA-256.
//!
//! # Checkpoints
//!
//! Once `checkpoint_every` entries (default 1000) have been appended since the last checkpoint
//! (at the next fsync, so counts need not be exact multiples), once the oldest entry no
//! checkpoint covers is `checkpoint_interval` old (default 10 s; so a crash loses truncation
//! detection for at most that window, however quiet the log), and at [`AuditLog::close`], a
//! line is appended to `checkpoints.jsonl` and fsynced:
//!
//! ```json
//! {"count":1000,"head_hash":"…","time":"…","component":"authority","key_id":"…","signature":"…"}
//! ```
//!
//! The line is canonical JSON like an entry, with lowercase hex; `key_id` is the id the writer
//! was given for its checkpoint key (listed with the key in `checkpoint.pub`). `signature` is
//! hex Ed25519 over
//! `"tollgate-audit-checkpoint-v1\n" || component || "\n" || decimal(count) || "\n" || head_hash`,
//! domain-separated from receipt signatures. The verifier checks every checkpoint's signature,
//! that counts strictly increase, and that the entry with `seq == count` exists and has hash
//! `head_hash`. That catches truncation (a checkpoint beyond the end of the log) and truncation
//! followed by fresh appends (a checkpoint whose head no longer matches). By default the verifier
//! trusts `checkpoint.pub` beside the log, which proves consistency only; pass the public key
//! from a trusted place ([`VerifyOptions::trusted_checkpoint_key`]) to prove authenticity.
//! Entries after the last checkpoint can be cut off without detection, and so can the last
//! checkpoints themselves: ship checkpoints off the host for a stronger bound.
//!
//! # Durability and what a crash may lose
//!
//! One writer thread owns the files. With [`Durability::EveryEntry`] (the default),
//! [`AuditLog::append`] returns only after the entry is written and the file fsynced; the writer
//! drains everything queued, writes it, fsyncs once and acknowledges the whole group. No crash,
//! of the process or of the machine, loses an acknowledged entry.
//!
//! With [`Durability::Batched`], `append` returns once the entry is queued (its `seq` and `hash`
//! are already fixed) and the writer fsyncs at least every `max_delay`. A process crash loses
//! what was still queued (the writer writes continuously, so normally just the group in hand);
//! an operating-system crash or power loss loses at most what was appended in the last
//! `max_delay` plus however long the write and fsync in progress take (a stalled disk stretches
//! this, and the queue is unbounded meanwhile). [`AuditLog::flush`] waits until everything
//! appended so far is durable. Either way a crash never leaves a gap or a broken chain: what
//! survives is a prefix of the log, possibly with a torn last line.
//!
//! New files are created with their directory fsynced, checkpoints are fsynced, and a checkpoint
//! is only ever written for entries already fsynced, so a crash never leaves a checkpoint ahead
//! of the log.
//!
//! # Recovery
//!
//! Opening an existing directory checks the newest file line by line (and its link to the last
//! entry of the file before) with the configured key, and refuses to append onto a chain that
//! does not verify there or that the last checkpoint says was truncated or rewritten. Older files
//! are not re-read at every start: [`verify_dir`] checks the whole log. A torn final line (no trailing newline, or not JSON) is not
//! dropped silently: its bytes are moved to `<file>.torn-<unix-seconds>`, the file is truncated
//! to its last complete entry and fsynced, and a `log_recovered` entry records `torn_bytes`,
//! `torn_sha256`, `torn_file` and `log_file`.
//!
//! # Single writer
//!
//! One [`AuditLog`] per directory: a second open in the same process is refused, and across
//! processes the owning daemon's data-directory lock keeps a second writer out.
#![forbid(unsafe_code)]

mod bound;
mod checkpoint;
mod component;
mod config;
mod draft;
mod entry;
mod error;
mod files;
mod key;
mod kind;
mod log;
mod meta;
mod problem;
mod queue;
mod read;
mod recovery;
mod registration;
mod time;
mod verify;
mod writer;

pub use bound::{
    MAX_ENTRY_BYTES, MAX_FIELD_BYTES, MAX_ID_BYTES, MAX_LIST_ITEMS, TRUNCATION_MARKER,
};
pub use checkpoint::CHECKPOINT_SIGNING_DOMAIN;
pub use component::{
    checkpoint_key_id, checkpoint_key_path, component_config, load_or_create_checkpoint_key,
    log_dir,
};
pub use config::{
    AuditConfig, Durability, DEFAULT_CHECKPOINT_EVERY, DEFAULT_CHECKPOINT_INTERVAL,
    DEFAULT_MAX_FILE_BYTES,
};
pub use draft::{EntryDraft, Redactor};
pub use entry::{Entry, ENTRY_HASH_DOMAIN, GENESIS_HASH};
pub use error::AuditError;
pub use files::{ensure_private_dir, PrivateDirError};
pub use key::{AuditKey, AUDIT_KEY_ENV};
pub use kind::{Decision, EntryKind};
pub use log::{AppendObserver, Appended, AuditLog, PendingEntry};
pub use meta::{MetaScalar, MetaValue, Metadata};
pub use problem::{Problem, VerifyError};
pub use queue::RECORD_MAX_DELAY;
pub use read::{read_entries, AuditReader, EntryFilter};
pub use verify::{
    verify_dir, CheckpointTrust, RecoveredTail, TornTail, VerifyOptions, VerifyReport,
};
