//! The delivery worker's storage: fan-out, claims, attempts.
