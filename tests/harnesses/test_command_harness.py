"""The ``command`` harness for agent CLIs: env, model variables, {instruction}, setup, artifacts."""

from __future__ import annotations

import re
from typing import Any

import pytest

from agent_helpers import FILE_TASKS, detail, run_dir
from conftest import write_config

RUN = ("--agentcompass=agentcompass.yaml", "-p", "no:cacheprovider")
SECRET = "tok-5d1e0c2b9a8f"
MODEL_KEY = "sk-cli-key-77aa11bb"

AGENT = (
    "printf hi > hello.txt; "
    'echo "model=$AGENTCOMPASS_MODEL url=$OPENAI_BASE_URL key=$OPENAI_API_KEY '
    'token=$MY_TOKEN task=$AGENTCOMPASS_TASK_ID"; '
    'echo "log line" > "$AGENTCOMPASS_LOGS_DIR/agent.log"; mkdir -p "$AGENTCOMPASS_LOGS_DIR/sub"; '
    'echo nested > "$AGENTCOMPASS_LOGS_DIR/sub/more.txt"; echo "instruction: $1" >&2'
)


def command_request(params: dict[str, Any], environment: dict[str, Any] | None = None) -> dict[str, Any]:
    return {
        "name": "cli",
        "benchmark": {"id": FILE_TASKS},
        "harness": {"id": "command", "params": params},
        "environment": environment or {"id": "local"},
        "model": {"id": "cli-model", "params": {"base_url": "http://127.0.0.1:9/v1", "api_key": "${MODEL_KEY}"}},
    }


@pytest.fixture(autouse=True)
def secrets(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MY_SECRET", SECRET)
    monkeypatch.setenv("MODEL_KEY", MODEL_KEY)


def full_params() -> dict[str, Any]:
    return {
        "command": ["sh", "-c", AGENT, "sh", "{instruction}"],
        "timeout": 60,
        "env": {"MY_TOKEN": "${MY_SECRET}"},
        "setup": ["mkdir -p tools && echo installed > tools/marker", ["sh", "-c", "cat tools/marker"]],
    }


#: What the agent sees of the model: the gateway's address and a token of its attempt, never the key.
GATEWAY_OUTPUT = r"model=cli-model url=http://[0-9.]+:[0-9]+/v1 key=agc-[0-9a-f]{48} token=\*\*\* task=file-0"


def check_run(pytester: pytest.Pytester, output: str = GATEWAY_OUTPUT) -> None:
    record = detail(pytester, name="cli")
    assert re.fullmatch(output, record["output"]), record["output"]
    setup = record["metadata"]["setup"]
    assert [s["exit_code"] for s in setup] == [0, 0] and setup[1]["stdout_tail"] == "installed\n"
    artifacts = record["artifacts"]
    folder = run_dir(pytester, "cli")
    assert (folder / artifacts["stdout"]).read_text().startswith("model=cli-model")
    assert (folder / artifacts["stderr"]).read_text() == "instruction: Write 'hi' into hello.txt.\n"
    logs = sorted(artifacts["logs"])
    assert logs == [f"artifacts/file-0/attempt-0/agent/logs/{name}" for name in ("agent.log", "sub/more.txt")]
    assert (folder / logs[0]).read_text() == "log line\n"
    everything = b"".join(p.read_bytes() for p in pytester.path.rglob("*") if p.is_file())
    assert SECRET.encode() not in everything and MODEL_KEY.encode() not in everything


def test_agent_cli_gets_env_model_instruction_and_setup_on_local(pytester: pytest.Pytester) -> None:
    write_config(pytester, [command_request(full_params())])
    result = pytester.runpytest(*RUN)
    result.assert_outcomes(passed=1)
    assert SECRET not in result.stdout.str() and MODEL_KEY not in result.stdout.str()
    check_run(pytester)


def test_direct_model_access_gives_the_agent_the_configured_endpoint(pytester: pytest.Pytester) -> None:
    write_config(pytester, [command_request({**full_params(), "model_access": "direct"})])
    result = pytester.runpytest(*RUN)
    result.assert_outcomes(passed=1)
    check_run(pytester, re.escape("model=cli-model url=http://127.0.0.1:9/v1 key=*** token=*** task=file-0"))


def test_failed_setup_command_is_an_inference_error(pytester: pytest.Pytester) -> None:
    params = {"command": "sh -c 'printf hi > hello.txt'", "setup": ["echo preparing", "echo broken >&2; exit 3"]}
    write_config(pytester, [command_request(params)])
    result = pytester.runpytest(*RUN)
    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines(["*inference_error*setup command 1 exited with 3: broken*"])
    assert [s["exit_code"] for s in detail(pytester, name="cli")["metadata"]["setup"]] == [0, 3]


@pytest.mark.parametrize(
    ("params", "message"),
    [
        (
            {"command": "sh -c 'echo", "timeout": 5},
            "harness.params.command: cannot split the command*No closing quotation",
        ),
        ({"command": "true", "timeout": "30"}, "harness.params.timeout: Input should be a valid number"),
        ({"command": "true", "env": {"A": 1}}, "harness.params.env.A: Input should be a valid string"),
        ({"command": "true", "setup": [[]]}, "harness.params.setup: *setup[[]0] is an empty list"),
    ],
)
def test_bad_params_are_config_errors(pytester: pytest.Pytester, params: dict[str, Any], message: str) -> None:
    write_config(pytester, [command_request(params)])
    result = pytester.runpytest(*RUN)
    assert result.ret != 0
    result.stdout.fnmatch_lines([f"*agentcompass.yaml:*: requests[[]0].{message}*"])
    assert "Traceback" not in result.stdout.str() and "INTERNALERROR" not in result.stdout.str()


def test_agent_cli_in_docker(docker_engine: str, pytester: pytest.Pytester) -> None:
    write_config(pytester, [command_request(full_params(), {"id": "docker", "params": {"image": docker_engine}})])
    result = pytester.runpytest(*RUN)
    result.assert_outcomes(passed=1)
    assert SECRET not in result.stdout.str() and MODEL_KEY not in result.stdout.str()
    check_run(pytester)


def test_what_the_command_harness_cuts_is_said(pytester: pytest.Pytester) -> None:
    # The output past the provider's output_limit, the stderr kept in the error and the tails were cut in silence.
    agent = "head -c 5000 /dev/zero | tr '\\0' o; printf 'E%.0s' $(seq 900) >&2; exit 4"
    environment = {"id": "local", "params": {"output_limit": 1000}}
    write_config(pytester, [command_request({"command": ["sh", "-c", agent]}, environment)])
    result = pytester.runpytest(*RUN)
    result.assert_outcomes(errors=1)
    record = detail(pytester, name="cli")
    assert record["output"].startswith("o" * 1000)
    assert "[... 4000 more characters of stdout not captured: the environment's output_limit ...]" in record["output"]
    assert "agent command exited with 4: [... 400 characters before ...]" in record["error"]
    facts = record["metadata"]["agent"]
    assert facts["stdout_cut"] == "4000 characters past the environment's output_limit were not captured"
    assert facts["stderr_tail"] == "E" * 900 and "stderr_cut" not in facts
