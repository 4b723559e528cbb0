//! Scripted policies that play perfectly, from the env's own rendering:
//! Sokoban (the next moves of a shortest solution, by BFS) and Countdown
//! (an expression the exact search finds). They test the loop end to end:
//! if the loop renders, parses and executes faithfully, they solve every
//! puzzle whose solution fits the action budget.

use anyhow::{Context as _, Result, anyhow};
use ragen_agent::policies::reply;
use ragen_agent::{ByteTokenizer, Context, Policy, Response, Tokenizer};
use ragen_env_countdown::solver as countdown;
use ragen_env_sokoban::solver;
use ragen_env_sokoban::symbols::Symbols;
use ragen_runtime::EnvSpec;

pub struct SokobanSolverPolicy {
    symbols: Symbols,
}

impl SokobanSolverPolicy {
    /// The symbol table comes from the env's own legend (its order is the
    /// `symbols` config order), so other vocabularies work too.
    pub fn new(spec: &EnvSpec) -> Result<Self> {
        let table: String = spec.legend.iter().map(|l| l.symbol.as_str()).collect();
        let symbols = Symbols::parse(&table).map_err(|e| anyhow!("not a Sokoban legend: {e}"))?;
        Ok(Self { symbols })
    }
}

impl Policy for SokobanSolverPolicy {
    fn name(&self) -> &str {
        "sokoban-solver"
    }

    fn tokenizer(&self) -> &dyn Tokenizer {
        &ByteTokenizer
    }

    fn respond(&mut self, contexts: &[Context<'_>]) -> Result<Vec<Response>> {
        contexts
            .iter()
            .map(|c| {
                let room = self.symbols.parse_level(c.observation).map_err(|e| anyhow!("{e}")).context("cannot read the state")?;
                let moves = solver::solve(&room, 2_000_000).map_err(|e| anyhow!("solver: {e:?}"))?.unwrap_or_default();
                let names: Vec<&str> = moves.iter().take(c.max_actions.max(1) as usize).map(|d| d.name()).collect();
                // An unsolvable room still gets a well-formed answer.
                let names = if names.is_empty() { vec![c.actions[0].as_str()] } else { names };
                Ok(scripted(c.prefill, "Following the shortest solution.", &names))
            })
            .collect()
    }
}

/// Answers a Countdown observation (`Target: T, nums: [a, b, ...]`) with
/// an expression that reaches the target, or `0` when there is none.
pub struct CountdownSolverPolicy;

impl CountdownSolverPolicy {
    /// The puzzle an observation shows.
    pub fn read(observation: &str) -> Result<(Vec<u64>, u64)> {
        let bad = || anyhow!("not a Countdown state (`Target: T, nums: [a, b]`): {observation:?}");
        let rest = observation.trim().strip_prefix("Target: ").ok_or_else(bad)?;
        let (target, nums) = rest.split_once(", nums: [").ok_or_else(bad)?;
        let nums = nums.strip_suffix(']').ok_or_else(bad)?;
        let numbers = nums.split(',').map(|n| n.trim().parse::<u64>().map_err(|_| bad())).collect::<Result<Vec<u64>>>()?;
        Ok((numbers, target.trim().parse().map_err(|_| bad())?))
    }
}

impl Policy for CountdownSolverPolicy {
    fn name(&self) -> &str {
        "countdown-solver"
    }

    fn tokenizer(&self) -> &dyn Tokenizer {
        &ByteTokenizer
    }

    fn respond(&mut self, contexts: &[Context<'_>]) -> Result<Vec<Response>> {
        contexts
            .iter()
            .map(|c| {
                let (numbers, target) = Self::read(c.observation)?;
                let answer = countdown::solve(&numbers, target).unwrap_or_else(|| "0".into());
                Ok(scripted(c.prefill, "Searching every expression over the numbers.", &[answer.as_str()]))
            })
            .collect()
    }
}

/// A solver's reply: fixed text, so every token has probability 1.
fn scripted(prefill: &str, thought: &str, answers: &[&str]) -> Response {
    let text = reply(prefill, thought, answers);
    let tokens = ByteTokenizer.encode(&text);
    Response { logprobs: vec![0.0; tokens.len()], text, tokens }
}
