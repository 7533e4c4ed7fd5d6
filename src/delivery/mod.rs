//! Webhooks to merchants' endpoints, everything of a delivery that needs no database:
//! the Standard Webhooks signature (`signing`), one POST and what its answer means
//! (`attempt`), when to try again and when to give up (`schedule`), which addresses a
//! delivery may reach (`guard`) and the settings (`settings`). The merchant's side of it
//! (verifying a delivery, applying each event once) is the client crate's
//! (`pagos_client::webhooks`).
//!
//! This room never reads or writes the database and never decides which event goes to
//! which endpoint: the outbox and the delivery worker do, with what it returns. It never
//! logs a secret, a signature or a delivered body.

pub mod attempt;
pub mod guard;
pub mod schedule;
pub mod settings;
pub mod signing;

pub use attempt::{Attempt, Deliverer, Message, Outcome};
pub use guard::{AddressPolicy, Destination, Refusal};
pub use schedule::{Next, Schedule};
pub use settings::WebhookSettings;
pub use signing::{Keys, Secret, SignedHeaders};
