//! The tamper matrix: each edit is caught, at the first bad entry, for the right reason.

use std::fs;

use ed25519_dalek::{Signer as _, SigningKey};
use tollgate_audit::{verify_dir, AuditError, AuditLog, Problem, VerifyOptions};

use crate::common::*;

const LOG1: &str = "log-000001.jsonl";
const CHECKPOINTS: &str = "checkpoints.jsonl";

/// Ten entries in one file, checkpoints at 4, 8 and 10 (close).
fn ten(keyed: bool) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    write_log(dir.path(), keyed, 10, 4, 1 << 20);
    let report = verify_dir(dir.path(), &options(keyed)).unwrap();
    assert_eq!(report.entries, 10);
    assert_eq!(report.checkpoints_checked, 3);
    dir
}

#[test]
fn changed_byte_is_a_hash_mismatch_at_that_entry() {
    let dir = ten(false);
    let path = log_path(dir.path(), 1);
    let mut lines = read_lines(&path);
    lines[4] = lines[4].replace("reason 5", "reason 7");
    write_lines(&path, &lines);
    let problem = assert_broken(
        verify_dir(dir.path(), &options(false)),
        LOG1,
        5,
        Some(5),
        |p| {
            matches!(
                p,
                Problem::HashMismatch {
                    keyed: false,
                    plain_sha256: false
                }
            )
        },
    );
    assert!(problem
        .to_string()
        .contains("if this log is keyed, pass the audit key"));
}

#[test]
fn changed_bytes_with_the_same_value_are_not_canonical() {
    for (from, to) in [
        // Same string value, different escaping.
        ("reason 5", "re\\u0061son 5"),
        // Same object, extra whitespace.
        ("\"seq\":5,", "\"seq\": 5,"),
    ] {
        let dir = ten(false);
        let path = log_path(dir.path(), 1);
        let mut lines = read_lines(&path);
        lines[4] = lines[4].replace(from, to);
        write_lines(&path, &lines);
        assert_broken(
            verify_dir(dir.path(), &options(false)),
            LOG1,
            5,
            None,
            |p| matches!(p, Problem::NotCanonical { .. }),
        );
    }
}

#[test]
fn changed_value_with_hash_recomputed_breaks_the_next_link() {
    let dir = ten(false);
    let path = log_path(dir.path(), 1);
    let mut lines = read_lines(&path);
    lines[4] = rehash(&lines[4].replace("reason 5", "reason X"), None);
    write_lines(&path, &lines);
    assert_broken(
        verify_dir(dir.path(), &options(false)),
        LOG1,
        6,
        Some(6),
        |p| matches!(p, Problem::PrevHashMismatch { .. }),
    );
}

#[test]
fn changed_value_with_whole_unkeyed_chain_recomputed_is_caught_by_checkpoints() {
    let dir = ten(false);
    let path = log_path(dir.path(), 1);
    let mut lines = read_lines(&path);
    lines[4] = lines[4].replace("reason 5", "reason X");
    rechain(&mut lines, 4, None);
    write_lines(&path, &lines);
    // Without a key anyone can rebuild the chain; the signed checkpoint at 8 still catches it.
    assert_broken(
        verify_dir(dir.path(), &options(false)),
        LOG1,
        8,
        Some(8),
        |p| {
            matches!(
                p,
                Problem::CheckpointHeadMismatch {
                    count: 8,
                    checkpoint_line: 2,
                    ..
                }
            )
        },
    );
}

#[test]
fn keyed_chain_rehashed_with_plain_sha256_is_caught_at_the_changed_entry() {
    let dir = ten(true);
    let path = log_path(dir.path(), 1);
    let mut lines = read_lines(&path);
    lines[4] = lines[4].replace("reason 5", "reason X");
    rechain(&mut lines, 4, None);
    write_lines(&path, &lines);
    let problem = assert_broken(
        verify_dir(dir.path(), &options(true)),
        LOG1,
        5,
        Some(5),
        |p| {
            matches!(
                p,
                Problem::HashMismatch {
                    keyed: true,
                    plain_sha256: true
                }
            )
        },
    );
    assert!(problem.to_string().contains("without the key"), "{problem}");
    // A verifier that was not given the key fails at entry 1 and says to pass it.
    let problem = assert_broken(
        verify_dir(dir.path(), &options(false)),
        LOG1,
        1,
        Some(1),
        |p| matches!(p, Problem::HashMismatch { keyed: false, .. }),
    );
    assert!(problem.to_string().contains("pass the audit key"));
}

#[test]
fn keyed_changed_value_with_hmac_recomputed_by_key_holder_is_not_a_hash_mismatch() {
    // Control for the test above: re-hashing with the real key passes the hash check at entry
    // 5, so the keyed verifier's complaint there really is about the missing key.
    let dir = ten(true);
    let path = log_path(dir.path(), 1);
    let mut lines = read_lines(&path);
    lines[4] = rehash(&lines[4].replace("reason 5", "reason X"), Some(&KEY));
    write_lines(&path, &lines);
    assert_broken(
        verify_dir(dir.path(), &options(true)),
        LOG1,
        6,
        Some(6),
        |p| matches!(p, Problem::PrevHashMismatch { .. }),
    );
}

#[test]
fn deleted_entry_is_a_seq_gap() {
    let dir = ten(false);
    let path = log_path(dir.path(), 1);
    let mut lines = read_lines(&path);
    lines.remove(4);
    write_lines(&path, &lines);
    assert_broken(
        verify_dir(dir.path(), &options(false)),
        LOG1,
        5,
        Some(6),
        |p| {
            *p == Problem::SeqGap {
                expected: 5,
                found: 6,
            }
        },
    );
}

#[test]
fn swapped_entries_are_caught_at_the_first_swapped_line() {
    let dir = ten(false);
    let path = log_path(dir.path(), 1);
    let mut lines = read_lines(&path);
    lines.swap(4, 5);
    write_lines(&path, &lines);
    assert_broken(
        verify_dir(dir.path(), &options(false)),
        LOG1,
        5,
        Some(6),
        |p| {
            *p == Problem::SeqGap {
                expected: 5,
                found: 6,
            }
        },
    );
}

#[test]
fn duplicated_entry_is_a_repeated_seq() {
    let dir = ten(false);
    let path = log_path(dir.path(), 1);
    let mut lines = read_lines(&path);
    let copy = lines[4].clone();
    lines.insert(5, copy);
    write_lines(&path, &lines);
    assert_broken(
        verify_dir(dir.path(), &options(false)),
        LOG1,
        6,
        Some(5),
        |p| {
            *p == Problem::SeqRepeated {
                expected: 6,
                found: 5,
            }
        },
    );
}

#[test]
fn truncated_tail_is_caught_by_the_closing_checkpoint_and_refused_by_the_writer() {
    let dir = ten(false);
    let path = log_path(dir.path(), 1);
    let mut lines = read_lines(&path);
    lines.truncate(8);
    write_lines(&path, &lines);
    assert_broken(
        verify_dir(dir.path(), &options(false)),
        CHECKPOINTS,
        3,
        Some(10),
        |p| {
            *p == Problem::CheckpointBeyondEnd {
                count: 10,
                entries: 8,
            }
        },
    );
    match AuditLog::open(config(dir.path(), false)) {
        Err(AuditError::Broken { .. }) => {}
        other => panic!("the writer must refuse a truncated log, got {other:?}"),
    }
}

#[test]
fn truncated_then_appended_by_an_honest_writer_is_a_checkpoint_head_mismatch() {
    let dir = ten(true);
    let path = log_path(dir.path(), 1);
    let mut lines = read_lines(&path);
    lines.truncate(6);
    write_lines(&path, &lines);
    // The forger hides the checkpoints so the writer agrees to open, appends, then puts the
    // old checkpoints back to look untouched.
    let checkpoints = dir.path().join(CHECKPOINTS);
    let saved = dir.path().join("saved-checkpoints");
    fs::rename(&checkpoints, &saved).unwrap();
    let log = AuditLog::open(config(dir.path(), true)).unwrap();
    for i in 7..=12 {
        assert_eq!(log.append(draft(i)).unwrap().seq, i);
    }
    log.close().unwrap();
    fs::rename(&saved, &checkpoints).unwrap();
    assert_broken(
        verify_dir(dir.path(), &options(true)),
        LOG1,
        8,
        Some(8),
        |p| {
            matches!(
                p,
                Problem::CheckpointHeadMismatch {
                    count: 8,
                    checkpoint_line: 2,
                    ..
                }
            )
        },
    );
    // The writer refuses it too (its last checkpoint, 10, does not match entry 10).
    assert!(matches!(
        AuditLog::open(config(dir.path(), true)),
        Err(AuditError::Broken { .. })
    ));
}

/// Ten entries over several small files.
fn rotated() -> (tempfile::TempDir, usize) {
    let dir = tempfile::tempdir().unwrap();
    write_log(dir.path(), false, 10, 4, 1000);
    let report = verify_dir(dir.path(), &options(false)).unwrap();
    assert!(report.files >= 4, "{report:?}");
    (dir, report.files)
}

#[test]
fn removed_rotated_file_is_missing() {
    let (dir, _) = rotated();
    fs::remove_file(log_path(dir.path(), 2)).unwrap();
    assert_broken(
        verify_dir(dir.path(), &options(false)),
        "log-000002.jsonl",
        0,
        None,
        |p| {
            *p == Problem::FileMissing {
                expected: "log-000002.jsonl".into(),
            }
        },
    );
}

#[test]
fn reordered_rotated_files_are_out_of_order() {
    let (dir, _) = rotated();
    let two = log_path(dir.path(), 2);
    let three = log_path(dir.path(), 3);
    let first_of_two = read_lines(&two).len() as u64;
    let first_seq_of_three = read_lines(&log_path(dir.path(), 1)).len() as u64 + first_of_two + 1;
    let temp = dir.path().join("swap");
    fs::rename(&two, &temp).unwrap();
    fs::rename(&three, &two).unwrap();
    fs::rename(&temp, &three).unwrap();
    let expected_seq = read_lines(&log_path(dir.path(), 1)).len() as u64 + 1;
    assert_broken(
        verify_dir(dir.path(), &options(false)),
        "log-000002.jsonl",
        1,
        Some(first_seq_of_three),
        |p| {
            *p == Problem::FileOutOfOrder {
                expected_seq,
                found_seq: first_seq_of_three,
            }
        },
    );
}

#[test]
fn removed_newest_rotated_file_is_truncation() {
    let (dir, files) = rotated();
    fs::remove_file(log_path(dir.path(), files as u64)).unwrap();
    assert_broken(
        verify_dir(dir.path(), &options(false)),
        CHECKPOINTS,
        3,
        Some(10),
        |p| matches!(p, Problem::CheckpointBeyondEnd { count: 10, .. }),
    );
}

fn alter_checkpoint(edit: impl FnOnce(&str) -> String) -> tempfile::TempDir {
    let dir = ten(false);
    let path = dir.path().join(CHECKPOINTS);
    let mut lines = read_lines(&path);
    lines[1] = edit(&lines[1]);
    write_lines(&path, &lines);
    dir
}

#[test]
fn altered_checkpoint_count_head_or_signature_is_a_bad_signature() {
    type Edit = Box<dyn Fn(&str) -> String>;
    let edits: [(&str, Edit, u64); 3] = [
        (
            "count",
            Box::new(|l: &str| l.replace("\"count\":8,", "\"count\":9,")),
            9,
        ),
        (
            "head",
            Box::new(|l: &str| {
                let at = l.find("\"head_hash\":\"").unwrap() + 13;
                let flipped = if &l[at..=at] == "0" { "1" } else { "0" };
                format!("{}{flipped}{}", &l[..at], &l[at + 1..])
            }),
            8,
        ),
        (
            "signature",
            Box::new(|l: &str| {
                let at = l.find("\"signature\":\"").unwrap() + 13;
                let flipped = if &l[at..=at] == "0" { "1" } else { "0" };
                format!("{}{flipped}{}", &l[..at], &l[at + 1..])
            }),
            8,
        ),
    ];
    for (what, edit, seq) in edits {
        let dir = alter_checkpoint(edit);
        let problem = assert_broken(
            verify_dir(dir.path(), &options(false)),
            CHECKPOINTS,
            2,
            Some(seq),
            |p| matches!(p, Problem::CheckpointSignature { .. }),
        );
        eprintln!("{what}: {problem}");
    }
}

#[test]
fn checkpoints_out_of_order_are_refused() {
    let dir = ten(false);
    let path = dir.path().join(CHECKPOINTS);
    let mut lines = read_lines(&path);
    lines.swap(0, 1);
    write_lines(&path, &lines);
    assert_broken(
        verify_dir(dir.path(), &options(false)),
        CHECKPOINTS,
        2,
        None,
        |p| {
            *p == Problem::CheckpointsNotIncreasing {
                previous: 8,
                found: 4,
            }
        },
    );
}

#[test]
fn forged_checkpoints_pass_the_key_beside_the_log_but_not_a_trusted_key() {
    // A forger who can write the directory rebuilds the chain, signs new checkpoints with their
    // own key and replaces checkpoint.pub: only a key from elsewhere catches that.
    let dir = ten(false);
    let path = log_path(dir.path(), 1);
    let mut lines = read_lines(&path);
    lines[4] = lines[4].replace("reason 5", "reason X");
    rechain(&mut lines, 4, None);
    write_lines(&path, &lines);
    let forger = SigningKey::from_bytes(&[99u8; 32]);
    let mut checkpoints = Vec::new();
    for count in [4u64, 8, 10] {
        let head = hash_of(&lines[count as usize - 1]);
        let message = format!("tollgate-audit-checkpoint-v1\nauthority\n{count}\n{head}");
        let signature = hex::encode(forger.sign(message.as_bytes()).to_bytes());
        checkpoints.push(format!(
            "{{\"count\":{count},\"head_hash\":\"{head}\",\"time\":\"2025-01-01T00:00:00.000Z\",\"component\":\"authority\",\"key_id\":\"{KEY_ID}\",\"signature\":\"{signature}\"}}"
        ));
    }
    write_lines(&dir.path().join(CHECKPOINTS), &checkpoints);
    fs::write(
        dir.path().join("checkpoint.pub"),
        format!(
            "{} {KEY_ID}\n",
            hex::encode(forger.verifying_key().as_bytes())
        ),
    )
    .unwrap();

    let report = verify_dir(dir.path(), &options(false)).unwrap();
    assert!(matches!(
        report.checkpoint_trust,
        tollgate_audit::CheckpointTrust::BesideLog(_)
    ));
    let trusted = VerifyOptions {
        key: None,
        trusted_checkpoint_key: Some(signing_key().verifying_key()),
    };
    assert_broken(
        verify_dir(dir.path(), &trusted),
        CHECKPOINTS,
        1,
        Some(4),
        |p| matches!(p, Problem::CheckpointSignature { .. }),
    );
}

#[test]
fn torn_line_in_the_middle_is_an_error() {
    let dir = ten(false);
    let path = log_path(dir.path(), 1);
    let mut lines = read_lines(&path);
    lines[4].truncate(30);
    write_lines(&path, &lines);
    assert_broken(
        verify_dir(dir.path(), &options(false)),
        LOG1,
        5,
        None,
        |p| *p == Problem::TornLine,
    );
    assert!(matches!(
        AuditLog::open(config(dir.path(), false)),
        Err(AuditError::Broken { .. })
    ));
}

#[test]
fn torn_line_at_the_end_of_an_older_file_is_an_error() {
    let (dir, _) = rotated();
    let path = log_path(dir.path(), 1);
    let count = read_lines(&path).len();
    let mut file = fs::OpenOptions::new().append(true).open(&path).unwrap();
    std::io::Write::write_all(&mut file, b"{\"seq\":99,\"ti").unwrap();
    assert_broken(
        verify_dir(dir.path(), &options(false)),
        LOG1,
        count + 1,
        None,
        |p| *p == Problem::TornLine,
    );
}

#[test]
fn unknown_fields_and_floats_are_unparseable() {
    for (from, to) in [
        ("\"metadata\":{", "\"extra\":1,\"metadata\":{"),
        ("\"n\":5", "\"n\":5.0"),
    ] {
        let dir = ten(false);
        let path = log_path(dir.path(), 1);
        let mut lines = read_lines(&path);
        lines[4] = rehash(&lines[4].replace(from, to), None);
        write_lines(&path, &lines);
        assert_broken(
            verify_dir(dir.path(), &options(false)),
            LOG1,
            5,
            None,
            |p| matches!(p, Problem::Unparseable { .. }),
        );
    }
}
