//! Logs to stderr through `tracing`: `RUST_LOG` filters, `PAGOS_LOG_FORMAT=json` for JSON.
//!
//! Colour (ANSI escape codes) only when stderr is a terminal and `NO_COLOR` is not set: a
//! file, a pipe or journald must get plain text. This room only sets up logging; it never
//! logs anything itself.

use crate::config::LogFormat;
use std::ffi::OsStr;
use std::io::IsTerminal;
use tracing_subscriber::EnvFilter;

pub fn init(format: LogFormat) {
    let filter = EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| EnvFilter::new("info,sqlx=warn,sea_orm=warn,tower_http=warn"));
    let ansi = colour(
        std::io::stderr().is_terminal(),
        std::env::var_os("NO_COLOR").as_deref(),
    );
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(ansi);
    match format {
        LogFormat::Json => builder.json().init(),
        LogFormat::Text => builder.init(),
    }
}

/// Whether logs are coloured: on a terminal, unless `NO_COLOR` holds a non-empty value
/// (no-color.org: "when present and not an empty string").
pub fn colour(stderr_is_terminal: bool, no_color: Option<&OsStr>) -> bool {
    stderr_is_terminal && no_color.is_none_or(OsStr::is_empty)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn colour_only_on_a_terminal_without_no_color() {
        assert!(colour(true, None));
        assert!(
            colour(true, Some(OsStr::new(""))),
            "an empty NO_COLOR is unset"
        );
        assert!(!colour(true, Some(OsStr::new("1"))));
        assert!(
            !colour(true, Some(OsStr::new("false"))),
            "any non-empty value"
        );
        assert!(!colour(false, None), "a file, a pipe, journald");
    }
}
