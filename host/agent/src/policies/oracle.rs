//! The env's own best play (the contract's optional `oracle`), written as
//! well-formed replies: the reference policy of `eval --policy oracle` and
//! the source of demonstrations for a supervised warm start.

use crate::policy::{ByteTokenizer, Context, Policy, Response, Tokenizer};
use anyhow::{Result, anyhow};
use ragen_runtime::Action;

/// Replies with the actions the env's oracle gives for the current state:
/// action names joined by ` || `, or the text of a text action. Every
/// token has probability 1 (the reply is determined by the state).
#[derive(Clone, Debug, Default)]
pub struct OraclePolicy;

/// Why a plugin cannot be played by its oracle, and what to do instead.
pub const ORACLE_MISSING: &str = "this plugin has no oracle (the optional `ragen:env/oracle` interface of wit/env.wit, \
     or `has-oracle` says false); with ragen-env-sdk, implement `Oracle` for the env and export it with \
     `export_env!(MyEnv, oracle)`";

/// The reasoning an oracle reply carries when thinking is on.
pub const ORACLE_THOUGHT: &str = "Playing the best move for this state.";

impl Policy for OraclePolicy {
    fn name(&self) -> &str {
        "oracle"
    }

    fn tokenizer(&self) -> &dyn Tokenizer {
        &ByteTokenizer
    }

    fn wants_oracle(&self) -> bool {
        true
    }

    fn respond(&mut self, contexts: &[Context<'_>]) -> Result<Vec<Response>> {
        contexts
            .iter()
            .map(|c| {
                let plan = c.oracle.ok_or_else(|| anyhow!("env {}: the loop gave the oracle policy no oracle answer", c.env))?;
                let words = plan
                    .iter()
                    .map(|a| match a {
                        Action::Id(id) => {
                            c.actions.get(*id as usize).map(String::as_str).ok_or_else(|| anyhow!("action id {id} has no name"))
                        }
                        Action::Text(text) => Ok(text.as_str()),
                    })
                    .collect::<Result<Vec<&str>>>()?;
                let text = super::reply(c.prefill, ORACLE_THOUGHT, &words);
                let tokens = ByteTokenizer.encode(&text);
                Ok(Response { logprobs: vec![0.0; tokens.len()], text, tokens })
            })
            .collect()
    }
}
