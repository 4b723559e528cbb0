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
use crate::loss::{Clip, kl_to_reference, masked_log_softmax, masked_mean, policy_loss, value_loss};
use anyhow::{Context, Result, bail};
use burn::module::{AutodiffModule, ModuleVisitor, Param};
use burn::optim::adaptor::OptimizerAdaptor;
use burn::optim::{AdamW, AdamWConfig, GradientsParams, Optimizer};
use burn::prelude::*;
use burn::record::{BinFileRecorder, FullPrecisionSettings, Recorder};
use burn::tensor::ElementConversion;
use burn::tensor::backend::AutodiffBackend;
use ragen_agent::Trajectory;
use ragen_policy::{AnswerGrammar, PluginTokenizer, PolicyModel, PolicyNetwork};
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
    /// Weight of the KL to the frozen initial policy (vanilla StarPO 0.001,
    /// StarPO-S 0: no reference model is kept then).
    pub kl_coef: f64,
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
            kl_coef: 0.0,
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
    /// KL(policy ‖ frozen reference), k3 estimate; 0 when `kl_coef` is 0.
    pub kl_to_reference: f32,
    /// Global gradient norm before clipping.
    pub grad_norm: f32,
    pub agent_tokens: usize,
    /// Trajectories longer than the model's context, of which only the last
    /// `max_seq_len` tokens were trained on.
    pub truncated: usize,
}

/// One trajectory laid out for the update.
struct Row<'a> {
    trajectory: &'a Trajectory,
    tokens: Vec<u32>,
    /// Positions of the agent's tokens.
    agent: Vec<usize>,
    /// The grammar's mask at each agent token, `[agent.len() · vocab]`.
    allowed: Vec<bool>,
    old_logp: Vec<f32>,
}

/// The network being trained (any [`PolicyNetwork`]; our transformer by
/// default), its optimiser and the grammar its replies obey.
pub struct Learner<B: AutodiffBackend, M: AutodiffModule<B> = PolicyModel<B>> {
    model: Option<M>,
    /// The frozen initial policy the KL term pulls towards (only kept when
    /// `kl_coef` is not 0).
    reference: Option<M::InnerModule>,
    optimizer: OptimizerAdaptor<AdamW, M, B>,
    grammar: AnswerGrammar,
    config: UpdateConfig,
    device: B::Device,
}

impl<B, M> Learner<B, M>
where
    B: AutodiffBackend,
    M: PolicyNetwork<B> + AutodiffModule<B>,
    M::InnerModule: PolicyNetwork<B::InnerBackend>,
{
    pub fn new(model: M, grammar: AnswerGrammar, config: UpdateConfig, device: B::Device) -> Self {
        let optimizer = AdamWConfig::new().with_weight_decay(config.weight_decay).init();
        let reference = (config.kl_coef != 0.0).then(|| model.valid());
        Self { model: Some(model), reference, optimizer, grammar, config, device }
    }

    /// The model without gradient tracking, for sampling.
    pub fn policy_model(&self) -> M::InnerModule {
        self.model().valid()
    }

    pub fn model(&self) -> &M {
        self.model.as_ref().expect("the model is only taken during a step")
    }

    /// Write the model and the optimiser state into `dir` (which exists).
    pub fn save(&self, dir: &Path) -> Result<()> {
        let recorder = BinFileRecorder::<FullPrecisionSettings>::new();
        self.model().clone().save_file(dir.join("model"), &recorder).context("cannot write the model")?;
        recorder.record(self.optimizer.to_record(), dir.join("optimizer")).context("cannot write the optimizer state")?;
        if let Some(reference) = &self.reference {
            reference.clone().save_file(dir.join("reference"), &recorder).context("cannot write the reference model")?;
        }
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
        if let Some(reference) = self.reference.take() {
            let device = self.device.clone();
            self.reference = Some(match reference.load_file(dir.join("reference"), &recorder, &device) {
                Ok(r) => r,
                Err(e) => bail!("cannot read the reference model from `{}`: {e}", dir.display()),
            });
        }
        Ok(())
    }

    /// One update on `batch` (already filtered).
    pub fn update(&mut self, batch: &[&Trajectory], tokenizer: &PluginTokenizer) -> Result<UpdateStats> {
        let cfg = self.config;
        let model = self.model.take().expect("model present");
        let vocab = tokenizer.vocab_size();

        // 1. Lay out each trajectory: its tokens, where the agent's are, the
        //    grammar's mask at each of them, and their sampling log-probs.
        let mut rows: Vec<Row> = Vec::with_capacity(batch.len());
        let mut values_seen: Vec<Vec<f32>> = vec![];
        let mut truncated = 0;
        for t in batch {
            let mut view = t.token_view(tokenizer);
            // Sampling read each turn's last `max_seq_len - reply budget`
            // tokens; the update reads the conversation's last `max_seq_len`.
            truncated += view.keep_last(model.max_seq_len()) as usize;
            let agent: Vec<usize> = (0..view.tokens.len()).filter(|&i| view.loss_mask[i] == 1).collect();
            if agent.is_empty() {
                continue;
            }
            let mut allowed = Vec::with_capacity(agent.len() * vocab);
            for (k, &start) in view.turn_starts.iter().enumerate() {
                let end = view.turn_starts.get(k + 1).map_or(view.tokens.len(), |&n| n);
                let reply: Vec<u32> = (start..end).take_while(|&i| view.loss_mask[i] == 1).map(|i| view.tokens[i]).collect();
                let states = self.grammar.states(&reply).map_err(|e| anyhow::anyhow!("a reply breaks the grammar: {e}"))?;
                for s in states {
                    allowed.extend_from_slice(self.grammar.allowed(s));
                }
            }
            let old_logp = agent.iter().map(|&i| view.logprobs[i]).collect();
            rows.push(Row { trajectory: t, tokens: view.tokens, agent, allowed, old_logp });
        }
        if rows.is_empty() {
            self.model = Some(model);
            bail!("no agent tokens in the batch to learn from");
        }

        // 2. Forward passes over right-padded chunks (padding sits after each
        //    row's last token, so the causal mask already hides it); read
        //    off the agent tokens' log-probs, values and entropies, and the
        //    frozen reference's log-probs when the KL term is on.
        let (mut logps, mut values, mut entropies, mut ref_logps) = (vec![], vec![], vec![], vec![]);
        let mut rest = &rows[..];
        while !rest.is_empty() {
            let mut c = 1;
            while c < rest.len() {
                let len = rest[..=c].iter().map(|r| r.tokens.len()).max().unwrap_or(0);
                if c + 1 > model.rows_per_pass(len) {
                    break;
                }
                c += 1;
            }
            let (chunk, tail) = rest.split_at(c);
            rest = tail;
            let l = chunk.iter().map(|r| r.tokens.len()).max().unwrap_or(0);
            let ids: Vec<i64> = chunk
                .iter()
                .flat_map(|r| r.tokens.iter().map(|&x| x as i64).chain(std::iter::repeat_n(0, l - r.tokens.len())))
                .collect();
            // Token i of row r is predicted at flat position r·l + i − 1.
            let picks: Vec<i64> =
                chunk.iter().enumerate().flat_map(|(r, row)| row.agent.iter().map(move |&i| (r * l + i) as i64 - 1)).collect();
            let n = picks.len();
            let picks = Tensor::<B, 1, Int>::from_data(TensorData::new(picks, [n]), &self.device);
            let allowed: Vec<bool> = chunk.iter().flat_map(|r| r.allowed.iter().copied()).collect();
            let allowed = Tensor::<B, 2, Bool>::from_data(TensorData::new(allowed, [n, vocab]), &self.device);
            let taken: Vec<i64> = chunk.iter().flat_map(|r| r.agent.iter().map(|&i| r.tokens[i] as i64)).collect();
            let taken = Tensor::<B, 2, Int>::from_data(TensorData::new(taken, [n, 1]), &self.device);
            let ids = Tensor::<B, 2, Int>::from_data(TensorData::new(ids, [chunk.len(), l]), &self.device);

            let (logits, vals) = model.logits_and_values(ids.clone()); // [c, l, v], [c, l]
            let logits = logits.reshape([chunk.len() * l, vocab]).select(0, picks.clone()); // [n, v]
            let logp_all = masked_log_softmax(logits, allowed.clone(), cfg.temperature); // [n, v]
            logps.push(logp_all.clone().gather(1, taken.clone()).reshape([n]));
            entropies.push(crate::loss::entropy(logp_all));
            values.push(vals.reshape([chunk.len() * l]).select(0, picks.clone())); // [n]
            if let Some(reference) = &self.reference {
                let inner = |t: Tensor<B, 2, Int>| t.inner();
                let (logits, _) = reference.logits_and_values(inner(ids));
                let logits = logits.reshape([chunk.len() * l, vocab]).select(0, picks.inner());
                let logp_all = masked_log_softmax(logits, allowed.inner(), cfg.temperature);
                ref_logps.push(logp_all.gather(1, taken.inner()).reshape([n]));
            }
        }
        let value_tensor = Tensor::cat(values, 0);
        let flat_values = value_tensor.clone().into_data().convert::<f32>().to_vec::<f32>().expect("f32 values");
        let mut at = 0;
        for r in &rows {
            values_seen.push(flat_values[at..at + r.agent.len()].to_vec());
            at += r.agent.len();
        }
        let old_logps: Vec<Vec<f32>> = rows.iter().map(|r| r.old_logp.clone()).collect();
        let kept: Vec<&Trajectory> = rows.iter().map(|r| r.trajectory).collect();
        let seen: Vec<&Vec<f32>> = values_seen.iter().collect();

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
        let logp_for_kl = logp.clone();
        let value = value_tensor;
        let entropy = Tensor::cat(entropies, 0);
        let mask = Tensor::<B, 1>::ones([n], device);
        let old_values: Vec<f32> = seen.iter().flat_map(|v| v.iter().copied()).collect();
        let pg = policy_loss(logp, floats(old_logps.concat()), floats(advantages), mask.clone(), cfg.clip);
        let vl = value_loss(value, floats(old_values), floats(returns), mask.clone(), cfg.value_clip);
        let ent = masked_mean(entropy, mask.clone());
        let kl = if ref_logps.is_empty() {
            Tensor::<B, 1>::zeros([1], device)
        } else {
            kl_to_reference(logp_for_kl, Tensor::from_inner(Tensor::cat(ref_logps, 0)), mask.clone())
        };
        let loss = pg.loss.clone()
            + vl.clone() * if cfg.estimator == Estimator::Gae { cfg.value_coef } else { 0.0 }
            - ent.clone() * cfg.entropy_coef
            + kl.clone() * cfg.kl_coef;

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
            kl_to_reference: scalar(kl),
            grad_norm: norm as f32,
            agent_tokens: n,
            truncated,
        })
    }
}

/// √(Σ‖g‖²) over every parameter's gradient. Burn's own clipping works
/// per tensor; the global norm is also one of the Echo-Trap signals.
fn global_norm<B: AutodiffBackend, M: AutodiffModule<B>>(model: &M, grads: &GradientsParams) -> f64 {
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

fn scale_grads<B: AutodiffBackend, M: AutodiffModule<B>>(model: &M, grads: &mut GradientsParams, factor: f64) {
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
