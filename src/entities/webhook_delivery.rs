use sea_orm::entity::prelude::*;

/// Where one event's delivery to one endpoint stands; stored as its name.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, EnumIter, DeriveActiveEnum)]
#[sea_orm(rs_type = "String", db_type = "String(StringLen::N(20))")]
pub enum DeliveryState {
    /// Not delivered yet: attempts go on at `next_attempt_at`.
    #[sea_orm(string_value = "PENDIENTE")]
    Pending,
    /// A 2xx answered one attempt.
    #[sea_orm(string_value = "ENTREGADA")]
    Delivered,
    /// Every attempt of the schedule failed, or the endpoint was `DESACTIVADO` when the
    /// event was written (no attempt then); a reactivation with redelivery sends it again.
    #[sea_orm(string_value = "ABANDONADA")]
    GivenUp,
}

impl DeliveryState {
    pub fn as_str(self) -> &'static str {
        match self {
            DeliveryState::Pending => "PENDIENTE",
            DeliveryState::Delivered => "ENTREGADA",
            DeliveryState::GivenUp => "ABANDONADA",
        }
    }
}

/// One event to one endpoint.
#[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel)]
#[sea_orm(table_name = "webhook_deliveries")]
pub struct Model {
    #[sea_orm(primary_key, auto_increment = false)]
    pub event_id: String,
    #[sea_orm(primary_key, auto_increment = false)]
    pub endpoint_id: Uuid,
    pub merchant_id: Uuid,
    pub state: DeliveryState,
    /// Attempts made so far; the next is number `attempts + 1`.
    pub attempts: i32,
    /// `attempts` when the current round began (a redelivery starts the schedule over).
    pub round_start: i32,
    /// When the next attempt is due; a claim moves it past the attempt too (for
    /// processes that do not know `claimed_until`).
    pub next_attempt_at: ChronoDateTimeUtc,
    /// Until when a worker holds the delivery (its attempt in flight): written by the
    /// claim, cleared when the attempt is stored. No claim takes it before then, whatever
    /// `next_attempt_at` says (a reactivation may make it due meanwhile).
    pub claimed_until: Option<ChronoDateTimeUtc>,
    pub delivered_at: Option<ChronoDateTimeUtc>,
    pub created_at: ChronoDateTimeUtc,
    pub updated_at: ChronoDateTimeUtc,
}

#[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
pub enum Relation {}

impl ActiveModelBehavior for ActiveModel {}
