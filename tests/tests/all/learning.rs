//! The whole loop learns: rollouts through the sandbox, the Burn policy
//! sampling under the grammar, and StarPO updates.

use burn::backend::{Autodiff, Flex};
use ragen_agent::{PromptTemplates, Role, RolloutConfig, RolloutRunner, Tokenizer, Trajectory, summarize};
use ragen_learner::loss::LossAgg;
use ragen_learner::{Estimator, Learner, UpdateConfig};
use ragen_policy::{AnswerGrammar, BurnPolicy, PluginTokenizer, PolicyModelConfig, SamplingConfig};
use std::time::Instant;

use crate::common::scratch_model;

type B = Autodiff<Flex>;

#[test]
fn a_tiny_transformer_learns_to_pick_the_better_arm() {
    let started = Instant::now();
    // The better arm always pays 1, the other 0.1: a clear signal, so the
    // test is about the machinery, not about patience.
    let settings = vec![("hi_arm_hiscore_prob".to_string(), "1.0".to_string())];
    // A short prompt: this model reads tokens, not English.
    let templates = PromptTemplates {
        system: String::new(),
        intro: "{actions}\n".into(),
        intro_text: String::new(),
        legend: String::new(),
        turn: "{state}\n".into(),
        reward: "{reward}\n".into(),
        no_effect: String::new(),
        format_think: String::new(),
        format_answer: String::new(),
    };
    let config = RolloutConfig { env_groups: 4, group_size: 8, enable_think: false, ..RolloutConfig::default() };
    let runner =
        RolloutRunner::new(ragen_runtime::LocalPlugin::provider(crate::common::shipped("bandit")), &settings, config, templates, 2)
            .unwrap();
    let tok = PluginTokenizer::new(runner.spec());
    let device = Default::default();
    let model = scratch_model::<B>(
        &PolicyModelConfig::new(tok.vocab_size()).with_d_model(32).with_n_layers(1).with_n_heads(2).with_max_seq_len(256),
        0,
    );
    let grammar = AnswerGrammar::new(&tok, false, 0, 1);
    let mut learner = Learner::new(model, Some(grammar), UpdateConfig { lr: 3e-3, ..UpdateConfig::default() }, device);

    let mut history = vec![];
    for step in 0..60u64 {
        let sampling = SamplingConfig { temperature: 1.0, think_budget: 0 };
        let mut policy = BurnPolicy::new(learner.policy_model(), tok.clone(), false, 1, sampling, step, Default::default());
        let seeds: Vec<u64> = (0..4).map(|g| step * 4 + g).collect();
        let ts = runner.run(&mut policy, &seeds).unwrap();
        let success = summarize(&ts).success_rate;
        history.push(success);
        if history.len() >= 3 && history[history.len() - 3..].iter().all(|&s| s >= 0.95) {
            break;
        }
        let batch: Vec<&Trajectory> = ts.iter().collect();
        let stats = learner.update(&batch, &tok).unwrap();
        assert!(stats.grad_norm.is_finite() && stats.entropy.is_finite(), "{stats:?}");
    }
    eprintln!("success per update: {history:?} ({:?})", started.elapsed());
    let last = &history[history.len() - 3..];
    assert!(last.iter().all(|&s| s >= 0.95), "did not learn within {} updates: {history:?}", history.len());
}

#[test]
fn the_kl_term_starts_at_zero_and_grows_as_the_policy_moves() {
    let templates = short_templates();
    let config = RolloutConfig { env_groups: 4, group_size: 8, enable_think: false, ..RolloutConfig::default() };
    let runner =
        RolloutRunner::new(ragen_runtime::LocalPlugin::provider(crate::common::shipped("bandit")), &[], config, templates, 2).unwrap();
    let tok = PluginTokenizer::new(runner.spec());
    let device = Default::default();
    let model = scratch_model::<B>(
        &PolicyModelConfig::new(tok.vocab_size()).with_d_model(32).with_n_layers(1).with_n_heads(2).with_max_seq_len(256),
        1,
    );
    let grammar = AnswerGrammar::new(&tok, false, 0, 1);
    let mut learner = Learner::new(model, Some(grammar), UpdateConfig { lr: 1e-2, kl_coef: 0.01, ..UpdateConfig::default() }, device);
    let mut kls = vec![];
    for step in 0..4u64 {
        let sampling = SamplingConfig { temperature: 1.0, think_budget: 0 };
        let mut policy = BurnPolicy::new(learner.policy_model(), tok.clone(), false, 1, sampling, step, Default::default());
        let ts = runner.run(&mut policy, &[step, step + 10, step + 20, step + 30]).unwrap();
        let batch: Vec<&Trajectory> = ts.iter().collect();
        kls.push(learner.update(&batch, &tok).unwrap().kl_to_reference);
    }
    // The first update compares the reference with itself.
    assert!(kls[0].abs() < 1e-6, "{kls:?}");
    assert!(kls[3] > 1e-5, "the policy moved, so the KL must be positive: {kls:?}");
}

/// The short prompt the tests use: action names, then each state.
fn short_templates() -> PromptTemplates {
    PromptTemplates {
        system: String::new(),
        intro: "{actions}\n".into(),
        legend: String::new(),
        turn: "{state}\n".into(),
        ..PromptTemplates::default()
    }
}

/// FrozenLake rollouts (several turns each) from a fresh tiny model, with
/// the short prompt the tests use.
fn frozenlake_batch(update: UpdateConfig) -> (Vec<Trajectory>, PluginTokenizer, Learner<B>) {
    let templates = short_templates();
    let config =
        RolloutConfig { env_groups: 4, group_size: 4, enable_think: false, max_actions_per_turn: Some(1), ..RolloutConfig::default() };
    let settings = vec![("is_slippery".to_string(), "false".to_string())];
    let runner =
        RolloutRunner::new(ragen_runtime::LocalPlugin::provider(crate::common::shipped("frozenlake")), &settings, config, templates, 2)
            .unwrap();
    let tok = PluginTokenizer::new(runner.spec());
    let device = Default::default();
    let model = scratch_model::<B>(
        &PolicyModelConfig::new(tok.vocab_size()).with_d_model(32).with_n_layers(1).with_n_heads(2).with_max_seq_len(256),
        2,
    );
    let grammar = AnswerGrammar::new(&tok, false, 0, 1);
    let learner = Learner::new(model, Some(grammar), update, device);
    let sampling = SamplingConfig { temperature: 1.0, think_budget: 0 };
    let mut policy = BurnPolicy::new(learner.policy_model(), tok.clone(), false, 1, sampling, 7, Default::default());
    let ts = runner.run(&mut policy, &[1, 2, 3, 4]).unwrap();
    assert!(ts.iter().any(|t| t.turns.len() > 1), "the batch needs later turns to have observations to predict");
    (ts, tok, learner)
}

#[test]
fn every_turn_keeps_the_state_it_answered_and_every_estimator_and_aggregation_trains() {
    let (ts, tok, first) = frozenlake_batch(UpdateConfig::default());
    for t in &ts {
        let prompts: Vec<&str> = t.segments.windows(2).filter(|w| w[1].role == Role::Assistant).map(|w| w[0].text.as_str()).collect();
        assert_eq!(prompts.len(), t.turns.len());
        for (turn, prompt) in t.turns.iter().zip(prompts) {
            assert!(!turn.observation.is_empty() && prompt.contains(&turn.observation), "{:?} not in {prompt:?}", turn.observation);
        }
    }
    // A group's members start from one state: GiGPO's first anchor.
    assert!(ts.chunks(4).all(|g| g.iter().all(|t| t.turns[0].observation == g[0].turns[0].observation)));
    let batch: Vec<&Trajectory> = ts.iter().collect();
    for name in ["grpo", "dr_grpo", "rloo", "reinforce_plus_plus", "gigpo"] {
        for loss_agg in [LossAgg::TokenMean, LossAgg::SeqMeanTokenSum, LossAgg::SeqMeanTokenMean] {
            let estimator = Estimator::parse(name).unwrap();
            let update = UpdateConfig { lr: 3e-3, estimator, loss_agg, ..UpdateConfig::default() };
            let mut learner = Learner::new(first.model().clone(), Some(AnswerGrammar::new(&tok, false, 0, 1)), update, Default::default());
            let stats = learner.update(&batch, &tok).unwrap();
            assert!(
                stats.policy_loss.is_finite() && stats.grad_norm > 0.0 && stats.grad_norm.is_finite(),
                "{name} {loss_agg:?}: {stats:?}"
            );
        }
    }
}

#[test]
fn epochs_and_mini_batches_take_one_step_each_and_move_the_policy_off_the_sampler() {
    let (ts, tok, mut learner) = frozenlake_batch(UpdateConfig { lr: 3e-3, epochs: 3, mini_batch_size: 6, ..UpdateConfig::default() });
    let batch: Vec<&Trajectory> = ts.iter().collect();
    let stats = learner.update(&batch, &tok).unwrap();
    // 16 trajectories in mini-batches of 6: 3 steps per epoch, 3 epochs.
    assert_eq!(stats.optimizer_steps, 9, "{stats:?}");
    // The first step's ratio is exactly 1; later steps see a moved policy,
    // so the mean approximate KL over the steps is not 0.
    assert!(stats.approx_kl.abs() > 1e-6, "{stats:?}");
    assert_eq!(stats.world_model_loss, 0.0, "off by default");
}

#[test]
fn the_world_model_loss_predicts_the_next_observation_and_falls_with_training() {
    let (ts, tok, mut learner) = frozenlake_batch(UpdateConfig { lr: 3e-3, world_model_coef: 1.0, ..UpdateConfig::default() });
    let batch: Vec<&Trajectory> = ts.iter().collect();
    let losses: Vec<f32> = (0..30).map(|_| learner.update(&batch, &tok).unwrap().world_model_loss).collect();
    // Untrained, about ln(vocab) nats per token; the observations repeat
    // the previous grid almost exactly, so it must fall well below that.
    assert!(losses[0] > 2.0, "{losses:?}");
    assert!(losses[29] < 0.5 * losses[0], "{losses:?}");
}

#[test]
fn with_a_context_window_the_learner_reads_exactly_what_each_reply_was_sampled_from() {
    let templates = PromptTemplates {
        system: "Play.".into(),
        intro: "{actions}\n".into(),
        legend: String::new(),
        turn: "{state}\n".into(),
        ..PromptTemplates::default()
    };
    let config = RolloutConfig {
        env_groups: 4,
        group_size: 4,
        enable_think: false,
        max_actions_per_turn: Some(1),
        max_context_window: Some(1),
        ..RolloutConfig::default()
    };
    let settings = vec![("is_slippery".to_string(), "false".to_string())];
    let runner =
        RolloutRunner::new(ragen_runtime::LocalPlugin::provider(crate::common::shipped("frozenlake")), &settings, config, templates, 2)
            .unwrap();
    let tok = PluginTokenizer::new(runner.spec());
    let device = Default::default();
    let model = scratch_model::<B>(
        &PolicyModelConfig::new(tok.vocab_size()).with_d_model(32).with_n_layers(1).with_n_heads(2).with_max_seq_len(256),
        3,
    );
    let mut learner = Learner::new(model, Some(AnswerGrammar::new(&tok, false, 0, 1)), UpdateConfig::default(), device);
    let sampling = SamplingConfig { temperature: 1.0, think_budget: 0 };
    let mut policy = BurnPolicy::new(learner.policy_model(), tok.clone(), false, 1, sampling, 3, Default::default());
    let ts = runner.run(&mut policy, &[1, 2, 3, 4]).unwrap();
    let t = ts.iter().find(|t| t.turns.len() >= 3).expect("some episode lasts three turns");
    // One view per reply, each the system message (with the task), the
    // current state and the reply: the same length every turn.
    let views = t.token_views(&tok);
    assert_eq!(views.len(), t.turns.len());
    assert!(views.iter().all(|v| v.turn_starts.len() == 1), "one reply per view");
    assert_eq!(views[1].tokens.len(), views[2].tokens.len(), "a window of one turn does not grow");
    assert!(
        tok.decode(&views[2].tokens).starts_with("<|system|>\nPlay.\nLeft, Down, Right, Up\n<|user|>\n"),
        "{}",
        tok.decode(&views[2].tokens)
    );
    // The learner's first step recomputes the sampling log-probs exactly.
    let batch: Vec<&Trajectory> = ts.iter().collect();
    let stats = learner.update(&batch, &tok).unwrap();
    assert!(stats.approx_kl.abs() < 1e-5 && stats.clip_fraction == 0.0, "{stats:?}");
}

/// The default model, but the learner may put only one row in each pass.
#[derive(burn::module::Module, Debug)]
struct OneRowPerPass<B: burn::prelude::Backend> {
    inner: ragen_policy::PolicyModel<B>,
}

impl<B: ragen_ops::AttentionBackend + ragen_ops::PointwiseBackend> ragen_policy::PolicyNetwork<B> for OneRowPerPass<B> {
    fn hidden_at_and_values(
        &self,
        tokens: burn::prelude::Tensor<B, 2, burn::prelude::Int>,
        at: burn::prelude::Tensor<B, 1, burn::prelude::Int>,
    ) -> (burn::prelude::Tensor<B, 2>, burn::prelude::Tensor<B, 2>) {
        self.inner.hidden_at_and_values(tokens, at)
    }

    fn output_layer(&self) -> ragen_ops::OutputLayer<B> {
        self.inner.output_layer()
    }

    fn rows_per_pass(&self, _: usize) -> usize {
        1
    }

    fn max_seq_len(&self) -> usize {
        self.inner.max_seq_len()
    }
}

#[test]
fn a_step_taken_one_row_per_pass_equals_the_step_taken_in_one_pass() {
    // The KL and world-model terms on too, so every term's share is checked.
    let update = UpdateConfig { lr: 3e-3, kl_coef: 0.01, world_model_coef: 0.5, ..UpdateConfig::default() };
    let (ts, tok, whole) = frozenlake_batch(update);
    let batch: Vec<&Trajectory> = ts.iter().collect();
    let grammar = AnswerGrammar::new(&tok, false, 0, 1);
    let split = OneRowPerPass { inner: whole.model().clone() };
    let mut split = Learner::new(split, Some(grammar), update, Default::default());
    let mut whole = whole;
    let a = whole.update(&batch, &tok).unwrap();
    let b = split.update(&batch, &tok).unwrap();
    let close = |x: f32, y: f32| (x - y).abs() <= 1e-5 + 1e-4 * x.abs().max(y.abs());
    for (name, x, y) in [
        ("policy loss", a.policy_loss, b.policy_loss),
        ("value loss", a.value_loss, b.value_loss),
        ("entropy", a.entropy, b.entropy),
        ("world-model loss", a.world_model_loss, b.world_model_loss),
        ("gradient norm", a.grad_norm, b.grad_norm),
    ] {
        assert!(close(x, y), "{name}: {x} in one pass, {y} one row per pass");
    }
    assert!(a.grad_norm > 0.0 && a.world_model_loss > 0.0);
    // And the models they step to.
    let (pa, pb) = (weights(&whole.policy_model()), weights(&split.policy_model().inner));
    // AdamW's first step moves each weight by about lr·g/|g|, which float
    // noise in a near-zero gradient can change by a few percent of lr.
    let gap = pa.iter().zip(&pb).fold(0f32, |m, (x, y)| m.max((x - y).abs()));
    assert!(gap < 0.05 * 3e-3, "the parameters after the step differ by {gap}");
}

/// Every weight of `m`, in visiting order.
fn weights(m: &ragen_policy::PolicyModel<Flex>) -> Vec<f32> {
    use burn::module::Module;
    let mut all = vec![];
    struct Collect<'a>(&'a mut Vec<f32>);
    impl burn::module::ModuleVisitor<Flex> for Collect<'_> {
        fn visit_float<const D: usize>(&mut self, param: &burn::module::Param<burn::prelude::Tensor<Flex, D>>) {
            self.0.extend(param.val().into_data().to_vec::<f32>().unwrap());
        }
    }
    m.visit(&mut Collect(&mut all));
    all
}

/// A small critic network for the tests' tokenizer, its weights drawn.
fn small_critic(tok: &PluginTokenizer) -> ragen_policy::PolicyModel<B> {
    scratch_model(&PolicyModelConfig::new(tok.vocab_size()).with_d_model(16).with_n_layers(1).with_n_heads(2).with_max_seq_len(256), 1)
}

#[test]
fn a_critic_of_its_own_takes_the_value_loss_off_the_policy_and_fits_the_returns() {
    let update = UpdateConfig { lr: 3e-3, value_coef: 0.5, ..UpdateConfig::default() };
    let (ts, tok, shared) = frozenlake_batch(update);
    let batch: Vec<&Trajectory> = ts.iter().collect();
    let grammar = || Some(AnswerGrammar::new(&tok, false, 0, 1));
    let policy = shared.model().clone();
    let critic = small_critic(&tok);
    // The same policy and critic, with the value loss weighed 0.5 and 0.
    let learner = |value_coef: f64| {
        Learner::new(policy.clone(), grammar(), UpdateConfig { value_coef, ..update }, Default::default()).with_critic(critic.clone(), 1.0)
    };
    let (mut half, mut zero) = (learner(0.5), learner(0.0));
    let (a, b) = (half.update(&batch, &tok).unwrap(), zero.update(&batch, &tok).unwrap());
    assert_eq!(weights(&half.policy_model()), weights(&zero.policy_model()), "value_coef must not reach the policy's step");
    assert!(a.critic_grad_norm > 0.0 && a.critic_grad_norm == b.critic_grad_norm, "{a:?}");
    // Control: with the value head on the trunk, value_coef does move it.
    let mut shared_zero = Learner::new(policy.clone(), grammar(), UpdateConfig { value_coef: 0.0, ..update }, Default::default());
    let mut shared = shared;
    shared.update(&batch, &tok).unwrap();
    shared_zero.update(&batch, &tok).unwrap();
    assert_ne!(weights(&shared.policy_model()), weights(&shared_zero.policy_model()));
    // The critic alone fits the batch's returns.
    let losses: Vec<f32> = (0..25).map(|_| half.update(&batch, &tok).unwrap().value_loss).collect();
    assert!(losses[24] < 0.5 * a.value_loss, "the critic's value loss went from {} to {losses:?}", a.value_loss);
}

#[test]
fn a_critic_of_its_own_is_checkpointed_with_its_optimizer() {
    let update = UpdateConfig { lr: 3e-3, ..UpdateConfig::default() };
    let (ts, tok, learner) = frozenlake_batch(update);
    let batch: Vec<&Trajectory> = ts.iter().collect();
    let grammar = || Some(AnswerGrammar::new(&tok, false, 0, 1));
    let policy = learner.model().clone();
    let mut trained = Learner::new(policy.clone(), grammar(), update, Default::default()).with_critic(small_critic(&tok), 1.0);
    trained.update(&batch, &tok).unwrap();
    let dir = std::env::temp_dir().join(format!("ragen-critic-checkpoint-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    trained.save(&dir).unwrap();
    // A fresh critic of other weights, loaded from the checkpoint, steps
    // exactly as the one that wrote it (weights and AdamW moments).
    let mut resumed = Learner::new(policy.clone(), grammar(), update, Default::default()).with_critic(small_critic(&tok), 1.0);
    resumed.load(&dir).unwrap();
    let (a, b) = (trained.update(&batch, &tok).unwrap(), resumed.update(&batch, &tok).unwrap());
    assert_eq!((a.value_loss, a.critic_grad_norm), (b.value_loss, b.critic_grad_norm));
    assert_eq!(weights(&trained.policy_model()), weights(&resumed.policy_model()));
    // A checkpoint without a critic is refused by a learner that has one,
    // with what to do.
    let plain = dir.join("plain");
    std::fs::create_dir_all(&plain).unwrap();
    Learner::new(policy.clone(), grammar(), update, Default::default()).save(&plain).unwrap();
    let err = format!("{:#}", resumed.load(&plain).unwrap_err());
    assert!(err.contains("[critic]") && err.contains("resume with the config"), "{err}");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn the_imitation_loss_is_the_mean_surprise_of_the_agent_tokens_alone() {
    let (ts, tok, mut learner) = frozenlake_batch(UpdateConfig { lr: 1e-3, ..UpdateConfig::default() });
    let batch: Vec<&Trajectory> = ts.iter().collect();
    // The replies were sampled at temperature 1 under the grammar's masks,
    // as imitation scores them, so before its one step the loss is exactly
    // the mean of −log p the sampler recorded over the replies' tokens. A
    // loss that also read the prompts or the env's messages would differ.
    let sampled: Vec<f32> = ts
        .iter()
        .flat_map(|t| t.token_view(&tok).logprobs.into_iter().zip(t.token_view(&tok).loss_mask))
        .filter(|(_, m)| *m == 1)
        .map(|(l, _)| -l)
        .collect();
    let expected = sampled.iter().sum::<f32>() / sampled.len() as f32;
    let stats = learner.imitate(&batch, &tok, ragen_learner::Passes { epochs: 1, mini_batch_size: 0 }).unwrap();
    assert_eq!(stats.agent_tokens, sampled.len());
    assert_eq!(stats.optimizer_steps, 1);
    assert!((stats.policy_loss - expected).abs() < 1e-3 * expected.max(1.0), "{} against {expected}", stats.policy_loss);
    assert_eq!((stats.value_loss, stats.world_model_loss), (0.0, 0.0), "nothing else is trained");
}

#[test]
fn a_tiny_transformer_imitates_the_oracle_and_then_plays_like_it() {
    // A fixed lake without slips: the oracle's path is the same every
    // episode, so a few dozen steps of imitation must reproduce it.
    let templates = short_templates();
    let config = RolloutConfig {
        env_groups: 4,
        group_size: 1,
        enable_think: false,
        max_actions_per_turn: Some(1),
        max_turn: Some(10),
        ..RolloutConfig::default()
    };
    let settings: Vec<(String, String)> =
        [("is_slippery", "false"), ("map", "SFFF/FHFH/FFFH/HFFG")].iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
    let runner =
        RolloutRunner::new(ragen_runtime::LocalPlugin::provider(crate::common::shipped("frozenlake")), &settings, config, templates, 2)
            .unwrap();
    let tok = PluginTokenizer::new(runner.spec());
    let demos: Vec<Trajectory> = runner.run(&mut ragen_agent::policies::OraclePolicy, &[0, 1, 2, 3]).unwrap();
    assert!(demos.iter().all(|t| t.success), "the oracle solves the fixed lake");
    let demos: Vec<Trajectory> = demos.iter().map(|t| t.retokenized(&tok)).collect();
    let device = Default::default();
    let model = scratch_model::<B>(
        &PolicyModelConfig::new(tok.vocab_size()).with_d_model(32).with_n_layers(1).with_n_heads(2).with_max_seq_len(512),
        0,
    );
    let mut learner =
        Learner::new(model, Some(AnswerGrammar::new(&tok, false, 0, 1)), UpdateConfig { lr: 1e-2, ..UpdateConfig::default() }, device);
    let batch: Vec<&Trajectory> = demos.iter().collect();
    let mut losses = vec![];
    for _ in 0..60 {
        losses.push(learner.imitate(&batch, &tok, ragen_learner::Passes { epochs: 1, mini_batch_size: 0 }).unwrap().policy_loss);
    }
    assert!(losses[59] < 0.1 * losses[0], "the loss falls: {losses:?}");
    let sampling = SamplingConfig { temperature: 0.1, think_budget: 0 };
    let mut policy = BurnPolicy::new(learner.policy_model(), tok.clone(), false, 1, sampling, 5, Default::default());
    let played = summarize(&runner.run(&mut policy, &[10, 11, 12, 13]).unwrap());
    assert_eq!(played.success_rate, 1.0, "{played:?} after losses {losses:?}");
}
