"""The Python runner with one handler, ``conformance.output``, that writes the steps its task's
payload carries (``tests/conformance/output.json``) the way Python programs write: ``print`` to
``sys.stdout`` and ``sys.stderr``, and ``ctx.log``; then fails if the payload says so.

``python output_runner.py SERVER AGENT_DIR NAME``; stops on SIGTERM.
"""

import sys

from switchyard_runner import Runner, TaskContext, TaskFailure

server, directory, name = sys.argv[1:4]
runner = Runner(server=server, directory=directory, name=name, capacity=1)


@runner.handler("conformance.output")
async def replay(task: TaskContext) -> dict:
    for step in task.payload["steps"]:
        if step["stream"] == "stdout":
            print(step["text"], end="")
        elif step["stream"] == "stderr":
            print(step["text"], end="", file=sys.stderr)
        else:
            task.log(step["text"])
    if task.payload.get("fail"):
        raise TaskFailure("the scenario fails", code="scenario")
    return {}


runner.run_forever()
