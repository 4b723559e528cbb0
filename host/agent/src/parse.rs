//! Turning the agent's reply into env actions, as the reference does.
//!
//! The reply (pre-fill included) must contain `<think>…</think>` followed,
//! after optional whitespace, by `<answer>…</answer>` (only the answer when
//! thinking is off); the first such match counts and text around it is
//! ignored. The answer is split on `||`, each part trimmed and matched
//! case-insensitively against the action names; unknown names are dropped,
//! and at most `max_actions_per_turn` parts are kept (extra parts are cut,
//! as in the reference's code, without a penalty). The format penalty
//! applies when no match was found, when any name was unknown, or when no
//! valid action is left.
//!
//! The separator and the matching are the runtime's
//! ([`ragen_runtime::ACTION_SEPARATOR`], [`ragen_runtime::action_name_key`]),
//! not this module's: the runtime's spec checker, which refuses a spec
//! when loading it, holds the rules that follow from them (names equal
//! ignoring case and surrounding spaces are refused; names holding `||` or
//! `<` are warned about), and it cannot depend on this crate, which depends
//! on it. Using its items here keeps the parser and those rules the same.
//!
//! For an env whose actions are text (`action-space.text`, e.g.
//! Countdown), the whole answer, trimmed, is the one action of the turn:
//! it is not split on `||`, and it is penalised, and not sent, when it is
//! empty or longer than the env's `max-bytes`.

use ragen_runtime::{ACTION_SEPARATOR, ActionSpace, EnvSpec, action_name_key};
use regex::Regex;
use serde::{Deserialize, Serialize};

/// What a reply asked for.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Parsed {
    /// The thinking, if the reply had the expected shape and thinking is on.
    pub think: Option<String>,
    /// The raw answer text, if the reply had the expected shape.
    pub answer: Option<String>,
    /// Valid action ids, in order (names spaces).
    pub actions: Vec<u32>,
    /// The text action (text spaces): the trimmed answer.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub text: Option<String>,
    /// Parts of the answer (after the cut to `max_actions_per_turn`).
    pub proposed: usize,
    /// True when the format penalty applies.
    pub penalised: bool,
}

/// Parses replies against one env's action names.
#[derive(Clone, Debug)]
pub struct ResponseParser {
    pattern: Regex,
    think: bool,
    /// Each action name's [`action_name_key`].
    action_keys: Vec<String>,
    max_actions_per_turn: usize,
    /// `Some(max-bytes)` when the answer itself is the action.
    text_max_bytes: Option<usize>,
}

impl Parsed {
    /// Actions the reply validly asked for.
    pub fn valid(&self) -> usize {
        self.actions.len() + self.text.is_some() as usize
    }
}

impl ResponseParser {
    pub fn new(actions: &[String], enable_think: bool, max_actions_per_turn: usize) -> Self {
        // (?s): `.` also matches newlines, like Python's re.DOTALL.
        let pattern = if enable_think { r"(?s)<think>(.*?)</think>\s*<answer>(.*?)</answer>" } else { r"(?s)<answer>(.*?)</answer>" };
        Self {
            pattern: Regex::new(pattern).expect("a fixed, valid pattern"),
            think: enable_think,
            action_keys: actions.iter().map(|a| action_name_key(a)).collect(),
            max_actions_per_turn,
            text_max_bytes: None,
        }
    }

    /// The parser for `spec`'s action space: names or text.
    pub fn for_spec(spec: &EnvSpec, enable_think: bool, max_actions_per_turn: usize) -> Self {
        let mut parser = Self::new(spec.action_names(), enable_think, max_actions_per_turn);
        if let ActionSpace::Text(t) = &spec.action_space {
            parser.text_max_bytes = Some(t.max_bytes as usize);
        }
        parser
    }

    pub fn parse(&self, reply: &str) -> Parsed {
        let Some(m) = self.pattern.captures(reply) else {
            return Parsed { think: None, answer: None, actions: vec![], text: None, proposed: 0, penalised: true };
        };
        let (think, answer) = if self.think { (Some(m[1].to_string()), m[2].to_string()) } else { (None, m[1].to_string()) };
        if let Some(max) = self.text_max_bytes {
            let trimmed = answer.trim();
            let text = (!trimmed.is_empty() && trimmed.len() <= max).then(|| trimmed.to_string());
            let penalised = text.is_none();
            return Parsed { think, answer: Some(answer), actions: vec![], text, proposed: 1, penalised };
        }
        let parts: Vec<&str> =
            answer.split(ACTION_SEPARATOR).map(str::trim).filter(|p| !p.is_empty()).take(self.max_actions_per_turn).collect();
        let actions: Vec<u32> = parts
            .iter()
            .filter_map(|p| {
                let key = action_name_key(p);
                self.action_keys.iter().position(|a| *a == key).map(|i| i as u32)
            })
            .collect();
        let (proposed, penalised) = (parts.len(), actions.is_empty() || actions.len() != parts.len());
        Parsed { think, answer: Some(answer), actions, text: None, proposed, penalised }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sokoban() -> ResponseParser {
        let names: Vec<String> = ["Up", "Down", "Left", "Right"].iter().map(|s| s.to_string()).collect();
        ResponseParser::new(&names, true, 5)
    }

    fn check(reply: &str, actions: &[u32], penalised: bool) {
        let p = sokoban().parse(reply);
        assert_eq!((p.actions.as_slice(), p.penalised), (actions, penalised), "{reply:?} -> {p:?}");
    }

    #[test]
    fn well_formed() {
        check("<think>go up</think><answer>Up || Left</answer>", &[0, 2], false);
        check("<think>x</think>\n  <answer> right </answer>", &[3], false);
    }

    #[test]
    fn mixed_case_matches() {
        check("<think></think><answer>uP || LEFT || down</answer>", &[0, 2, 1], false);
    }

    /// The runtime refuses a spec whose names the parser could not tell
    /// apart, and only such a spec: the second of two names equal ignoring
    /// case (and surrounding spaces) would always parse as the first.
    #[test]
    fn the_runtime_refuses_exactly_the_names_the_parser_confuses() {
        use ragen_runtime::ReportLimits;
        let pairs = [("Up", "UP"), ("Up", " up "), ("É", "é"), ("Up", "Upp"), ("Straße", "STRASSE"), ("Left", "Right")];
        for (a, b) in pairs {
            let names = vec![a.to_string(), b.to_string()];
            let confused = ResponseParser::new(&names, false, 1).parse(&format!("<answer>{b}</answer>")).actions != [1];
            let mut spec = crate::prompt::tests::spec();
            spec.action_space = ActionSpace::Names(names);
            let refused = ReportLimits::default().check_spec(&spec).is_err();
            assert_eq!(refused, confused, "{a:?} and {b:?}: refused {refused}, confused by the parser {confused}");
        }
    }

    #[test]
    fn unknown_actions_are_dropped_with_the_penalty() {
        check("<think>t</think><answer>Up || Jump || Left</answer>", &[0, 2], true);
        check("<think>t</think><answer>Fly</answer>", &[], true);
    }

    #[test]
    fn empty_answer_is_penalised() {
        check("<think>t</think><answer></answer>", &[], true);
        check("<think>t</think><answer> || </answer>", &[], true);
    }

    #[test]
    fn missing_closing_answer_tag_is_no_answer() {
        check("<think>t</think><answer>Up || Left", &[], true);
        check("just Up", &[], true);
    }

    #[test]
    fn text_outside_the_tags_is_ignored() {
        check("Sure! <think>plan</think><answer>Down</answer> Hope this helps.", &[1], false);
        // But text between </think> and <answer> breaks the shape.
        check("<think>plan</think> so: <answer>Down</answer>", &[], true);
    }

    #[test]
    fn nested_and_repeated_tags_take_the_first_complete_match() {
        let p = sokoban().parse("<think>a<think>b</think><answer>Up</answer><answer>Down</answer>");
        assert_eq!(p.think.as_deref(), Some("a<think>b"));
        assert_eq!(p.actions, [0]);
        check("<think>a</think><answer>Left</answer><think>b</think><answer>Right</answer>", &[2], false);
        // An answer tag inside the answer: the non-greedy match ends at the first close.
        check("<think>a</think><answer>Up <answer>Down</answer></answer>", &[], true);
    }

    #[test]
    fn more_actions_than_allowed_are_cut_without_penalty() {
        let p = sokoban().parse("<think>t</think><answer>Up||Up||Up||Up||Up||Left||Left</answer>");
        assert_eq!(p.actions, [0, 0, 0, 0, 0]);
        assert_eq!(p.proposed, 5);
        assert!(!p.penalised);
        // An unknown action past the cut is never seen.
        check("<think>t</think><answer>Up||Up||Up||Up||Up||Jump</answer>", &[0, 0, 0, 0, 0], false);
    }

    fn countdown() -> ResponseParser {
        use ragen_runtime::TextActions;
        let mut spec = crate::prompt::tests::spec();
        spec.action_space = ActionSpace::Text(TextActions { max_bytes: 12, form: "an expression".into() });
        ResponseParser::for_spec(&spec, true, 5)
    }

    #[test]
    fn a_text_answer_is_one_action_not_split() {
        let p = countdown().parse("<think>t</think><answer> (3 + 5) * 2 </answer>");
        assert_eq!((p.text.as_deref(), p.actions.len(), p.valid(), p.penalised), (Some("(3 + 5) * 2"), 0, 1, false));
        assert_eq!(countdown().parse("<think>t</think><answer>1 || 2</answer>").text.as_deref(), Some("1 || 2"));
    }

    #[test]
    fn an_empty_or_overlong_text_answer_is_penalised_and_not_sent() {
        for reply in ["<think>t</think><answer>  </answer>", "<think>t</think><answer>1+2+3+4+5+6+7</answer>", "no tags"] {
            let p = countdown().parse(reply);
            assert_eq!((p.text.as_deref(), p.valid(), p.penalised), (None, 0, true), "{reply:?}");
        }
    }

    #[test]
    fn without_thinking_only_the_answer_is_needed() {
        let names: Vec<String> = ["Phoenix", "Dragon"].iter().map(|s| s.to_string()).collect();
        let p = ResponseParser::new(&names, false, 1);
        let out = p.parse("<answer> dragon </answer>");
        assert_eq!((out.actions, out.penalised, out.think), (vec![1], false, None));
        // The think tags are not required, and not harmful.
        assert_eq!(p.parse("<think>hm</think><answer>Phoenix</answer>").actions, [0]);
    }
}
