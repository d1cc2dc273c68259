//! Wiring of the server. The server itself arrives with the webhook, index and watch loop.

use anyhow::{bail, Result};

use crate::cli::Config;

pub fn main(_config: Config) -> Result<()> {
    bail!(
        "the server is not available in this build yet; use `rekindle hash` or `rekindle explain`"
    )
}
