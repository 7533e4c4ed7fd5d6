use sea_orm::entity::prelude::*;

/// The status a webhook last reported for a charge; stored as its name, as it always was.
#[derive(Clone, Copy, Debug, PartialEq, Eq, EnumIter, DeriveActiveEnum)]
#[sea_orm(rs_type = "String", db_type = "String(StringLen::N(20))")]
pub enum ReportedStatus {
    #[sea_orm(string_value = "succeeded")]
    Succeeded,
    #[sea_orm(string_value = "declined")]
    Declined,
    #[sea_orm(string_value = "pending")]
    Pending,
}

impl ReportedStatus {
    pub fn as_str(self) -> &'static str {
        match self {
            ReportedStatus::Succeeded => "succeeded",
            ReportedStatus::Declined => "declined",
            ReportedStatus::Pending => "pending",
        }
    }
}

/// Equal to its stored name.
impl PartialEq<&str> for ReportedStatus {
    fn eq(&self, other: &&str) -> bool {
        self.as_str() == *other
    }
}

/// What a gateway's webhooks last told us about one of its charges.
#[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel)]
#[sea_orm(table_name = "webhook_charges")]
pub struct Model {
    #[sea_orm(primary_key, auto_increment = false)]
    pub source: String,
    #[sea_orm(primary_key, auto_increment = false)]
    pub charge_id: String,
    /// The reference the charge carries, as the gateway sent it.
    pub reference: String,
    /// The payment the reference names; `None` for an orphan charge (no such payment).
    pub payment_id: Option<Uuid>,
    /// As of `last_sequence`.
    pub status: ReportedStatus,
    pub amount: i64,
    pub currency: String,
    pub decline_code: Option<String>,
    /// The highest event sequence applied for this charge; lower or equal ones are stale.
    pub last_sequence: i64,
    pub last_event_id: String,
    pub first_seen_at: ChronoDateTimeUtc,
    pub updated_at: ChronoDateTimeUtc,
}

#[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
pub enum Relation {}

impl ActiveModelBehavior for ActiveModel {}
