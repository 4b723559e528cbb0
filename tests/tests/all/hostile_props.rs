//! Property tests: whatever a misbehaving plugin reports (its spec, its
//! observations, its rewards and metrics), the host's consumers never
//! panic: the agent loop (on the `configurable` faulty plugin, set at
//! random), the prompt builder, the parser, the tokenizer, the grammar and
//! summarize (the dashboard's is in ragen-host). A spec is
//! either refused at the boundary ([`ReportLimits::check_spec`], which
//! every `PluginInstance::spec` call applies) or survives the prompt
//! builder, the response parser, the tokenizer and the answer grammar; the
//! rewards the pool lets through keep every summary finite.

use proptest::prelude::*;
use ragen_agent::policies::RandomPolicy;
use ragen_agent::{PromptBuilder, PromptTemplates, ResponseParser, RolloutConfig, RolloutRunner, Trajectory, summarize};
use ragen_policy::{AnswerGrammar, PluginTokenizer};
use ragen_runtime::{ActionSpace, EnvSpec, LegendEntry, Limits, Plugin, ReportLimits, SandboxLimits};
use std::sync::{Arc, OnceLock};

/// Cases of the agent-loop property whose settings passed the bounds.
static PLAYED: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// The `configurable` faulty plugin: everything it reports comes from its
/// settings. Loaded once.
fn configurable() -> Arc<Plugin> {
    static PLUGIN: OnceLock<Arc<Plugin>> = OnceLock::new();
    PLUGIN.get_or_init(|| crate::common::faulty("configurable", SandboxLimits::default())).clone()
}

/// Settings for it: counts and limits at and past every bound, text with
/// control characters, and rewards and metrics of every kind of f64.
fn settings() -> impl Strategy<Value = Vec<(String, String)>> {
    // Weighted so that most settings pass the bounds and the loop plays.
    let count = prop_oneof![1 => Just(0usize), 8 => 1..5usize, 1 => 250..300usize];
    let limit = prop_oneof![1 => Just(0u32), 12 => 1..70u32, 1 => Just(u32::MAX)];
    let number = prop_oneof![Just(f64::NAN), Just(f64::INFINITY), Just(1e308), Just(-1e308), -10.0..10.0f64, any::<f64>()];
    (
        count,
        text(12),
        prop_oneof![1 => Just(0usize), 8 => 1..3usize, 1 => Just(5_000usize)],
        number.clone(),
        number,
        limit.clone(),
        limit.clone(),
        limit,
    )
        .prop_map(|(actions, text, repeat, reward, metric, turns, per_turn, steps)| {
            vec![
                ("actions".into(), actions.to_string()),
                ("text".into(), text),
                ("repeat".into(), repeat.to_string()),
                ("reward".into(), reward.to_string()),
                ("metric".into(), metric.to_string()),
                ("max_turns".into(), turns.to_string()),
                ("max_actions_per_turn".into(), per_turn.to_string()),
                ("max_steps".into(), steps.to_string()),
            ]
        })
}

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
            action_space: ActionSpace::Names(actions),
            limits: Limits { max_actions_per_episode: a, max_actions_per_turn: b, max_turns: c, max_steps: d },
            metrics,
        })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 96, ..ProptestConfig::default() })]

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
        let _ = prompts.next_user(reward, 1, 2, &observation, limits.max_actions_per_traj);
        let parser = ResponseParser::new(spec.action_names(), think, limits.max_actions_per_turn as usize);
        let parsed = parser.parse(&reply);
        prop_assert!(parsed.actions.iter().all(|&a| (a as usize) < spec.action_names().len()));
        prop_assert!(parsed.actions.len() <= limits.max_actions_per_turn as usize);
        let tokenizer = PluginTokenizer::with_text(&spec, &templates.texts());
        let grammar = AnswerGrammar::new(&tokenizer, think, 16, limits.max_actions_per_turn);
        prop_assert!(grammar.max_reply_tokens() >= grammar.min_reply_tokens());
    }

    /// The agent loop on whatever the plugin is set to report: it refuses
    /// the settings (a spec outside the bounds), or plays, with every
    /// episode either complete or failed with a reason, and a finite summary.
    #[test]
    fn a_configurable_misbehaving_plugin_never_panics_the_agent_loop(settings in settings(), seed in any::<u64>()) {
        let config = RolloutConfig { env_groups: 2, group_size: 2, ..RolloutConfig::default() };
        let runner = match RolloutRunner::new(ragen_runtime::LocalPlugin::provider(configurable()), &settings, config, PromptTemplates::default(), 1) {
            Ok(runner) => runner,
            Err(e) => {
                let message = format!("{e:#}");
                prop_assert!(!message.is_empty());
                return Ok(());
            }
        };
        PLAYED.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let ts = runner.run(&mut RandomPolicy::new(seed), &[seed, seed ^ 1]).unwrap();
        prop_assert_eq!(ts.len(), 4);
        for t in &ts {
            prop_assert_eq!(t.failure.is_some(), t.failure_kind.is_some());
        }
        let m = summarize(&ts);
        prop_assert!(m.return_mean.is_finite() && m.return_std.is_finite(), "{:?}", m);
        let tokenizer = PluginTokenizer::with_text(runner.spec(), &PromptTemplates::default().texts());
        let limits = runner.limits();
        let _ = AnswerGrammar::new(&tokenizer, true, 16, limits.max_actions_per_turn);
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

#[test]
fn the_agent_loop_property_really_plays() {
    // Run the property here too, so this test sees its counter.
    a_configurable_misbehaving_plugin_never_panics_the_agent_loop();
    let played = PLAYED.load(std::sync::atomic::Ordering::Relaxed);
    eprintln!("{played} generated settings passed the bounds and played");
    assert!(played >= 10, "only {played} of the generated settings passed the bounds: the property barely ran the loop");
}
