"""Three small terminal tasks for a shell agent; each is checked by a shell verifier.

Every task writes its starting files into the task Environment, and the
verifier runs in that same Environment after the agent (``reuse``). The
commands only need a POSIX shell and coreutils (busybox is enough), so the
tasks run on ``local`` and on ``docker``.
"""

from __future__ import annotations

from dataclasses import dataclass

from pytest_agentcompass import (
    BaseBenchmark,
    EnvironmentSession,
    ExecutionPlan,
    PreparedTask,
    RunRequest,
    RunResult,
    TaskSpec,
    apply_verifier_result,
)


@dataclass(frozen=True)
class TerminalTask:
    task_id: str
    instruction: str
    files: dict[str, str]
    verifier: str  # a shell script: exit 0 = solved


LOG = "".join(f"{i:03d} {'ERROR disk full' if i % 7 == 0 else 'INFO ok'}\n" for i in range(1, 61))

TASKS = [
    TerminalTask(
        "greeting",
        "Create a file named greeting.txt in the current directory containing exactly the line: hello, world",
        {},
        '[ "$(cat greeting.txt)" = "hello, world" ]',
    ),
    TerminalTask(
        "count-errors",
        "The file server.log holds one event per line. Write the number of lines that contain ERROR "
        "into a file named answer.txt (just the number).",
        {"server.log": LOG},
        '[ "$(tr -d " \\n" < answer.txt)" = "8" ]',
    ),
    TerminalTask(
        "fix-script",
        "The script add.sh should print the sum of its two arguments, but `sh add.sh 3 4` prints the wrong "
        "number. Fix add.sh.",
        {"add.sh": "echo $(( $1 - $2 ))\n"},
        '[ "$(sh add.sh 3 4)" = "7" ] && [ "$(sh add.sh 10 -2)" = "8" ]',
    ),
]


class TerminalTasks(BaseBenchmark):
    evaluation_environment_mode = "reuse"

    def load_tasks(self, req: RunRequest) -> list[TaskSpec]:
        return [TaskSpec(t.task_id, question=t.instruction, category="terminal") for t in TASKS]

    async def prepare_task(
        self, task: TaskSpec, env: EnvironmentSession, req: RunRequest, benchmark_plan: object
    ) -> PreparedTask:
        spec = next(t for t in TASKS if t.task_id == task.task_id)
        for name, text in spec.files.items():
            await env.write_text(name, text)
        return PreparedTask(task.task_id, prompt=spec.instruction)

    async def evaluate(
        self,
        task: TaskSpec,
        prepared: PreparedTask,
        result: RunResult,
        req: RunRequest,
        plan: ExecutionPlan,
        env: EnvironmentSession | None = None,
    ) -> RunResult:
        assert env is not None
        spec = next(t for t in TASKS if t.task_id == task.task_id)
        verdict = await env.exec(["sh", "-c", spec.verifier], timeout=30)
        return apply_verifier_result(result, verdict)
