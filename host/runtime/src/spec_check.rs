//! The one checker of what a plugin says about itself: its `info()` and an
//! env's `spec()`. Every rule lives here, once, and each problem it finds
//! comes from one rule, with a [`Severity`]:
//!
//! * [`Severity::Error`]: the host refuses the answer.
//!   [`PluginInstance::info`](crate::PluginInstance::info) and
//!   [`spec`](crate::PluginInstance::spec) return a `contract` fault naming
//!   every error, so no consumer (a sampler's action table, a prompt, a
//!   tokenizer's vocabulary, a loop bounded by a limit) ever sees it.
//! * [`Severity::Warning`]: the host loads the plugin and says so where it
//!   can (`ragen-host serve` logs it). The conformance suite
//!   (`ragen-conformance`, run by `ragen-host validate`) fails on it all the
//!   same: a plugin shared with others should have none.
//!
//! The bounds the rules check against are [`ReportLimits`]'.
//!
//! # Action names
//!
//! An agent picks actions by writing their names: the response parser
//! (`ragen_agent::parse`) splits its answer on [`ACTION_SEPARATOR`] and
//! matches each part to a name by [`action_name_key`], and so do `serve`'s
//! protocol and `play`. The rules about names live here rather than in the
//! parser because the runtime is where a spec is refused, and the agent
//! depends on the runtime, not the other way round. The parser uses these
//! same items, so the matching and the rules about it cannot drift apart.

use crate::{ActionSpace, ConfigKey, EnvSpec, LegendEntry, Limits, PluginInfo, ReportLimits, TextActions};
use std::collections::{HashMap, HashSet};
use std::fmt::{self, Write};

/// What the host does about a [`Problem`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Severity {
    /// The host refuses the plugin's answer (a `contract` fault).
    Error,
    /// The host takes it, and `validate` fails the plugin for it.
    Warning,
}

impl Severity {
    /// `error` or `warning`, for reports.
    pub fn as_str(self) -> &'static str {
        match self {
            Severity::Error => "error",
            Severity::Warning => "warning",
        }
    }
}

/// One thing wrong with a plugin's info or spec.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Problem {
    pub severity: Severity,
    /// The rule that found it, a stable kebab-case name such as
    /// `duplicate-action-name`: what tools and tests match on, so the
    /// wording can improve without breaking them.
    pub rule: &'static str,
    /// What is wrong, naming the field and, where it helps, the fix. Plugin
    /// text quoted in it is cut short and its control characters escaped,
    /// so it is safe to log or print as it is.
    pub message: String,
}

impl Problem {
    pub fn is_error(&self) -> bool {
        self.severity == Severity::Error
    }
}

impl fmt::Display for Problem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

/// What separates the actions of one answer (`Up || Left`). A name holding
/// it could never be written alone, since the answer is split on it.
pub const ACTION_SEPARATOR: &str = "||";

/// Marks an action name must not contain: the separator, and `<`, with
/// which the answer format's tags (`<answer>`, `</answer>`) begin.
///
/// A name holding one is a [`Severity::Warning`], not an error: only agents
/// writing the answer format are hurt (a `serve` client picks an action by
/// a JSON string or an id, where these marks mean nothing), while `inspect`
/// and `play` stay useful to the author finding the problem.
pub const RESERVED_IN_ACTION_NAMES: [&str; 2] = [ACTION_SEPARATOR, "<"];

/// What an answer's part and an action name are compared by: the text
/// trimmed and lowercased, so `up`, ` UP ` and `Up` all name `Up`.
///
/// Two names with the same key cannot be told apart by any consumer that
/// matches this way (an answer naming the second would pick the first), so
/// they are a [`Severity::Error`]: `duplicate-action-name`.
pub fn action_name_key(name: &str) -> String {
    name.trim().to_lowercase()
}

/// Characters a terminal would act on rather than show (newlines and tabs
/// are kept, so grids still render).
fn is_control(c: char) -> bool {
    c.is_control() && c != '\n' && c != '\t'
}

/// Plugin text as a message quotes it: in backticks, cut to 60 characters,
/// control characters written as `\u{1b}`.
fn quote(s: &str) -> String {
    const SHOWN: usize = 60;
    let mut out = String::from("`");
    for (i, c) in s.chars().enumerate() {
        if i == SHOWN {
            out.push('…');
            break;
        }
        if is_control(c) {
            let _ = write!(out, "\\u{{{:x}}}", c as u32);
        } else {
            out.push(c);
        }
    }
    out.push('`');
    out
}

/// Why a mark of [`RESERVED_IN_ACTION_NAMES`] is reserved.
fn why_reserved(mark: &str) -> &'static str {
    if mark == ACTION_SEPARATOR { "it separates the actions of one answer" } else { "the answer format's tags begin with it" }
}

impl ReportLimits {
    /// Every problem with `info()`'s answer, errors and warnings.
    pub fn info_problems(&self, info: &PluginInfo) -> Vec<Problem> {
        let mut check = Checker { limits: self, found: Vec::new() };
        check.info(info);
        check.config_keys(&info.config_keys);
        check.found
    }

    /// Every problem with `spec()`'s answer, errors and warnings.
    pub fn spec_problems(&self, spec: &EnvSpec) -> Vec<Problem> {
        let mut check = Checker { limits: self, found: Vec::new() };
        check.instructions(&spec.instructions);
        match &spec.action_space {
            ActionSpace::Names(names) => check.action_names(names),
            ActionSpace::Text(text) => check.text_actions(text),
        }
        check.legend(&spec.legend);
        check.metrics(&spec.metrics);
        check.episode_limits(&spec.limits);
        check.found
    }
}

/// The rules, applied one field at a time.
struct Checker<'a> {
    limits: &'a ReportLimits,
    found: Vec<Problem>,
}

impl Checker<'_> {
    fn error(&mut self, rule: &'static str, message: String) {
        self.found.push(Problem { severity: Severity::Error, rule, message });
    }

    fn warning(&mut self, rule: &'static str, message: String) {
        self.found.push(Problem { severity: Severity::Warning, rule, message });
    }

    /// `text-too-long`: one name, description or entry over the limit.
    /// Whether `s` is within it (the other rules on `s` then apply).
    fn text(&mut self, what: &str, s: &str) -> bool {
        let max = self.limits.max_text_bytes;
        if s.len() <= max {
            return true;
        }
        self.error("text-too-long", format!("{what} is {} bytes long, over the limit of {max} bytes", s.len()));
        false
    }

    /// `too-many-entries`: a list over its limit. Whether it is within it:
    /// the items of a longer list are not checked one by one (a list of a
    /// million would give a million problems).
    fn count(&mut self, what: &str, n: usize, max: usize) -> bool {
        if n <= max {
            return true;
        }
        self.error("too-many-entries", format!("{n} {what}, over the limit of {max}"));
        false
    }

    /// `control-characters`: text a person's terminal will show must not
    /// act on the terminal (the CLI escapes it anyway; a log may not).
    fn printable(&mut self, what: &str, s: &str) {
        if s.chars().any(is_control) {
            self.warning("control-characters", format!("{what} ({}) contains control characters, which a terminal would act on", quote(s)));
        }
    }

    fn info(&mut self, info: &PluginInfo) {
        let name_ok = self.text("the name", &info.name);
        self.text("the version", &info.version);
        let description_ok = self.text("the description", &info.description);
        if info.name.trim().is_empty() {
            self.error("empty-name", "the plugin's name is empty".into());
        }
        if info.version.trim().is_empty() {
            self.warning("empty-version", "the plugin's version is empty".into());
        }
        if info.description.trim().is_empty() {
            self.warning("empty-description", "the plugin's description is empty: a person choosing an environment reads it".into());
        }
        if name_ok {
            self.printable("the name", &info.name);
        }
        if description_ok {
            self.printable("the description", &info.description);
        }
    }

    fn config_keys(&mut self, keys: &[ConfigKey]) {
        if !self.count("config keys", keys.len(), self.limits.max_entries) {
            return;
        }
        let mut seen = HashSet::new();
        for k in keys {
            let name_ok = self.text("a config key's name", &k.name);
            self.text(&format!("config key {}'s default", quote(&k.name)), &k.default_value);
            self.text(&format!("config key {}'s description", quote(&k.name)), &k.description);
            if name_ok && !seen.insert(k.name.as_str()) {
                self.warning("duplicate-config-key", format!("config key {} is declared twice", quote(&k.name)));
            }
        }
    }

    fn instructions(&mut self, s: &str) {
        let max = self.limits.max_instructions_bytes;
        if s.len() > max {
            self.error("text-too-long", format!("the instructions are {} bytes long, over the limit of {max} bytes", s.len()));
            return;
        }
        if s.trim().is_empty() {
            self.warning("empty-instructions", "the instructions are empty: the agent would not know the task".into());
        }
        self.printable("the instructions", s);
    }

    fn action_names(&mut self, names: &[String]) {
        if names.is_empty() {
            self.error("empty-action-list", "the action list is empty; an environment needs at least one action".into());
            return;
        }
        if !self.count("actions", names.len(), self.limits.max_actions) {
            return;
        }
        // Each key with the first action that has it.
        let mut seen: HashMap<String, usize> = HashMap::new();
        for (i, name) in names.iter().enumerate() {
            if name.trim().is_empty() {
                self.error("empty-action-name", format!("action #{i} has an empty name"));
                continue;
            }
            if !self.text(&format!("action #{i}'s name"), name) {
                continue;
            }
            for mark in RESERVED_IN_ACTION_NAMES.into_iter().filter(|m| name.contains(*m)) {
                self.warning(
                    "reserved-in-action-name",
                    format!(
                        "action name {} contains `{mark}`, which the answer format reserves ({}): an agent could not name this action",
                        quote(name),
                        why_reserved(mark)
                    ),
                );
            }
            self.printable("an action name", name);
            let key = action_name_key(name);
            if let Some(&first) = seen.get(&key) {
                self.error(
                    "duplicate-action-name",
                    format!(
                        "action #{i} {} repeats action #{first} {}: answers are matched to names ignoring case and surrounding spaces, \
                         so no answer could pick the second; make the names unique that way",
                        quote(name),
                        quote(&names[first])
                    ),
                );
            } else {
                seen.insert(key, i);
            }
        }
    }

    fn text_actions(&mut self, text: &TextActions) {
        let max = self.limits.max_text_action_bytes;
        if text.max_bytes == 0 || text.max_bytes > max {
            self.error(
                "text-max-bytes-out-of-range",
                format!("the text action space's max-bytes is {}; it must be between 1 and {max}", text.max_bytes),
            );
        }
        if self.text("the text action space's form", &text.form) && text.form.trim().is_empty() {
            self.warning("empty-text-form", "the text action space's form is empty: the prompt would not say what to answer".into());
        }
    }

    fn legend(&mut self, legend: &[LegendEntry]) {
        if !self.count("legend entries", legend.len(), self.limits.max_entries) {
            return;
        }
        for l in legend {
            let symbol_ok = self.text("a legend symbol", &l.symbol);
            let meaning_ok = self.text(&format!("legend symbol {}'s meaning", quote(&l.symbol)), &l.meaning);
            if !(symbol_ok && meaning_ok) {
                continue;
            }
            if l.symbol.is_empty() || l.meaning.trim().is_empty() {
                self.warning("empty-legend-part", format!("legend entry {} = {} has an empty part", quote(&l.symbol), quote(&l.meaning)));
            }
            self.printable("a legend symbol", &l.symbol);
        }
    }

    fn metrics(&mut self, metrics: &[String]) {
        if !self.count("metrics", metrics.len(), self.limits.max_entries) {
            return;
        }
        let mut seen = HashSet::new();
        for m in metrics {
            if !self.text("a metric's name", m) {
                continue;
            }
            if m.trim().is_empty() {
                self.warning("empty-metric-name", "a metric's name is empty: name each number the steps report".into());
            } else if !seen.insert(m.as_str()) {
                self.warning("duplicate-metric-name", format!("metric {} is declared twice", quote(m)));
            }
        }
    }

    fn episode_limits(&mut self, l: &Limits) {
        let ranges = [
            ("max-turns", l.max_turns, self.limits.max_turns),
            ("max-actions-per-turn", l.max_actions_per_turn, self.limits.max_actions_per_turn),
            ("max-actions-per-episode", l.max_actions_per_episode, self.limits.max_actions_per_episode),
            ("max-steps", l.max_steps, self.limits.max_actions_per_episode),
        ];
        for (name, value, max) in ranges {
            if value == 0 || value > max {
                self.error("limit-out-of-range", format!("limits.{name} is {value}; it must be between 1 and {max}"));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(names: &[&str]) -> EnvSpec {
        EnvSpec {
            instructions: "Push the boxes.".into(),
            legend: vec![LegendEntry { symbol: "#".into(), meaning: "wall".into() }],
            action_space: ActionSpace::Names(names.iter().map(|s| s.to_string()).collect()),
            limits: Limits { max_actions_per_episode: 10, max_actions_per_turn: 5, max_turns: 5, max_steps: 100 },
            metrics: vec!["boxes".into()],
        }
    }

    fn rules(problems: &[Problem]) -> Vec<(Severity, &'static str)> {
        problems.iter().map(|p| (p.severity, p.rule)).collect()
    }

    #[test]
    fn a_clean_spec_has_no_problems() {
        let problems = ReportLimits::default().spec_problems(&spec(&["Up", "Down"]));
        assert!(problems.is_empty(), "{problems:?}");
    }

    /// The parser matches an answer's part to a name by `action_name_key`:
    /// names equal under it are refused, and only those. (`ragen_agent`'s
    /// parse tests check the same pairs against the parser itself.)
    #[test]
    fn names_differing_only_in_case_or_spaces_are_refused_as_the_parser_would_confuse_them() {
        let limits = ReportLimits::default();
        for (a, b) in [("Up", "up"), ("Up", "UP"), ("Up", " up "), ("É", "é"), ("Up", "Up")] {
            assert_eq!(action_name_key(a), action_name_key(b), "{a:?} {b:?}");
            let problems = limits.spec_problems(&spec(&[a, b]));
            assert_eq!(rules(&problems), [(Severity::Error, "duplicate-action-name")], "{a:?} {b:?}");
            let refused = limits.check_spec(&spec(&[a, b])).unwrap_err();
            assert_eq!(refused, problems[0].message);
            assert!(refused.contains("ignoring case"), "{refused}");
        }
        // Lowercasing `STRASSE` gives `strasse`, not `straße`: the parser
        // tells them apart, and so does the checker.
        for (a, b) in [("Straße", "STRASSE"), ("Up", "Upp")] {
            assert_ne!(action_name_key(a), action_name_key(b));
            let problems = limits.spec_problems(&spec(&[a, b]));
            assert!(problems.is_empty(), "{a:?} {b:?}: {problems:?}");
        }
    }

    #[test]
    fn reserved_marks_and_control_characters_warn_but_load() {
        let limits = ReportLimits::default();
        let s = spec(&["Up || Down", "<Left>", "Right\x1b[31m"]);
        assert_eq!(
            rules(&limits.spec_problems(&s)),
            [
                (Severity::Warning, "reserved-in-action-name"),
                (Severity::Warning, "reserved-in-action-name"),
                (Severity::Warning, "control-characters"),
            ]
        );
        assert_eq!(limits.check_spec(&s), Ok(()));
        let shown = &limits.spec_problems(&s)[2].message;
        assert!(shown.contains("`Right\\u{1b}[31m`") && !shown.contains('\x1b'), "{shown}");
    }

    #[test]
    fn every_problem_is_found_and_the_refusal_names_every_error() {
        let mut s = spec(&[]);
        s.instructions = " ".into();
        s.limits.max_turns = 0;
        s.limits.max_steps = u32::MAX;
        s.metrics = vec!["x".into(), "x".into()];
        let limits = ReportLimits::default();
        assert_eq!(
            rules(&limits.spec_problems(&s)),
            [
                (Severity::Warning, "empty-instructions"),
                (Severity::Error, "empty-action-list"),
                (Severity::Warning, "duplicate-metric-name"),
                (Severity::Error, "limit-out-of-range"),
                (Severity::Error, "limit-out-of-range"),
            ]
        );
        let refused = limits.check_spec(&s).unwrap_err();
        assert!(refused.starts_with("the action list is empty"), "{refused}");
        assert!(refused.contains("limits.max-turns is 0") && refused.contains("limits.max-steps is 4294967295"), "{refused}");
        assert!(!refused.contains("instructions"), "warnings do not refuse: {refused}");
    }

    #[test]
    fn a_list_over_its_limit_is_one_problem_not_one_per_item() {
        let names: Vec<String> = (0..10_000).map(|_| "same".to_string()).collect();
        let mut s = spec(&[]);
        s.action_space = ActionSpace::Names(names);
        assert_eq!(rules(&ReportLimits::default().spec_problems(&s)), [(Severity::Error, "too-many-entries")]);
    }

    #[test]
    fn info_rules() {
        let info = PluginInfo {
            name: " ".into(),
            version: String::new(),
            description: "a\x07b".into(),
            multi_turn: true,
            config_keys: vec![
                ConfigKey { name: "k".into(), default_value: "1".into(), description: "d".into() },
                ConfigKey { name: "k".into(), default_value: "x".repeat(2000), description: "d".into() },
            ],
        };
        let limits = ReportLimits::default();
        assert_eq!(
            rules(&limits.info_problems(&info)),
            [
                (Severity::Error, "empty-name"),
                (Severity::Warning, "empty-version"),
                (Severity::Warning, "control-characters"),
                (Severity::Error, "text-too-long"),
                (Severity::Warning, "duplicate-config-key"),
            ]
        );
        let refused = limits.check_info(&info).unwrap_err();
        assert_eq!(refused, "the plugin's name is empty; config key `k`'s default is 2000 bytes long, over the limit of 1024 bytes");
    }
}
