//! ragen-learner: StarPO and StarPO-S, one place per equation.
//!
//! Done so far (issue 5 is in progress): the advantage estimators
//! ([`gae`], [`grpo`]) and StarPO-S's variance filter ([`RolloutFilter`]).
//! The PPO loss, the presets and `train` build on these.

mod advantages;
mod filter;

pub use advantages::{gae, grpo};
pub use filter::RolloutFilter;
