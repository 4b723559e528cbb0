//! ragen-learner: StarPO and StarPO-S, one place per equation.
//!
//! * [`Estimator`]: the advantage estimators (GAE, GRPO, Dr. GRPO, RLOO,
//!   REINFORCE++, GiGPO);
//! * [`RolloutFilter`]: StarPO-S's variance filter and RAGEN-2's adaptive
//!   selection modes;
//! * [`loss`]: the decoupled-clip PPO surrogate, the clipped value loss, the
//!   k3 KL to the frozen reference, masked entropy;
//! * [`Learner::update`]: one update, top to bottom; [`Learner::imitate`]:
//!   the supervised update of a warm start on demonstrations;
//! * [`Schedule`]: warm-up and decay of the learning rate and the entropy coefficient;
//! * [`config`]: the presets (`starpo-s`, `starpo`, `grpo`) and overrides;
//! * [`trainee`]: what trains, the from-scratch transformer ([`Scratch`])
//!   or a pretrained model with LoRA ([`Chat`]);
//! * [`train`]: the run loop (an optional warm start on demonstrations, then
//!   rollouts, filter, update, validation, metrics, checkpoints, resume);
//! * [`checkpoint`]: what a run directory and a checkpoint hold on disk,
//!   writing a checkpoint whole, finding the latest, loading it back.

mod advantages;
pub mod checkpoint;
pub mod config;
mod filter;
pub mod loss;
pub mod metrics;
mod overlong;
pub mod run;
mod schedule;
pub mod trainee;
mod update;
mod warm_start;

pub use advantages::{Estimator, Gigpo, SequenceInput, StepInput, gae, group_centred, grpo, rloo};
pub use checkpoint::{BaseModel, CheckpointInfo, RunDir, find_checkpoint, load_trained};
pub use config::{Algo, CriticSection, PluginRecord, Positions, SamplingSection, TrainConfig, WarmStartSection};
pub use filter::{FilterStrategy, RolloutFilter};
pub use metrics::{StepMetrics, read_metrics};
pub use overlong::Overlong;
pub use run::{build_learner, train};
pub use schedule::{Decay, Schedule};
pub use trainee::{Chat, Scratch, Trainee};
pub use update::{Learner, Passes, UpdateConfig, UpdateStats};
