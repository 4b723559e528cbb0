//! `ragen-host inspect`: everything a plugin says about itself, as text or
//! JSON, read through the sandbox exactly as training would read it.

use crate::args::Settings;
use crate::oci::PluginSource;
use crate::output::print_report;
use anyhow::{Context, Result, anyhow};
use ragen_runtime::{ActionSpace, CONTRACT_PACKAGE, CompileCache, Plugin};
use serde::Serialize;
use std::fmt::Write;
use std::path::Path;
use std::process::ExitCode;

/// Show what a plugin says about itself: name, version, actions, symbol
/// legend, config keys and defaults, limits, the contract version it was
/// built against, its size, and the imports it declares (none grants anything).
#[derive(clap::Args)]
pub struct InspectCommand {
    /// The plugin: a .wasm file (e.g. target/plugins/sokoban.wasm),
    /// oci://registry/namespace/name:tag (or @sha256:…), or an OpenEnv
    /// server's ws://host:port.
    file: PluginSource,
    /// Print one JSON object instead of text.
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    settings: Settings,
}

impl InspectCommand {
    pub fn execute(self, access: &crate::oci::Access) -> Result<ExitCode> {
        let settings = self.settings.parse()?;
        let report = match &self.file {
            PluginSource::Remote(address) => inspect_remote(address, &settings)?,
            file => inspect(&file.local(access)?, &settings)?,
        };
        print_report(&report, self.json, Report::to_text)?;
        Ok(ExitCode::SUCCESS)
    }
}

#[derive(Serialize)]
pub struct Report {
    pub file: String,
    pub size_bytes: usize,
    /// Seconds to read, compile (or fetch from the compile cache) and link it.
    pub load_seconds: f64,
    /// Where its compiled code came from: `compiled` (and kept in the cache
    /// when one is on), `cache`, or `compiled, cache off`.
    pub compiled: &'static str,
    /// The contract the plugin was built against, e.g. `ragen:env@0.2.0`.
    pub contract: String,
    /// Whether it exports the contract's batched calls (`batch`).
    pub batched: bool,
    /// Whether it has the contract's optional oracle (`eval --policy oracle`).
    pub oracle: bool,
    pub name: String,
    pub version: String,
    pub description: String,
    pub multi_turn: bool,
    pub config_keys: Vec<ConfigKey>,
    /// The env as configured by the defaults plus any `--set`.
    pub env: EnvSpec,
    /// Everything the component imports. None of it grants anything: WASI
    /// answers with no files, network or environment, still clocks and
    /// fixed-seed randomness; any other import traps if called.
    pub imports: Vec<String>,
}

#[derive(Serialize)]
pub struct ConfigKey {
    pub name: String,
    pub default: String,
    pub description: String,
}

#[derive(Serialize)]
pub struct EnvSpec {
    pub settings: Vec<(String, String)>,
    pub instructions: String,
    pub legend: Vec<Legend>,
    /// The action names (empty when actions are text).
    pub actions: Vec<String>,
    /// Set when the action is free text instead of a name.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub text_action: Option<TextAction>,
    pub limits: Limits,
    /// Names of the numbers each step reports beside the reward.
    pub metrics: Vec<String>,
}

#[derive(Serialize)]
pub struct TextAction {
    pub max_bytes: u32,
    /// What an answer looks like, for the prompt.
    pub form: String,
}

#[derive(Serialize)]
pub struct Legend {
    pub symbol: String,
    pub meaning: String,
}

#[derive(Serialize)]
pub struct Limits {
    pub max_actions_per_episode: u32,
    pub max_actions_per_turn: u32,
    pub max_turns: u32,
    pub max_steps: u32,
}

pub fn inspect(file: &Path, settings: &[(String, String)]) -> Result<Report> {
    let clock = std::time::Instant::now();
    let plugin = Plugin::from_file(file)?;
    let load_seconds = clock.elapsed().as_secs_f64();
    let compiled = match (plugin.from_cache(), CompileCache::process_default()) {
        (true, _) => "cache",
        (false, CompileCache::Off) => "compiled, cache off",
        (false, CompileCache::Dir(_)) => "compiled",
    };
    let mut inst = plugin.instantiate()?;
    let info = inst.info().with_context(|| format!("`{}`: its info() call failed", file.display()))?;
    let env = inst
        .create(settings)
        .with_context(|| format!("`{}`: its create() call failed", file.display()))?
        .map_err(|e| anyhow!("the plugin rejected the settings: {}", e.message))?;
    let spec = inst.spec(env).with_context(|| format!("`{}`: its spec() call failed", file.display()))?;
    Ok(Report {
        file: file.display().to_string(),
        size_bytes: plugin.size_bytes(),
        load_seconds,
        compiled,
        contract: format!("{CONTRACT_PACKAGE}@{}", plugin.contract_version()),
        batched: plugin.has_batch(),
        oracle: plugin.has_oracle()?,
        name: info.name,
        version: info.version,
        description: info.description,
        multi_turn: info.multi_turn,
        config_keys: config_keys(info.config_keys),
        env: env_report(spec, settings),
        imports: plugin.imports().to_vec(),
    })
}

/// `compiled` for an env on a server.
const ON_THE_SERVER: &str = "on the server";

/// What a server says it serves, in the same report (no file, no imports:
/// the env runs on the server).
pub fn inspect_remote(address: &ragen_remote::RemoteAddress, settings: &[(String, String)]) -> Result<Report> {
    let clock = std::time::Instant::now();
    let remote = ragen_remote::Remote::connect(address)?;
    let (info, spec) = remote.describe(settings)?;
    Ok(Report {
        file: address.to_string(),
        size_bytes: 0,
        load_seconds: clock.elapsed().as_secs_f64(),
        compiled: ON_THE_SERVER,
        contract: "OpenEnv over WebSocket".into(),
        batched: false,
        oracle: false,
        name: info.name,
        version: info.version,
        description: info.description,
        multi_turn: info.multi_turn,
        config_keys: config_keys(info.config_keys),
        env: env_report(spec, settings),
        imports: Vec::new(),
    })
}

fn config_keys(keys: Vec<ragen_runtime::ConfigKey>) -> Vec<ConfigKey> {
    keys.into_iter().map(|k| ConfigKey { name: k.name, default: k.default_value, description: k.description }).collect()
}

fn env_report(spec: ragen_runtime::EnvSpec, settings: &[(String, String)]) -> EnvSpec {
    EnvSpec {
        actions: spec.action_names().to_vec(),
        text_action: match &spec.action_space {
            ActionSpace::Text(t) => Some(TextAction { max_bytes: t.max_bytes, form: t.form.clone() }),
            ActionSpace::Names(_) => None,
        },
        settings: settings.to_vec(),
        instructions: spec.instructions,
        legend: spec.legend.into_iter().map(|l| Legend { symbol: l.symbol, meaning: l.meaning }).collect(),
        limits: Limits {
            max_actions_per_episode: spec.limits.max_actions_per_episode,
            max_actions_per_turn: spec.limits.max_actions_per_turn,
            max_turns: spec.limits.max_turns,
            max_steps: spec.limits.max_steps,
        },
        metrics: spec.metrics,
    }
}

impl Report {
    pub fn to_text(&self) -> String {
        let mut s = String::new();
        let l = &self.env.limits;
        // Writing to a String cannot fail.
        let _ = writeln!(s, "{} {}: {}", self.name, self.version, self.description);
        let _ = writeln!(s, "  file          {} ({} bytes)", self.file, self.size_bytes);
        let _ = writeln!(s, "  loaded        in {:.2} s ({})", self.load_seconds, self.compiled);
        let batched = if self.batched { "batched calls" } else { "single calls only" };
        let oracle = if self.oracle { "an oracle" } else { "no oracle" };
        let _ = writeln!(s, "  contract      {} ({batched}, {oracle})", self.contract);
        let _ = writeln!(s, "  turns         {}", if self.multi_turn { "multi-turn" } else { "single-turn" });
        match &self.env.text_action {
            Some(t) => {
                let _ = writeln!(s, "  actions       text of up to {} bytes: {}", t.max_bytes, t.form);
            }
            None => {
                let actions: Vec<String> = self.env.actions.iter().enumerate().map(|(i, a)| format!("{i}={a}")).collect();
                let _ = writeln!(s, "  actions       {}", actions.join(", "));
            }
        }
        if !self.env.legend.is_empty() {
            let legend: Vec<String> = self.env.legend.iter().map(|e| format!("{} {}", e.symbol, e.meaning)).collect();
            let _ = writeln!(s, "  legend        {}", legend.join(", "));
        }
        let _ = writeln!(
            s,
            "  limits        {} actions/episode, {} actions/turn, {} turns, {} steps",
            l.max_actions_per_episode, l.max_actions_per_turn, l.max_turns, l.max_steps
        );
        if !self.env.metrics.is_empty() {
            let _ = writeln!(s, "  metrics       {}", self.env.metrics.join(", "));
        }
        let how = if self.compiled == ON_THE_SERVER {
            "the server's: set with `ragen-host serve --set KEY=VALUE`"
        } else {
            "set with --set KEY=VALUE"
        };
        let _ = writeln!(s, "  config keys   ({how})");
        let width = self.config_keys.iter().map(|k| k.name.len() + k.default.chars().count() + 3).max().unwrap_or(0);
        for k in &self.config_keys {
            let default = if k.default.is_empty() { "\"\"".to_string() } else { k.default.clone() };
            let lhs = format!("{} = {}", k.name, default);
            let _ = writeln!(s, "    {lhs:<width$}  {}", k.description);
        }
        let imports = if self.imports.is_empty() { "none".to_string() } else { self.imports.join(", ") };
        let _ = writeln!(
            s,
            "  imports       {imports}\n                (nothing granted: WASI without files, network or environment, with still clocks\n                 and fixed-seed randomness; anything else traps if called)"
        );
        let _ = writeln!(s, "  instructions");
        for line in self.env.instructions.lines() {
            let _ = writeln!(s, "    {line}");
        }
        s
    }
}
