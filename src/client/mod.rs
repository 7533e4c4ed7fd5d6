//! The retrying client: one idempotency key per payment intent, kept in a journal across
//! crashes, retried with backoff and jitter. (Being written: see `cli`.)

pub mod cli;
