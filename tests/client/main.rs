//! Integration tests of the retrying client over real HTTP: one binary, one module per area.
//! `protocol` scripts the server with wiremock; `end_to_end` runs the real `pagos pay`
//! against the real `pagos serve`.

mod helpers;

mod end_to_end;
mod protocol;
