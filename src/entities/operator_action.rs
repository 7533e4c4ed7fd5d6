use sea_orm::entity::prelude::*;

/// What on-call asked: the actions that move nothing by on-call's own hand (the
/// reconciler's and the endpoint's rows say what they did), and those that move money or
/// settle a state (the payment's and the refund's own rows say what moved; this says who
/// asked what, and what came of it, refusals too). Stored as its name (`as_str`): a plain
/// string column, no CHECK, so a new one needs no migration.
#[derive(Clone, Copy, Debug, PartialEq, Eq, EnumIter)]
pub enum Action {
    /// "Reconcile now" of one payment.
    ReconcilePayment,
    /// "Reconcile now" of one refund.
    ReconcileRefund,
    /// A reconciliation pass run by hand.
    ReconcilePass,
    /// A merchant's webhook endpoint reactivated from the console.
    ReactivateEndpoint,
    /// A payment under review resolved by hand (`COMPLETADA`, or `FALLIDA`, with or
    /// without refunding what the provider charged).
    ResolvePayment,
    /// A refund under review resolved by hand.
    ResolveRefund,
    /// A refund of a payment asked by on-call (the admin API's, the console's form).
    RefundPayment,
}

impl Action {
    pub fn as_str(self) -> &'static str {
        match self {
            Action::ReconcilePayment => "reconcile_payment",
            Action::ReconcileRefund => "reconcile_refund",
            Action::ReconcilePass => "reconcile_pass",
            Action::ReactivateEndpoint => "reactivate_endpoint",
            Action::ResolvePayment => "resolve_payment",
            Action::ResolveRefund => "resolve_refund",
            Action::RefundPayment => "refund_payment",
        }
    }
}

/// One action of on-call: who asked what, when, and what came of it. Written before the
/// work starts, completed (`finished_at`) when it ends.
#[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel)]
#[sea_orm(table_name = "operator_actions")]
pub struct Model {
    #[sea_orm(primary_key, auto_increment = false)]
    pub id: Uuid,
    /// When it was asked.
    pub at: ChronoDateTimeUtc,
    /// The operator's name, `admin` for the break-glass token.
    pub operator: String,
    /// An `Action`'s name. Read as its text, so that a row a newer pagos wrote, of an
    /// action this one does not know (a rolling deploy that adds one), is listed by its
    /// name instead of failing the whole list.
    #[sea_orm(column_type = "String(StringLen::N(32))")]
    pub action: String,
    /// The payment, refund or endpoint acted on; None for a pass.
    pub target: Option<Uuid>,
    /// What was asked and, once over, what came of it.
    pub detail: String,
    /// None while the work runs, or when the process stopped before it ended.
    pub finished_at: Option<ChronoDateTimeUtc>,
}

#[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
pub enum Relation {}

impl ActiveModelBehavior for ActiveModel {}
