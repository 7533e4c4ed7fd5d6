use sea_orm::entity::prelude::*;

/// What an operator may do: `lector` reads, `operador` also acts (resolve, reconcile,
/// refund). Stored as its name.
#[derive(Clone, Copy, Debug, PartialEq, Eq, EnumIter, DeriveActiveEnum)]
#[sea_orm(rs_type = "String", db_type = "String(StringLen::N(16))")]
pub enum Role {
    #[sea_orm(string_value = "lector")]
    Lector,
    #[sea_orm(string_value = "operador")]
    Operador,
}

impl Role {
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Lector => "lector",
            Role::Operador => "operador",
        }
    }

    /// Whether this role may change anything.
    pub fn may_act(self) -> bool {
        self == Role::Operador
    }
}

impl std::fmt::Display for Role {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::str::FromStr for Role {
    type Err = String;
    fn from_str(s: &str) -> Result<Role, String> {
        match s {
            "lector" => Ok(Role::Lector),
            "operador" => Ok(Role::Operador),
            _ => Err("expected lector or operador".to_owned()),
        }
    }
}

/// One person of on-call. The token is never stored: only its SHA-256.
#[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel)]
#[sea_orm(table_name = "operators")]
pub struct Model {
    #[sea_orm(primary_key, auto_increment = false)]
    pub id: Uuid,
    /// Unique; what the audit trail records.
    pub name: String,
    pub role: Role,
    /// SHA-256 of the token, hex.
    pub token_hash: String,
    pub created_at: ChronoDateTimeUtc,
    pub revoked_at: Option<ChronoDateTimeUtc>,
}

#[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
pub enum Relation {}

impl ActiveModelBehavior for ActiveModel {}
