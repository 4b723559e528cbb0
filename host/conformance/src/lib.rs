//! ragen-conformance: the conformance suite for environment plugins. It is
//! what `ragen-host validate` runs before a plugin is shared (and `push`
//! before it is published), and `ragen_envs.validate` from Python.
//!
//! [`validate`] loads a plugin, checks what it says about itself with the
//! runtime's spec checker ([`ReportLimits::info_problems`] and
//! [`spec_problems`](ReportLimits::spec_problems): the rules the host loads
//! by, so the suite and the host never disagree about a spec), then plays
//! it: the same seeds in two instances (determinism, and no state kept
//! across resets), different seeds, finite numbers, bad config and bad
//! actions, the episode rules, the batched calls against single calls, the
//! oracle against random play (when the plugin has one), and its speed. Each check runs in a fresh instance, so one fault does not
//! hide the others, and each failure says what to fix.
//!
//! The suite is stricter than loading: a spec [`Problem`] of either
//! [`Severity`] fails the `metadata` check (the host refuses errors and
//! loads warnings; a plugin shared with others should have neither).
//!
//! The result is a [`Report`]: one [`Check`] per check, with a [`Status`]
//! and a message, and the spec checker's problems. Printing it is the
//! caller's business (`ragen-host validate` prints one line per check).

mod checks;
mod oracle;
mod validator;

use ragen_runtime::{ActionSpace, EnvSpec, Plugin, PluginInfo, ReportLimits, SandboxLimits};
use std::path::Path;
use std::time::{Duration, Instant};
use validator::Validator;

pub use ragen_runtime::{Problem, Severity};

/// What the suite runs with.
#[derive(Clone, Debug)]
pub struct Options {
    /// Settings every env is created with (`(key, value)` pairs).
    pub settings: Vec<(String, String)>,
    /// Seeds to play in the determinism and value checks (at least 2 are
    /// played, since different seeds must give different episodes).
    pub seeds: u64,
    pub limits: SandboxLimits,
    /// Wall-clock budget of the checks, counted once the component has
    /// compiled. Checks stop calling the plugin once it is spent (a call
    /// already under way ends within its own `call_timeout`), and those not
    /// run fail saying so.
    pub budget: Duration,
}

impl Default for Options {
    /// `ragen-host validate`'s defaults.
    fn default() -> Self {
        Self { settings: Vec::new(), seeds: 16, limits: SandboxLimits::default(), budget: Duration::from_secs(30) }
    }
}

/// A check's verdict.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Status {
    Pass,
    /// Passed, with advice (e.g. the batched calls are not exported).
    Warn,
    Fail,
}

impl Status {
    /// `pass`, `warn` or `fail`, for reports.
    pub fn as_str(self) -> &'static str {
        match self {
            Status::Pass => "pass",
            Status::Warn => "warn",
            Status::Fail => "fail",
        }
    }
}

/// One check's verdict and what it found: what passed, or what to fix.
#[derive(Clone, Debug, PartialEq)]
pub struct Check {
    /// `load`, `metadata`, `determinism`, `seeds differ`, `finite`, `bad
    /// config`, `bad action`, `episode rules`, `batch`, `oracle` or `speed`.
    pub name: &'static str,
    pub status: Status,
    /// Plugin text in it is the plugin's own (the CLI escapes what it
    /// prints), except in the spec problems, which the checker quotes.
    pub message: String,
}

/// What [`validate`] found.
#[derive(Clone, Debug, PartialEq)]
pub struct Report {
    /// The file, as given.
    pub file: String,
    /// In the order they ran. The suite stops after `load` or `metadata`
    /// fails: a plugin that cannot describe itself cleanly is not played.
    pub checks: Vec<Check>,
    /// Every problem the spec checker found in the plugin's info and spec
    /// (the `metadata` check's message lists them too).
    pub problems: Vec<Problem>,
}

impl Report {
    /// No check failed (warnings pass).
    pub fn passed(&self) -> bool {
        self.checks.iter().all(|c| c.status != Status::Fail)
    }

    fn push(&mut self, name: &'static str, outcome: Result<Outcome, String>) {
        let (status, message) = match outcome {
            Ok(Outcome::Pass(m)) => (Status::Pass, m),
            Ok(Outcome::Warn(m)) => (Status::Warn, m),
            Err(m) => (Status::Fail, m),
        };
        self.checks.push(Check { name, status, message });
    }
}

/// What a check that did not fail says.
pub(crate) enum Outcome {
    Pass(String),
    Warn(String),
}

/// What the plugin says about itself, for the checks that play it.
pub(crate) struct Described {
    pub(crate) space: ActionSpace,
    pub(crate) num_metrics: usize,
    pub(crate) max_steps: u32,
    /// The actions an episode and a turn may take, as the spec recommends.
    pub(crate) max_actions_per_episode: u32,
    pub(crate) max_actions_per_turn: u32,
}

/// The `metadata` check on what a plugin reported: every problem the
/// runtime's checker finds, and the check's verdict on them. The suite has
/// no spec rules of its own, so a spec the host refuses always fails here,
/// naming the same errors.
pub(crate) fn metadata_check(limits: &ReportLimits, info: &PluginInfo, spec: &EnvSpec) -> (Result<String, String>, Vec<Problem>) {
    let mut problems = limits.info_problems(info);
    problems.extend(limits.spec_problems(spec));
    if !problems.is_empty() {
        // Errors first: they are why the host would not load it.
        let listed: Vec<&str> =
            problems.iter().filter(|p| p.is_error()).chain(problems.iter().filter(|p| !p.is_error())).map(|p| p.message.as_str()).collect();
        let fix = if problems.iter().any(Problem::is_error) {
            "fix the plugin's info/spec: the host refuses to load it until the errors are fixed"
        } else {
            "fix the plugin's info/spec"
        };
        return (Err(format!("{} ({fix})", listed.join("; "))), problems);
    }
    let actions = match &spec.action_space {
        ActionSpace::Names(names) => format!("{} actions", names.len()),
        ActionSpace::Text(t) => format!("text actions of up to {} bytes", t.max_bytes),
    };
    let detail =
        format!("{} {}, {actions}, {} legend entries, {} config keys", info.name, info.version, spec.legend.len(), info.config_keys.len());
    (Ok(detail), problems)
}

/// Run the suite on `file`, telling `progress` which check is starting.
pub fn validate(file: &Path, opts: &Options, progress: &mut dyn FnMut(&str)) -> Report {
    let mut report = Report { file: file.display().to_string(), checks: Vec::new(), problems: Vec::new() };
    let plugin = match Plugin::from_file_with(file, opts.limits.clone()) {
        Ok(p) => p,
        Err(e) => {
            report.push("load", Err(format!("{e:#}")));
            return report;
        }
    };
    report.push("load", Ok(Outcome::Pass(format!("component, ragen:env@{}, {} bytes", plugin.contract_version(), plugin.size_bytes()))));
    // The budget covers the checks, not compiling the component (seconds
    // for a language runtime, reported by `load`'s line and by bench).
    let deadline = Instant::now() + opts.budget;
    progress("metadata");
    let (verdict, problems, described) = validator::describe(&plugin, opts);
    report.problems = problems;
    report.push("metadata", verdict.map(Outcome::Pass));
    let Some(described) = described else {
        return report;
    };
    let v = Validator::new(&plugin, opts, deadline, described);
    for (name, run) in checks::runs() {
        progress(name);
        let outcome = match v.in_budget() {
            Ok(()) => run(&v),
            Err(why) => Err(format!("not run: {why}")),
        };
        report.push(name, outcome);
    }
    report
}

#[cfg(test)]
mod tests {
    use super::*;
    use ragen_runtime::{ConfigKey, LegendEntry, Limits, TextActions};

    fn info() -> PluginInfo {
        PluginInfo {
            name: "grid".into(),
            version: "0.1.0".into(),
            description: "A grid.".into(),
            multi_turn: true,
            config_keys: vec![ConfigKey { name: "size".into(), default_value: "4".into(), description: "the side".into() }],
        }
    }

    fn spec(names: &[&str]) -> EnvSpec {
        EnvSpec {
            instructions: "Reach the goal.".into(),
            legend: vec![LegendEntry { symbol: "G".into(), meaning: "goal".into() }],
            action_space: ActionSpace::Names(names.iter().map(|s| s.to_string()).collect()),
            limits: Limits { max_actions_per_episode: 10, max_actions_per_turn: 5, max_turns: 5, max_steps: 10 },
            metrics: vec![],
        }
    }

    /// Specs with an error, with a warning only, and clean: the suite's
    /// `metadata` verdict and the runtime's load verdict agree on every
    /// error, and the suite fails warnings the runtime loads.
    #[test]
    fn the_suite_and_the_runtime_agree_on_every_spec_error() {
        let mut zero_turns = spec(&["Up"]);
        zero_turns.limits.max_turns = 0;
        let mut text = spec(&[]);
        text.action_space = ActionSpace::Text(TextActions { max_bytes: 0, form: String::new() });
        let cases = [
            ("clean", spec(&["Up", "Down"])),
            ("no actions", spec(&[])),
            ("names equal ignoring case", spec(&["Up", "UP"])),
            ("names equal ignoring spaces", spec(&["Up", "up "])),
            ("a reserved mark", spec(&["Up || Down"])),
            ("a control character", spec(&["Up\x1b[2J"])),
            ("a limit of 0", zero_turns),
            ("a text space of 0 bytes", text),
        ];
        let limits = ReportLimits::default();
        for (what, spec) in cases {
            let runtime = limits.check_spec(&spec);
            let (suite, problems) = metadata_check(&limits, &info(), &spec);
            let errors: Vec<&Problem> = problems.iter().filter(|p| p.is_error()).collect();
            assert_eq!(runtime.is_err(), !errors.is_empty(), "{what}: {runtime:?} {problems:?}");
            if let Err(refused) = &runtime {
                let failed = suite.as_ref().expect_err(what);
                assert!(failed.contains(refused.as_str()), "{what}: the suite says `{failed}`, the runtime `{refused}`");
                assert!(failed.contains("the host refuses to load it"), "{what}: {failed}");
            }
            assert_eq!(suite.is_err(), !problems.is_empty(), "{what}: {suite:?}");
        }
    }

    #[test]
    fn a_clean_spec_is_described() {
        let (verdict, problems) = metadata_check(&ReportLimits::default(), &info(), &spec(&["Up", "Down"]));
        assert!(problems.is_empty(), "{problems:?}");
        assert_eq!(verdict, Ok("grid 0.1.0, 2 actions, 1 legend entries, 1 config keys".to_string()));
    }

    #[test]
    fn a_missing_file_fails_to_load_and_nothing_else_runs() {
        let report = validate(Path::new("/no/such/plugin.wasm"), &Options::default(), &mut |_| {});
        assert_eq!(report.checks.len(), 1);
        assert_eq!((report.checks[0].name, report.checks[0].status), ("load", Status::Fail));
        assert!(report.checks[0].message.contains("/no/such/plugin.wasm"), "{}", report.checks[0].message);
        assert!(!report.passed());
    }
}
