"""`ragen_envs.validate`: the conformance suite `ragen-host validate` runs,
with its report as dicts."""

import ragen_envs

CHECKS = ["load", "metadata", "determinism", "seeds differ", "finite", "bad config", "bad action", "episode rules", "batch", "oracle", "speed"]


def test_a_shipped_plugin_passes_every_check(plugin):
    report = ragen_envs.validate(plugin("bandit"))
    assert report["passed"], report
    assert [c["name"] for c in report["checks"]] == CHECKS
    assert all(c["status"] == "pass" for c in report["checks"]), report["checks"]
    assert report["problems"] == []


def test_settings_reach_the_plugin(plugin):
    report = ragen_envs.validate(plugin("bandit"), seeds=4, ragen_no_such_key=1)
    metadata = report["checks"][1]
    assert metadata["name"] == "metadata" and metadata["status"] == "fail", report
    assert "create with the given settings failed" in metadata["message"], metadata


def test_a_spec_error_and_a_warning_are_named_with_their_rule(test_plugin):
    refused = ragen_envs.validate(test_plugin("empty-actions"))
    assert not refused["passed"]
    assert {"severity": "error", "rule": "empty-action-list"} == {k: refused["problems"][0][k] for k in ("severity", "rule")}
    assert "the host refuses to load it" in refused["checks"][1]["message"]

    warned = ragen_envs.validate(test_plugin("escape-codes"))
    assert not warned["passed"]
    assert [c["name"] for c in warned["checks"]] == ["load", "metadata"], "a plugin with spec problems is not played"
    rules = {(p["severity"], p["rule"]) for p in warned["problems"]}
    assert rules == {("warning", "control-characters")}, warned["problems"]
    assert all("\x1b" not in p["message"] for p in warned["problems"]), "plugin text is escaped"


def test_a_missing_file_fails_to_load(tmp_path):
    report = ragen_envs.validate(tmp_path / "missing.wasm")
    assert not report["passed"]
    assert [(c["name"], c["status"]) for c in report["checks"]] == [("load", "fail")]
    assert "missing.wasm" in report["checks"][0]["message"]
