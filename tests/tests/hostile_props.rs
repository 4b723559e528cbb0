//! Property tests: whatever a misbehaving plugin reports (its spec, its
//! observations, its rewards), the host's consumers never panic. A spec is
//! either refused at the boundary ([`ReportLimits::check_spec`], which
//! every `PluginInstance::spec` call applies) or survives the prompt
//! builder, the response parser, the tokenizer and the answer grammar; the
//! rewards the pool lets through keep every summary finite.

use proptest::prelude::*;
use ragen_agent::{PromptBuilder, PromptTemplates, ResponseParser, RolloutConfig, Trajectory, summarize};
use ragen_policy::{AnswerGrammar, PluginTokenizer};
use ragen_runtime::{EnvSpec, LegendEntry, Limits, ReportLimits};

/// Any text, control characters and multi-byte characters included.
fn text(max: usize) -> impl Strategy<Value = String> {
    prop::collection::vec(any::<char>(), 0..max).prop_map(|cs| cs.into_iter().collect())
}

fn spec() -> impl Strategy<Value = EnvSpec> {
    let limit = prop_oneof![Just(0u32), 1..8u32, Just(u32::MAX), any::<u32>()];
    (
        text(300),
        prop::collection::vec((text(3), text(20)), 0..6),
        prop::collection::vec(text(8), 0..8),
        (limit.clone(), limit.clone(), limit.clone(), limit),
        prop::collection::vec(text(6), 0..3),
    )
        .prop_map(|(instructions, legend, actions, (a, b, c, d), metrics)| EnvSpec {
            instructions,
            legend: legend.into_iter().map(|(symbol, meaning)| LegendEntry { symbol, meaning }).collect(),
            actions,
            limits: Limits { max_actions_per_episode: a, max_actions_per_turn: b, max_turns: c, max_steps: d },
            metrics,
        })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn a_spec_is_refused_or_every_consumer_takes_it(
        spec in spec(),
        observation in text(200),
        reply in text(80),
        reward in any::<f64>(),
        think in any::<bool>(),
    ) {
        if ReportLimits::default().check_spec(&spec).is_err() {
            return Ok(());
        }
        let limits = RolloutConfig::default().limits(&spec);
        let templates = PromptTemplates::default();
        let prompts = PromptBuilder::new(templates.clone(), &spec, think, limits.max_actions_per_turn);
        let _ = prompts.system();
        let _ = prompts.first_user(&observation, limits.max_actions_per_traj);
        let _ = prompts.next_user(reward, 2, &observation, limits.max_actions_per_traj);
        let parser = ResponseParser::new(&spec.actions, think, limits.max_actions_per_turn as usize);
        let parsed = parser.parse(&reply);
        prop_assert!(parsed.actions.iter().all(|&a| (a as usize) < spec.actions.len()));
        prop_assert!(parsed.actions.len() <= limits.max_actions_per_turn as usize);
        let tokenizer = PluginTokenizer::with_text(&spec, &templates.texts());
        let grammar = AnswerGrammar::new(&tokenizer, think, 16, limits.max_actions_per_turn);
        prop_assert!(grammar.max_reply_tokens() >= grammar.min_reply_tokens());
    }

    #[test]
    fn summaries_of_rewards_the_pool_lets_through_are_finite(
        rewards in prop::collection::vec(-1e9f64..=1e9, 0..300),
        group_size in 1usize..17,
    ) {
        let ts: Vec<Trajectory> = rewards.iter().enumerate().map(|(i, &r)| trajectory(i, i / group_size, r)).collect();
        let m = summarize(&ts);
        for (name, v) in [("return", m.return_mean), ("return std", m.return_std), ("in-group std", m.in_group_reward_std), ("success", m.success_rate)] {
            prop_assert!(v.is_finite(), "{name} is {v}");
        }
    }
}

fn trajectory(env: usize, group: usize, reward: f64) -> Trajectory {
    Trajectory {
        group,
        seed: group as u64,
        env,
        segments: vec![],
        turns: vec![],
        reward,
        penalty: 0.0,
        success: reward > 0.0,
        num_actions: 1,
        valid_action_ratio: 1.0,
        effective_action_ratio: 1.0,
        context_window: None,
        failure: None,
        failure_kind: None,
    }
}
