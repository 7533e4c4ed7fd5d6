//! What on-call's resolutions share when they check the provider before writing: of a
//! payment (`admin::resolve_by_hand`) and of a refund (`refund_resolution`). On-call's
//! reason to overrule the provider (`contraProveedor`), the refusal when the provider
//! contradicts the resolution (409 `provider-disagrees`), the 503 when it cannot be asked,
//! and the audit reason of an overrule.

use super::problem::{ApiError, Problem, ProblemType};
use crate::gateway::GatewayError;
use serde::Serialize;

/// The longest `contraProveedor`, in characters.
pub const MAX_OVERRULE_CHARS: usize = 1000;

/// `contraProveedor` as on-call sent it: none, or the reason trimmed; a 422 when it is
/// blank or longer than `MAX_OVERRULE_CHARS`.
pub fn overrule(asked: Option<&str>) -> Result<Option<String>, ApiError> {
    match asked.map(str::trim) {
        None => Ok(None),
        Some(why) if why.is_empty() || why.chars().count() > MAX_OVERRULE_CHARS => {
            Err(Problem::new(ProblemType::Validation)
                .detail("contraProveedor must be 1–1000 characters: why on-call overrules what the provider shows, for the audit trail")
                .into())
        }
        Some(why) => Ok(Some(why.to_owned())),
    }
}

/// The 503 of a look-up that failed (`err`) about this `subject` (`payment`, `refund`):
/// nothing was changed; `then` says what to do.
pub fn unreachable(subject: &str, err: &GatewayError, then: &str) -> ApiError {
    Problem::new(ProblemType::Unavailable)
        .detail(format!(
            "The provider could not be asked about this {subject} ({err}); nothing was changed. {then}"
        ))
        .retry_after(5)
        .into()
}

/// A 409 `provider-disagrees`: `why`, then what the provider shows (`shows`, in words);
/// nothing changed, the `subject` still under review. What was found is listed under
/// `field` (`cargos`, `reembolsos`).
pub fn disagrees(
    why: &str,
    shows: &str,
    subject: &str,
    field: &str,
    found: impl Serialize,
) -> ApiError {
    Problem::new(ProblemType::ProviderDisagrees)
        .detail(format!(
            "{why} The provider shows: {shows}. Nothing was changed: the {subject} is still REVISION_MANUAL."
        ))
        .with(field, found)
        .into()
}

/// The audit reason of a resolution (`reason`) that overrules the provider, which `which`
/// (`showed …`, `could not be asked (…)`), for on-call's reason `why`.
pub fn overruled(reason: &str, which: &str, why: &str) -> String {
    format!("{reason} [overruling the provider, which {which}: {why}]")
}
