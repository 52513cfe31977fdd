"""Config loading: every problem named with its file, line and YAML path."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pytest_agentcompass import ConfigError, load_config

from conftest import tracing_request, write_config

GOOD = """\
requests:
  - name: a
    benchmark: {id: "x.py:B"}
"""


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "c.yaml"
    path.write_text(text)
    return path


def test_defaults(tmp_path: Path) -> None:
    loaded = load_config(write(tmp_path, GOOD))
    req = loaded.orchestration.requests[0]
    assert loaded.orchestration.task_concurrency == 8
    assert req.harness.id == "none"
    assert req.environment.id == "local"
    assert req.execution.attempts.k == 1
    assert req.execution.retry_pattern_list is None


def test_unknown_key_names_path_and_line(tmp_path: Path) -> None:
    path = write(tmp_path, GOOD + "    execution:\n      max_retires: 3\n")
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert f"{path}:5: requests[0].execution.max_retires: unknown key" in str(info.value)


def test_bad_type_names_path_and_line(tmp_path: Path) -> None:
    text = GOOD + "  - name: b\n    benchmark: {id: y}\n    execution:\n      max_retries: lots\n"
    path = write(tmp_path, text)
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert f"{path}:7: requests[1].execution.max_retries: Input should be a valid integer" in str(info.value)


def test_missing_required_key_points_at_parent(tmp_path: Path) -> None:
    path = write(tmp_path, "requests:\n  - name: a\n")
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert f"{path}:2: requests[0].benchmark: Field required" in str(info.value)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("requests: []\n", "requests: List should have at least 1 item"),
        (
            GOOD + "  - name: a\n    benchmark: {id: y}\n",
            "c.yaml:4: requests[1].name: duplicate request name 'a' (first on line 2)",
        ),
        ("requests:\n  - name: 'bad name'\n    benchmark: {id: y}\n", "request name 'bad name' must start"),
        (GOOD + "    execution: {retry_pattern_list: ['(']}\n", "invalid regular expression '('"),
        (GOOD + "    environment: {evaluation_environment_mode: x}\n", "Input should be 'none', 'reuse' or 'fresh'"),
        (GOOD + "    environment: {capacity: -1}\n", "greater than or equal to 0"),
        (
            GOOD + "    execution: {pass_threshold: .nan}\n",
            "c.yaml:4: requests[0].execution.pass_threshold: Input should be a finite number",
        ),
        (
            GOOD + "    execution: {max_stored_chars: 10}\n",
            "max_stored_chars: Input should be greater than or equal to 100",
        ),
        ("- just a list\n", "must be a mapping"),
        ("requests: [\n", "c.yaml:2: invalid YAML at column 1: expected the node content, but found '<stream end>'"),
        (
            "requests:\n  - name: a: b\n",
            "c.yaml:2: invalid YAML at column 12: mapping values are not allowed here",
        ),
        (
            "requests:\n  - name: a\n  benchmark: {id: y}\n",
            "c.yaml:3: invalid YAML at column 3: expected <block end>, but found '?' (while parsing a block "
            "collection that starts on line 2)",
        ),
        # A control character (pasted from a terminal): its line, not its offset in the file.
        ("requests:\n  - name: a\x07b\n", "c.yaml:2: invalid YAML at column 12: character 0x0007 is not allowed"),
        # A BOM is no column, as in an editor.
        ("\ufeffreq\x01uests:\n", "c.yaml:1: invalid YAML at column 4: character 0x0001 is not allowed"),
        (
            GOOD + "    execution: {retry_backoff_seconds: .inf}\n",
            "retry_backoff_seconds: Input should be a finite number",
        ),
    ],
)
def test_problems_are_reported(tmp_path: Path, text: str, message: str) -> None:
    with pytest.raises(ConfigError, match=None) as info:
        load_config(write(tmp_path, text))
    assert message in str(info.value)


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"cannot read agentcompass config .*nope\.yaml"):
        load_config(tmp_path / "nope.yaml")


def test_a_file_that_is_not_utf8_names_its_line(tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    path.write_bytes(GOOD.encode() + b"    mode: caf\xe9\n")
    with pytest.raises(ConfigError, match=r"c\.yaml:4: not UTF-8 text \(byte 0xe9\); save it as UTF-8"):
        load_config(path)


def test_env_vars_expand_and_missing_ones_are_named(tmp_path: Path) -> None:
    text = GOOD + "    model: {id: gpt, params: {api_key: '${KEY}', base_url: 'http://${HOST}/v1'}}\n"
    loaded = load_config(write(tmp_path, text), environ={"KEY": "sk-secret-123", "HOST": "localhost"})
    params = loaded.orchestration.requests[0].model.params  # type: ignore[union-attr]
    assert params == {"api_key": "sk-secret-123", "base_url": "http://localhost/v1"}
    assert "sk-secret-123" not in json.dumps(loaded.redacted_dump())
    with pytest.raises(ConfigError, match=r"c.yaml:4: requests\[0\].model.params.api_key: environment variable KEY"):
        load_config(write(tmp_path, text), environ={"HOST": "h"})


def test_variable_defaults_apply_when_unset_and_are_no_secret(tmp_path: Path) -> None:
    text = (
        'output_dir: "${UNSET_OUT:-runs-default}"\n'
        + GOOD
        + "    model: {id: m, params: {api_key: '${KEY:-none}', base_url: 'http://${HOST:-localhost:8000}/v1'}}\n"
    )
    loaded = load_config(write(tmp_path, text), environ={"KEY": "sk-from-the-environment"})
    assert loaded.orchestration.output_dir == "runs-default"
    assert loaded.output_root == tmp_path / "runs-default"
    params = loaded.orchestration.requests[0].model.params  # type: ignore[union-attr]
    assert params == {"api_key": "sk-from-the-environment", "base_url": "http://localhost:8000/v1"}
    dump = loaded.redacted_dump()
    # What the environment gave is a secret; what the file says is not.
    assert dump["requests"][0]["model"]["params"] == {"api_key": "***", "base_url": "http://localhost:8000/v1"}
    assert dump["output_dir"] == "runs-default" and loaded.secrets == {"sk-from-the-environment"}
    # Set, even to "", the variable wins over its default (as in Harbor's task files).
    empty = load_config(write(tmp_path, text), environ={"UNSET_OUT": "", "KEY": "k"})
    assert empty.orchestration.output_dir == ""


def test_only_credentials_from_variables_are_secrets(tmp_path: Path) -> None:
    # Every ${VAR} was a secret: a mode or a model name of 8+ characters became *** in the
    # request's name, in every plan and anywhere the word appeared, and the records no longer said
    # which mode or model ran.
    text = """\
requests:
  - name: "${MODE}"
    benchmark: {id: "x.py:B", params: {verifier_mode: "${MODE}", data_token: "${DATA}"}}
    model:
      id: "${OPENAI_MODEL}"
      params: {api_key: "${FAKE}", base_url: "${PROXY}", headers: {X-Team: "${TEAM}"}}
"""
    environ = {
        "MODE": "snapshot",
        "OPENAI_MODEL": "gpt-4o-mini-2024",
        "FAKE": "plain-looking-value-1",
        "PROXY": "https://bob:hunter22@proxy.example/v1",
        "TEAM": "research-team",
        "DATA": "abcdefgh-1234",
        "UNUSED_API_KEY": "never-read-1234",
    }
    loaded = load_config(write(tmp_path, text), environ=environ)
    dump = loaded.redacted_dump()
    request = dump["requests"][0]
    assert request["name"] == "snapshot" and request["benchmark"]["params"]["verifier_mode"] == "snapshot"
    assert request["model"]["id"] == "gpt-4o-mini-2024"
    # Named like a credential (the key it fills, or the variable), sent as a header, a URL with a password:
    assert request["model"]["params"] == {"api_key": "***", "base_url": "***", "headers": {"X-Team": "***"}}
    assert request["benchmark"]["params"]["data_token"] == "***"
    assert loaded.secrets == {
        "plain-looking-value-1",
        "https://bob:hunter22@proxy.example/v1",
        "research-team",
        "abcdefgh-1234",
    }


def test_a_wrong_value_is_echoed_unless_a_secret_gave_it(tmp_path: Path) -> None:
    text = GOOD + (
        "    environment: {evaluation_environment_mode: nonee}\n"
        "    execution: {details_layout: jurnal, max_retries: '${TOKEN}', pass_threshold: '${LEVEL}'}\n"
        "    model: {id: m, params: {max_connections: '${TOKEN}', timeout: '${LEVEL}'}}\n"
    )
    path = write(tmp_path, text)
    with pytest.raises(ConfigError) as info:
        load_config(path, environ={"TOKEN": "sk-do-not-print-me-0123456789", "LEVEL": "high"})
    assert sorted(str(info.value).splitlines()) == sorted(
        [
            "invalid agentcompass config:",
            f"{path}:4: requests[0].environment.evaluation_environment_mode: "
            "Input should be 'none', 'reuse' or 'fresh', got 'nonee'",
            f"{path}:5: requests[0].execution.details_layout: Input should be 'files' or 'journal', got 'jurnal'",
            f"{path}:5: requests[0].execution.max_retries: Input should be a valid integer, "
            "unable to parse string as an integer",
            f"{path}:5: requests[0].execution.pass_threshold: Input should be a valid number, "
            "unable to parse string as a number, got 'high'",
        ]
    )
    fixed = text.replace("nonee", "none").replace("jurnal", "journal").replace("'${TOKEN}', pass", "2, pass")
    fixed = fixed.replace("pass_threshold: '${LEVEL}'", "pass_threshold: 0.5")
    with pytest.raises(ConfigError) as info:
        load_config(write(tmp_path, fixed), environ={"TOKEN": "sk-do-not-print-me-0123456789", "LEVEL": "high"})
    assert "sk-do-not-print-me" not in str(info.value)
    assert "requests[0].model.params.max_connections: Input should be a valid integer" in str(info.value)
    assert (
        "requests[0].model.params.timeout: Input should be a valid number, "
        "unable to parse string as a number, got 'high'" in str(info.value)
    )


def test_a_wrong_value_where_a_credential_goes_is_not_echoed(tmp_path: Path) -> None:
    # Typed straight into the file, not from a variable: still where a key goes, so not printed.
    path = write(tmp_path, GOOD + "    model: {id: m, params: {api_key: 987654321, timeout: soon}}\n")
    with pytest.raises(ConfigError) as info:
        load_config(path)
    said = str(info.value)
    assert "requests[0].model.params.api_key: Input should be a valid string" in said
    assert "987654321" not in said
    assert "timeout: Input should be a valid number, unable to parse string as a number, got 'soon'" in said


def test_an_unset_variable_without_default_names_its_line(tmp_path: Path) -> None:
    text = GOOD + "    carry_over: '${RUN_TO_CARRY_OVER}'\n    harness: {id: '${HARNESS:-none}'}\n"
    path = write(tmp_path, text)
    with pytest.raises(ConfigError) as info:
        load_config(path, environ={})
    assert str(info.value) == f"{path}:4: requests[0].carry_over: environment variable RUN_TO_CARRY_OVER is not set"


def test_a_typo_in_model_params_is_a_config_error(tmp_path: Path) -> None:
    text = GOOD + "    model:\n      id: m\n      params:\n        temprature: 0\n        max_connections: -2\n"
    path = write(tmp_path, text)
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert str(info.value).splitlines() == [
        "invalid agentcompass config:",
        f"{path}:7: requests[0].model.params.temprature: unknown key",
        f"{path}:8: requests[0].model.params.max_connections: Input should be greater than or equal to 0, got -2",
    ]


def test_a_typo_in_model_params_stops_pytest_before_anything_runs(pytester: pytest.Pytester, trace: Path) -> None:
    request = tracing_request("r", trace, n=1)
    request["model"] = {"id": "m", "params": {"api_key": "k", "temprature": 0}}
    write_config(pytester, [request])
    result = pytester.runpytest("--agentcompass=agentcompass.yaml")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*agentcompass.yaml:*: requests[[]0[]].model.params.temprature: unknown key"])
    assert not (pytester.path / "runs").exists() and not trace.exists()


def test_model_params_of_the_gateway_load_and_a_typo_among_them_is_named(tmp_path: Path) -> None:
    params = "        anthropic_base_url: http://127.0.0.1:9\n        max_total_tokens: 1000\n"
    loaded = load_config(write(tmp_path, GOOD + "    model:\n      id: m\n      params:\n" + params))
    assert loaded.orchestration.requests[0].model.params["max_total_tokens"] == 1000  # type: ignore[union-attr]
    path = write(tmp_path, GOOD + "    model:\n      id: m\n      params:\n" + params + "        max_cots: 1\n")
    with pytest.raises(ConfigError, match=rf"{path}:9: requests\[0\].model.params.max_cots: unknown key"):
        load_config(path)


def test_model_params_the_harness_does_not_read_are_named_when_the_request_is_built(
    pytester: pytest.Pytester, trace: Path
) -> None:
    """A key only the gateway reads, given to a harness that calls the model itself: named with
    file and line when the request is built, before any run directory exists."""
    request = tracing_request("r", trace, n=1)
    request["harness"] = {"id": "openai"}
    request["benchmark"]["id"] = request["benchmark"]["id"].replace("TracingBenchmark", "TracingHarnessBenchmark")
    request["model"] = {"id": "m", "params": {"api_key": "k", "max_total_tokens": 10}}
    write_config(pytester, [request])
    result = pytester.runpytest("--agentcompass=agentcompass.yaml")
    assert result.ret != pytest.ExitCode.OK
    result.stdout.fnmatch_lines(["*agentcompass.yaml:*: requests[[]0[]].model.params.max_total_tokens: unknown key*"])
    assert "Traceback" not in result.stdout.str()
    assert not (pytester.path / "runs").exists()


def test_usage_error_in_pytest(pytester: pytest.Pytester) -> None:
    (pytester.path / "agentcompass.yaml").write_text("requests:\n  - name: a\n    benchmark: {id: x}\n    bogus: 1\n")
    result = pytester.runpytest("--agentcompass=agentcompass.yaml")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*agentcompass.yaml:4: requests[[]0[]].bogus: unknown key*"])
    assert "Traceback" not in result.stderr.str() + result.stdout.str()


def test_secrets_never_reach_the_run_directory(
    pytester: pytest.Pytester, trace: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AGENT_KEY", "sk-live-abcdef")
    request = tracing_request("s", trace, n=2)
    request["model"] = {"id": "m", "params": {"api_key": "${AGENT_KEY}"}}
    write_config(pytester, [request])
    pytester.runpytest("--agentcompass=agentcompass.yaml").assert_outcomes(passed=2)
    written = [p for p in (pytester.path / "runs").rglob("*") if p.is_file()]
    assert written
    for path in written:
        assert "sk-live-abcdef" not in path.read_text(), path


def test_a_short_secret_is_masked_whole_not_inside_ids(
    pytester: pytest.Pytester, trace: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FLAG", "1")
    request = tracing_request("r1", trace, n=3, wrong=["t1"])
    request["model"] = {"id": "m", "params": {"headers": {"X-Verbose": "${FLAG}", "X-Level": "level ${FLAG}"}}}
    request["judge"] = {"id": "j", "params": {"flag": "${FLAG}"}}
    write_config(pytester, [request])
    pytester.runpytest("--agentcompass=agentcompass.yaml", "-x", "--agentcompass-concurrency=1")
    (run_dir,) = (pytester.path / "runs/r1").iterdir()
    assert "***" not in run_dir.name
    info = json.loads((run_dir / "run_info.json").read_text())
    params = info["config"]["requests"][0]["model"]["params"]
    assert params == {"headers": {"X-Verbose": "***", "X-Level": "***"}}  # the fields it was expanded into
    assert "***" not in info["fingerprint"] and info["run_id"] == run_dir.name
    assert json.loads((run_dir / "details/t1.json").read_text())["judge"]["params"] == {"flag": "***"}
    assert json.loads((run_dir / "details/t1.json").read_text())["task_id"] == "t1"
    # The interrupted run (-x) resumes: ids and fingerprint were written intact.
    result = pytester.runpytest("--agentcompass=agentcompass.yaml")
    result.assert_outcomes(passed=2, failed=1)
    assert [p.name for p in (pytester.path / "runs/r1").iterdir()] == [run_dir.name]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert "pass@1" in summary["metrics"] and summary["request"] == "r1"


@pytest.mark.parametrize(
    ("value", "message"),
    [("0", "must be at least 1, got 0"), ("-3", "must be at least 1, got -3"), ("two", "'two' is not a whole number")],
)
def test_the_concurrency_option_is_checked_like_the_config(
    pytester: pytest.Pytester, trace: Path, value: str, message: str
) -> None:
    # -1 waited forever with no output; 0 was taken for "not given" and ignored.
    write_config(pytester, [tracing_request("r", trace, n=2)])
    option = f"--agentcompass-concurrency={value}"
    result = pytester.runpytest_subprocess("--agentcompass=agentcompass.yaml", option, timeout=30)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([f"*argument --agentcompass-concurrency: {message}"])
    assert not trace.exists()  # nothing ran


@pytest.mark.parametrize("url", ["localhost:8000/v1", "ftp://host/v1", "http://"])
def test_a_model_base_url_that_is_no_http_url_is_a_config_error(tmp_path: Path, url: str) -> None:
    # Was accepted, then every model call failed "cannot reach" it.
    path = write(tmp_path, GOOD + f"    model:\n      id: m\n      params:\n        base_url: '{url}'\n")
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert f"{path}:7: requests[0].model.params.base_url: " in str(info.value)
    assert "is not an http:// or https:// URL" in str(info.value)


def test_a_required_variable_says_its_message_and_a_doubled_dollar_is_literal(tmp_path: Path) -> None:
    # ${X:?message} and $${...} were kept as they were written (a folder named "${X:?...}").
    text = GOOD + "    carry_over: '${RUN_TO_CARRY_OVER:?name the run to carry over}'\n"
    path = write(tmp_path, text)
    with pytest.raises(ConfigError) as info:
        load_config(path, environ={})
    assert str(info.value) == (
        f"{path}:4: requests[0].carry_over: environment variable RUN_TO_CARRY_OVER "
        "(name the run to carry over) is not set"
    )
    given = load_config(path, environ={"RUN_TO_CARRY_OVER": "latest"})
    assert given.orchestration.requests[0].carry_over == "latest"
    literal = write(tmp_path, "output_dir: 'runs-$${HOME}'\n" + GOOD)
    assert load_config(literal, environ={"HOME": "/root"}).orchestration.output_dir == "runs-${HOME}"


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("[transient]", "['transient'] is a list of one pattern (errors whose text matches 'transient'); the policy"),
        ("{transient: true}", "{'transient': True} is not a retry policy: use null (any error retries), a list"),
        ("true", "True is not a retry policy: use null"),
    ],
)
def test_a_retry_policy_in_the_wrong_shape_says_what_is_allowed(tmp_path: Path, value: str, message: str) -> None:
    # [transient] retried only errors saying "transient"; a mapping gave two lines about union members.
    path = write(tmp_path, GOOD + f"    execution:\n      retry_pattern_list: {value}\n")
    with pytest.raises(ConfigError) as info:
        load_config(path)
    lines = str(info.value).splitlines()
    assert len(lines) == 2 and lines[1].startswith(f"{path}:5: requests[0].execution.retry_pattern_list: "), lines
    assert message in lines[1]


def test_a_config_whose_aliases_explode_is_refused(tmp_path: Path) -> None:
    # Nine nested aliases of nine: a billion values from a few hundred bytes. Loading hung.
    levels = ['a: &a ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]']
    for prev, name in zip("abcdefgh", "bcdefghi", strict=True):
        levels.append(f"{name}: &{name} [{', '.join([f'*{prev}'] * 9)}]")
    path = write(tmp_path, "\n".join(levels) + "\n" + GOOD)
    with pytest.raises(ConfigError, match=r"c\.yaml:\d+: its YAML aliases expand to more than 200,000 values"):
        load_config(path)


def test_a_config_alias_into_itself_or_nested_past_reading_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"c\.yaml:1: a YAML alias refers to a value that holds it"):
        load_config(write(tmp_path, "a: &a [1, *a]\n" + GOOD))
    with pytest.raises(ConfigError, match=r"c\.yaml: invalid YAML: nested too deeply to read"):
        load_config(write(tmp_path, "requests: " + "[" * 100_000))
