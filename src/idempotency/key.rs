//! The client's `Idempotency-Key`, parsed once at the edge (`pagos_types::key`, shared
//! with the client, which makes its keys by the same rule).

pub use pagos_types::key::*;
