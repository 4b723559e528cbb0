//! Replies recorded elsewhere (a file of trajectories: a scripted policy,
//! a person at `play`, another model), played again turn by turn, so that a
//! demonstration is rendered by this loop's prompts and checked by this
//! env.

use crate::policy::{ByteTokenizer, Context, Policy, Response, Tokenizer};
use crate::prompt::Role;
use crate::trajectory::Trajectory;
use anyhow::{Result, bail};

/// Plays `replies[env]` in order: env `i` of the rollout gets the replies
/// of the `i`-th recorded trajectory. Every token has probability 1.
pub struct ReplayPolicy {
    replies: Vec<Vec<String>>,
    /// The next reply of each env.
    next: Vec<usize>,
}

impl ReplayPolicy {
    /// The replies of each trajectory, each without the pre-fill it was
    /// recorded after. Fails when a recorded pre-fill is not `prefill`
    /// (thinking on in one and off in the other: the replies would not be
    /// what this loop parses).
    pub fn new(trajectories: &[&Trajectory], prefill: &str) -> Result<Self> {
        let mut replies = Vec::with_capacity(trajectories.len());
        for t in trajectories {
            let mut own = Vec::new();
            for s in t.segments.iter().filter(|s| s.role == Role::Assistant) {
                if s.prefill != prefill {
                    bail!(
                        "the demonstration of seed {} was recorded after the pre-fill {:?}, and this run's replies follow {prefill:?}: \
                         record it with the same enable_think",
                        t.seed,
                        s.prefill
                    );
                }
                own.push(s.text.strip_prefix(s.prefill.as_str()).unwrap_or(&s.text).to_string());
            }
            replies.push(own);
        }
        let next = vec![0; replies.len()];
        Ok(Self { replies, next })
    }
}

impl Policy for ReplayPolicy {
    fn name(&self) -> &str {
        "replay"
    }

    fn tokenizer(&self) -> &dyn Tokenizer {
        &ByteTokenizer
    }

    fn respond(&mut self, contexts: &[Context<'_>]) -> Result<Vec<Response>> {
        contexts
            .iter()
            .map(|c| {
                let (Some(replies), Some(next)) = (self.replies.get(c.env), self.next.get_mut(c.env)) else {
                    bail!("env {} has no recorded demonstration ({} were given)", c.env, self.replies.len())
                };
                let Some(text) = replies.get(*next) else {
                    bail!(
                        "env {}'s demonstration has {} replies and the episode wants more: it was recorded under other settings",
                        c.env,
                        replies.len()
                    )
                };
                *next += 1;
                let tokens = ByteTokenizer.encode(text);
                Ok(Response { logprobs: vec![0.0; tokens.len()], text: text.clone(), tokens })
            })
            .collect()
    }
}
