//! Sea-ORM entities: one module per table, rows as the database holds them.
//!
//! Entities carry no behaviour; the rules live in `saga` and `idempotency`.

/// The entity of an audit trail's table (`table`): one row says who (`Actor`) moved the
/// row `of` names (a payment, a refund) from which `state` to which, and why. Its module
/// brings `Actor`, the state type and sea-orm's prelude in scope.
macro_rules! audit_trail {
    ($(#[$doc:meta])* table = $table:tt, of = $of:ident, state = $state:ident) => {
        $(#[$doc])*
        #[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel)]
        #[sea_orm(table_name = $table)]
        pub struct Model {
            #[sea_orm(primary_key, auto_increment = false)]
            pub id: Uuid,
            pub $of: Uuid,
            pub from_state: Option<$state>,
            pub to_state: $state,
            pub actor: Actor,
            pub reason: String,
            pub created_at: ChronoDateTimeUtc,
        }

        #[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
        pub enum Relation {}

        impl ActiveModelBehavior for ActiveModel {}

        impl super::AuditRow for Model {
            type State = $state;

            fn of_move(
                subject: Uuid,
                from: $state,
                to: $state,
                actor: Actor,
                reason: &str,
                at: ChronoDateTimeUtc,
            ) -> Model {
                Model {
                    id: Uuid::now_v7(),
                    $of: subject,
                    from_state: Some(from),
                    to_state: to,
                    actor,
                    reason: reason.to_owned(),
                    created_at: at,
                }
            }
        }
    };
}

/// A row of an audit trail (`audit_trail!`): one move of a payment or a refund.
pub trait AuditRow {
    type State;

    /// The row of a move of `subject` from `from` to `to` by `actor`, at `at`.
    fn of_move(
        subject: uuid::Uuid,
        from: Self::State,
        to: Self::State,
        actor: payment_transition::Actor,
        reason: &str,
        at: chrono::DateTime<chrono::Utc>,
    ) -> Self;
}

pub mod api_key;
pub mod event;
pub mod event_to_fan_out;
pub mod idempotency_key;
pub mod instance_fact;
pub mod merchant;
pub mod operator;
pub mod operator_action;
pub mod payment;
pub mod payment_transition;
pub mod processed_message;
pub mod refund;
pub mod refund_transition;
pub mod webhook_attempt;
pub mod webhook_charge;
pub mod webhook_delivery;
pub mod webhook_endpoint;
pub mod webhook_refund;

#[cfg(test)]
mod tests {
    use super::idempotency_key::KeyStatus;
    use super::operator_action::Action;
    use super::payment::PaymentState;
    use super::payment_transition::Actor;
    use super::webhook_charge::ReportedStatus;
    use super::webhook_refund::ReportedRefundStatus;
    use sea_orm::ActiveEnum;

    /// Each enum's stored text, exactly what rows written before the enums hold.
    #[test]
    fn every_enum_is_stored_as_the_text_older_rows_hold() {
        fn stored<E: ActiveEnum<Value = String> + std::fmt::Debug + PartialEq>(
            pairs: &[(E, &str)],
        ) {
            for (value, text) in pairs {
                assert_eq!(&value.to_value(), text);
                assert_eq!(
                    E::try_from_value(&(*text).to_owned()).ok().as_ref(),
                    Some(value)
                );
            }
            assert!(E::try_from_value(&"something else".to_owned()).is_err());
        }
        stored(&[
            (PaymentState::EnProceso, "EN_PROCESO"),
            (PaymentState::Enviada, "ENVIADA"),
            (PaymentState::Completada, "COMPLETADA"),
            (PaymentState::Fallida, "FALLIDA"),
            (PaymentState::RevisionManual, "REVISION_MANUAL"),
        ]);
        stored(&[
            (KeyStatus::InProgress, "EN_PROCESO"),
            (KeyStatus::Completed, "COMPLETADA"),
        ]);
        stored(&[
            (Actor::Request, "request"),
            (Actor::Reconciler, "reconciler"),
            (Actor::Webhook, "webhook"),
            (Actor::Admin, "admin"),
        ]);
        stored(&[
            (ReportedStatus::Succeeded, "succeeded"),
            (ReportedStatus::Declined, "declined"),
            (ReportedStatus::Pending, "pending"),
        ]);
        // On-call's actions are stored as their names (a plain text column, read as text).
        let names: Vec<&str> = <Action as sea_orm::Iterable>::iter()
            .map(Action::as_str)
            .collect();
        assert_eq!(
            names,
            [
                "reconcile_payment",
                "reconcile_refund",
                "reconcile_pass",
                "reactivate_endpoint",
                "resolve_payment",
                "resolve_refund",
                "refund_payment",
            ]
        );
        stored(&[
            (ReportedRefundStatus::Succeeded, "succeeded"),
            (ReportedRefundStatus::Failed, "failed"),
            (ReportedRefundStatus::Pending, "pending"),
        ]);
    }
}
