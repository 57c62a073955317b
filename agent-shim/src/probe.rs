//! `tollgate-shim probe`: what this kernel offers the confinement the shim applies, as one
//! JSON object on stdout, for `tollgate doctor` (which links no sandbox code itself).

use landlock::{Access, AccessFs, CompatLevel, Compatible, Ruleset, RulesetAttr, ABI};

use crate::confine::REQUIRED_LANDLOCK_ABI;

/// The highest Landlock ABI whose file-system rights this kernel enforces, or why none.
fn landlock_abi() -> Result<u32, String> {
    let mut last_error = String::new();
    for (abi, number) in [
        (ABI::V5, 5),
        (ABI::V4, 4),
        (ABI::V3, 3),
        (ABI::V2, 2),
        (ABI::V1, 1),
    ] {
        let created = Ruleset::default()
            .set_compatibility(CompatLevel::HardRequirement)
            .handle_access(AccessFs::from_all(abi))
            .and_then(|ruleset| ruleset.create());
        match created {
            Ok(_) => return Ok(number),
            Err(e) => last_error = e.to_string(),
        }
    }
    Err(last_error)
}

/// Prints the probe's findings; exit status 0.
pub fn main() -> i32 {
    let (abi, error) = match landlock_abi() {
        Ok(abi) => (Some(abi), None),
        Err(e) => (None, Some(e)),
    };
    let required = match REQUIRED_LANDLOCK_ABI {
        ABI::V1 => 1,
        ABI::V2 => 2,
        _ => 3,
    };
    println!(
        "{}",
        serde_json::json!({
            "landlock_abi": abi,
            "landlock_required": required,
            "landlock_error": error,
        })
    );
    0
}
