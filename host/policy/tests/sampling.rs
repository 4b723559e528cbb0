//! The policy network and KV-cache sampling, on the CPU backend.

use burn::backend::Flex;
use burn::prelude::*;
use ragen_agent::{ResponseParser, Tokenizer};
use ragen_policy::{
    AnswerGrammar, PluginTokenizer, PolicyModel, PolicyModelConfig, masked_logprobs, sample, sample_batch, sample_batch_with,
};
use ragen_rng::SeedRng;
use ragen_runtime::{ActionSpace, EnvSpec, LegendEntry, Limits};

type B = Flex;

fn spec() -> EnvSpec {
    EnvSpec {
        instructions: "Push.".into(),
        legend: "#_OX√PS".chars().map(|c| LegendEntry { symbol: c.to_string(), meaning: "m".into() }).collect(),
        action_space: ActionSpace::Names(["Up", "Down", "Left", "Right"].iter().map(|s| s.to_string()).collect()),
        limits: Limits { max_actions_per_episode: 10, max_actions_per_turn: 5, max_turns: 5, max_steps: 100 },
        metrics: vec![],
    }
}

fn model(tok: &PluginTokenizer) -> PolicyModel<B> {
    PolicyModelConfig::new(tok.vocab_size())
        .with_d_model(32)
        .with_n_layers(2)
        .with_n_heads(4)
        .with_max_seq_len(256)
        .init(&Default::default())
}

/// The model with learned positions, then with rotary ones: the cache,
/// padding and batching must give the same answers with either.
fn both_models(tok: &PluginTokenizer) -> [PolicyModel<B>; 2] {
    let config = PolicyModelConfig::new(tok.vocab_size()).with_d_model(32).with_n_layers(2).with_n_heads(4).with_max_seq_len(256);
    [config.init(&Default::default()), config.with_rotary(true).init(&Default::default())]
}

#[test]
fn forward_gives_logits_and_values_per_position() {
    let tok = PluginTokenizer::new(&spec());
    let m = model(&tok);
    let ids = Tensor::<B, 2, Int>::from_data(TensorData::new(vec![1i64; 14], [2, 7]), &Default::default());
    let (logits, values) = m.forward(ids.clone());
    assert_eq!(logits.dims(), [2, 7, tok.vocab_size()]);
    assert_eq!(values.dims(), [2, 7]);
    // The learner's path: logits at chosen flat positions only, the same
    // numbers; values everywhere.
    let at = Tensor::<B, 1, Int>::from_data(TensorData::new(vec![0i64, 6, 9, 13], [4]), &Default::default());
    let (picked, values_too) = ragen_policy::PolicyNetwork::logits_at_and_values(&m, ids, at.clone());
    let v = tok.vocab_size();
    picked.into_data().assert_approx_eq::<f32>(&logits.reshape([14, v]).select(0, at).into_data(), burn::tensor::Tolerance::absolute(1e-5));
    values_too.into_data().assert_approx_eq::<f32>(&values.into_data(), burn::tensor::Tolerance::absolute(1e-6));
}

#[test]
fn kv_cache_sampling_gives_the_log_probs_of_a_full_forward_pass() {
    let s = spec();
    let tok = PluginTokenizer::new(&s);
    let device = Default::default();
    let prompt = tok.encode("<|user|>\nTurn 1:\nState:\n#P_X_O#\n<|assistant|>\n<think>");
    for (m, (think, temperature)) in both_models(&tok).iter().flat_map(|m| [(true, 1.0f32), (true, 0.5), (false, 1.0)].map(|c| (m, c))) {
        let grammar = AnswerGrammar::new(&tok, think, 16, 5);
        let parser = ResponseParser::new(s.action_names(), think, 5);
        for seed in 0..4 {
            let out = sample(m, &prompt, &grammar, temperature, grammar.max_reply_tokens(), &mut SeedRng::new(seed), &device);
            assert!(out.complete, "the budget always fits a complete reply");
            let full = masked_logprobs(m, &prompt, &out.tokens, &grammar, temperature, &device).unwrap();
            assert_eq!(full.len(), out.logprobs.len());
            for (i, (a, b)) in out.logprobs.iter().zip(&full).enumerate() {
                assert!((a - b).abs() < 1e-4, "token {i}: cached {a} vs full {b}");
                assert!(*a <= 0.0 && a.is_finite());
            }
            let prefill = if think { "<think>" } else { "<answer>" };
            let text = format!("{prefill}{}", tok.decode(&out.tokens));
            assert!(!parser.parse(&text).penalised, "{text:?}");
        }
    }
}

#[test]
fn a_padded_batch_samples_what_each_prompt_samples_alone() {
    let s = spec();
    let tok = PluginTokenizer::new(&s);
    let device = Default::default();
    let grammar = AnswerGrammar::new(&tok, true, 16, 5);
    // Prompts of different lengths, first with nothing in common (padding
    // on the left), then sharing a prefix (computed once, padding after it).
    let unrelated = ["<|user|>\nState:\n#P_X_O#\n<|assistant|>\n<think>", "<think>", "<|user|>\nTurn 2:\n#_#\n<|assistant|>\n<think>"];
    let shared = [
        "<|system|>\nPush boxes.<|user|>\nState:\n#P_X_O#\n<|assistant|>\n<think>",
        "<|system|>\nPush boxes.<|user|>\nState:\n#P_X_O#\n<|assistant|>\n<think>",
        "<|system|>\nPush boxes.<|user|>\n#_#\n<|assistant|>\n<think>",
        "<|system|>\nPush boxes.<|user|>\nState:\n#P_X_O#\n<|assistant|>\n<think>Up</think><answer>Up</answer><|user|>\n#_P#\n<|assistant|>\n<think>",
    ];
    for (m, texts) in both_models(&tok).iter().flat_map(|m| [(m, &unrelated[..]), (m, &shared[..])]) {
        let prompts: Vec<Vec<u32>> = texts.iter().map(|t| tok.encode(t)).collect();
        let refs: Vec<&[u32]> = prompts.iter().map(Vec::as_slice).collect();
        let budget = grammar.max_reply_tokens();
        let mut rngs: Vec<SeedRng> = (0..texts.len() as u64).map(|r| SeedRng::stream(9, r)).collect();
        let batch = sample_batch(m, &refs, &grammar, 1.0, budget, &mut rngs, &device);
        let mut rngs: Vec<SeedRng> = (0..texts.len() as u64).map(|r| SeedRng::stream(9, r)).collect();
        let uncached = sample_batch_with(m, &refs, &grammar, 1.0, budget, &mut rngs, &device, false);
        for (r, prompt) in prompts.iter().enumerate() {
            let alone = sample(m, prompt, &grammar, 1.0, budget, &mut SeedRng::stream(9, r as u64), &device);
            assert_eq!(batch[r].tokens, alone.tokens, "row {r}: padding changed the reply");
            assert_eq!(uncached[r].tokens, alone.tokens, "row {r}: the uncached path differs");
            let full = masked_logprobs(m, prompt, &batch[r].tokens, &grammar, 1.0, &device).unwrap();
            for (i, (a, b)) in batch[r].logprobs.iter().zip(&full).enumerate() {
                assert!((a - b).abs() < 1e-4, "row {r} token {i}: batched {a} vs full {b}");
            }
        }
        // Rows 0 and 1 of `shared` have the same prompt but their own streams.
        assert!(batch.iter().map(|s| &s.tokens).collect::<std::collections::HashSet<_>>().len() > 1);
    }
}

#[test]
fn sampling_is_reproducible_from_the_seed() {
    let tok = PluginTokenizer::new(&spec());
    let m = model(&tok);
    let grammar = AnswerGrammar::new(&tok, true, 16, 5);
    let prompt = tok.encode("<think>");
    let draw = |seed| sample(&m, &prompt, &grammar, 1.0, 64, &mut SeedRng::new(seed), &Default::default());
    assert_eq!(draw(3), draw(3));
    assert_ne!(draw(3).tokens, draw(4).tokens);
}

#[test]
fn attention_is_causal() {
    // Changing the last token must not change any earlier position's output.
    let tok = PluginTokenizer::new(&spec());
    let m = model(&tok);
    let device = Default::default();
    let run = |last: i64| {
        let ids = Tensor::<B, 2, Int>::from_data(TensorData::new(vec![5, 9, 260, 17, last], [1, 5]), &device);
        let (logits, values) = m.forward(ids);
        (logits.narrow(1, 0, 4).into_data().to_vec::<f32>().unwrap(), values.narrow(1, 0, 4).into_data().to_vec::<f32>().unwrap())
    };
    let (a, va) = run(40);
    let (b, vb) = run(41);
    for (x, y) in a.iter().zip(&b).chain(va.iter().zip(&vb)) {
        assert!((x - y).abs() < 1e-5, "{x} vs {y}");
    }
}

#[test]
fn temperature_zero_puts_all_mass_on_the_most_likely_allowed_token() {
    let logits = [1.0, 3.0, 2.0, 3.0];
    // Token 1 and 3 tie: the first wins; a disallowed best is skipped.
    let dist = ragen_policy::masked_log_distribution(&logits, &[true; 4], 0.0);
    assert_eq!(dist, vec![f32::NEG_INFINITY, 0.0, f32::NEG_INFINITY, f32::NEG_INFINITY]);
    let dist = ragen_policy::masked_log_distribution(&logits, &[true, false, true, false], 0.0);
    assert_eq!(dist, vec![f32::NEG_INFINITY, f32::NEG_INFINITY, 0.0, f32::NEG_INFINITY]);
    // Greedy sampling is then the same whatever the random stream.
    let s = spec();
    let tok = PluginTokenizer::new(&s);
    let m = model(&tok);
    let grammar = AnswerGrammar::new(&tok, true, 16, 5);
    let prompt = tok.encode("<think>");
    let a = sample(&m, &prompt, &grammar, 0.0, 12, &mut SeedRng::new(1), &Default::default());
    let b = sample(&m, &prompt, &grammar, 0.0, 12, &mut SeedRng::new(2), &Default::default());
    assert_eq!(a.tokens.len(), 12, "the untrained model writes to the limit");
    assert_eq!(a.tokens, b.tokens);
    assert!(a.logprobs.iter().all(|&lp| lp == 0.0), "{:?}", a.logprobs);
}
