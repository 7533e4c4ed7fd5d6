//! Merchants and their API keys: names parsed once, keys generated and hashed, the store
//! behind `pagos merchants …` and behind authentication, and the command line's output.
//!
//! Never stores, logs or shows a whole API key: only its SHA-256 and a prefix too short to
//! authenticate. The one exception is the command that creates a key, which prints it once.

pub mod cli;
pub mod key;
pub mod name;
pub mod store;
