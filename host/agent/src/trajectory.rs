//! What one env's episode leaves for the learner and for people: the whole
//! conversation, the agent's tokens, and per-turn outcomes.

use crate::parse::Parsed;
use crate::policy::{Message, Tokenizer};
use crate::prompt::Role;
use anyhow::{Context, Result};
use serde::{Deserialize, Serialize};
use std::io::{BufRead, Write};

/// One message. Assistant messages keep the sampled tokens and their
/// log-probabilities (of the text after the pre-fill).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Segment {
    pub role: Role,
    /// The full text, pre-fill included for assistant messages.
    pub text: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub prefill: String,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tokens: Vec<u32>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub logprobs: Vec<f32>,
}

/// One reply and what it did.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Turn {
    /// The env's observation the reply answered: the state GiGPO groups
    /// steps by (empty in files written before it was kept).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub observation: String,
    pub parsed: Parsed,
    /// Actions executed (valid, within the budget, up to the first `done`).
    pub executed: Vec<String>,
    pub effective: usize,
    /// Sum of the env rewards of this turn's actions.
    pub reward: f64,
    /// The penalties charged for this reply (0 or negative): the format
    /// penalty, plus DAPO's overlong shaping when training turns it on.
    pub penalty: f64,
    pub done: bool,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Trajectory {
    /// Index of the group (prompt) this trajectory belongs to.
    pub group: usize,
    /// The seed every env in the group was reset from.
    pub seed: u64,
    /// The env that played it.
    pub env: usize,
    pub segments: Vec<Segment>,
    pub turns: Vec<Turn>,
    /// Env rewards plus format penalties: what the learner optimises.
    pub reward: f64,
    pub penalty: f64,
    pub success: bool,
    pub num_actions: usize,
    /// Executed / proposed actions over the whole episode.
    pub valid_action_ratio: f64,
    /// Actions that changed the state / executed actions.
    pub effective_action_ratio: f64,
    /// The rollout's `max_context_window`: how many turns each reply was
    /// sampled from (absent: the whole conversation).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub context_window: Option<u32>,
    /// Set when the env failed (trap, timeout, invalid output...).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failure: Option<String>,
    /// The failure's kind (`trap`, `timeout`, `invalid output`, ...).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failure_kind: Option<String>,
}

/// A trajectory as one token sequence.
#[derive(Clone, Debug, PartialEq)]
pub struct TokenView {
    pub tokens: Vec<u32>,
    /// 1 for tokens the agent sampled (trained on), 0 for the rest.
    pub loss_mask: Vec<u8>,
    /// The policy's log-probability of each agent token (0 elsewhere).
    pub logprobs: Vec<f32>,
    /// Index of the first sampled token of each turn.
    pub turn_starts: Vec<usize>,
}

impl TokenView {
    /// Keep only the last `n` tokens, as a model with a context of `n` can
    /// read them. A turn whose reply would lose its beginning is dropped from
    /// training (its tokens stay as context, with mask 0): the grammar's
    /// states, and so the learner's masks, are defined from a reply's start.
    /// Returns whether anything was cut.
    pub fn keep_last(&mut self, n: usize) -> bool {
        let Some(cut) = self.tokens.len().checked_sub(n).filter(|&c| c > 0) else { return false };
        self.tokens.drain(..cut);
        self.loss_mask.drain(..cut);
        self.logprobs.drain(..cut);
        // Sampled tokens before the first turn that starts inside the window
        // belong to a cut turn.
        let first_whole = self.turn_starts.iter().position(|&s| s >= cut).unwrap_or(self.turn_starts.len());
        let keep_from = self.turn_starts.get(first_whole).map_or(self.tokens.len(), |&s| s - cut);
        for m in &mut self.loss_mask[..keep_from] {
            *m = 0;
        }
        self.turn_starts = self.turn_starts[first_whole..].iter().map(|&s| s - cut).collect();
        true
    }
}

impl Trajectory {
    /// This trajectory with every reply re-encoded by `tokenizer` (the text
    /// after the pre-fill), each token at log-probability 0: a
    /// demonstration played by another policy (the env's oracle, a script,
    /// a person), ready for a model with that tokenizer to imitate. The
    /// prompts are the ones the demonstration was played with, so a warm
    /// start reads exactly what reinforcement learning will.
    pub fn retokenized(&self, tokenizer: &dyn Tokenizer) -> Trajectory {
        let mut t = self.clone();
        for s in t.segments.iter_mut().filter(|s| s.role == Role::Assistant) {
            let reply = s.text.strip_prefix(s.prefill.as_str()).unwrap_or(&s.text);
            s.tokens = tokenizer.encode(reply);
            s.logprobs = vec![0.0; s.tokens.len()];
        }
        t
    }

    /// The sequences the policy's replies were sampled from, each with
    /// its replies: the whole conversation as one view, or, with a context
    /// window or a chat template, one view per reply (the prompt it read,
    /// then the reply).
    pub fn token_views(&self, tokenizer: &dyn Tokenizer) -> Vec<TokenView> {
        if let Some(views) = self.chat_views(tokenizer) {
            return views;
        }
        if self.context_window.is_none() {
            return vec![self.token_view(tokenizer)];
        }
        (0..self.segments.len())
            .filter(|&i| self.segments[i].role == Role::Assistant)
            .map(|i| {
                let read: Vec<&Segment> = visible(&self.segments[..i], self.context_window).collect();
                lay_out(read.into_iter().chain(std::iter::once(&self.segments[i])), tokenizer)
            })
            .collect()
    }

    /// With a tokenizer that renders a chat template, one view per reply:
    /// the exact prompt the policy read ([`Tokenizer::chat_prompt`]) and the
    /// sampled tokens. A template may render a past reply otherwise than as
    /// its sampled tokens, so the whole conversation is not one sequence.
    fn chat_views(&self, tokenizer: &dyn Tokenizer) -> Option<Vec<TokenView>> {
        (0..self.segments.len())
            .filter(|&i| self.segments[i].role == Role::Assistant)
            .map(|i| {
                let messages: Vec<Message> =
                    visible(&self.segments[..i], self.context_window).map(|s| Message { role: s.role, text: &s.text }).collect();
                let reply = &self.segments[i];
                let prompt = tokenizer.chat_prompt(&messages, &reply.prefill)?;
                let n = prompt.len();
                Some(TokenView {
                    tokens: prompt.into_iter().chain(reply.tokens.iter().copied()).collect(),
                    loss_mask: std::iter::repeat_n(0, n).chain(std::iter::repeat_n(1, reply.tokens.len())).collect(),
                    logprobs: std::iter::repeat_n(0.0, n).chain(reply.logprobs.iter().copied()).collect(),
                    turn_starts: vec![n],
                })
            })
            .collect::<Option<Vec<_>>>()
            .filter(|views| !views.is_empty())
    }

    /// Lay the conversation out as tokens: each message's role header and
    /// text; in assistant messages the pre-fill is context (mask 0) and the
    /// sampled tokens are the agent's (mask 1). This is what the policy read
    /// only when there is no context window ([`Trajectory::token_views`]).
    pub fn token_view(&self, tokenizer: &dyn Tokenizer) -> TokenView {
        lay_out(self.segments.iter(), tokenizer)
    }

    /// The conversation as plain text, for people.
    pub fn transcript(&self) -> String {
        self.segments.iter().map(|s| format!("[{:?}]\n{}\n", s.role, s.text)).collect::<Vec<_>>().join("\n")
    }
}

/// The messages a policy reads before replying, of a conversation that
/// has reached `segments` (system, user, assistant, user, ...): all of
/// them, or with a window of `w` turns the system message and the last
/// `2w − 1` messages (the current user message and `w − 1` earlier
/// exchanges).
pub fn visible(segments: &[Segment], window: Option<u32>) -> impl Iterator<Item = &Segment> {
    let skip = match window {
        Some(w) if segments.len() > 2 * w as usize => segments.len() - (2 * w as usize - 1) - 1,
        _ => 0,
    };
    segments.iter().take(1).chain(segments.iter().skip(1 + skip))
}

/// Role header and text of each message; assistant messages as pre-fill
/// (context) then the sampled tokens (the agent's).
fn lay_out<'a>(segments: impl Iterator<Item = &'a Segment>, tokenizer: &dyn Tokenizer) -> TokenView {
    let mut v = TokenView { tokens: vec![], loss_mask: vec![], logprobs: vec![], turn_starts: vec![] };
    let context = |v: &mut TokenView, ids: Vec<u32>| {
        v.loss_mask.extend(std::iter::repeat_n(0, ids.len()));
        v.logprobs.extend(std::iter::repeat_n(0.0, ids.len()));
        v.tokens.extend(ids);
    };
    for s in segments {
        context(&mut v, tokenizer.role_header(s.role));
        if s.role == Role::Assistant {
            context(&mut v, tokenizer.encode(&s.prefill));
            v.turn_starts.push(v.tokens.len());
            v.tokens.extend(&s.tokens);
            v.loss_mask.extend(std::iter::repeat_n(1, s.tokens.len()));
            v.logprobs.extend(&s.logprobs);
        } else {
            context(&mut v, tokenizer.encode(&s.text));
        }
    }
    v
}

/// Write one JSON object per line.
pub fn write_jsonl(out: &mut dyn Write, trajectories: &[Trajectory]) -> Result<()> {
    for t in trajectories {
        serde_json::to_writer(&mut *out, t).context("cannot serialise a trajectory")?;
        out.write_all(b"\n").context("cannot write trajectories")?;
    }
    out.flush().context("cannot write trajectories")
}

/// Read what [`write_jsonl`] wrote; errors name the line.
pub fn read_jsonl(input: &mut dyn BufRead) -> Result<Vec<Trajectory>> {
    let mut out = Vec::new();
    for (i, line) in input.lines().enumerate() {
        let line = line.context("cannot read trajectories")?;
        if line.trim().is_empty() {
            continue;
        }
        out.push(serde_json::from_str(&line).with_context(|| format!("line {}: not a trajectory", i + 1))?);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::TokenView;

    /// Twenty tokens; two replies: 5..11 and 14..17.
    fn view() -> TokenView {
        let loss_mask: Vec<u8> = (0..20).map(|i| ((5..11).contains(&i) || (14..17).contains(&i)) as u8).collect();
        let logprobs = loss_mask.iter().map(|&m| -(m as f32)).collect();
        TokenView { tokens: (0..20).collect(), loss_mask, logprobs, turn_starts: vec![5, 14] }
    }

    #[test]
    fn keep_last_cuts_from_the_left_and_drops_a_reply_that_lost_its_start() {
        let mut v = view();
        assert!(!v.keep_last(20), "nothing to cut");
        assert!(!v.keep_last(64));

        assert!(v.keep_last(13)); // cut 7: the first reply loses tokens 5 and 6
        assert_eq!(v.tokens, (7..20).collect::<Vec<u32>>());
        assert_eq!(v.turn_starts, vec![14 - 7]);
        let trained: Vec<u32> = v.tokens.iter().zip(&v.loss_mask).filter(|(_, m)| **m == 1).map(|(t, _)| *t).collect();
        assert_eq!(trained, vec![14, 15, 16], "only the whole reply is still trained on");
        assert_eq!(v.logprobs.len(), 13);

        let mut v = view();
        assert!(v.keep_last(15)); // cut 5: both replies whole
        assert_eq!(v.turn_starts, vec![0, 9]);
        assert_eq!(v.loss_mask.iter().filter(|&&m| m == 1).count(), 9);
    }

    #[test]
    fn a_window_keeps_the_system_message_and_the_last_turns() {
        use super::{Segment, visible};
        use crate::prompt::Role;
        let seg = |role, text: &str| Segment { role, text: text.into(), prefill: String::new(), tokens: vec![], logprobs: vec![] };
        let conversation = [
            seg(Role::System, "s"),
            seg(Role::User, "u1"),
            seg(Role::Assistant, "a1"),
            seg(Role::User, "u2"),
            seg(Role::Assistant, "a2"),
            seg(Role::User, "u3"),
        ];
        let texts = |w| visible(&conversation, w).map(|s| s.text.as_str()).collect::<Vec<_>>();
        assert_eq!(texts(None), ["s", "u1", "a1", "u2", "a2", "u3"]);
        assert_eq!(texts(Some(1)), ["s", "u3"]);
        assert_eq!(texts(Some(2)), ["s", "u2", "a2", "u3"]);
        assert_eq!(texts(Some(3)), ["s", "u1", "a1", "u2", "a2", "u3"]);
        assert_eq!(texts(Some(9)), texts(None));
    }
}
