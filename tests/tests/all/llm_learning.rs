//! StarPO-S on a pretrained-format model with LoRA: a tiny random Llama
//! written as a Hugging Face directory, sampled through its chat template,
//! updated by the learner. Only the adapters and the value head move; the
//! KL to the reference (the base without adapters) starts at zero; and the
//! model learns Bandit (through StarPO-S's variance filter, as a run applies it).
//! A critic of its own (`[critic]`) is a second copy of the file.

use burn::backend::{Autodiff, Flex};
use burn::module::{Module, ModuleVisitor, Param, ParamId};
use burn::prelude::*;
use ragen_agent::{PromptTemplates, RolloutRunner, Trajectory, summarize};
use ragen_learner::{Chat, CriticSection, RolloutFilter, TrainConfig, Trainee};
use ragen_llm::{Architecture, LoraConfig};
use ragen_test_fixtures::tiny_llm::Tiny;
use safetensors::Dtype;
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Instant;

use crate::common::{scratch_model, seeded};

type B = Autodiff<Flex>;

/// Bandit's two arms, each with `</answer>`, as single tokens: a random
/// model's one-token reply is then a valid answer about one time in a
/// hundred, and learning has something to start from.
const WORDS: [&str; 2] = ["Phoenix</answer>", "Dragon</answer>"];

fn tiny_model(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("ragen-llm-learning-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    Tiny::with_words(Architecture::Llama, &WORDS).write_hf(&dir, Dtype::F32);
    dir
}

/// A short prompt (this model reads tokens, not English), one-token
/// replies after the `<answer>` pre-fill, LoRA of rank 8.
fn config(model: PathBuf) -> TrainConfig {
    let mut c = TrainConfig { model_path: Some(model), lora: LoraConfig::new(8, 16.0), ..TrainConfig::default() };
    c.agent.prompt = PromptTemplates {
        system: String::new(),
        intro: "{actions}\n".into(),
        legend: String::new(),
        turn: "{state}\n".into(),
        format_think: String::new(),
        format_answer: String::new(),
        ..PromptTemplates::default()
    };
    c.agent.rollout.enable_think = false;
    c.agent.rollout.env_groups = 8;
    c.agent.rollout.group_size = 16;
    c.sampling.max_new_tokens = 1;
    c
}

/// Every float parameter's values, by id.
fn parameters<M: Module<Flex>>(module: &M) -> BTreeMap<ParamId, Vec<f32>> {
    struct Collect(BTreeMap<ParamId, Vec<f32>>);
    impl ModuleVisitor<Flex> for Collect {
        fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<Flex, D>>) {
            self.0.insert(param.id, param.val().into_data().to_vec::<f32>().unwrap());
        }
    }
    let mut c = Collect(BTreeMap::new());
    module.visit(&mut c);
    c.0
}

fn runner(config: &TrainConfig, settings: &[(String, String)]) -> RolloutRunner {
    RolloutRunner::new(
        ragen_runtime::LocalPlugin::provider(crate::common::shipped("bandit")),
        settings,
        config.agent.rollout.clone(),
        config.agent.prompt.clone(),
        2,
    )
    .unwrap()
}

#[test]
fn an_update_moves_only_the_adapters_and_the_value_head_and_the_kl_starts_at_zero() {
    let mut config = config(tiny_model("update"));
    config.ppo.kl_coef = Some(0.01);
    let runner = runner(&config, &[]);
    let (trainee, mut learner) = seeded(0, || Chat::build::<B>(&config, config.model_path.as_ref().unwrap(), Default::default())).unwrap();
    let before = parameters(&learner.policy_model());
    let trainable: Vec<ParamId> = parameters(&learner.policy_model().tuned).into_keys().collect();
    assert!(trainable.len() > 2 * 7, "two layers of seven adapters (A and B) and the head");

    let mut policy = Trainee::<B>::policy(&trainee, learner.policy_model(), 1.0, 7, &Default::default());
    let ts = runner.run(policy.as_mut(), &[1, 2, 3, 4, 5, 6, 7, 8]).unwrap();
    let batch: Vec<&Trajectory> = ts.iter().collect();
    let stats = learner.update(&batch, Trainee::<B>::tokenizer(&trainee)).unwrap();
    assert_eq!(stats.kl_to_reference, 0.0, "the policy is its reference until the first step: {stats:?}");

    let after = parameters(&learner.policy_model());
    let changed: Vec<&ParamId> = before.keys().filter(|id| before[id] != after[id]).collect();
    assert!(!changed.is_empty(), "the update changed nothing");
    for id in &changed {
        assert!(trainable.contains(id), "a frozen base parameter changed ({} values)", before[id].len());
    }
    assert!(before.len() > trainable.len() + 10, "the base's parameters are visited too");
}

#[test]
fn a_tiny_llama_with_lora_learns_bandit() {
    let started = Instant::now();
    // The better arm always pays 1, the other what a malformed reply costs:
    // a clear signal, so the test is about the machinery, not patience. (A
    // random model that finds the worse arm first would otherwise settle on
    // it: it is worth more than a malformed reply, and the better arm is
    // then too rare to be found.)
    let settings = vec![("hi_arm_hiscore_prob".to_string(), "1.0".to_string()), ("lo_arm_score".to_string(), "-0.1".to_string())];
    let mut config = config(tiny_model("bandit"));
    config.ppo.lr = Some(2e-2);
    config.agent.rollout.env_groups = 16;
    let runner = runner(&config, &settings);
    let (trainee, mut learner) = seeded(0, || Chat::build::<B>(&config, config.model_path.as_ref().unwrap(), Default::default())).unwrap();
    let mut history = vec![];
    for step in 0..80u64 {
        let mut policy = Trainee::<B>::policy(&trainee, learner.policy_model(), 1.0, step, &Default::default());
        let g = config.agent.rollout.env_groups as u64;
        let seeds: Vec<u64> = (0..g).map(|i| step * g + i).collect();
        let ts = runner.run(policy.as_mut(), &seeds).unwrap();
        history.push(summarize(&ts).success_rate);
        if history.len() >= 3 && history[history.len() - 3..].iter().all(|&s| s >= 0.9) {
            break;
        }
        // StarPO-S's variance filter, as a run applies it.
        let rewards: Vec<Vec<f32>> =
            (0..seeds.len()).map(|g| ts.iter().filter(|t| t.group == g).map(|t| t.reward as f32).collect()).collect();
        let kept = RolloutFilter::top_share(0.25).keep(&rewards);
        let batch: Vec<&Trajectory> = ts.iter().filter(|t| kept.contains(&t.group)).collect();
        let stats = learner.update(&batch, Trainee::<B>::tokenizer(&trainee)).unwrap();
        assert!(stats.grad_norm.is_finite() && stats.entropy.is_finite(), "{stats:?}");
    }
    eprintln!("success per update: {history:?} ({:?})", started.elapsed());
    assert!(history[0] < 0.2, "a random model rarely answers at all: {history:?}");
    let last = &history[history.len() - 3..];
    assert!(last.iter().all(|&s| s >= 0.9), "did not learn within {} updates: {history:?}", history.len());
}

#[test]
fn a_pretrained_models_critic_of_its_own_is_a_second_copy_that_trains_apart() {
    let mut config = config(tiny_model("critic"));
    let path = config.model_path.clone().unwrap();
    config.critic = Some(CriticSection { d_model: Some(8), ..CriticSection::default() });
    let refused = seeded(0, || Chat::build::<B>(&config, &path, Default::default())).err().expect("a shape key for a pretrained critic");
    assert!(format!("{refused:#}").contains("takes only `lr`"), "{refused:#}");

    config.critic = Some(CriticSection { lr: Some(1e-3), ..CriticSection::default() });
    let runner = runner(&config, &[]);
    let (trainee, mut learner) = seeded(0, || Chat::build::<B>(&config, &path, Default::default())).unwrap();
    let before = parameters(&learner.policy_model());
    let trainable: Vec<ParamId> = parameters(&learner.policy_model().tuned).into_keys().collect();
    let mut policy = Trainee::<B>::policy(&trainee, learner.policy_model(), 1.0, 7, &Default::default());
    let ts = runner.run(policy.as_mut(), &[1, 2, 3, 4, 5, 6, 7, 8]).unwrap();
    let batch: Vec<&Trajectory> = ts.iter().collect();
    let stats = learner.update(&batch, Trainee::<B>::tokenizer(&trainee)).unwrap();
    assert!(stats.critic_grad_norm > 0.0 && stats.value_loss > 0.0, "the critic trained: {stats:?}");
    let after = parameters(&learner.policy_model());
    let changed: Vec<&ParamId> = before.keys().filter(|id| before[id] != after[id]).collect();
    assert!(!changed.is_empty() && changed.iter().all(|id| trainable.contains(id)), "the policy's adapters train, its base does not");
}

/// Every float gradient of `module`, by parameter id.
fn gradients<M: Module<B>>(module: &M, grads: &<B as burn::tensor::backend::AutodiffBackend>::Gradients) -> BTreeMap<ParamId, Vec<f32>> {
    struct Collect<'g>(BTreeMap<ParamId, Vec<f32>>, &'g <B as burn::tensor::backend::AutodiffBackend>::Gradients);
    impl ModuleVisitor<B> for Collect<'_> {
        fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
            if let Some(g) = param.val().grad(self.1) {
                self.0.insert(param.id, g.into_data().to_vec::<f32>().unwrap());
            }
        }
    }
    let mut c = Collect(BTreeMap::new(), grads);
    module.visit(&mut c);
    c.0
}

fn assert_close(a: &[f32], b: &[f32], what: &str) {
    assert_eq!(a.len(), b.len(), "{what}: lengths");
    let worst = a.iter().zip(b).map(|(x, y)| (x - y).abs() / (1.0 + y.abs())).fold(0.0f32, f32::max);
    assert!(worst < 1e-4, "{what} differ by up to {worst}");
}

/// The learner runs a pass's shared instructions once
/// (`hidden_at_and_values_after`): the hidden states, values and gradients
/// are those of the whole rows, for a pretrained model with LoRA and for
/// the model trained from scratch.
#[test]
fn a_shared_prefix_scores_and_trains_as_the_whole_rows_do() {
    fn agree<M: ragen_policy::PolicyNetwork<B>>(model: &M, what: &str) {
        let device = Default::default();
        let prefix = [3i64, 9, 4, 1, 7];
        // Two rows after the prefix, the first right-padded.
        let own = [2i64, 8, 5, 6, 0, 0, 4, 4, 1, 2, 3, 9];
        let (s, l) = (prefix.len(), 6);
        let whole: Vec<i64> = own.chunks(l).flat_map(|row| prefix.iter().chain(row).copied()).collect();
        let at = [1i64, 3, 6 + 2, 6 + 5];
        let at_whole: Vec<i64> = at.iter().map(|&i| i + s as i64 * (i / l as i64 + 1)).collect();
        let ints = |v: Vec<i64>| Tensor::<B, 1, Int>::from_data(TensorData::new(v.clone(), [v.len()]), &device);
        let (h1, v1) = model.hidden_at_and_values_after(ints(prefix.to_vec()), ints(own.to_vec()).reshape([2, l]), ints(at.to_vec()));
        let (h2, v2) = model.hidden_at_and_values(ints(whole).reshape([2, s + l]), ints(at_whole));
        let v2 = v2.narrow(1, s, l);
        let floats = |t: Tensor<B, 2>| t.inner().into_data().to_vec::<f32>().unwrap();
        assert_close(&floats(h1.clone()), &floats(h2.clone()), &format!("{what}: hidden states"));
        assert_close(&floats(v1.clone()), &floats(v2.clone()), &format!("{what}: values"));
        let g1 = gradients(model, &(h1.sum() + v1.sum()).backward());
        let g2 = gradients(model, &(h2.sum() + v2.sum()).backward());
        assert_eq!(g1.keys().collect::<Vec<_>>(), g2.keys().collect::<Vec<_>>(), "{what}: the same parameters get gradients");
        assert!(!g1.is_empty(), "{what}: something trains");
        for (id, g) in &g1 {
            assert_close(g, &g2[id], &format!("{what}: gradient of {id}"));
        }
    }
    let device = Default::default();
    let pretrained = ragen_llm::Pretrained::<B>::load(&tiny_model("prefix"), &device).unwrap();
    agree(&seeded(0, || pretrained.model.with_lora(&LoraConfig::new(8, 16.0))), "LoRA on a tiny Llama");
    let scratch = ragen_policy::PolicyModelConfig::new(32).with_d_model(32).with_n_layers(2).with_n_heads(2).with_rotary(true);
    agree(&scratch_model::<B>(&scratch, 0), "a model from scratch with rotary positions");
    agree(&scratch_model::<B>(&scratch.with_rotary(false), 0), "a model from scratch with learned positions");
}

/// A rollout whose prompts share their instructions, and within a group
/// the whole first prompt, prefills each shared part once; replies are
/// drawn from the same distributions, so the same seeds give the same
/// tokens as prompts sampled one at a time.
#[test]
fn a_shared_prefix_rollout_gives_the_tokens_of_an_unshared_one() {
    let mut config = config(tiny_model("shared-rollout"));
    config.sampling.max_new_tokens = 4;
    config.agent.rollout.env_groups = 4;
    config.agent.rollout.group_size = 4;
    let runner = runner(&config, &[]);
    let device = Default::default();
    let replies = |batch: usize| {
        let config = TrainConfig { sampling: ragen_learner::SamplingSection { batch, ..config.sampling.clone() }, ..config.clone() };
        let (trainee, learner) = seeded(0, || Chat::build::<B>(&config, config.model_path.as_ref().unwrap(), device)).unwrap();
        let mut policy = Trainee::<B>::policy(&trainee, learner.policy_model(), 1.0, 7, &device);
        let ts = runner.run(policy.as_mut(), &[10, 11, 12, 13]).unwrap();
        let agent = |t: &Trajectory| -> Vec<(Vec<u32>, Vec<f32>)> {
            t.segments.iter().filter(|s| !s.tokens.is_empty()).map(|s| (s.tokens.clone(), s.logprobs.clone())).collect()
        };
        ts.iter().map(agent).collect::<Vec<_>>()
    };
    // All sixteen at once; five at a time, waiting prompts taking the
    // slots of finished replies; one at a time, nothing shared.
    let (shared, queued, alone) = (replies(16), replies(5), replies(1));
    assert_eq!(shared.len(), 16);
    for (other, what) in [(&queued, "five slots"), (&alone, "one at a time")] {
        for (t, (a, b)) in shared.iter().zip(other).enumerate() {
            assert!(!a.is_empty() && a.len() == b.len(), "trajectory {t} has its replies ({what})");
            for ((ta, la), (tb, lb)) in a.iter().zip(b) {
                assert_eq!(ta, tb, "trajectory {t}: the same tokens ({what})");
                assert_close(la, lb, &format!("trajectory {t}: log-probabilities ({what})"));
            }
        }
    }
}
