//! ragen-learner: StarPO and StarPO-S, one place per equation.
//!
//! Done so far (issue 5 is in progress): the advantage estimators
//! ([`gae`], [`grpo`]), StarPO-S's variance filter ([`RolloutFilter`]), and
//! the loss terms ([`loss`]: the decoupled-clip PPO surrogate, the clipped
//! value loss, the k3 KL to a reference, masked entropy) and one update
//! ([`Learner::update`]). The training loop, the presets and `train` build
//! on these.

mod advantages;
mod filter;
pub mod loss;
mod update;

pub use advantages::{gae, grpo};
pub use filter::RolloutFilter;
pub use update::{Estimator, Learner, UpdateConfig, UpdateStats};
