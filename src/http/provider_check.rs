//! What on-call's resolutions share when they check the provider before writing: of a
//! payment (`admin::resolve_by_hand`) and of a refund (`refund_resolution`). The provider's
//! id on-call names (`gatewayRef`) and which of the provider's ids a resolution that says
//! the money moved records (`choose`); on-call's reason to overrule the provider
//! (`contraProveedor`), the refusal when the provider contradicts the resolution (409
//! `provider-disagrees`), the 503 when it cannot be asked, and an overrule's words in the
//! audit (in what was asked, `asked_in_words`; in the reason written, `overruled`).

use super::actions;
use super::extract::field_error;
use super::problem::{ApiError, Problem, ProblemType};
use crate::domain::FieldError;
use crate::gateway::GatewayError;
use serde::Serialize;

/// The longest `contraProveedor`, in characters.
pub const MAX_OVERRULE_CHARS: usize = 1000;

/// `contraProveedor` as on-call sent it: none, or the reason trimmed; the field at fault
/// when it is blank or longer than `MAX_OVERRULE_CHARS`.
pub fn overrule(asked: Option<&str>) -> Result<Option<String>, FieldError> {
    match asked.map(str::trim) {
        None => Ok(None),
        Some(why) if why.is_empty() || why.chars().count() > MAX_OVERRULE_CHARS => {
            Err(field_error(
                "contraProveedor",
                "must be 1–1000 characters: why on-call overrules what the provider shows, for the audit trail",
            ))
        }
        Some(why) if why.contains('\0') => Err(field_error(
            "contraProveedor",
            "must not contain the NUL character (\\u0000)",
        )),
        Some(why) => Ok(Some(why.to_owned())),
    }
}

/// `gatewayRef` as on-call sent it: none, or the provider's id trimmed; the field at fault
/// when, trimmed, it is blank or longer than the 255 characters pagos stores (as the
/// provider's own ids are held, `gateway::storable`).
pub fn gateway_ref(asked: Option<&str>) -> Result<Option<&str>, FieldError> {
    match asked.map(str::trim) {
        Some(r)
            if r.is_empty()
                || r.chars().count() > crate::gateway::storable::MAX_GATEWAY_REF_LEN
                || r.contains('\0') =>
        {
            Err(field_error(
                "gatewayRef",
                "must be 1–255 characters, without NUL (\\u0000)",
            ))
        }
        asked => Ok(asked),
    }
}

/// The 422 `validation-failed` of a resolution on-call asked with fields at fault: each
/// listed in `errores`, as the merchant API lists them, and said in `detail` (`estado must
/// be …; motivo is required …`), which the resolution's audit row keeps.
pub fn invalid(errors: Vec<FieldError>) -> ApiError {
    let words = errors
        .iter()
        .map(|e| format!("{} {}", e.campo, e.detalle))
        .collect::<Vec<_>>()
        .join("; ");
    Problem::new(ProblemType::Validation)
        .detail(words)
        .with("errores", errors)
        .into()
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

/// What on-call asked of a resolution, for its row of who asked (`actions::audited`):
/// `what` (`resolve the payment COMPLETADA (charge …)`), the overrule's reason if any,
/// then the motivo, each as `actions::said` cuts it.
pub fn asked_in_words(what: &str, overrule: Option<&str>, motivo: &str) -> String {
    let overruling = overrule
        .map(|why| format!(", overruling the provider ({})", actions::said(why)))
        .unwrap_or_default();
    format!("{what}{overruling}: {}", actions::said(motivo))
}

/// The audit reason of a resolution (`reason`) that overrules the provider, which `which`
/// (`showed …`, `could not be asked (…)`), for on-call's reason `why`.
pub fn overruled(reason: &str, which: &str, why: &str) -> String {
    format!("{reason} [overruling the provider, which {which}: {why}]")
}

/// Which provider id a COMPLETADA (COMPLETADO) resolution records, among the ids of what
/// the provider holds that fits it (`fitting`: its succeeded charges, or refunds, of the
/// right amount and currency). Each resolution says a refusal in its own words.
#[derive(Debug, PartialEq, Eq)]
pub enum Choice<'a> {
    /// This id: the one on-call named (it fits, or on-call overrules), or else the only
    /// one that fits.
    Record(&'a str),
    /// The row's own provider id fits: it stays.
    KeepOwn,
    /// On-call named this id, which does not fit, and does not overrule.
    NamedUnfit(&'a str),
    /// Nothing named, and nothing fits.
    NoneFits,
    /// Nothing named, several fit, and none is the row's own: which one is on-call's to say.
    Several,
}

/// The choice among `fitting` of the id on-call `named` (`gatewayRef`), else of the row's
/// `own` provider id, else of the only one that fits. An `overruled` resolution records
/// the id named even when it does not fit.
pub fn choose<'a>(
    fitting: &[&'a str],
    named: Option<&'a str>,
    own: Option<&str>,
    overruled: bool,
) -> Choice<'a> {
    if let Some(named) = named {
        return if overruled || fitting.contains(&named) {
            Choice::Record(named)
        } else {
            Choice::NamedUnfit(named)
        };
    }
    if fitting.iter().any(|id| Some(*id) == own) {
        return Choice::KeepOwn;
    }
    match fitting {
        [one] => Choice::Record(one),
        [] => Choice::NoneFits,
        _ => Choice::Several,
    }
}

#[cfg(test)]
mod tests {
    use super::{Choice, choose};

    #[test]
    fn the_id_named_is_recorded_when_it_fits_or_on_call_overrules() {
        assert_eq!(
            choose(&["a", "b"], Some("b"), None, false),
            Choice::Record("b")
        );
        assert_eq!(
            choose(&["a"], Some("x"), Some("a"), false),
            Choice::NamedUnfit("x")
        );
        assert_eq!(choose(&[], Some("x"), None, true), Choice::Record("x"));
    }

    #[test]
    fn a_gateway_ref_is_measured_in_characters_once_trimmed() {
        use super::gateway_ref;
        let accented = "é".repeat(255);
        assert_eq!(gateway_ref(Some(&accented)), Ok(Some(accented.as_str())));
        let padded = format!("  {}  ", "c".repeat(255));
        assert_eq!(gateway_ref(Some(&padded)), Ok(Some(padded.trim())));
        for bad in ["c".repeat(256), "   ".to_owned(), "ch\0x".to_owned()] {
            assert!(gateway_ref(Some(&bad)).is_err(), "{bad:?}");
        }
        assert_eq!(gateway_ref(None), Ok(None));
    }

    #[test]
    fn unnamed_the_own_id_stays_else_the_only_one_that_fits() {
        assert_eq!(choose(&["a", "b"], None, Some("b"), false), Choice::KeepOwn);
        assert_eq!(choose(&["a"], None, Some("z"), false), Choice::Record("a"));
        assert_eq!(choose(&[], None, Some("z"), true), Choice::NoneFits);
        assert_eq!(choose(&["a", "b"], None, None, true), Choice::Several);
    }
}
