//! `ragen-host`: the ragen-rs command line.

mod inspect;

use anyhow::{Context, Result, bail};
use clap::{Parser, Subcommand};
use std::path::PathBuf;
use std::process::ExitCode;

#[derive(Parser)]
#[command(
    name = "ragen-host",
    version,
    about = "Run and check ragen-rs environment plugins (WebAssembly components).",
    long_about = "Run and check ragen-rs environment plugins.\n\n\
        A plugin is one .wasm component implementing wit/env.wit; it describes itself, so the \
        file is all you need. `make plugins` builds the shipped ones into target/plugins/.\n\n\
        Example:\n  ragen-host inspect target/plugins/sokoban.wasm\n  \
        ragen-host inspect target/plugins/sokoban.wasm --set dim_x=8 --json"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Show what a plugin says about itself: name, version, actions, symbol
    /// legend, config keys and defaults, limits, the contract version it was
    /// built against, its size, and the imports it declares (none are granted).
    Inspect {
        /// The plugin, e.g. target/plugins/sokoban.wasm
        file: PathBuf,
        /// Print one JSON object instead of text.
        #[arg(long)]
        json: bool,
        /// Describe the env under this setting (repeatable), e.g. --set dim_x=8
        #[arg(long = "set", value_name = "KEY=VALUE")]
        settings: Vec<String>,
    },
}

/// Parse `KEY=VALUE` settings; the value may contain `=`.
fn parse_settings(settings: &[String]) -> Result<Vec<(String, String)>> {
    settings
        .iter()
        .map(|s| match s.split_once('=') {
            Some((k, v)) if !k.trim().is_empty() => Ok((k.trim().to_string(), v.to_string())),
            _ => bail!("--set `{s}`: expected KEY=VALUE, e.g. --set dim_x=8"),
        })
        .collect()
}

fn run(cli: Cli) -> Result<()> {
    match cli.command {
        Command::Inspect { file, json, settings } => {
            let settings = parse_settings(&settings)?;
            let report = inspect::inspect(&file, &settings)?;
            if json {
                println!("{}", serde_json::to_string_pretty(&report).context("cannot write JSON")?);
            } else {
                print!("{}", report.to_text());
            }
            Ok(())
        }
    }
}

fn main() -> ExitCode {
    match run(Cli::parse()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}
