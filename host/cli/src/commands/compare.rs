//! `ragen-host compare`: several training runs drawn side by side in one
//! PNG, from their metrics.jsonl.

use crate::output::errln;
use anyhow::Result;
use std::path::PathBuf;
use std::process::ExitCode;

/// Draw several training runs side by side in one PNG (success,
/// validation success, in-group reward std, entropy, gradient norm,
/// reward), e.g. StarPO against StarPO-S on the same env and seed:
/// `ragen-host compare runs/starpo runs/starpo-s --out compare.png`.
#[derive(clap::Args)]
pub struct CompareCommand {
    /// Run directories (each with metrics.jsonl).
    #[arg(required = true)]
    runs: Vec<PathBuf>,
    /// The PNG to write.
    #[arg(long)]
    out: PathBuf,
}

impl CompareCommand {
    pub fn execute(self) -> Result<ExitCode> {
        crate::dashboard::compare_runs(&self.runs, &self.out)?;
        errln!("wrote {}", self.out.display());
        Ok(ExitCode::SUCCESS)
    }
}
