//! `pagos pay`: the retrying client's command line.

use std::process::ExitCode;

#[derive(Debug, clap::Args)]
pub struct PayArgs {}

pub async fn run(_args: PayArgs) -> anyhow::Result<ExitCode> {
    anyhow::bail!("pagos pay is not available in this build yet")
}
