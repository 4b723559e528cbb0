//! `ragen-host play`: a person plays a plugin in the terminal, typing action
//! names as the agent would (`Up || Left`), or, for an env whose action is
//! text (Countdown), the answer itself.

use crate::args::Settings;
use crate::oci::PluginSource;
use anyhow::{Context, Result, anyhow};
use ragen_runtime::{Action, ActionSpace, EnvProvider, EnvSpec, Envs, PoolConfig};
use std::io::{BufRead, Write};
use std::process::ExitCode;

/// Play a plugin yourself: type action names (case-insensitive; several
/// separated by `||`, as the agent does), see the state, reward and info
/// after each. `reset [N]` starts over, `quit` leaves.
#[derive(clap::Args)]
pub struct PlayCommand {
    /// The plugin: a .wasm file, oci://registry/namespace/name:tag, or an
    /// OpenEnv server's ws://host:port.
    file: PluginSource,
    /// Seed of the first episode.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    #[command(flatten)]
    settings: Settings,
}

impl PlayCommand {
    /// Play on the terminal; a closed stdout (`| head`) ends the game
    /// quietly (see `crate::output`).
    pub fn execute(self, access: &crate::oci::Access) -> Result<ExitCode> {
        let stdin = std::io::stdin();
        let mut out = crate::term::Escaping(crate::output::Stdout);
        let env = self.file.provider(access, ragen_runtime::SandboxLimits::default())?;
        play(env.as_ref(), self.seed, &self.settings.parse()?, &mut stdin.lock(), &mut out)?;
        Ok(ExitCode::SUCCESS)
    }
}

const COMMANDS: &str = "Commands: `reset` (next seed), `reset N` (seed N), `help`, `quit`.";

/// What to type, for this env's action space.
fn help(spec: &EnvSpec) -> String {
    match &spec.action_space {
        ActionSpace::Names(names) => format!(
            "Actions: {}\nType action names (case-insensitive), several separated by `||` (e.g. `up || left`).\n{COMMANDS}",
            names.join(", ")
        ),
        ActionSpace::Text(t) => {
            format!("Type your answer, {} (at most {} bytes); the whole line is one action.\n{COMMANDS}", t.form, t.max_bytes)
        }
    }
}

pub fn play(
    source: &dyn EnvProvider,
    seed: u64,
    settings: &[(String, String)],
    input: &mut dyn BufRead,
    out: &mut dyn Write,
) -> Result<()> {
    let (info, spec) = source.describe(settings)?;
    let config = PoolConfig { threads: 1, settings: settings.to_vec(), autoreset: false, ..PoolConfig::new(1) };
    let envs = source.open(&config)?;
    writeln!(out, "{} {}: {}\n\n{}\n", info.name, info.version, info.description, spec.instructions)?;
    if !spec.legend.is_empty() {
        let legend: Vec<String> = spec.legend.iter().map(|l| format!("{} {}", l.symbol, l.meaning)).collect();
        writeln!(out, "Symbols: {}", legend.join(", "))?;
    }
    writeln!(out, "{}", help(&spec))?;
    let mut game = Game { envs, spec, seed, total: 0.0, over: false };
    game.start(out)?;
    let mut line = String::new();
    loop {
        write!(out, "> ")?;
        out.flush()?;
        line.clear();
        if input.read_line(&mut line).context("cannot read from the terminal")? == 0 {
            writeln!(out)?;
            return Ok(());
        }
        if !game.command(line.trim(), out)? {
            return Ok(());
        }
    }
}

/// One person's game: the env, its rules, and the episode under way.
struct Game {
    /// One env: a plugin's, here, or a server's.
    envs: Box<dyn Envs>,
    spec: EnvSpec,
    seed: u64,
    /// The episode's return so far.
    total: f64,
    /// The episode has ended (done, or an env error).
    over: bool,
}

impl Game {
    /// Start an episode from `self.seed`.
    fn start(&mut self, out: &mut dyn Write) -> Result<()> {
        let seed = self.seed;
        let first = self.envs.reset(&[0], &[seed])?.pop().context("no answer to reset")?;
        let obs = first.map_err(|e| anyhow!("reset(seed {seed}) failed: {}", e.message))?;
        self.total = 0.0;
        self.over = false;
        writeln!(out, "\nEpisode with seed {seed}:\n{obs}")?;
        Ok(())
    }

    /// Carry out one typed line; `false` when the person leaves.
    fn command(&mut self, command: &str, out: &mut dyn Write) -> Result<bool> {
        let lower = command.to_lowercase();
        let mut words = lower.split_whitespace();
        match words.next() {
            None => {}
            Some("quit" | "q" | "exit") => return Ok(false),
            Some("help" | "?") => writeln!(out, "{}", help(&self.spec))?,
            Some("reset") => {
                let next = words.next();
                match next.map(|n| (n, n.parse::<u64>())) {
                    Some((n, Err(_))) => writeln!(out, "`{n}` is not a seed; use a whole number, e.g. `reset 7`")?,
                    Some((_, Ok(n))) => {
                        self.seed = n;
                        self.start(out)?;
                    }
                    None => {
                        self.seed += 1;
                        self.start(out)?;
                    }
                }
            }
            Some(_) => self.act(command, out)?,
        }
        Ok(true)
    }

    /// Play `a || b || …`: unknown names are skipped with a note; the turn
    /// stops at an env error or the episode's end.
    fn act(&mut self, command: &str, out: &mut dyn Write) -> Result<()> {
        if self.over {
            writeln!(out, "The episode is over: type `reset` for a new one, or `quit`.")?;
            return Ok(());
        }
        let spec = &self.spec;
        let mut actions = Vec::new();
        match &spec.action_space {
            ActionSpace::Text(_) => actions.push((Action::Text(command.to_string()), command.to_string())),
            ActionSpace::Names(names) => {
                // Split and matched as the agent's answers are.
                for word in command.split(ragen_runtime::ACTION_SEPARATOR).map(str::trim).filter(|w| !w.is_empty()) {
                    let key = ragen_runtime::action_name_key(word);
                    match names.iter().position(|a| ragen_runtime::action_name_key(a) == key) {
                        Some(id) => actions.push((Action::Id(id as u32), names[id].clone())),
                        None => writeln!(out, "unknown action `{word}` (skipped); actions are: {}", names.join(", "))?,
                    }
                }
            }
        }
        for (action, name) in actions {
            let r = match self.envs.step(&[0], &[action])?.pop().context("no answer to step")? {
                Err(e) => {
                    self.over = true;
                    writeln!(out, "{}\nThe episode is over. Type `reset` for a new episode or `quit`.", e.message)?;
                    break;
                }
                Ok(r) => r,
            };
            self.total += r.reward;
            let total = self.total;
            let metrics: String = spec.metrics.iter().zip(&r.info.metrics).map(|(name, v)| format!(", {name} {v}")).collect();
            writeln!(
                out,
                "{}: reward {} (return {total:.2}), done {}, success {}, valid {}, effective {}{metrics}\n{}",
                name, r.reward, r.done, r.info.success, r.info.action_is_valid, r.info.action_is_effective, r.observation
            )?;
            if r.done {
                self.over = true;
                let how = if r.info.success { "solved" } else { "not solved" };
                writeln!(out, "Episode over ({how}), return {total:.2}. Type `reset` for a new episode or `quit`.")?;
                break;
            }
        }
        Ok(())
    }
}
