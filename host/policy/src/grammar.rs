//! Constrained decoding for the answer format.
//!
//! A model trained from scratch practically never writes a well-formed
//! `<answer>` by chance, so every trajectory would earn the same format
//! penalty and there would be nothing to learn from. The grammar masks the
//! logits so that only tokens keeping the reply well-formed can be sampled;
//! the learner recomputes log-probabilities under the same masks
//! ([`AnswerGrammar::states`] replays a reply). The reply starts after the
//! pre-fill (`<think>`, or `<answer>` with thinking off).

use crate::tokenizer::{ANSWER_CLOSE, ANSWER_OPEN, PluginTokenizer, SEPARATOR, THINK_CLOSE};

/// Where a reply is in the format.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GrammarState {
    /// Thinking, with `used` thinking tokens written.
    Think { used: u32 },
    /// `</think>` is written; `<answer>` comes next.
    AnswerOpen,
    /// An action name comes next; `written` names so far.
    Action { written: u32 },
    /// After a name: ` || ` if another fits, or `</answer>`.
    AfterAction { written: u32 },
    /// `</answer>` is written; the reply is complete.
    Done,
}

/// Indices into `AnswerGrammar::masks`.
const THINKING: usize = 0;
const THINK_MUST_CLOSE: usize = 1;
const OPEN_ANSWER: usize = 2;
const ACTION: usize = 3;
const SEPARATOR_OR_CLOSE: usize = 4;
const CLOSE: usize = 5;
const NOTHING: usize = 6;

#[derive(Clone, Debug)]
pub struct AnswerGrammar {
    enable_think: bool,
    think_budget: u32,
    max_actions: u32,
    think_close: u32,
    answer_open: u32,
    answer_close: u32,
    separator: u32,
    /// One allowed-token mask per kind of state, `vocab_size` long each.
    masks: Vec<Vec<bool>>,
}

impl AnswerGrammar {
    /// The vocabulary its masks cover.
    pub fn vocab_size(&self) -> usize {
        self.masks.first().map_or(0, Vec::len)
    }

    /// `think_budget`: thinking tokens before `</think>` is forced;
    /// `max_actions`: action names per reply (at least 1).
    pub fn new(tokenizer: &PluginTokenizer, enable_think: bool, think_budget: u32, max_actions: u32) -> Self {
        let id = |w: &str| tokenizer.id(w).expect("format tags are in every plugin vocabulary");
        let (think_close, answer_open, answer_close, separator) = (id(THINK_CLOSE), id(ANSWER_OPEN), id(ANSWER_CLOSE), id(SEPARATOR));
        let v = tokenizer.vocab_size();
        let only = |ids: &[u32]| {
            let mut m = vec![false; v];
            for &i in ids {
                m[i as usize] = true;
            }
            m
        };
        // Thinking: any byte but `<` (so no tag can be spelled out of bytes),
        // the action names and symbols, and `</think>` to end it. No role
        // headers and no other tags.
        let mut thinking = vec![false; v];
        for (i, allowed) in thinking.iter_mut().enumerate() {
            let id = i as u32;
            *allowed = if tokenizer.is_byte(id) {
                id != u32::from(b'<')
            } else {
                let text = tokenizer.token_bytes(id);
                id == think_close || id == separator || !text.starts_with(b"<")
            };
        }
        let masks = vec![
            thinking,
            only(&[think_close]),
            only(&[answer_open]),
            only(tokenizer.action_tokens()),
            only(&[separator, answer_close]),
            only(&[answer_close]),
            vec![false; v],
        ];
        Self { enable_think, think_budget, max_actions: max_actions.max(1), think_close, answer_open, answer_close, separator, masks }
    }

    /// The state right after the pre-fill.
    pub fn start(&self) -> GrammarState {
        if self.enable_think { GrammarState::Think { used: 0 } } else { GrammarState::Action { written: 0 } }
    }

    fn mask_index(&self, state: GrammarState) -> usize {
        match state {
            GrammarState::Think { used } if used >= self.think_budget => THINK_MUST_CLOSE,
            GrammarState::Think { .. } => THINKING,
            GrammarState::AnswerOpen => OPEN_ANSWER,
            GrammarState::Action { .. } => ACTION,
            GrammarState::AfterAction { written } if written >= self.max_actions => CLOSE,
            GrammarState::AfterAction { .. } => SEPARATOR_OR_CLOSE,
            GrammarState::Done => NOTHING,
        }
    }

    /// `allowed[token]` in this state (all false once done).
    pub fn allowed(&self, state: GrammarState) -> &[bool] {
        &self.masks[self.mask_index(state)]
    }

    /// The state after writing `token`; an error if the token is not allowed.
    pub fn advance(&self, state: GrammarState, token: u32) -> Result<GrammarState, String> {
        if !self.allowed(state).get(token as usize).copied().unwrap_or(false) {
            return Err(format!("token {token} is not allowed in state {state:?}"));
        }
        Ok(match state {
            GrammarState::Think { .. } if token == self.think_close => GrammarState::AnswerOpen,
            GrammarState::Think { used } => GrammarState::Think { used: used + 1 },
            GrammarState::AnswerOpen => GrammarState::Action { written: 0 },
            GrammarState::Action { written } => GrammarState::AfterAction { written: written + 1 },
            GrammarState::AfterAction { .. } if token == self.answer_close => GrammarState::Done,
            GrammarState::AfterAction { written } => GrammarState::Action { written },
            GrammarState::Done => unreachable!("nothing is allowed once done"),
        })
    }

    /// The state before each token of a reply: what the learner needs to
    /// recompute log-probabilities under the masks sampling used.
    pub fn states(&self, tokens: &[u32]) -> Result<Vec<GrammarState>, String> {
        let mut state = self.start();
        let mut out = Vec::with_capacity(tokens.len());
        for &t in tokens {
            out.push(state);
            state = self.advance(state, t)?;
        }
        Ok(out)
    }

    /// Tokens of the longest reply the grammar allows: the thinking budget,
    /// `</think><answer>`, the names and separators, `</answer>`. A sampling
    /// budget of this many tokens always completes the reply.
    pub fn max_reply_tokens(&self) -> usize {
        let answer = 2 * self.max_actions as usize;
        if self.enable_think { self.think_budget as usize + 2 + answer } else { answer }
    }

    /// Tokens of the shortest well-formed reply from the start: the floor on
    /// a reply-length budget.
    pub fn min_reply_tokens(&self) -> usize {
        if self.enable_think { 4 } else { 2 }
    }

    /// The separator and closing tags (for callers that need to recognise them).
    pub fn answer_close(&self) -> u32 {
        self.answer_close
    }

    pub fn answer_open(&self) -> u32 {
        self.answer_open
    }

    pub fn separator(&self) -> u32 {
        self.separator
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tokenizer::tests::sokoban_spec;
    use ragen_agent::{ResponseParser, Tokenizer};
    use ragen_rng::SeedRng;

    /// Sample uniformly among allowed tokens until done.
    fn random_reply(g: &AnswerGrammar, rng: &mut SeedRng) -> Vec<u32> {
        let mut state = g.start();
        let mut out = vec![];
        while state != GrammarState::Done {
            let allowed: Vec<u32> = g.allowed(state).iter().enumerate().filter(|(_, a)| **a).map(|(i, _)| i as u32).collect();
            assert!(!allowed.is_empty(), "stuck in {state:?}");
            let t = allowed[rng.below(allowed.len())];
            out.push(t);
            state = g.advance(state, t).unwrap();
            assert!(out.len() < 1000, "no end");
        }
        out
    }

    #[test]
    fn every_sampled_reply_parses_without_penalty() {
        let spec = sokoban_spec();
        let tok = PluginTokenizer::new(&spec);
        for (think, prefill) in [(true, "<think>"), (false, "<answer>")] {
            let g = AnswerGrammar::new(&tok, think, 12, 5);
            let parser = ResponseParser::new(spec.action_names(), think, 5);
            let mut rng = SeedRng::new(9);
            for _ in 0..500 {
                let reply = random_reply(&g, &mut rng);
                let text = format!("{prefill}{}", tok.decode(&reply));
                let parsed = parser.parse(&text);
                assert!(!parsed.penalised, "{text:?} -> {parsed:?}");
                assert!((1..=5).contains(&parsed.actions.len()), "{text:?}");
                // The learner's replay sees the same states.
                assert_eq!(g.states(&reply).unwrap().len(), reply.len());
            }
        }
    }

    #[test]
    fn the_think_budget_and_action_cap_are_enforced() {
        let tok = PluginTokenizer::new(&sokoban_spec());
        let g = AnswerGrammar::new(&tok, true, 3, 2);
        let close = tok.id("</think>").unwrap();
        assert_eq!(g.allowed(GrammarState::Think { used: 3 }).iter().filter(|a| **a).count(), 1);
        assert!(g.allowed(GrammarState::Think { used: 3 })[close as usize]);
        let after_two = g.allowed(GrammarState::AfterAction { written: 2 });
        assert!(after_two[g.answer_close() as usize] && !after_two[g.separator() as usize]);
        let after_one = g.allowed(GrammarState::AfterAction { written: 1 });
        assert!(after_one[g.answer_close() as usize] && after_one[g.separator() as usize]);
        // Thinking cannot spell a tag out of bytes.
        assert!(!g.allowed(GrammarState::Think { used: 0 })[b'<' as usize]);
    }

    #[test]
    fn replaying_an_ill_formed_reply_is_an_error() {
        let tok = PluginTokenizer::new(&sokoban_spec());
        let g = AnswerGrammar::new(&tok, true, 8, 5);
        assert!(g.states(&tok.encode("hm</think><answer>Up</answer>")).is_ok());
        assert!(g.states(&tok.encode("hm</think>Up</answer>")).is_err(), "<answer> is missing");
        assert!(g.states(&tok.encode("hm</think><answer>Jump</answer>")).is_err(), "not an action");
    }
}
