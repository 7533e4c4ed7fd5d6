use sea_orm::entity::prelude::*;

pub use pagos_types::EndpointState;

/// A merchant's endpoint. The secrets are kept as given (`whsec_…`): every delivery signs
/// with them.
#[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel)]
#[sea_orm(table_name = "webhook_endpoints")]
pub struct Model {
    #[sea_orm(primary_key, auto_increment = false)]
    pub id: Uuid,
    pub merchant_id: Uuid,
    pub url: String,
    /// Comma-separated event types; None: every type.
    pub event_types: Option<String>,
    pub secret: String,
    /// The secret the last rotation replaced, which also signs until `previous_secret_until`
    /// (24 h after that rotation).
    pub previous_secret: Option<String>,
    pub previous_secret_until: Option<ChronoDateTimeUtc>,
    /// The secret the rotation before replaced, kept when that rotation was less than 24 h
    /// before the last one: it also signs until `older_secret_until`.
    pub older_secret: Option<String>,
    pub older_secret_until: Option<ChronoDateTimeUtc>,
    pub state: EndpointState,
    /// The first failure after the last success.
    pub failing_since: Option<ChronoDateTimeUtc>,
    pub disabled_reason: Option<String>,
    pub created_at: ChronoDateTimeUtc,
    pub updated_at: ChronoDateTimeUtc,
}

#[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
pub enum Relation {}

impl ActiveModelBehavior for ActiveModel {}
