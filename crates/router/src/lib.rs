//! The router decides where a model call may go.
//!
//! Today it holds the receipt-side rule every route decision starts from: a route must be
//! granted by the receipt, and the text's sensitivity must not exceed that grant's
//! `max_sensitivity`. The classifier and the HTTP routes arrive with the router issue.
#![forbid(unsafe_code)]

use tollgate_proto::v1 as pb;

/// How sensitive a text is, ordered `Low < Medium < High`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Sensitivity {
    /// Nothing sensitive found.
    Low,
    /// Personal data or internal names.
    Medium,
    /// Secrets and credentials.
    High,
}

impl Sensitivity {
    /// From the protocol enum; `None` for UNSPECIFIED or unknown values.
    pub fn from_proto(value: i32) -> Option<Self> {
        match pb::Sensitivity::try_from(value) {
            Ok(pb::Sensitivity::Low) => Some(Self::Low),
            Ok(pb::Sensitivity::Medium) => Some(Self::Medium),
            Ok(pb::Sensitivity::High) => Some(Self::High),
            _ => None,
        }
    }

    /// Lowercase name.
    pub fn name(self) -> &'static str {
        match self {
            Self::Low => "low",
            Self::Medium => "medium",
            Self::High => "high",
        }
    }
}

/// Why a route may not carry a text.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RouteDenied {
    /// The receipt does not grant the route at all.
    #[error("route {route:?} is not granted by receipt {receipt_id}")]
    NotGranted {
        /// The receipt.
        receipt_id: String,
        /// The route asked for.
        route: String,
    },
    /// The route is granted, but only for less sensitive text.
    #[error("route {route:?} may carry {allowed} text under receipt {receipt_id}, this text is {actual}")]
    TooSensitive {
        /// The receipt.
        receipt_id: String,
        /// The route asked for.
        route: String,
        /// The grant's ceiling.
        allowed: &'static str,
        /// The text's sensitivity.
        actual: &'static str,
    },
}

/// Whether `receipt` lets `route` carry text of `sensitivity`.
pub fn check_route(
    receipt: &pb::Receipt,
    route: &str,
    sensitivity: Sensitivity,
) -> Result<(), RouteDenied> {
    let grant = receipt
        .routes
        .iter()
        .find(|g| g.name == route)
        .ok_or_else(|| RouteDenied::NotGranted {
            receipt_id: receipt.receipt_id.clone(),
            route: route.to_owned(),
        })?;
    // An unspecified grant carries nothing: fail closed.
    match Sensitivity::from_proto(grant.max_sensitivity) {
        Some(allowed) if sensitivity <= allowed => Ok(()),
        allowed => Err(RouteDenied::TooSensitive {
            receipt_id: receipt.receipt_id.clone(),
            route: route.to_owned(),
            allowed: allowed.map_or("no", Sensitivity::name),
            actual: sensitivity.name(),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn receipt() -> pb::Receipt {
        pb::Receipt {
            receipt_id: "r1".into(),
            routes: vec![
                pb::RouteGrant {
                    name: "local".into(),
                    max_sensitivity: pb::Sensitivity::High as i32,
                },
                pb::RouteGrant {
                    name: "claude".into(),
                    max_sensitivity: pb::Sensitivity::Low as i32,
                },
                pb::RouteGrant {
                    name: "broken".into(),
                    max_sensitivity: 0,
                },
            ],
            ..Default::default()
        }
    }

    #[test]
    fn granted_routes_carry_up_to_their_sensitivity() {
        let r = receipt();
        assert!(check_route(&r, "local", Sensitivity::High).is_ok());
        assert!(check_route(&r, "claude", Sensitivity::Low).is_ok());
        assert!(matches!(
            check_route(&r, "claude", Sensitivity::Medium),
            Err(RouteDenied::TooSensitive { .. })
        ));
        assert!(matches!(
            check_route(&r, "openai", Sensitivity::Low),
            Err(RouteDenied::NotGranted { .. })
        ));
        assert!(check_route(&r, "broken", Sensitivity::Low).is_err());
    }
}
