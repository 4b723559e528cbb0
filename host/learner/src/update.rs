//! One StarPO update on a batch of trajectories, top to bottom:
//!
//! 1. lay each trajectory out as tokens (the policy's own tokens for its
//!    replies) and run the model over it once, with gradients;
//! 2. read off, at every agent token, the log-probability under the grammar
//!    mask and temperature the reply was sampled with, the critic's value
//!    and the entropy;
//! 3. advantages: GAE over the agent tokens with the trajectory reward on
//!    the last one (PPO), or the group-normalised reward (GRPO); whitened
//!    over the batch;
//! 4. loss = clipped surrogate + value_coef · clipped value loss
//!    − entropy_coef · entropy (token means);
//! 5. global gradient norm, clipped to `max_grad_norm`; AdamW step.

use crate::advantages::{gae, grpo};
use crate::loss::{Clip, masked_log_softmax, masked_mean, policy_loss, value_loss};
use anyhow::{Context, Result, bail};
use burn::module::{AutodiffModule, ModuleVisitor, Param};
use burn::optim::adaptor::OptimizerAdaptor;
use burn::optim::{AdamW, AdamWConfig, GradientsParams, Optimizer};
use burn::prelude::*;
use burn::record::{BinFileRecorder, FullPrecisionSettings, Recorder};
use burn::tensor::ElementConversion;
use burn::tensor::backend::AutodiffBackend;
use ragen_agent::Trajectory;
use ragen_policy::{AnswerGrammar, PluginTokenizer, PolicyModel};
use std::path::Path;

/// Where advantages come from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Estimator {
    /// PPO with the critic: GAE over agent tokens.
    Gae,
    /// GRPO: group-normalised trajectory rewards, no critic.
    Grpo,
}

/// Every hyper-parameter of the update, named as in the reference.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct UpdateConfig {
    pub estimator: Estimator,
    pub clip: Clip,
    pub entropy_coef: f64,
    /// Weight of the value loss in the shared-trunk objective.
    pub value_coef: f64,
    pub value_clip: f64,
    pub gamma: f32,
    pub lambda: f32,
    pub max_grad_norm: f64,
    pub lr: f64,
    pub weight_decay: f32,
    /// The temperature replies were sampled at.
    pub temperature: f64,
}

impl Default for UpdateConfig {
    /// StarPO-S with a learning rate for a model trained from scratch.
    fn default() -> Self {
        Self {
            estimator: Estimator::Gae,
            clip: Clip { low: 0.2, high: 0.28 },
            entropy_coef: 0.001,
            value_coef: 0.5,
            value_clip: 0.5,
            gamma: 1.0,
            lambda: 1.0,
            max_grad_norm: 1.0,
            lr: 1e-3,
            weight_decay: 0.01,
            temperature: 1.0,
        }
    }
}

/// What one update measured (the Echo-Trap signals among them).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct UpdateStats {
    pub policy_loss: f32,
    pub value_loss: f32,
    pub entropy: f32,
    pub clip_fraction: f32,
    pub approx_kl: f32,
    /// Global gradient norm before clipping.
    pub grad_norm: f32,
    pub agent_tokens: usize,
}

/// The model being trained, its optimiser and the grammar its replies obey.
pub struct Learner<B: AutodiffBackend> {
    model: Option<PolicyModel<B>>,
    optimizer: OptimizerAdaptor<AdamW, PolicyModel<B>, B>,
    grammar: AnswerGrammar,
    config: UpdateConfig,
    device: B::Device,
}

impl<B: AutodiffBackend> Learner<B> {
    pub fn new(model: PolicyModel<B>, grammar: AnswerGrammar, config: UpdateConfig, device: B::Device) -> Self {
        let optimizer = AdamWConfig::new().with_weight_decay(config.weight_decay).init();
        Self { model: Some(model), optimizer, grammar, config, device }
    }

    /// The model without gradient tracking, for sampling.
    pub fn policy_model(&self) -> PolicyModel<B::InnerBackend> {
        self.model().valid()
    }

    pub fn model(&self) -> &PolicyModel<B> {
        self.model.as_ref().expect("the model is only taken during a step")
    }

    /// Write the model and the optimiser state into `dir` (which exists).
    pub fn save(&self, dir: &Path) -> Result<()> {
        let recorder = BinFileRecorder::<FullPrecisionSettings>::new();
        self.model().clone().save_file(dir.join("model"), &recorder).context("cannot write the model")?;
        recorder.record(self.optimizer.to_record(), dir.join("optimizer")).context("cannot write the optimizer state")?;
        Ok(())
    }

    /// Restore what [`Learner::save`] wrote.
    pub fn load(&mut self, dir: &Path) -> Result<()> {
        let recorder = BinFileRecorder::<FullPrecisionSettings>::new();
        let model = self.model.take().expect("model present");
        let model = model.load_file(dir.join("model"), &recorder, &self.device);
        let model = match model {
            Ok(m) => m,
            Err(e) => bail!("cannot read the model from `{}`: {e}", dir.display()),
        };
        self.model = Some(model);
        let record = recorder
            .load(dir.join("optimizer"), &self.device)
            .with_context(|| format!("cannot read the optimizer state from `{}`", dir.display()))?;
        self.optimizer = self.optimizer.clone().load_record(record);
        Ok(())
    }

    /// One update on `batch` (already filtered).
    pub fn update(&mut self, batch: &[&Trajectory], tokenizer: &PluginTokenizer) -> Result<UpdateStats> {
        let cfg = self.config;
        let model = self.model.take().expect("model present");
        let vocab = tokenizer.vocab_size();

        // 1-2. One forward per trajectory; gather the agent tokens' rows.
        let (mut logps, mut old_logps, mut values, mut entropies) = (vec![], vec![], vec![], vec![]);
        let mut values_seen: Vec<Vec<f32>> = vec![];
        for t in batch {
            let view = t.token_view(tokenizer);
            let agent: Vec<usize> = (0..view.tokens.len()).filter(|&i| view.loss_mask[i] == 1).collect();
            if agent.is_empty() {
                values_seen.push(vec![]);
                continue;
            }
            // Grammar states of every reply, turn by turn, for the masks.
            let mut allowed = Vec::with_capacity(agent.len() * vocab);
            for (k, &start) in view.turn_starts.iter().enumerate() {
                let end = view.turn_starts.get(k + 1).map_or(view.tokens.len(), |&n| n);
                let reply: Vec<u32> = (start..end).take_while(|&i| view.loss_mask[i] == 1).map(|i| view.tokens[i]).collect();
                let states = self.grammar.states(&reply).map_err(|e| anyhow::anyhow!("a reply breaks the grammar: {e}"))?;
                for s in states {
                    allowed.extend_from_slice(self.grammar.allowed(s));
                }
            }
            let n = agent.len();
            let l = view.tokens.len();
            let ids: Vec<i64> = view.tokens.iter().map(|&x| x as i64).collect();
            let (logits, vals) = model.forward(Tensor::<B, 2, Int>::from_data(TensorData::new(ids, [1, l]), &self.device));
            // Token i is predicted at position i − 1.
            let rows: Vec<i64> = agent.iter().map(|&i| i as i64 - 1).collect();
            let rows = Tensor::<B, 1, Int>::from_data(TensorData::new(rows, [n]), &self.device);
            let logits = logits.reshape([l, vocab]).select(0, rows.clone()); // [n, v]
            let value = vals.reshape([l]).select(0, rows); // [n]
            let allowed = Tensor::<B, 2, Bool>::from_data(TensorData::new(allowed, [n, vocab]), &self.device);
            let logp_all = masked_log_softmax(logits, allowed, cfg.temperature); // [n, v]
            let taken: Vec<i64> = agent.iter().map(|&i| view.tokens[i] as i64).collect();
            let taken = Tensor::<B, 2, Int>::from_data(TensorData::new(taken, [n, 1]), &self.device);
            logps.push(logp_all.clone().gather(1, taken).reshape([n]));
            entropies.push(crate::loss::entropy(logp_all));
            old_logps.push(agent.iter().map(|&i| view.logprobs[i]).collect::<Vec<f32>>());
            values_seen.push(value.clone().into_data().convert::<f32>().to_vec::<f32>().expect("f32 values"));
            values.push(value);
        }
        let kept: Vec<&&Trajectory> = batch.iter().zip(&values_seen).filter(|(_, v)| !v.is_empty()).map(|(t, _)| t).collect();
        if kept.is_empty() {
            self.model = Some(model);
            bail!("no agent tokens in the batch to learn from");
        }
        let seen: Vec<&Vec<f32>> = values_seen.iter().filter(|v| !v.is_empty()).collect();

        // 3. Advantages and returns, then whitening over the batch.
        let mut advantages: Vec<f32> = vec![];
        let mut returns: Vec<f32> = vec![];
        match cfg.estimator {
            Estimator::Gae => {
                for (t, v) in kept.iter().zip(&seen) {
                    let mut rewards = vec![0.0; v.len()];
                    *rewards.last_mut().unwrap() = t.reward as f32;
                    let (a, r) = gae(&rewards, v, cfg.gamma, cfg.lambda);
                    advantages.extend(a);
                    returns.extend(r);
                }
            }
            Estimator::Grpo => {
                let rewards: Vec<f32> = kept.iter().map(|t| t.reward as f32).collect();
                let groups: Vec<usize> = kept.iter().map(|t| t.group).collect();
                for ((a, v), t) in grpo(&rewards, &groups, 1e-6).into_iter().zip(&seen).zip(&kept) {
                    advantages.extend(std::iter::repeat_n(a, v.len()));
                    returns.extend(std::iter::repeat_n(t.reward as f32, v.len()));
                }
            }
        }
        let n = advantages.len();
        let mean = advantages.iter().sum::<f32>() / n as f32;
        let std = (advantages.iter().map(|a| (a - mean).powi(2)).sum::<f32>() / n as f32).sqrt();
        for a in &mut advantages {
            *a = (*a - mean) / (std + 1e-8);
        }

        // 4. The objective.
        let device = &self.device;
        let floats = |xs: Vec<f32>| Tensor::<B, 1>::from_data(TensorData::new(xs, [n]), device);
        let logp = Tensor::cat(logps, 0);
        let value = Tensor::cat(values, 0);
        let entropy = Tensor::cat(entropies, 0);
        let mask = Tensor::<B, 1>::ones([n], device);
        let old_values: Vec<f32> = seen.iter().flat_map(|v| v.iter().copied()).collect();
        let pg = policy_loss(logp, floats(old_logps.concat()), floats(advantages), mask.clone(), cfg.clip);
        let vl = value_loss(value, floats(old_values), floats(returns), mask.clone(), cfg.value_clip);
        let ent = masked_mean(entropy, mask);
        let loss = pg.loss.clone()
            + vl.clone() * if cfg.estimator == Estimator::Gae { cfg.value_coef } else { 0.0 }
            - ent.clone() * cfg.entropy_coef;

        // 5. Gradients, global norm, clip, step.
        let grads = loss.backward();
        let mut grads = GradientsParams::from_grads(grads, &model);
        let norm = global_norm(&model, &grads);
        if norm.is_finite() && norm > cfg.max_grad_norm {
            scale_grads(&model, &mut grads, cfg.max_grad_norm / norm);
        }
        if !norm.is_finite() {
            self.model = Some(model);
            bail!("the gradient norm is {norm}; the update was skipped and the model is unchanged");
        }
        self.model = Some(self.optimizer.step(cfg.lr, model, grads));
        let scalar = |t: Tensor<B, 1>| t.into_scalar().elem::<f32>();
        Ok(UpdateStats {
            policy_loss: scalar(pg.loss),
            value_loss: scalar(vl),
            entropy: scalar(ent),
            clip_fraction: scalar(pg.clip_fraction),
            approx_kl: scalar(pg.approx_kl),
            grad_norm: norm as f32,
            agent_tokens: n,
        })
    }
}

/// √(Σ‖g‖²) over every parameter's gradient. Burn's own clipping works
/// per tensor; the global norm is also one of the Echo-Trap signals.
fn global_norm<B: AutodiffBackend>(model: &PolicyModel<B>, grads: &GradientsParams) -> f64 {
    struct Norm<'a> {
        grads: &'a GradientsParams,
        sum: f64,
    }
    impl<B: AutodiffBackend> ModuleVisitor<B> for Norm<'_> {
        fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
            if let Some(g) = self.grads.get::<B::InnerBackend, D>(param.id) {
                self.sum += g.powi_scalar(2).sum().into_scalar().elem::<f64>();
            }
        }
    }
    let mut v = Norm { grads, sum: 0.0 };
    model.visit(&mut v);
    v.sum.sqrt()
}

fn scale_grads<B: AutodiffBackend>(model: &PolicyModel<B>, grads: &mut GradientsParams, factor: f64) {
    struct Scale<'a> {
        grads: &'a mut GradientsParams,
        factor: f64,
    }
    impl<B: AutodiffBackend> ModuleVisitor<B> for Scale<'_> {
        fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
            if let Some(g) = self.grads.remove::<B::InnerBackend, D>(param.id) {
                self.grads.register::<B::InnerBackend, D>(param.id, g * self.factor);
            }
        }
    }
    model.visit(&mut Scale { grads, factor });
}
