//! Where a payment stands: the five states of the contract's `estado`.
//!
//! Only the names and their spelling live here; which moves between them are legal is the
//! server's state machine (`pagos::saga::state::transition`).

#[cfg(feature = "sea-orm")]
use sea_orm::entity::prelude::StringLen;
use serde::{Deserialize, Serialize};
use std::fmt;
use std::str::FromStr;

/// Where a payment stands. The names are the contract's (`estado`).
///
/// With the `sea-orm` feature (the server's), an entity column of this type is stored as
/// the same contract name, in a text column (`payments.state`, the audit trail's states).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[cfg_attr(
    feature = "sea-orm",
    derive(sea_orm::EnumIter, sea_orm::DeriveActiveEnum),
    sea_orm(rs_type = "String", db_type = "String(StringLen::N(20))")
)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum PaymentState {
    /// Registered, never sent to the gateway.
    #[cfg_attr(feature = "sea-orm", sea_orm(string_value = "EN_PROCESO"))]
    EnProceso,
    /// Maybe sent: after a crash, ask the provider before anything else.
    #[cfg_attr(feature = "sea-orm", sea_orm(string_value = "ENVIADA"))]
    Enviada,
    /// Charged. Final.
    #[cfg_attr(feature = "sea-orm", sea_orm(string_value = "COMPLETADA"))]
    Completada,
    /// Declined or refused by the gateway; no money moved. Final.
    #[cfg_attr(feature = "sea-orm", sea_orm(string_value = "FALLIDA"))]
    Fallida,
    /// pagos cannot decide without risking a second charge: on-call decides.
    #[cfg_attr(feature = "sea-orm", sea_orm(string_value = "REVISION_MANUAL"))]
    RevisionManual,
}

impl PaymentState {
    pub const ALL: [PaymentState; 5] = [
        PaymentState::EnProceso,
        PaymentState::Enviada,
        PaymentState::Completada,
        PaymentState::Fallida,
        PaymentState::RevisionManual,
    ];

    /// Sent or never sent, and neither final nor under review: the states a payment is
    /// sent or looked up in (the reconciler's).
    pub const IN_FLIGHT: [PaymentState; 2] = [PaymentState::EnProceso, PaymentState::Enviada];

    pub const fn as_str(self) -> &'static str {
        match self {
            PaymentState::EnProceso => "EN_PROCESO",
            PaymentState::Enviada => "ENVIADA",
            PaymentState::Completada => "COMPLETADA",
            PaymentState::Fallida => "FALLIDA",
            PaymentState::RevisionManual => "REVISION_MANUAL",
        }
    }

    /// COMPLETADA and FALLIDA never change again (but for a contradiction, see `Event`).
    pub fn is_terminal(self) -> bool {
        matches!(self, PaymentState::Completada | PaymentState::Fallida)
    }
}

impl fmt::Display for PaymentState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A state equals its contract name: `state == "COMPLETADA"`.
impl PartialEq<str> for PaymentState {
    fn eq(&self, other: &str) -> bool {
        self.as_str() == other
    }
}

impl PartialEq<&str> for PaymentState {
    fn eq(&self, other: &&str) -> bool {
        self.as_str() == *other
    }
}

impl FromStr for PaymentState {
    type Err = UnknownState;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        PaymentState::ALL
            .into_iter()
            .find(|state| state.as_str() == s)
            .ok_or_else(|| UnknownState(s.to_owned()))
    }
}

#[derive(Debug, thiserror::Error)]
#[error("unknown payment state {0:?}")]
pub struct UnknownState(pub String);

#[cfg(test)]
mod tests {
    use super::*;

    #[cfg(feature = "sea-orm")]
    #[test]
    fn the_database_keeps_the_contract_spelling() {
        use sea_orm::ActiveEnum;
        for state in PaymentState::ALL {
            assert_eq!(state.to_value(), state.as_str());
            assert_eq!(
                PaymentState::try_from_value(&state.as_str().to_owned()).ok(),
                Some(state)
            );
        }
        assert!(PaymentState::try_from_value(&"PAGADA".to_owned()).is_err());
    }

    #[test]
    fn state_names_round_trip_through_their_contract_spelling() {
        for state in PaymentState::ALL {
            assert_eq!(state.as_str().parse::<PaymentState>().ok(), Some(state));
            let json = serde_json::to_string(&state).unwrap_or_default();
            assert_eq!(json, format!("\"{}\"", state.as_str()));
        }
        assert!("PAGADA".parse::<PaymentState>().is_err());
        assert!(PaymentState::Completada == "COMPLETADA");
        assert!(PaymentState::Completada != "FALLIDA");
    }
}
