//! ragen-learner: StarPO and StarPO-S, one place per equation.
//!
//! Done so far (issue 5 is in progress): the advantage estimators
//! ([`gae`], [`grpo`]), StarPO-S's variance filter ([`RolloutFilter`]), and
//! the loss terms ([`loss`]: the decoupled-clip PPO surrogate, the clipped
//! value loss, the k3 KL to a reference, masked entropy) and one update
//! ([`Learner::update`]). The training loop, the presets and `train` build
//! on these.

mod advantages;
pub mod config;
mod filter;
pub mod loss;
pub mod run;
mod update;

pub use advantages::{gae, grpo};
pub use filter::RolloutFilter;
pub use config::{Algo, TrainConfig};
pub use run::{StepMetrics, load_policy, train};
pub use update::{Estimator, Learner, UpdateConfig, UpdateStats};
