//! The settings of deliveries to merchants' endpoints (`PAGOS_WEBHOOKS_*`), part of
//! `pagos serve`'s settings. Each is parsed at start: a bad one stops the process with
//! one line naming it (exit 2), like every setting.

use super::guard::AddressPolicy;
use super::schedule::{Retries, Schedule};
use clap::Args;
use std::time::Duration;

/// The longest `PAGOS_WEBHOOKS_TIMEOUT`: a longer one only holds a delivery slot for a
/// receiver that is not answering anyway.
const MAX_TIMEOUT: Duration = Duration::from_secs(300);

fn timeout(text: &str) -> Result<Duration, String> {
    match humantime::parse_duration(text) {
        Err(e) => Err(format!("{e}; expected a duration such as 250ms, 15s or 1m")),
        Ok(d) if d.is_zero() => Err("must be greater than zero".into()),
        Ok(d) if d > MAX_TIMEOUT => Err("must be at most 5m".into()),
        Ok(d) => Ok(d),
    }
}

fn horizon(text: &str) -> Result<Duration, String> {
    match humantime::parse_duration(text) {
        Err(e) => Err(format!("{e}; expected a duration such as 12h or 5d")),
        Ok(d) if d.is_zero() => Err("must be greater than zero".into()),
        Ok(d) => Ok(d),
    }
}

#[derive(Clone, Debug, Args)]
pub struct WebhookSettings {
    /// Timeout of one delivery to a merchant's endpoint, from resolving its host to its
    /// answer: a 2xx within it is delivered
    #[arg(long = "webhooks-timeout", env = "PAGOS_WEBHOOKS_TIMEOUT", default_value = "15s",
          value_parser = timeout, value_name = "DURATION")]
    pub timeout: Duration,
    /// Wait before each attempt of a delivery, comma-separated (each ±20 % jitter; a 429 or
    /// 503 with Retry-After waits at least that long); after the last, the delivery is
    /// given up
    #[arg(long = "webhooks-schedule", env = "PAGOS_WEBHOOKS_SCHEDULE",
          default_value = Schedule::DEFAULT, value_parser = Schedule::parse, value_name = "WAITS")]
    pub schedule: Schedule,
    /// An endpoint whose deliveries have all failed for this long is deactivated
    /// (DESACTIVADO)
    #[arg(long = "webhooks-disable-after", env = "PAGOS_WEBHOOKS_DISABLE_AFTER",
          default_value = "5d", value_parser = horizon, value_name = "DURATION")]
    pub disable_after: Duration,
    /// Let endpoints be plain http:// and resolve to loopback, private or link-local
    /// addresses (local receivers in development and tests; never in production)
    #[arg(long = "webhooks-allow-private", env = "PAGOS_WEBHOOKS_ALLOW_PRIVATE",
          num_args = 0..=1, default_value = "false", default_missing_value = "true",
          value_parser = clap::builder::BoolishValueParser::new(), value_name = "BOOL")]
    pub allow_private: bool,
}

impl WebhookSettings {
    pub fn policy(&self) -> AddressPolicy {
        AddressPolicy::from_allow_private(self.allow_private)
    }

    pub fn retries(&self) -> Retries {
        Retries {
            schedule: self.schedule.clone(),
            disable_after: self.disable_after,
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::config::{Cli, Command, one_line_error_in};
    use clap::Parser;
    use std::time::Duration;

    fn serve(args: &[&str]) -> Result<super::WebhookSettings, String> {
        let all = std::iter::once("pagos")
            .chain(std::iter::once("serve"))
            .chain(args.iter().copied());
        match Cli::try_parse_from(all) {
            Ok(Cli {
                command: Command::Serve(settings),
                ..
            }) => Ok(settings.webhooks),
            Ok(other) => panic!("not serve: {other:?}"),
            Err(e) => Err(one_line_error_in(&e, ["serve".to_owned()])),
        }
    }

    #[test]
    fn the_defaults_are_the_contracts() {
        let s = serve(&[]).expect("defaults parse");
        assert_eq!(s.timeout, Duration::from_secs(15));
        assert_eq!(s.disable_after, Duration::from_secs(5 * 24 * 3600));
        assert_eq!(s.schedule.attempts(), 8);
        assert!(!s.allow_private);
        assert_eq!(s.policy(), crate::delivery::AddressPolicy::PublicOnly);
    }

    #[test]
    fn allowing_private_addresses_takes_a_flag_or_a_boolean() {
        assert!(
            serve(&["--webhooks-allow-private"])
                .expect("parses")
                .allow_private
        );
        assert!(
            serve(&["--webhooks-allow-private=true"])
                .expect("parses")
                .allow_private
        );
        assert!(
            !serve(&["--webhooks-allow-private=false"])
                .expect("parses")
                .allow_private
        );
        let line = serve(&["--webhooks-allow-private=maybe"]).expect_err("refused");
        assert!(line.contains("PAGOS_WEBHOOKS_ALLOW_PRIVATE"), "{line}");
    }

    #[test]
    fn each_bad_setting_is_one_line_naming_its_flag_and_env() {
        for (args, env) in [
            (&["--webhooks-timeout", "0s"][..], "PAGOS_WEBHOOKS_TIMEOUT"),
            (&["--webhooks-timeout", "10m"][..], "PAGOS_WEBHOOKS_TIMEOUT"),
            (
                &["--webhooks-schedule", "0s,5x"][..],
                "PAGOS_WEBHOOKS_SCHEDULE",
            ),
            (
                &["--webhooks-disable-after", "soon"][..],
                "PAGOS_WEBHOOKS_DISABLE_AFTER",
            ),
            (
                &["--webhooks-disable-after", "0s"][..],
                "PAGOS_WEBHOOKS_DISABLE_AFTER",
            ),
        ] {
            let line = serve(args).expect_err("refused");
            assert!(line.contains(env), "{args:?}: {line}");
            assert!(line.contains(args[0]), "{args:?}: {line}");
            assert!(!line.contains('\n'), "{line}");
        }
    }
}
