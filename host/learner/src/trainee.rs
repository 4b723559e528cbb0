//! What a run trains: the network, the tokenizer its conversations are laid
//! out with, the grammar its replies obey (if any), and how it samples.
//!
//! Two kinds exist. [`Scratch`] is the small transformer trained from
//! nothing, with a tokenizer built from the plugin and replies constrained
//! by the answer grammar. [`Chat`] is a pretrained Llama / Qwen2 model
//! (optionally with LoRA adapters), its own tokenizer and chat template,
//! and free replies that pay the format penalty when malformed, as in the
//! paper. The run, the learner and the checkpoints are the same for both.

use crate::config::TrainConfig;
use crate::update::Learner;
use anyhow::{Result, ensure};
use burn::module::AutodiffModule;
use ragen_agent::{Policy, Tokenizer};
use ragen_llm::{Llm, LlmConfig, LlmPolicy, LlmSampling, Pretrained};
use ragen_ops::TrainBackend;
use ragen_policy::{AnswerGrammar, BurnPolicy, PluginTokenizer, PolicyModel, PolicyModelConfig, PolicyNetwork, SamplingConfig};
use ragen_runtime::{ActionSpace, EnvSpec};
use std::path::{Path, PathBuf};

/// How a run turns its network into a policy, and what the learner needs
/// to lay out its conversations.
pub trait Trainee<B: TrainBackend + 'static> {
    type Net: PolicyNetwork<B> + AutodiffModule<B, InnerModule: PolicyNetwork<B::InnerBackend>>;

    /// The tokenizer the policy's conversations are laid out with.
    fn tokenizer(&self) -> &dyn Tokenizer;

    /// The policy `net` gives, sampling at `temperature` from `seed`.
    fn policy(
        &self,
        net: <Self::Net as AutodiffModule<B>>::InnerModule,
        temperature: f32,
        seed: u64,
        device: &B::Device,
    ) -> Box<dyn Policy>;
}

/// The from-scratch transformer, its plugin tokenizer and its grammar.
pub struct Scratch {
    pub tokenizer: PluginTokenizer,
    think: bool,
    think_budget: u32,
    max_actions: u32,
}

impl Scratch {
    /// The tokenizer, grammar, model and learner `config` describes for an
    /// env (freshly initialised from the backend's seeded generator).
    pub fn build<B: TrainBackend>(config: &TrainConfig, spec: &EnvSpec, device: B::Device) -> Result<(Self, Learner<B>)> {
        if let ActionSpace::Text(text) = &spec.action_space {
            anyhow::bail!(
                "this env's action is free text ({}), and a model trained from scratch can only pick action names; \
                 train a pretrained model instead: --model target/models/SmolLM2-135M-Instruct.Q4_1.gguf (`make model`) \
                 or `model_path = \"...\"` in the config",
                text.form
            );
        }
        let resolved = config.resolve()?;
        let tokenizer = PluginTokenizer::with_text(spec, &config.agent.prompt.texts());
        let limits = config.agent.rollout.limits(spec);
        let think = config.agent.rollout.enable_think;
        let grammar = AnswerGrammar::new(&tokenizer, think, config.sampling.think_budget, limits.max_actions_per_turn);
        let shape = PolicyModelConfig { vocab_size: tokenizer.vocab_size(), ..config.model.clone() };
        let model = shape.init::<B>(&device);
        let mut learner = Learner::new(model, Some(grammar), resolved.update, device.clone());
        // The critic of its own, initialised after the policy, so the
        // policy's weights are the same with or without it.
        if let (Some(critic), Some(scale)) = (&config.critic, resolved.critic_lr_scale) {
            learner = learner.with_critic(critic.model(&shape).init::<B>(&device), scale);
        }
        let scratch = Self { tokenizer, think, think_budget: config.sampling.think_budget, max_actions: limits.max_actions_per_turn };
        Ok((scratch, learner))
    }
}

impl<B: TrainBackend> Trainee<B> for Scratch {
    type Net = PolicyModel<B>;

    fn tokenizer(&self) -> &dyn Tokenizer {
        &self.tokenizer
    }

    fn policy(&self, net: PolicyModel<B::InnerBackend>, temperature: f32, seed: u64, device: &B::Device) -> Box<dyn Policy> {
        let sampling = SamplingConfig { temperature, think_budget: self.think_budget };
        Box::new(BurnPolicy::new(net, self.tokenizer.clone(), self.think, self.max_actions, sampling, seed, device.clone()))
    }
}

/// A pretrained model from its file, with LoRA adapters when `[lora]` has
/// a rank, and the tokenizer and chat template the file carries.
pub struct Chat {
    config: LlmConfig,
    path: PathBuf,
    /// The tokenizer with the template, as the policy and the learner use it.
    chat: ragen_llm::ChatTokenizer,
    max_new_tokens: usize,
    batch: usize,
}

impl Chat {
    /// Load the model `path` names, add the value head and the adapters of
    /// `config.lora`, and build its learner (no grammar: replies are free).
    pub fn build<B: TrainBackend>(config: &TrainConfig, path: &Path, device: B::Device) -> Result<(Self, Learner<B, Llm<B>>)> {
        let resolved = config.resolve()?;
        let pretrained = Pretrained::<B>::load(path, &device)?;
        let max_new_tokens = config.sampling.max_new_tokens;
        ensure!(
            max_new_tokens < pretrained.config.max_position_embeddings,
            "sampling.max_new_tokens = {max_new_tokens} leaves no room for a prompt in {}'s context of {} tokens",
            path.display(),
            pretrained.config.max_position_embeddings
        );
        let chat = pretrained.chat_tokenizer(max_new_tokens);
        let Pretrained { model, config: llm_config, path, .. } = pretrained;
        let model = model.with_lora(&config.lora);
        let mut learner = Learner::new(model, None, resolved.update, device.clone());
        if let Some(scale) = resolved.critic_lr_scale {
            ensure!(
                config.critic.as_ref().is_some_and(|c| *c == crate::CriticSection { lr: c.lr, ..Default::default() }),
                "[critic] of a pretrained model takes only `lr`: its critic is a second copy of `{}` (as verl's), with the \
                 same [lora] adapters; remove the shape keys",
                path.display()
            );
            // A second copy of the file, as verl initialises its critic.
            let critic = Pretrained::<B>::load(&path, &device)?.model.with_lora(&config.lora);
            learner = learner.with_critic(critic, scale);
        }
        let batch = config.sampling.batch.max(1);
        Ok((Self { config: llm_config, path, chat, max_new_tokens, batch }, learner))
    }
}

impl<B: TrainBackend> Trainee<B> for Chat {
    type Net = Llm<B>;

    fn tokenizer(&self) -> &dyn Tokenizer {
        &self.chat
    }

    fn policy(&self, net: Llm<B::InnerBackend>, temperature: f32, seed: u64, device: &B::Device) -> Box<dyn Policy> {
        let pretrained = Pretrained {
            model: net,
            tokenizer: self.chat.tokenizer.clone(),
            template: self.chat.template.clone(),
            config: self.config.clone(),
            path: self.path.clone(),
            device: device.clone(),
        };
        let sampling = LlmSampling {
            sampling: ragen_policy::Sampling { temperature, top_k: 0, top_p: 1.0 },
            max_new_tokens: self.max_new_tokens,
            batch: self.batch,
        };
        Box::new(LlmPolicy::new(pretrained, sampling, seed))
    }
}
