//! The agent loop end to end: prompts rendered from the plugin, replies
//! parsed, actions executed through the pool, trajectories recorded.

use crate::common::shipped;
use anyhow::Result;
use ragen_agent::policies::RandomPolicy;
use ragen_agent::{
    ByteTokenizer, Context, LossBins, Policy, PromptTemplates, Response, Role, RolloutConfig, RolloutRunner, Tokenizer, read_jsonl,
    summarize, write_jsonl,
};
use std::path::PathBuf;

fn runner(name: &str, groups: usize, group_size: usize) -> RolloutRunner {
    let config = RolloutConfig { env_groups: groups, group_size, ..RolloutConfig::default() };
    RolloutRunner::new(ragen_runtime::LocalPlugin::provider(shipped(name)), &[], config, PromptTemplates::default(), 2).unwrap()
}

#[test]
fn groups_share_their_seed_and_jsonl_round_trips() {
    let r = runner("sokoban", 8, 16);
    let seeds: Vec<u64> = (0..8).map(|g| 1000 + g).collect();
    let ts = r.run(&mut RandomPolicy::new(1), &seeds).unwrap();
    assert_eq!(ts.len(), 128);
    for g in 0..8 {
        let group: Vec<_> = ts.iter().filter(|t| t.group == g).collect();
        assert_eq!(group.len(), 16);
        assert!(group.iter().all(|t| t.seed == 1000 + g as u64));
        // Same seed, same first state: the first user message is identical.
        assert!(group.iter().all(|t| t.segments[1].text == group[0].segments[1].text));
    }
    let m = summarize(&ts);
    assert!(m.in_group_reward_std > 0.0, "random play varies within a group");

    let file = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("rollout.jsonl");
    write_jsonl(&mut std::fs::File::create(&file).unwrap(), &ts).unwrap();
    let text = std::fs::read_to_string(&file).unwrap();
    assert_eq!(text.lines().count(), 128, "one record per trajectory");
    assert!(text.contains("Turn 1:\\nState:\\n"), "the full text is there to read");
    let back = read_jsonl(&mut std::io::BufReader::new(std::fs::File::open(&file).unwrap())).unwrap();
    assert_eq!(back, ts);
}

#[test]
fn the_token_view_masks_exactly_the_sampled_tokens() {
    let r = runner("frozenlake", 2, 4);
    let ts = r.run(&mut RandomPolicy::new(3), &[5, 6]).unwrap();
    for t in &ts {
        let v = t.token_view(&ByteTokenizer);
        assert_eq!(v.tokens.len(), v.loss_mask.len());
        let replies: Vec<&ragen_agent::Segment> = t.segments.iter().filter(|s| s.role == Role::Assistant).collect();
        assert_eq!(v.turn_starts.len(), replies.len());
        assert_eq!(v.turn_starts.len(), t.turns.len());
        let sampled: Vec<u32> = v.tokens.iter().zip(&v.loss_mask).filter(|(_, m)| **m == 1).map(|(t, _)| *t).collect();
        let expected: Vec<u32> = replies.iter().flat_map(|s| s.tokens.clone()).collect();
        assert_eq!(sampled, expected);
        // The pre-fill is context, not a sampled token.
        for (&start, s) in v.turn_starts.iter().zip(&replies) {
            assert_eq!(ByteTokenizer.decode(&v.tokens[start - s.prefill.len()..start]), "<think>");
        }
    }
}

/// Replies with the same fixed text every turn.
struct Fixed(&'static str);

impl Policy for Fixed {
    fn name(&self) -> &str {
        "fixed"
    }
    fn tokenizer(&self) -> &dyn Tokenizer {
        &ByteTokenizer
    }
    fn respond(&mut self, contexts: &[Context<'_>]) -> Result<Vec<Response>> {
        Ok(contexts
            .iter()
            .map(|_| Response { text: self.0.into(), tokens: ByteTokenizer.encode(self.0), logprobs: vec![0.0; self.0.len()] })
            .collect())
    }
}

#[test]
fn malformed_replies_cost_the_format_penalty_every_turn() {
    let r = runner("sokoban", 1, 2);
    let ts = r.run(&mut Fixed("no tags at all"), &[3]).unwrap();
    for t in ts {
        assert_eq!(t.turns.len(), 5, "max_turn turns are played");
        assert_eq!(t.num_actions, 0);
        assert!((t.reward - 5.0 * -0.1).abs() < 1e-12, "{}", t.reward);
        assert_eq!(t.valid_action_ratio, 0.0);
    }
}

#[test]
fn the_action_budget_and_max_turn_are_respected() {
    // 5 valid actions per reply against a budget of 10: two turns, then stop.
    let r = runner("sokoban", 1, 1);
    let ts = r.run(&mut Fixed("hm</think><answer>Up || Up || Up || Up || Up</answer>"), &[9]).unwrap();
    let t = &ts[0];
    assert!(t.success || t.num_actions == 10, "{}", t.transcript());
    assert!(t.turns.len() <= 2);
    // One unknown name among valid ones: valid ones run, the penalty applies.
    let ts = r.run(&mut Fixed("hm</think><answer>Up || Jump</answer>"), &[9]).unwrap();
    assert!(ts[0].turns.iter().all(|turn| turn.penalty == -0.1 && turn.parsed.actions == [0]));
    assert_eq!(ts[0].valid_action_ratio, 0.5);
}

#[test]
fn an_untrained_transformer_always_answers_in_format() {
    use burn::backend::Flex;
    use ragen_policy::{BurnPolicy, PluginTokenizer, PolicyModelConfig, SamplingConfig};
    for name in ["bandit", "sokoban"] {
        let r = runner(name, 2, 2);
        let tok = PluginTokenizer::new(r.spec());
        let config = PolicyModelConfig::new(tok.vocab_size()).with_d_model(32).with_n_layers(1).with_n_heads(2).with_max_seq_len(512);
        let model = crate::common::scratch_model::<Flex>(&config, 0);
        let limits = r.limits();
        let sampling = SamplingConfig { temperature: 1.0, think_budget: 8 };
        let mut policy = BurnPolicy::new(model, tok, true, limits.max_actions_per_turn, sampling, 5, Default::default());
        let ts = r.run(&mut policy, &[11, 12]).unwrap();
        for t in &ts {
            assert!(t.turns.iter().all(|turn| !turn.parsed.penalised), "{}", t.transcript());
            assert_eq!(t.valid_action_ratio, 1.0);
            assert!(t.failure.is_none());
            // The recorded tokens are the policy's; their count matches the
            // token view's loss mask.
            let view = t.token_view(policy.plugin_tokenizer());
            let agent: usize = view.loss_mask.iter().map(|&m| m as usize).sum();
            assert_eq!(agent, t.segments.iter().map(|s| s.tokens.len()).sum::<usize>());
        }
    }
}

/// Answers every context with the same text.
struct Says(String);

impl Policy for Says {
    fn name(&self) -> &str {
        "says"
    }
    fn tokenizer(&self) -> &dyn Tokenizer {
        &ByteTokenizer
    }
    fn respond(&mut self, contexts: &[Context<'_>]) -> Result<Vec<Response>> {
        let tokens = ByteTokenizer.encode(&self.0);
        Ok(contexts.iter().map(|_| Response { text: self.0.clone(), logprobs: vec![0.0; tokens.len()], tokens: tokens.clone() }).collect())
    }
}

#[test]
fn countdown_answers_reach_the_env_as_text() {
    use ragen_env_countdown::{Countdown, expr, solver};
    let seed = 5;
    let puzzle = ragen_env_sdk::CheckedEnv::<Countdown>::create(&[]).unwrap().inner().puzzle(seed);
    let solved = solver::solve(&puzzle.numbers, puzzle.target).unwrap();
    let summed: Vec<String> = puzzle.numbers.iter().map(u64::to_string).collect();
    let summed = summed.join(" + ");
    let r = runner("countdown", 1, 1);
    assert!(r.spec().takes_text());
    for answer in [solved.as_str(), summed.as_str(), "1 + 1", "  "] {
        let reply = format!("I will try this.</think><answer> {answer} </answer>");
        let t = r.run(&mut Says(reply), &[seed]).unwrap().remove(0);
        assert_eq!(t.turns.len(), 1, "one turn");
        let want = if answer.trim().is_empty() { -0.1 } else { expr::score(answer, &puzzle.numbers, puzzle.target, 0.1) };
        assert!((t.reward - want).abs() < 1e-12, "{answer:?}: {} (want {want})", t.reward);
        assert_eq!(t.success, want == 1.0, "{answer:?}");
        if answer.trim().is_empty() {
            assert!(t.turns[0].executed.is_empty() && t.turns[0].penalty == -0.1, "an empty answer is not sent");
        } else {
            assert_eq!(t.turns[0].executed, [answer.to_string()], "the trimmed answer is the action");
        }
    }
    // The prompt describes the answer instead of listing actions.
    let t = r.run(&mut Says("x".into()), &[seed]).unwrap().remove(0);
    assert!(t.segments[1].text.contains("Your answer is one arithmetic expression") && t.segments[1].text.contains(&puzzle.render()));
}

/// RAGEN-2's template collapse, read from recorded trajectories: a policy
/// that answers every lake with the format example (FrozenLake's collapse)
/// is flagged; one that explores is not; a solved Bandit, which answers
/// every input with the better arm, is not either.
#[test]
fn the_collapse_signal_separates_a_collapsed_policy_from_a_solved_one() {
    let recorded = |name: &str, policy: &mut dyn Policy| {
        let ts = runner(name, 64, 1).run(policy, &(0..64).collect::<Vec<u64>>()).unwrap();
        let mut file = Vec::new();
        write_jsonl(&mut file, &ts).unwrap();
        summarize(&read_jsonl(&mut file.as_slice()).unwrap())
    };
    let collapsed = recorded("frozenlake", &mut Says("Up || Left</think><answer>Up || Left</answer>".into()));
    assert!(collapsed.input_entropy > 3.0, "64 lakes, nearly all different: {collapsed:?}");
    assert_eq!((collapsed.answer_entropy, collapsed.answer_mi), (0.0, 0.0), "one answer for every lake");
    let why = collapsed.template_collapse().expect("flagged");
    assert!(why.contains("template collapse") && why.contains("no longer depend on the state"), "{why}");

    let exploring = recorded("frozenlake", &mut RandomPolicy::new(3));
    assert!(exploring.answer_entropy > 2.0 && exploring.template_collapse().is_none(), "{exploring:?}");

    let solved = recorded("bandit", &mut ragen_agent::policies::OraclePolicy);
    assert_eq!(solved.success_rate, 1.0);
    assert!(solved.answer_mi < 0.05, "the best arm does not depend on the order shown: {solved:?}");
    assert!(solved.template_collapse().is_none(), "a solved task is not a collapse: {solved:?}");
}

/// Answers `Left` on even turns and `Right` on odd ones.
struct Alternates;

impl Policy for Alternates {
    fn name(&self) -> &str {
        "alternates"
    }
    fn tokenizer(&self) -> &dyn Tokenizer {
        &ByteTokenizer
    }
    fn respond(&mut self, contexts: &[Context<'_>]) -> Result<Vec<Response>> {
        Ok(contexts
            .iter()
            .map(|c| {
                let turn = c.messages.iter().filter(|m| m.role == Role::Assistant).count();
                let text = format!("</think><answer>{}</answer>", if turn % 2 == 0 { "Left" } else { "Right" });
                let tokens = ByteTokenizer.encode(&text);
                Response { text, logprobs: vec![0.0; tokens.len()], tokens }
            })
            .collect())
    }
}

/// Lost Sokoban episodes sorted by how they ended: always pushing `Up`
/// ends against a wall (stuck); `Left, Right, Left, ...` walks back and
/// forth (oscillating) wherever both cells are free.
#[test]
fn lost_episodes_are_told_apart_as_stuck_oscillating_or_other() {
    let config = RolloutConfig {
        env_groups: 32,
        group_size: 1,
        max_turn: Some(10),
        max_actions_per_turn: Some(1),
        max_actions_per_traj: Some(10),
        ..RolloutConfig::default()
    };
    let r =
        RolloutRunner::new(ragen_runtime::LocalPlugin::provider(shipped("sokoban")), &[], config, PromptTemplates::default(), 2).unwrap();
    let seeds: Vec<u64> = (0..32).collect();
    let lost = |ts: &[ragen_agent::Trajectory]| ts.iter().filter(|t| !t.success && t.failure.is_none()).count();

    let up = r.run(&mut Says("</think><answer>Up</answer>".into()), &seeds).unwrap();
    let bins = LossBins::of(&up);
    assert_eq!(bins.stuck + bins.oscillating + bins.other, lost(&up), "{bins:?}");
    assert!(bins.stuck * 4 >= lost(&up) * 3 && bins.oscillating == 0, "pushing Up ten times mostly ends at a wall: {bins:?}");

    let alternating = r.run(&mut Alternates, &seeds).unwrap();
    let bins = LossBins::of(&alternating);
    assert_eq!(bins.stuck + bins.oscillating + bins.other, lost(&alternating), "{bins:?}");
    assert!(bins.oscillating * 2 >= lost(&alternating), "walking back and forth: {bins:?}");
}
