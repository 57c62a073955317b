//! Receipt admission: the checks a supervisor makes before anything is spawned.

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use tollgate_receipt::{
    KeySet, Receipt, ReceiptVerifier, SignedReceipt, VerifyContext, VerifyError,
};

/// Admits receipts addressed to one supervisor id, signed by trusted keys, inside their
/// validity window (with clock skew) and not revoked.
#[derive(Debug, Clone)]
pub struct ReceiptAdmission {
    supervisor_id: String,
    verifier: ReceiptVerifier,
    revoked: HashSet<String>,
    /// The reason each revocation gave (absent or empty: none given).
    reasons: HashMap<String, String>,
}

impl ReceiptAdmission {
    /// Admission for `supervisor_id` trusting `keys`, tolerating `clock_skew`.
    pub fn new(supervisor_id: impl Into<String>, keys: KeySet, clock_skew: Duration) -> Self {
        Self {
            supervisor_id: supervisor_id.into(),
            verifier: ReceiptVerifier::new(keys).with_clock_skew(clock_skew),
            revoked: HashSet::new(),
            reasons: HashMap::new(),
        }
    }

    /// Records a revocation (from the authority's revocation stream).
    pub fn revoke(&mut self, receipt_id: impl Into<String>, reason: &str) {
        let receipt_id = receipt_id.into();
        if !reason.is_empty() {
            self.reasons.insert(receipt_id.clone(), reason.to_owned());
        }
        self.revoked.insert(receipt_id);
    }

    /// Why a run of `receipt_id` ends when its receipt was revoked: `the receipt was revoked:
    /// <the reason given at revocation>`.
    pub fn revoked_reason(&self, receipt_id: &str) -> String {
        revoked_reason(self.reasons.get(receipt_id).map_or("", String::as_str))
    }

    /// The keys receipts (and amendments) are checked with.
    pub fn keys(&self) -> &KeySet {
        self.verifier.keys()
    }

    /// Whether `receipt_id` has been revoked.
    pub fn is_revoked(&self, receipt_id: &str) -> bool {
        self.revoked.contains(receipt_id)
    }

    /// Takes over the revocations another admission has recorded (when keys are replaced).
    pub fn copy_revocations_from(&mut self, other: &Self) {
        self.revoked.extend(other.revoked.iter().cloned());
        self.reasons.extend(
            other
                .reasons
                .iter()
                .map(|(id, reason)| (id.clone(), reason.clone())),
        );
    }

    /// Verifies `signed` at Unix time `now`: signature, window, audience, revocation.
    pub fn admit(&self, signed: &SignedReceipt, now: i64) -> Result<Receipt, VerifyError> {
        self.verifier.verify(
            signed,
            &VerifyContext {
                now,
                audience: Some(&self.supervisor_id),
                revocations: &self.revoked,
            },
        )
    }
}

/// A revoked run's teardown reason: `the receipt was revoked`, with the revocation's own
/// reason after a colon when one was given.
pub fn revoked_reason(reason: &str) -> String {
    if reason.trim().is_empty() {
        "the receipt was revoked".to_owned()
    } else {
        format!("the receipt was revoked: {reason}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tollgate_receipt::{timestamp_from_unix, ReceiptSigner, VerifyFailure};

    #[test]
    fn admits_only_its_own_unrevoked_receipts() {
        let signer = ReceiptSigner::generate();
        let mut keys = KeySet::new();
        keys.insert(signer.public_key());
        let mut admission = ReceiptAdmission::new("workstation", keys, Duration::from_secs(5));
        let mut receipt = Receipt {
            receipt_id: uuid::Uuid::now_v7().to_string(),
            audience: vec!["workstation".into()],
            not_before: Some(timestamp_from_unix(100)),
            expires_at: Some(timestamp_from_unix(200)),
            ..Default::default()
        };
        let signed = signer.sign(&mut receipt);
        assert!(admission.admit(&signed, 150).is_ok());
        let other =
            ReceiptAdmission::new("laptop", admission.verifier.keys().clone(), Duration::ZERO);
        assert_eq!(
            other.admit(&signed, 150).unwrap_err().failure(),
            VerifyFailure::WrongAudience
        );
        admission.revoke(receipt.receipt_id.clone(), "key leaked");
        assert_eq!(
            admission.revoked_reason(&receipt.receipt_id),
            "the receipt was revoked: key leaked"
        );
        assert_eq!(
            admission.admit(&signed, 150).unwrap_err().failure(),
            VerifyFailure::Revoked
        );
    }
}
