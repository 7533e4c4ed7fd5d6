//! Integration tests of the retrying client against the real server: `end_to_end` runs the
//! real `pagos pay` against the real `pagos serve`. (What needs only a scripted server is
//! tested in the `pagos-client` crate, `client/tests/protocol.rs`.)

mod helpers;

#[path = "../support/binary.rs"]
mod binary;
mod end_to_end;
#[path = "../support/stripe.rs"]
mod stripe;
