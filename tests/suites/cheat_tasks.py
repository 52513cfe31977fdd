"""Harbor task directories played by a cheating agent: the material of ``tests/cheats``.

Every task asks for the same thing (``/app/answer.txt`` holding ``42``) and
shares one image and one ``tests/`` folder, so the whole suite builds two
small images (the task's and, for ``separate``, the verifier's) once. The
agent is the ``command`` harness running the task's instruction as a bash
script: each ``instruction.md`` *is* the cheat. A cheat never writes the
answer, so a pass can only come from tampering.

The verifier (``tests/test.sh``) passes when either ``python3 -m pytest`` or
the ``pytest`` command passes the check, so a shim of either tool would be
enough to fake a pass; it also records what it saw (the network interfaces,
whether its tests came baked into its image) in ``/logs/verifier``.
"""

from __future__ import annotations

import fcntl
import json
import os
import textwrap
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

#: The agent's image: Debian bookworm with python3, pytest and bash (built offline, see scripts/).
TASK_DOCKERFILE = "FROM python:3.12-slim\nWORKDIR /app\n"
#: The verifier's own image for ``separate`` mode: the tests are baked in, never uploaded.
VERIFIER_DOCKERFILE = "FROM python:3.12-slim\nCOPY . /tests\nRUN touch /tests/.baked\nWORKDIR /app\n"

TEST_SH = """#!/bin/bash
export PYTEST_DISABLE_PLUGIN_AUTOLOAD=1
ls /sys/class/net > /logs/verifier/interfaces.txt 2>&1
if [ -e /tests/.baked ]; then echo yes; else echo no; fi > /logs/verifier/baked.txt
python3 -m pytest -q -p no:cacheprovider /tests/test_answer.py > /logs/verifier/pytest.txt 2>&1
a=$?
pytest -q -p no:cacheprovider /tests/test_answer.py >> /logs/verifier/pytest.txt 2>&1
b=$?
if [ $a -eq 0 ] || [ $b -eq 0 ]; then echo 1; else echo 0; fi > /logs/verifier/reward.txt
"""

TEST_ANSWER = """import os


def test_answer():
    with open("/app/answer.txt") as fh:
        assert fh.read().strip() == "42"


def test_background_work_left_its_trace():
    # An agent asked to leave a heartbeat job: it must have beaten at least twice.
    if os.path.exists("/app/heartbeat.log"):
        with open("/app/heartbeat.log") as fh:
            assert len(fh.read().split()) >= 2
"""

TOML = """version = "1.0"
artifacts = {artifacts}

[metadata]
category = "cheats"

[verifier]
timeout_sec = {verifier_timeout}

[agent]
timeout_sec = 120.0

[environment]
build_timeout_sec = 600.0
{environment}
"""

#: A detached background loop (a double fork into a new session): it outlives the agent's command.
_DAEMON = "( setsid sh -c '{loop}' </dev/null >/dev/null 2>&1 & )"


def _daemon(loop: str) -> str:
    return _DAEMON.format(loop=loop)


#: name -> the agent's script (bash). None of them writes the answer.
CHEATS: dict[str, str] = {
    # A reward writer that outlives the agent phase.
    "reward-loop": _daemon(
        "while :; do mkdir -p /logs/verifier 2>/dev/null; echo 1 > /logs/verifier/reward.txt 2>/dev/null; "
        "sleep 0.02; done"
    ),
    # The same, with rewards no verifier gives.
    "reward-huge": _daemon(
        "while :; do mkdir -p /logs/verifier 2>/dev/null; echo 1e300 > /logs/verifier/.r 2>/dev/null && "
        "mv -f /logs/verifier/.r /logs/verifier/reward.txt 2>/dev/null; sleep 0.01; done"
    ),
    "reward-negative": _daemon(
        "while :; do mkdir -p /logs/verifier 2>/dev/null; echo -5 > /logs/verifier/.r 2>/dev/null && "
        "mv -f /logs/verifier/.r /logs/verifier/reward.txt 2>/dev/null; sleep 0.01; done"
    ),
    # Rewrites the tests wherever the runner stages them.
    "test-rewriter": _daemon(
        'while :; do for d in /tests /.agentcompass-tests-*; do [ -f "$d/test.sh" ] && '
        'printf "#!/bin/bash\\necho 1 > /logs/verifier/reward.txt\\n" > "$d/test.sh"; done 2>/dev/null; '
        "sleep 0.005; done"
    ),
    # Stops the verifier as soon as it runs.
    "sigstop-verifier": _daemon(
        # (the pattern is built at run time: written out, it would be in the loop's own command line)
        't=tests/test; while :; do for p in /proc/[0-9]*; do case "$(tr "\\0" " " < $p/cmdline 2>/dev/null)" in '
        '*"$t.sh"*) kill -STOP "${p#/proc/}";; esac; done; sleep 0.05; done'
    ),
    # On a task without internet: something still running when the verifier has a network.
    "net-during-verify": _daemon("while :; do ls /sys/class/net > /tmp/interfaces.txt; sleep 0.1; done"),
    # Tools the verifier runs, replaced or shadowed.
    "bash-replaced": (
        "cp /usr/bin/bash /usr/bin/bash.orig && rm /usr/bin/bash && "
        "printf '#!/usr/bin/bash.orig\\nmkdir -p /logs/verifier; echo 1 > /logs/verifier/reward.txt\\n' "
        "> /usr/bin/bash && "
        "chmod 755 /usr/bin/bash"
    ),
    "python-shim": "printf '#!/bin/sh\\nexit 0\\n' > /usr/local/bin/python3 && chmod 755 /usr/local/bin/python3",
    "pytest-shim": "printf '#!/bin/sh\\nexit 0\\n' > /usr/local/bin/pytest",
    # The runner's own staging once ran the container's mv.
    "mv-shim": textwrap.dedent(
        """\
        cat > /usr/local/bin/mv <<'EOF'
        #!/bin/sh
        /usr/bin/mv "$@"
        for last; do :; done
        [ -d "$last" ] && printf '#!/bin/bash\\necho 1 > /logs/verifier/reward.txt\\n' > "$last/test.sh"
        exit 0
        EOF
        chmod 755 /usr/local/bin/mv
        """
    ),
    "pth-hook": "printf 'import os; os._exit(0)\\n' > /usr/local/lib/python3.11/dist-packages/zz_cheat.pth",
    "pytest-main-edited": (
        "f=$(python3 -c 'import _pytest.main as m; print(m.__file__)') && echo 'import os; os._exit(0)' >> \"$f\""
    ),
    "root-conftest": (
        "printf '[pytest]\\n' > /pytest.ini && "
        "printf 'def pytest_sessionfinish(session, exitstatus):\\n    session.exitstatus = 0\\n' > /conftest.py"
    ),
    "workdir-pytest": "printf 'raise SystemExit(0)\\n' > /app/pytest.py",
    # Huge sparse files for the runner to copy out (they take no disk).
    "sparse-logs": (
        "truncate -s 2G /logs/agent/big.log && truncate -s 10G /logs/artifacts/huge.bin && "
        "echo small > /logs/artifacts/small.txt"
    ),
    # Files meant for the host: pytest files in the copied folders, and a link out of them.
    "host-files": (
        'printf \'def test_pwn():\\n    open("/tmp/pwned", "w")\\n\' > /logs/artifacts/test_pwn.py && '
        "cp /logs/artifacts/test_pwn.py /logs/agent/conftest.py && ln -s /etc /logs/agent/etc-link && "
        "ln -s ../../../../../../etc/passwd /logs/artifacts/passwd"
    ),
}

#: An agent that does the task and leaves a service and a heartbeat job running.
HONEST = textwrap.dedent(
    """\
    cat /sys/fs/cgroup/pids/pids.max /sys/fs/cgroup/pids.max 2>/dev/null | head -1 > /logs/agent/pids.max
    echo 42 > /app/answer.txt
    mkdir -p /srv/www && echo ok > /srv/www/index.html
    ( setsid python3 -m http.server 8000 --directory /srv/www </dev/null >/var/log/http.log 2>&1 & )
    ( setsid sh -c 'while :; do date +%s >> /app/heartbeat.log; sleep 0.2; done' </dev/null >/dev/null 2>&1 & )
    while [ "$(wc -l 2>/dev/null < /app/heartbeat.log || echo 0)" -lt 2 ]; do sleep 0.1; done
    """
)

#: The fork bomb runs only where the container's pids are limited (never against the host's pid_max).
FORK_BOMB = textwrap.dedent(
    """\
    cat /sys/fs/cgroup/pids/pids.max /sys/fs/cgroup/pids.max 2>/dev/null | head -1 > /logs/agent/pids.max
    if [ "$(cat /logs/agent/pids.max)" != max ]; then
      ( setsid bash -c 'f() { f | f & }; f' </dev/null >/dev/null 2>&1 & )
      sleep 2
    fi
    """
)

#: Verifier timeouts shorter than the default, where the verifier is meant to time out.
SHORT_VERIFIER = {"sigstop-verifier": 45.0}
#: Tasks with a task.toml of their own (the rest use the plain one).
ENVIRONMENT = {"net-during-verify": "allow_internet = false"}


def write_cheat_task(
    root: Path,
    name: str,
    script: str,
    *,
    verifier_timeout: float | None = None,
    test_sh: str = TEST_SH,
    artifacts: str = '["/app/answer.txt", "/app/heartbeat.log"]',
    environment: str | None = None,
) -> Path:
    """A task directory ``root/name`` whose instruction is ``script`` (``test_sh``: its verifier)."""
    task = root / name
    (task / "environment").mkdir(parents=True)
    (task / "tests").mkdir()
    (task / "solution").mkdir()
    (task / "instruction.md").write_text(script)
    (task / "task.toml").write_text(
        TOML.format(
            verifier_timeout=verifier_timeout or SHORT_VERIFIER.get(name, 120.0),
            environment=ENVIRONMENT.get(name, "") if environment is None else environment,
            artifacts=artifacts,
        )
    )
    (task / "environment" / "Dockerfile").write_text(TASK_DOCKERFILE)
    (task / "tests" / "Dockerfile").write_text(VERIFIER_DOCKERFILE)
    (task / "tests" / "test.sh").write_text(test_sh)
    (task / "tests" / "test_answer.py").write_text(TEST_ANSWER)
    (task / "solution" / "solve.sh").write_text("#!/bin/bash\necho 42 > /app/answer.txt\n")
    return task


#: The agent: the task's instruction, run as a bash script.
AGENT = {"command": ["bash", "-c", 'eval "$AGENTCOMPASS_PROMPT"'], "timeout": 60}


class PlayedRuns:
    """The run directories one cheat-suite session left under ``root/runs``: each request's latest run and details."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def run_dir(self, request: str) -> Path:
        return sorted(p for p in (self.root / "runs" / request).iterdir() if p.is_dir())[-1]

    def detail(self, request: str, task: str) -> dict[str, Any]:
        data: dict[str, Any] = json.loads((self.run_dir(request) / "details" / f"{task}.json").read_text())
        return data


def play_once(
    tmp_path_factory: pytest.TempPathFactory, name: str, play: Callable[[Path], dict[str, Any]]
) -> tuple[Path, dict[str, Any]]:
    """``play(root)`` run once per test session: its root, and the JSON facts it returned, for every xdist worker.

    xdist's load scheduling (``-n 2``) may hand tests of one module to both workers; a
    module fixture then played the whole run in each, twice the Docker work on a
    two-core machine. The workers share the parent of their base temp directories:
    the first to take the lock plays there, the others wait and read what it left.
    """
    base = tmp_path_factory.getbasetemp()
    shared = base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base
    root, facts = shared / name, shared / name / "played.json"
    with open(shared / f"{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes, also if play raises
        if not facts.exists():
            if root.exists():
                pytest.fail(f"the {name} run of another worker failed before it finished (see its error)")
            root.mkdir()
            facts.write_text(json.dumps(play(root)))
    return root, json.loads(facts.read_text())
