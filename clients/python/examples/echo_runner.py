"""A Switchyard runner with one handler: `echo` returns its payload.

    python examples/echo_runner.py   # SWITCHYARD_SERVER=127.0.0.1:50051, SWITCHYARD_AGENT_DIR=.
"""

from switchyard_runner import Runner, RunnerConfig, TaskContext

runner = Runner(RunnerConfig.from_env())


@runner.handler("echo")
async def echo(task: TaskContext) -> dict:
    task.progress(50, "echoing")
    return {"echo": task.payload}


if __name__ == "__main__":
    runner.run_forever()  # drains on SIGTERM, then exits 0
