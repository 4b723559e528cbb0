//! `ragen-host play`: a person plays a plugin in the terminal, typing action
//! names as the agent would (`Up || Left`).

use anyhow::{Context, Result, anyhow};
use ragen_runtime::Plugin;
use std::io::{BufRead, Write};
use std::path::Path;

const HELP: &str = "Type action names (case-insensitive), several separated by `||` (e.g. `up || left`).\n\
    Commands: `reset` (next seed), `reset N` (seed N), `help`, `quit`.";

pub fn play(file: &Path, seed: u64, settings: &[(String, String)], input: &mut dyn BufRead, out: &mut dyn Write) -> Result<()> {
    let plugin = Plugin::from_file(file)?;
    let mut inst = plugin.instantiate()?;
    let info = inst.info()?;
    let env = inst.create(settings)?.map_err(|e| anyhow!("the plugin rejected the settings: {}", e.message))?;
    let spec = inst.spec(env)?;
    writeln!(out, "{} {}: {}\n\n{}\n", info.name, info.version, info.description, spec.instructions)?;
    if !spec.legend.is_empty() {
        let legend: Vec<String> = spec.legend.iter().map(|l| format!("{} {}", l.symbol, l.meaning)).collect();
        writeln!(out, "Symbols: {}", legend.join(", "))?;
    }
    writeln!(out, "Actions: {}\n{HELP}", spec.actions.join(", "))?;

    let mut seed = seed;
    let mut total = 0.0;
    let start = |inst: &mut ragen_runtime::PluginInstance, seed: u64, out: &mut dyn Write| -> Result<()> {
        let obs = inst.reset(env, seed)?.map_err(|e| anyhow!("reset(seed {seed}) failed: {}", e.message))?;
        writeln!(out, "\nEpisode with seed {seed}:\n{obs}")?;
        Ok(())
    };
    start(&mut inst, seed, out)?;
    let mut line = String::new();
    loop {
        write!(out, "> ")?;
        out.flush()?;
        line.clear();
        if input.read_line(&mut line).context("cannot read from the terminal")? == 0 {
            writeln!(out)?;
            return Ok(());
        }
        let command = line.trim();
        let lower = command.to_lowercase();
        let mut words = lower.split_whitespace();
        match words.next() {
            None => continue,
            Some("quit" | "q" | "exit") => return Ok(()),
            Some("help" | "?") => {
                writeln!(out, "Actions: {}\n{HELP}", spec.actions.join(", "))?;
                continue;
            }
            Some("reset") => {
                seed = match words.next() {
                    Some(n) => match n.parse() {
                        Ok(n) => n,
                        Err(_) => {
                            writeln!(out, "`{n}` is not a seed; use a whole number, e.g. `reset 7`")?;
                            continue;
                        }
                    },
                    None => seed + 1,
                };
                total = 0.0;
                start(&mut inst, seed, out)?;
                continue;
            }
            Some(_) => {}
        }
        let mut actions = Vec::new();
        for word in command.split("||").map(str::trim).filter(|w| !w.is_empty()) {
            match spec.actions.iter().position(|a| a.eq_ignore_ascii_case(word)) {
                Some(id) => actions.push(id as u32),
                None => writeln!(out, "unknown action `{word}` (skipped); actions are: {}", spec.actions.join(", "))?,
            }
        }
        for id in actions {
            match inst.step(env, id)? {
                Err(e) => {
                    writeln!(out, "{}", e.message)?;
                    break;
                }
                Ok(r) => {
                    total += r.reward;
                    let metrics: String = spec.metrics.iter().zip(&r.info.metrics).map(|(name, v)| format!(", {name} {v}")).collect();
                    writeln!(
                        out,
                        "{}: reward {} (return {total:.2}), done {}, success {}, valid {}, effective {}{metrics}\n{}",
                        spec.actions[id as usize],
                        r.reward,
                        r.done,
                        r.info.success,
                        r.info.action_is_valid,
                        r.info.action_is_effective,
                        r.observation
                    )?;
                    if r.done {
                        let how = if r.info.success { "solved" } else { "not solved" };
                        writeln!(out, "Episode over ({how}), return {total:.2}. Type `reset` for a new episode or `quit`.")?;
                        break;
                    }
                }
            }
        }
    }
}
