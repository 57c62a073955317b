//! Signed amendments: an authority's widening of one live run (more gateway fs grants, a
//! bigger tool-call budget, a later expiry), signed like a receipt but under its own domain,
//! so a receipt signature never verifies as an amendment's or the reverse. The rules here are
//! the ones the authority applies before it signs and every supervisor applies again before it
//! changes a run.

use ed25519_dalek::Signer as _;
use prost::Message as _;

use crate::{verify_ed25519_strict, KeySet, ReceiptSigner};
use tollgate_proto::v1::{Amendment, FsGrant, Receipt, SignedAmendment};

/// Domain-separation prefix signed in front of every amendment's bytes.
pub const AMENDMENT_DOMAIN: &[u8] = b"tollgate.amendment.v1\n";

/// How old an amendment a supervisor still applies (seconds since it was minted).
pub const MAX_AMENDMENT_AGE: i64 = 300;

/// Most fs grants one amendment adds.
pub const MAX_ADDED_GRANTS: usize = 16;

/// Why an amendment is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AmendmentError {
    /// No trusted key has this id.
    #[error("amendment signed by unknown key {0}")]
    UnknownKey(String),
    /// The signature does not verify.
    #[error("amendment signature does not verify under key {0}")]
    BadSignature(String),
    /// The signed bytes are not an amendment, or say another key signed them.
    #[error("malformed amendment: {0}")]
    Malformed(String),
    /// It widens another receipt than this run's.
    #[error("amendment is for receipt {amended}, not this run's {run}")]
    OtherRun {
        /// The receipt it names.
        amended: String,
        /// The run's receipt.
        run: String,
    },
    /// Minted too long ago (or in the future).
    #[error("amendment minted at {} is not fresh (at most {MAX_AMENDMENT_AGE} s old); ask the authority for a new one", crate::rfc3339(*issued_at))]
    Stale {
        /// When it says it was minted.
        issued_at: i64,
    },
    /// It would do something an amendment may not (a mount, a lower budget, an earlier expiry).
    #[error("{field}: {reason}")]
    NotAWidening {
        /// The field at fault.
        field: String,
        /// Why.
        reason: String,
    },
}

/// The exact bytes an amendment signature covers.
pub fn amendment_signing_message(amendment_bytes: &[u8]) -> Vec<u8> {
    let mut message = Vec::with_capacity(AMENDMENT_DOMAIN.len() + amendment_bytes.len());
    message.extend_from_slice(AMENDMENT_DOMAIN);
    message.extend_from_slice(amendment_bytes);
    message
}

impl ReceiptSigner {
    /// Sets `amendment.key_id` to this key's id and signs its encoding.
    pub fn sign_amendment(&self, amendment: &mut Amendment) -> SignedAmendment {
        amendment.key_id = self.key_id().to_owned();
        let bytes = amendment.encode_to_vec();
        let signature = self.signing_key().sign(&amendment_signing_message(&bytes));
        SignedAmendment {
            amendment: bytes,
            key_id: self.key_id().to_owned(),
            signature: signature.to_bytes().to_vec(),
        }
    }
}

/// Checks `signed`'s signature against `keys` and decodes it.
pub fn verify_amendment(
    keys: &KeySet,
    signed: &SignedAmendment,
) -> Result<Amendment, AmendmentError> {
    let key = keys
        .get(&signed.key_id)
        .ok_or_else(|| AmendmentError::UnknownKey(signed.key_id.clone()))?;
    if !verify_ed25519_strict(
        key.as_bytes(),
        &amendment_signing_message(&signed.amendment),
        &signed.signature,
    ) {
        return Err(AmendmentError::BadSignature(signed.key_id.clone()));
    }
    let amendment = Amendment::decode(signed.amendment.as_slice()).map_err(|e| {
        AmendmentError::Malformed(format!("signed bytes are not an Amendment: {e}"))
    })?;
    if amendment.key_id != signed.key_id {
        return Err(AmendmentError::Malformed(format!(
            "key_id {:?} inside, {:?} outside",
            amendment.key_id, signed.key_id
        )));
    }
    Ok(amendment)
}

/// Whether `amendment` only widens `receipt`'s gateway envelope as an amendment may, and is
/// fresh at `now`: gateway-only fs grants (no mount, no exec) and programs, budgets no lower,
/// an expiry no earlier than the receipt's.
pub fn check_widening(
    receipt: &Receipt,
    amendment: &Amendment,
    now: i64,
) -> Result<(), AmendmentError> {
    if amendment.receipt_id != receipt.receipt_id {
        return Err(AmendmentError::OtherRun {
            amended: amendment.receipt_id.clone(),
            run: receipt.receipt_id.clone(),
        });
    }
    check_amendable(receipt)?;
    let issued_at = amendment.issued_at.as_ref().map_or(0, |t| t.seconds);
    if now - issued_at > MAX_AMENDMENT_AGE || issued_at - now > 30 {
        return Err(AmendmentError::Stale { issued_at });
    }
    check_added_grants(&amendment.add_fs)?;
    check_amended_grants(receipt, &amendment.add_fs)?;
    check_added_programs(receipt, &amendment.add_gateway_exec)?;
    let limits = receipt.limits.unwrap_or_default();
    for (field, asked, budget) in [
        ("tool_calls", amendment.tool_calls, limits.tool_calls),
        ("tokens", amendment.tokens, limits.tokens),
        ("output_bytes", amendment.output_bytes, limits.output_bytes),
        (
            "egress_bytes",
            amendment.egress_bytes,
            tollgate_proto::effective_egress(&limits).1,
        ),
    ] {
        if asked != 0 && asked < budget {
            return Err(AmendmentError::NotAWidening {
                field: field.into(),
                reason: format!(
                    "{asked} is below the receipt's {budget}; narrowing needs no amendment"
                ),
            });
        }
    }
    let expiry = receipt.expires_at.as_ref().map_or(0, |t| t.seconds);
    if let Some(new) = &amendment.expires_at {
        if new.seconds < expiry {
            return Err(AmendmentError::NotAWidening {
                field: "expires_at".into(),
                reason: format!(
                    "{} is before the receipt's expiry ({}); narrowing needs no amendment",
                    crate::rfc3339(new.seconds),
                    crate::rfc3339(expiry)
                ),
            });
        }
    }
    Ok(())
}

/// Whether `receipt` may be amended at all: not a delegated child's (its powers come from its
/// parent's receipt, and an amendment to it would reach past its parent).
pub fn check_amendable(receipt: &Receipt) -> Result<(), AmendmentError> {
    if receipt.parent_receipt_id.is_empty() {
        Ok(())
    } else {
        Err(AmendmentError::NotAWidening {
            field: "receipt_id".into(),
            reason: format!(
                "receipt {} is a delegated child's (of {}): amend its parent's run instead",
                receipt.receipt_id, receipt.parent_receipt_id
            ),
        })
    }
}

/// The programs an amendment lets the exec tool run, only through the gateway: at most
/// [`MAX_ADDED_GRANTS`], and with the receipt's own the rule a mint applies (each can run in
/// the sandbox, none in its exec list, none twice).
pub fn check_added_programs(
    receipt: &Receipt,
    add: &[tollgate_proto::v1::GatewayExecGrant],
) -> Result<(), AmendmentError> {
    if add.len() > MAX_ADDED_GRANTS {
        return Err(AmendmentError::NotAWidening {
            field: "add_gateway_exec".into(),
            reason: format!("at most {MAX_ADDED_GRANTS} programs an amendment"),
        });
    }
    let combined: Vec<_> = receipt.gateway_exec.iter().chain(add).cloned().collect();
    crate::paths::check_gateway_exec(&combined, &receipt.fs, &receipt.exec).map_err(|e| {
        AmendmentError::NotAWidening {
            field: format!(
                "add_gateway_exec[{}]",
                e.index.saturating_sub(receipt.gateway_exec.len())
            ),
            reason: e.to_string(),
        }
    })
}

/// Most amendments for children a delegation request carries.
pub const MAX_CHILD_AMENDMENTS: usize = 64;

/// `receipt` as the amendments for its children among `amendments` widen it: what a
/// delegated child of the run is checked against (grants, tool-call budget, expiry). An
/// amendment of another receipt, or one not for children, changes nothing: children never
/// gain what an amendment gives their parent unless it says so.
pub fn widened_for_children(receipt: &Receipt, amendments: &[Amendment]) -> Receipt {
    let mut widened = receipt.clone();
    for amendment in amendments
        .iter()
        .filter(|a| a.for_children && a.receipt_id == receipt.receipt_id)
    {
        for grant in &amendment.add_fs {
            if !widened.fs.contains(grant) {
                widened.fs.push(grant.clone());
            }
        }
        for grant in &amendment.add_gateway_exec {
            if !widened.gateway_exec.contains(grant) {
                widened.gateway_exec.push(grant.clone());
            }
        }
        let limits = widened.limits.get_or_insert_with(Default::default);
        limits.tool_calls = limits.tool_calls.max(amendment.tool_calls);
        limits.tokens = limits.tokens.max(amendment.tokens);
        limits.output_bytes = limits.output_bytes.max(amendment.output_bytes);
        if amendment.egress_bytes != 0 {
            limits.egress_bytes = tollgate_proto::effective_egress(limits)
                .1
                .max(amendment.egress_bytes);
        }
        if let Some(new) = &amendment.expires_at {
            if widened
                .expires_at
                .as_ref()
                .is_none_or(|old| new.seconds > old.seconds)
            {
                widened.expires_at = Some(*new);
            }
        }
    }
    widened
}

/// The run as amended keeps the rules a mint applies: W^X (no added WRITE grant reaches what
/// one of the receipt's executable grants or its root file system shows, by path), and an
/// added grant that asks is reached by no mount the kernel would let the agent use instead
/// (a WRITE mount for changes, any mount for reads).
pub fn check_amended_grants(receipt: &Receipt, add_fs: &[FsGrant]) -> Result<(), AmendmentError> {
    let combined: Vec<FsGrant> = receipt.fs.iter().chain(add_fs).cloned().collect();
    let refuse = |reason: String| AmendmentError::NotAWidening {
        field: "add_fs".into(),
        reason,
    };
    crate::paths::check_mounts(&combined).map_err(|e| refuse(e.to_string()))?;
    crate::paths::check_exec_grants(&combined, &receipt.exec).map_err(|e| {
        refuse(format!(
            "{e} (W^X: the agent could write a program it runs)"
        ))
    })?;
    crate::paths::Rootfs::parse(&receipt.rootfs, &combined).map_err(|e| {
        refuse(format!(
            "{e} (W^X: the agent could write a program it runs)"
        ))
    })?;
    Ok(())
}

/// An amendment's grants reach files through the gateway only: no mount (the kernel envelope
/// is never widened on a live run), no exec, an absolute normalised path, read or write; at
/// most [`MAX_ADDED_GRANTS`].
pub fn check_added_grants(add_fs: &[FsGrant]) -> Result<(), AmendmentError> {
    if add_fs.len() > MAX_ADDED_GRANTS {
        return Err(AmendmentError::NotAWidening {
            field: "add_fs".into(),
            reason: format!("at most {MAX_ADDED_GRANTS} grants an amendment"),
        });
    }
    for (i, grant) in add_fs.iter().enumerate() {
        let field = format!("add_fs[{i}]");
        if !grant.mount.is_empty() || grant.exec {
            return Err(AmendmentError::NotAWidening {
                field,
                reason: "an amendment adds gateway-only grants: a mount (or exec) would widen the kernel envelope of a live run; start a new run with a new receipt".into(),
            });
        }
        if !crate::paths::is_normal_absolute(&grant.path) {
            return Err(AmendmentError::NotAWidening {
                field,
                reason: format!("{:?} must be an absolute, normalised host path", grant.path),
            });
        }
        if !matches!(grant.access, 1 | 2) {
            return Err(AmendmentError::NotAWidening {
                field,
                reason: "access must be READ or WRITE".into(),
            });
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{signing_message, timestamp_from_unix};
    use tollgate_proto::v1 as pb;

    fn receipt() -> Receipt {
        Receipt {
            receipt_id: "r1".into(),
            expires_at: Some(timestamp_from_unix(1_000)),
            limits: Some(pb::Limits {
                tool_calls: 10,
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    fn amendment() -> Amendment {
        Amendment {
            receipt_id: "r1".into(),
            issued_at: Some(timestamp_from_unix(500)),
            tool_calls: 20,
            expires_at: Some(timestamp_from_unix(2_000)),
            add_fs: vec![FsGrant {
                path: "/srv/more".into(),
                access: pb::FsAccess::Write as i32,
                ..Default::default()
            }],
            ..Default::default()
        }
    }

    #[test]
    fn only_a_signed_amendment_under_its_own_domain_verifies() {
        let signer = ReceiptSigner::from_seed(&[5; 32]);
        let mut keys = KeySet::new();
        keys.insert(signer.public_key());
        let signed = signer.sign_amendment(&mut amendment());
        assert_eq!(verify_amendment(&keys, &signed).unwrap().tool_calls, 20);
        // Tampered bytes, a foreign key, a receipt's signing domain: all refused.
        let mut tampered = signed.clone();
        tampered.amendment[3] ^= 1;
        assert!(matches!(
            verify_amendment(&keys, &tampered),
            Err(AmendmentError::BadSignature(_) | AmendmentError::Malformed(_))
        ));
        let stranger = ReceiptSigner::from_seed(&[6; 32]).sign_amendment(&mut amendment());
        assert!(matches!(
            verify_amendment(&keys, &stranger),
            Err(AmendmentError::UnknownKey(_))
        ));
        let as_receipt = SignedAmendment {
            signature: signer
                .signing_key()
                .sign(&signing_message(&signed.amendment))
                .to_bytes()
                .to_vec(),
            ..signed
        };
        assert!(matches!(
            verify_amendment(&keys, &as_receipt),
            Err(AmendmentError::BadSignature(_))
        ));
    }

    #[test]
    fn an_amendment_only_widens_its_own_run_and_only_through_the_gateway() {
        assert_eq!(check_widening(&receipt(), &amendment(), 600), Ok(()));
        let other = Amendment {
            receipt_id: "r2".into(),
            ..amendment()
        };
        assert!(matches!(
            check_widening(&receipt(), &other, 600),
            Err(AmendmentError::OtherRun { .. })
        ));
        assert!(matches!(
            check_widening(&receipt(), &amendment(), 900),
            Err(AmendmentError::Stale { .. })
        ));
        let mut mounted = amendment();
        mounted.add_fs[0].mount = "/more".into();
        assert!(matches!(
            check_widening(&receipt(), &mounted, 600),
            Err(AmendmentError::NotAWidening { .. })
        ));
        let lower = Amendment {
            tool_calls: 5,
            ..amendment()
        };
        assert!(check_widening(&receipt(), &lower, 600).is_err());
        let earlier = Amendment {
            expires_at: Some(timestamp_from_unix(900)),
            ..amendment()
        };
        assert!(check_widening(&receipt(), &earlier, 600).is_err());
    }

    #[test]
    fn no_amendment_reaches_a_child_breaks_w_x_or_adds_too_much() {
        let child = Receipt {
            parent_receipt_id: "r0".into(),
            ..receipt()
        };
        assert!(check_widening(&child, &amendment(), 600).is_err());
        // The receipt runs programs from /opt/tools: no write may be added over them.
        let tools = Receipt {
            fs: vec![FsGrant {
                path: "/opt/tools".into(),
                access: pb::FsAccess::Read as i32,
                mount: "/tools".into(),
                exec: true,
                ..Default::default()
            }],
            exec: vec!["/tools/bin/run".into()],
            ..receipt()
        };
        for path in ["/opt/tools", "/opt/tools/bin", "/opt"] {
            let mut over = amendment();
            over.add_fs[0].path = path.into();
            assert!(
                matches!(
                    check_widening(&tools, &over, 600),
                    Err(AmendmentError::NotAWidening { .. })
                ),
                "{path}"
            );
        }
        assert_eq!(check_widening(&tools, &amendment(), 600), Ok(()));
        let many = Amendment {
            add_fs: vec![amendment().add_fs[0].clone(); MAX_ADDED_GRANTS + 1],
            ..amendment()
        };
        assert!(check_widening(&receipt(), &many, 600).is_err());
    }

    #[test]
    fn children_are_checked_against_only_the_amendments_for_them() {
        let plain = amendment();
        let other_run = Amendment {
            receipt_id: "r2".into(),
            for_children: true,
            ..amendment()
        };
        assert_eq!(
            widened_for_children(&receipt(), &[plain.clone(), other_run]),
            receipt(),
            "an amendment not for children, or of another run, changes nothing"
        );
        let for_children = Amendment {
            for_children: true,
            ..plain
        };
        let widened = widened_for_children(&receipt(), &[for_children.clone(), for_children]);
        assert_eq!(widened.fs.len(), 1, "each grant once");
        assert_eq!(widened.limits.unwrap().tool_calls, 20);
        assert_eq!(widened.expires_at.unwrap().seconds, 2_000);
    }

    #[test]
    fn programs_and_budgets_widen_only() {
        let mut r = receipt();
        r.exec = vec!["/bin/sh".into()];
        let program = |p: &str| pb::GatewayExecGrant {
            program: p.into(),
            ask: false,
        };
        let ok = Amendment {
            add_gateway_exec: vec![program("/usr/bin/git")],
            tokens: 1_000,
            ..amendment()
        };
        check_widening(&r, &ok, 600).unwrap();
        for (bad, field) in [
            (
                Amendment {
                    add_gateway_exec: vec![program("/bin/sh")],
                    ..amendment()
                },
                "add_gateway_exec[0]",
            ),
            (
                Amendment {
                    add_gateway_exec: vec![program("/work/tool")],
                    ..amendment()
                },
                "add_gateway_exec[0]",
            ),
            (
                Amendment {
                    output_bytes: 1,
                    ..amendment()
                },
                "output_bytes",
            ),
        ] {
            match check_widening(
                &Receipt {
                    limits: Some(pb::Limits {
                        output_bytes: 1 << 20,
                        ..r.limits.unwrap()
                    }),
                    ..r.clone()
                },
                &bad,
                600,
            ) {
                Err(AmendmentError::NotAWidening { field: f, .. }) => assert_eq!(f, field),
                other => panic!("{field}: {other:?}"),
            }
        }
    }
}
