use sea_orm::entity::prelude::*;

/// The status a webhook last reported for a refund, stored as its name.
#[derive(Clone, Copy, Debug, PartialEq, Eq, EnumIter, DeriveActiveEnum)]
#[sea_orm(rs_type = "String", db_type = "String(StringLen::N(20))")]
pub enum ReportedRefundStatus {
    #[sea_orm(string_value = "succeeded")]
    Succeeded,
    #[sea_orm(string_value = "failed")]
    Failed,
    #[sea_orm(string_value = "pending")]
    Pending,
}

impl ReportedRefundStatus {
    pub fn as_str(self) -> &'static str {
        match self {
            ReportedRefundStatus::Succeeded => "succeeded",
            ReportedRefundStatus::Failed => "failed",
            ReportedRefundStatus::Pending => "pending",
        }
    }
}

/// What a gateway's webhooks last told us about one of its refunds.
#[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel)]
#[sea_orm(table_name = "webhook_refunds")]
pub struct Model {
    #[sea_orm(primary_key, auto_increment = false)]
    pub source: String,
    #[sea_orm(primary_key, auto_increment = false)]
    pub provider_refund_id: String,
    /// The reference the refund carries, as the gateway sent it.
    pub reference: String,
    /// The pagos refund the reference names; `None` when it names none of ours.
    pub refund_id: Option<Uuid>,
    /// That refund's payment.
    pub payment_id: Option<Uuid>,
    /// The provider's id of the charge refunded.
    pub charge_id: String,
    /// As of `last_sequence`.
    pub status: ReportedRefundStatus,
    pub amount: i64,
    pub currency: String,
    pub failure_code: Option<String>,
    /// The highest event sequence applied for this refund; lower or equal ones are stale.
    pub last_sequence: i64,
    pub last_event_id: String,
    pub first_seen_at: ChronoDateTimeUtc,
    pub updated_at: ChronoDateTimeUtc,
}

#[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
pub enum Relation {}

impl ActiveModelBehavior for ActiveModel {}
