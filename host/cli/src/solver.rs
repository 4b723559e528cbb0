//! Plays Sokoban perfectly: reads the rendered state back into a room and
//! answers with the next moves of a shortest solution (BFS). It tests the
//! loop end to end: if the loop renders, parses and executes faithfully,
//! this policy solves every room whose solution fits the action budget.

use anyhow::{Context as _, Result, anyhow};
use ragen_agent::policies::reply;
use ragen_agent::{ByteTokenizer, Context, Policy, Response, Tokenizer};
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
                let text = reply(c.prefill, "Following the shortest solution.", &names);
                let tokens = ByteTokenizer.encode(&text);
                Ok(Response { logprobs: vec![0.0; tokens.len()], text, tokens })
            })
            .collect()
    }
}
