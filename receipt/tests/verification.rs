//! Receipt signing and verification: Wycheproof vectors, tampering, and every typed failure.

use std::collections::HashSet;

use prost::Message as _;
use tollgate_proto::v1 as pb;
use tollgate_receipt::{
    from_text, key_id, parse_envelope, timestamp_from_unix, to_text, verify_ed25519_strict, KeySet,
    NoRevocations, Receipt, ReceiptSigner, ReceiptVerifier, VerifyContext, VerifyFailure,
    SIGNING_DOMAIN,
};

const NOW: i64 = 1_800_000_000;

fn sample_receipt() -> Receipt {
    Receipt {
        receipt_id: uuid::Uuid::now_v7().to_string(),
        issuer: "test-authority".into(),
        owner: "alice".into(),
        subject: "summarizer".into(),
        audience: vec!["workstation".into()],
        issued_at: Some(timestamp_from_unix(NOW)),
        not_before: Some(timestamp_from_unix(NOW)),
        expires_at: Some(timestamp_from_unix(NOW + 600)),
        policy_version: "1".into(),
        limits: Some(pb::Limits {
            memory_bytes: 1 << 29,
            pids: 64,
            cpu_millicores: 1000,
            output_bytes: 5 << 20,
            tmpfs_bytes: 64 << 20,
            tool_calls: 1000,
            tokens: 200_000,
            files: 0,
            ..Default::default()
        }),
        fs: vec![pb::FsGrant {
            path: "/home/me/project".into(),
            access: pb::FsAccess::Read as i32,
            mount: "/project".into(),
            exec: false,
            ask: false,
            ask_reads: false,
        }],
        exec: vec!["/usr/bin/python3".into()],
        ..Default::default()
    }
}

fn verifier_for(signer: &ReceiptSigner) -> ReceiptVerifier {
    let mut keys = KeySet::new();
    keys.insert(signer.public_key());
    ReceiptVerifier::new(keys)
}

fn context(audience: Option<&str>) -> VerifyContext<'_> {
    VerifyContext {
        now: NOW + 1,
        audience,
        revocations: &NoRevocations,
    }
}

#[test]
fn wycheproof_ed25519_vectors() {
    let set = wycheproof::eddsa::TestSet::load(wycheproof::eddsa::TestName::Ed25519).unwrap();
    let mut checked = 0;
    for group in &set.test_groups {
        for test in &group.tests {
            let accepted = verify_ed25519_strict(&group.key.pk, &test.msg, &test.sig);
            match test.result {
                wycheproof::TestResult::Valid => {
                    assert!(
                        accepted,
                        "valid vector {} rejected: {}",
                        test.tc_id, test.comment
                    )
                }
                wycheproof::TestResult::Invalid => assert!(
                    !accepted,
                    "invalid vector {} accepted: {}",
                    test.tc_id, test.comment
                ),
                wycheproof::TestResult::Acceptable => {}
            }
            checked += 1;
        }
    }
    assert!(checked > 100, "only {checked} vectors ran");
}

#[test]
fn signature_follows_the_design_rule() {
    let signer = ReceiptSigner::from_seed(&[7; 32]);
    let mut receipt = sample_receipt();
    let signed = signer.sign(&mut receipt);
    // Re-derive everything from the rule alone.
    let mut message = SIGNING_DOMAIN.to_vec();
    message.extend_from_slice(&signed.receipt);
    assert_eq!(SIGNING_DOMAIN, b"tollgate.receipt.v1\n");
    assert!(verify_ed25519_strict(
        signer.public_key().as_bytes(),
        &message,
        &signed.signature
    ));
    assert!(!verify_ed25519_strict(
        signer.public_key().as_bytes(),
        &signed.receipt,
        &signed.signature
    ));
    use sha2::Digest as _;
    let digest = sha2::Sha256::digest(signer.public_key().as_bytes());
    assert_eq!(signed.key_id, hex::encode(&digest[..8]));
    assert_eq!(signed.key_id, key_id(&signer.public_key()));
    assert_eq!(
        Receipt::decode(signed.receipt.as_slice()).unwrap().key_id,
        signed.key_id
    );
}

#[test]
fn valid_receipt_round_trips_through_text() {
    let signer = ReceiptSigner::generate();
    let signed = signer.sign(&mut sample_receipt());
    let text = to_text(&signed);
    assert!(text.starts_with("tgr1."));
    assert!(!text.contains('=') && !text.contains('+') && !text.contains('/'));
    let parsed = from_text(&format!("  {text}\n")).unwrap();
    assert_eq!(parsed, signed);
    let receipt = verifier_for(&signer)
        .verify(&parsed, &context(Some("workstation")))
        .unwrap();
    assert_eq!(receipt.subject, "summarizer");
}

#[test]
fn every_single_byte_flip_of_the_envelope_is_rejected() {
    let signer = ReceiptSigner::generate();
    let verifier = verifier_for(&signer);
    let bytes = signer.sign(&mut sample_receipt()).encode_to_vec();
    for index in 0..bytes.len() {
        for mask in [0x01u8, 0x80, 0xff] {
            let mut tampered = bytes.clone();
            tampered[index] ^= mask;
            let outcome =
                parse_envelope(&tampered).and_then(|s| verifier.verify(&s, &context(None)));
            assert!(
                outcome.is_err(),
                "flip of byte {index} with mask {mask:#04x} was accepted"
            );
        }
    }
}

#[test]
fn every_character_change_of_the_text_form_is_rejected() {
    let signer = ReceiptSigner::generate();
    let verifier = verifier_for(&signer);
    let text = to_text(&signer.sign(&mut sample_receipt()));
    let alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
    for (index, original) in text.char_indices() {
        // Two substitutes per position keep the test quick but cover every position.
        for substitute in alphabet.chars().filter(|c| *c != original).take(2) {
            let mut tampered = text.clone();
            tampered.replace_range(index..index + 1, &substitute.to_string());
            let outcome = from_text(&tampered).and_then(|s| verifier.verify(&s, &context(None)));
            assert!(
                outcome.is_err(),
                "change at {index} to {substitute} accepted"
            );
        }
    }
}

#[test]
fn each_failure_has_its_own_reason() {
    let signer = ReceiptSigner::generate();
    let verifier = verifier_for(&signer);
    let failure = |signed: &pb::SignedReceipt, ctx: &VerifyContext<'_>| {
        verifier.verify(signed, ctx).unwrap_err().failure()
    };

    // Unknown key: signed by a key the verifier does not trust.
    let stranger = ReceiptSigner::generate().sign(&mut sample_receipt());
    assert_eq!(
        failure(&stranger, &context(None)),
        VerifyFailure::UnknownKey
    );

    // Bad signature: trusted key id, altered receipt bytes.
    let mut altered = signer.sign(&mut sample_receipt());
    let last = altered.receipt.len() - 1;
    altered.receipt[last] ^= 1;
    assert_eq!(
        failure(&altered, &context(None)),
        VerifyFailure::BadSignature
    );

    // Bad signature: a valid signature by another key under this key's id.
    let mut swapped = ReceiptSigner::generate().sign(&mut sample_receipt());
    swapped.key_id = signer.key_id().to_owned();
    assert_eq!(
        failure(&swapped, &context(None)),
        VerifyFailure::BadSignature
    );

    // Malformed: correctly signed bytes that are not a receipt.
    let bytes = b"\xff\xff\xff not protobuf".to_vec();
    let garbage = pb::SignedReceipt {
        signature: sign_raw(&signer, &bytes),
        receipt: bytes,
        key_id: signer.key_id().to_owned(),
    };
    assert_eq!(failure(&garbage, &context(None)), VerifyFailure::Malformed);

    // Malformed: signed receipt without an expiry.
    let mut no_expiry = sample_receipt();
    no_expiry.expires_at = None;
    let signed = signer.sign(&mut no_expiry);
    assert_eq!(failure(&signed, &context(None)), VerifyFailure::Malformed);

    // Malformed: bad text.
    assert_eq!(
        from_text("tgr2.AAAA").unwrap_err().failure(),
        VerifyFailure::Malformed
    );
    assert_eq!(
        from_text("tgr1.!!!").unwrap_err().failure(),
        VerifyFailure::Malformed
    );

    let signed = signer.sign(&mut sample_receipt());
    // Not yet valid and expired, with the skew honoured at both ends.
    let at = |now| VerifyContext {
        now,
        audience: None,
        revocations: &NoRevocations,
    };
    assert_eq!(failure(&signed, &at(NOW - 31)), VerifyFailure::NotYetValid);
    assert!(verifier.verify(&signed, &at(NOW - 29)).is_ok());
    assert!(verifier.verify(&signed, &at(NOW + 600 + 29)).is_ok());
    assert_eq!(
        failure(&signed, &at(NOW + 600 + 30)),
        VerifyFailure::Expired
    );
    let strict = verifier.clone().with_clock_skew(std::time::Duration::ZERO);
    assert_eq!(
        strict
            .verify(&signed, &at(NOW + 600))
            .unwrap_err()
            .failure(),
        VerifyFailure::Expired
    );

    // Wrong audience.
    assert_eq!(
        failure(&signed, &context(Some("laptop"))),
        VerifyFailure::WrongAudience
    );

    // Revoked.
    let receipt_id = Receipt::decode(signed.receipt.as_slice())
        .unwrap()
        .receipt_id;
    let revoked: HashSet<String> = [receipt_id].into();
    let ctx = VerifyContext {
        now: NOW + 1,
        audience: Some("workstation"),
        revocations: &revoked,
    };
    assert_eq!(failure(&signed, &ctx), VerifyFailure::Revoked);
}

#[test]
fn key_set_from_proto_checks_key_ids() {
    let signer = ReceiptSigner::generate();
    let good = pb::KeySet {
        issuer: "a".into(),
        keys: vec![pb::PublicKey {
            key_id: signer.key_id().into(),
            public_key: signer.public_key().as_bytes().to_vec(),
            ..Default::default()
        }],
    };
    assert!(KeySet::from_proto(&good)
        .unwrap()
        .get(signer.key_id())
        .is_some());
    let mut lying = good.clone();
    lying.keys[0].key_id = "0000000000000000".into();
    assert!(KeySet::from_proto(&lying).is_err());
    let mut short = good;
    short.keys[0].public_key.pop();
    assert!(KeySet::from_proto(&short).is_err());
}

fn sign_raw(signer: &ReceiptSigner, bytes: &[u8]) -> Vec<u8> {
    // Sign arbitrary bytes exactly as the signer would sign receipt bytes.
    use ed25519_dalek::Signer as _;
    let key = ed25519_dalek::SigningKey::from_bytes(&signer.seed());
    key.sign(&tollgate_receipt::signing_message(bytes))
        .to_bytes()
        .to_vec()
}
