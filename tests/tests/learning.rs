//! The whole loop learns: rollouts through the sandbox, the Burn policy
//! sampling under the grammar, and StarPO updates.

use burn::backend::{Autodiff, Flex};
use ragen_agent::{PromptTemplates, RolloutConfig, RolloutRunner, Trajectory, summarize};
use ragen_learner::{Learner, UpdateConfig};
use ragen_policy::{AnswerGrammar, BurnPolicy, PluginTokenizer, PolicyModelConfig, SamplingConfig};
use std::time::Instant;

mod common;

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
        legend: String::new(),
        turn: "{state}\n".into(),
        reward: "{reward}\n".into(),
        format_think: String::new(),
        format_answer: String::new(),
    };
    let config = RolloutConfig { env_groups: 4, group_size: 8, enable_think: false, ..RolloutConfig::default() };
    let runner = RolloutRunner::new(common::shipped("bandit"), &settings, config, templates, 2).unwrap();
    let tok = PluginTokenizer::new(runner.spec());
    let device = Default::default();
    let model = PolicyModelConfig::new(tok.vocab_size()).with_d_model(32).with_n_layers(1).with_n_heads(2).with_max_seq_len(256).init::<B>(&device);
    let grammar = AnswerGrammar::new(&tok, false, 0, 1);
    let mut learner = Learner::new(model, grammar, UpdateConfig { lr: 3e-3, ..UpdateConfig::default() }, device);

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
    let templates = PromptTemplates { system: String::new(), intro: "{actions}\n".into(), legend: String::new(), turn: "{state}\n".into(), ..PromptTemplates::default() };
    let config = RolloutConfig { env_groups: 4, group_size: 8, enable_think: false, ..RolloutConfig::default() };
    let runner = RolloutRunner::new(common::shipped("bandit"), &[], config, templates, 2).unwrap();
    let tok = PluginTokenizer::new(runner.spec());
    let device = Default::default();
    let model = PolicyModelConfig::new(tok.vocab_size()).with_d_model(32).with_n_layers(1).with_n_heads(2).with_max_seq_len(256).init::<B>(&device);
    let grammar = AnswerGrammar::new(&tok, false, 0, 1);
    let mut learner = Learner::new(model, grammar, UpdateConfig { lr: 1e-2, kl_coef: 0.01, ..UpdateConfig::default() }, device);
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
