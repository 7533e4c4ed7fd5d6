use sea_orm::entity::prelude::*;

pub use pagos_types::PaymentState;

/// Who made a decision, for the audit trail; stored as its name (`request`, …).
#[derive(Clone, Copy, Debug, PartialEq, Eq, EnumIter, DeriveActiveEnum)]
#[sea_orm(rs_type = "String", db_type = "String(StringLen::N(20))")]
pub enum Actor {
    #[sea_orm(string_value = "request")]
    Request,
    #[sea_orm(string_value = "reconciler")]
    Reconciler,
    #[sea_orm(string_value = "webhook")]
    Webhook,
    #[sea_orm(string_value = "admin")]
    Admin,
}

impl std::fmt::Display for Actor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Equal to its stored name.
impl PartialEq<&str> for Actor {
    fn eq(&self, other: &&str) -> bool {
        self.as_str() == *other
    }
}

impl Actor {
    pub fn as_str(self) -> &'static str {
        match self {
            Actor::Request => "request",
            Actor::Reconciler => "reconciler",
            Actor::Webhook => "webhook",
            Actor::Admin => "admin",
        }
    }
}

audit_trail! {
    /// One row of the audit trail: who moved a payment from where to where, and why.
    table = "payment_transitions",
    of = payment_id,
    state = PaymentState
}
