//! DAPO's overlong reward shaping ("soft overlong punishment"): a reply
//! that runs into the last `buffer_len` tokens before the length limit
//! pays a penalty that grows linearly to `penalty_factor` at the limit.
//! DAPO adds it because a reply cut at the limit is punished for its
//! length, not its reasoning, and a smooth penalty tells the policy so
//! before the cut. verl's `reward_model.overlong_buffer` (`len`,
//! `penalty_factor`) is the same shaping; here it is `ppo.overlong_buffer_len`
//! and `ppo.overlong_penalty_factor`.
//!
//! In a multi-turn episode each reply is charged on its own, against the
//! per-turn limit (`sampling.max_new_tokens`): the penalty joins that
//! turn's format penalty, so GiGPO's step rewards see it where it was
//! earned and the trajectory's reward is the sum as before.
//!
//! # Examples
//!
//! ```
//! use ragen_learner::Overlong;
//!
//! // Replies of at most 200 tokens; the last 50 are the buffer.
//! let o = Overlong { max_tokens: 200, buffer_len: 50, penalty_factor: 1.0 };
//! assert_eq!(o.penalty(150), 0.0); // up to the buffer: free
//! assert_eq!(o.penalty(175), -0.5); // halfway through it
//! assert_eq!(o.penalty(200), -1.0); // at the limit: the whole factor
//! ```

use ragen_agent::{Role, Trajectory};

/// The shaping's settings: the limit, its buffer and the largest penalty.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Overlong {
    /// The longest reply, in tokens (`sampling.max_new_tokens`).
    pub max_tokens: usize,
    /// Tokens before the limit over which the penalty grows (1 to `max_tokens − 1`).
    pub buffer_len: usize,
    /// The penalty at (and past) the limit, as a positive number.
    pub penalty_factor: f64,
}

impl Overlong {
    /// The penalty of a reply of `tokens` tokens: 0 up to
    /// `max_tokens − buffer_len`, then `−(excess / buffer_len) · penalty_factor`,
    /// and `−penalty_factor` from the limit on.
    pub fn penalty(&self, tokens: usize) -> f64 {
        let expected = self.max_tokens.saturating_sub(self.buffer_len);
        let excess = tokens.saturating_sub(expected) as f64 / self.buffer_len as f64;
        -(excess.min(1.0) * self.penalty_factor)
    }

    /// Charge each reply of `t` its penalty, in its turn's penalty, the
    /// trajectory's penalty and its reward. A trajectory's replies are its
    /// assistant segments, one per turn and in the same order.
    pub fn shape(&self, t: &mut Trajectory) {
        let replies = t.segments.iter().filter(|s| s.role == Role::Assistant);
        for (turn, reply) in t.turns.iter_mut().zip(replies) {
            let p = self.penalty(reply.tokens.len());
            turn.penalty += p;
            t.penalty += p;
            t.reward += p;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ragen_agent::{Segment, Turn};

    #[test]
    fn each_reply_pays_for_its_own_length_in_its_turn_and_the_total() {
        let o = Overlong { max_tokens: 10, buffer_len: 4, penalty_factor: 0.5 };
        // Replies of 6 (free), 8 (half the buffer: −0.25) and 10 (−0.5) tokens.
        let seg = |role, n: usize| Segment { role, text: String::new(), prefill: String::new(), tokens: vec![0; n], logprobs: vec![] };
        let mut t = Trajectory {
            segments: vec![
                seg(Role::User, 30),
                seg(Role::Assistant, 6),
                seg(Role::User, 30),
                seg(Role::Assistant, 8),
                seg(Role::User, 30),
                seg(Role::Assistant, 10),
            ],
            turns: vec![Turn { reward: 1.0, penalty: -0.1, ..Turn::default() }, Turn::default(), Turn::default()],
            reward: 0.9,
            penalty: -0.1,
            ..Trajectory::default()
        };
        o.shape(&mut t);
        let turns: Vec<f64> = t.turns.iter().map(|t| t.penalty).collect();
        assert_eq!(turns, [-0.1, -0.25, -0.5]);
        assert!((t.penalty - -0.85).abs() < 1e-12 && (t.reward - 0.15).abs() < 1e-12, "{} {}", t.penalty, t.reward);
        // Past the limit (a policy that ignores it) the penalty stays at the factor.
        assert_eq!(o.penalty(25), -0.5);
    }
}
