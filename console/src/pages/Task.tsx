// One task: its state, attempts and leases as a timeline (its history,
// replayed and then live), what matching says about it, and its output as
// the runners send it — all through one WatchTask with output — and cancel.
import { useEffect, useState } from "react";
import { toJson } from "@bufbuild/protobuf";

import {
  describe,
  stateName,
  tasks,
  when,
  OutputStream,
  TaskState,
  TaskErrorSchema,
  type AgentVerdict,
  type Task,
  type TaskEvent,
  type TaskOutputChunk,
} from "../api";
import { useStream } from "../live";
import { Link } from "../nav";
import { placementText } from "../place";

const TERMINAL = [TaskState.SUCCEEDED, TaskState.FAILED, TaskState.CANCELED];

export function TaskPage(props: { id: string }) {
  const [task, setTask] = useState<Task>();
  const [events, setEvents] = useState<TaskEvent[]>([]);
  const [output, setOutput] = useState<TaskOutputChunk[]>([]);
  const [explained, setExplained] = useState<{ summary: string; verdicts: AgentVerdict[] }>();
  const [actionError, setActionError] = useState<string>();
  const error = useStream(
    (signal) => {
      setEvents([]);
      setOutput([]);
      return tasks.watchTask({ taskId: props.id, output: true }, { signal });
    },
    (m) => {
      if (m.task) setTask(m.task);
      const event = m.event;
      if (event) setEvents((prev) => (prev.some((e) => e.sequence === event.sequence) ? prev : [...prev, event]));
      if (m.output.length) setOutput((prev) => [...prev, ...m.output]);
    },
    [props.id],
  );
  const state = task?.state;
  useEffect(() => {
    if (state === undefined) return;
    tasks
      .explainTask({ taskId: props.id })
      .then((r) => setExplained({ summary: r.summary, verdicts: r.verdicts }))
      .catch(() => setExplained(undefined));
  }, [props.id, state]);
  const cancel = async () => {
    try {
      await tasks.cancelTask({ taskId: props.id, reason: "canceled from the console" });
      setActionError(undefined);
    } catch (err) {
      setActionError(describe(err));
    }
  };
  return (
    <section>
      <p><Link to="/queue">← queue</Link></p>
      {error && <p className="error" role="alert">{error}</p>}
      {actionError && <p className="error" role="alert">{actionError}</p>}
      {task && (
        <>
          <h1>
            <code>{task.kind}</code>{" "}
            <span className={`badge state-${stateName(task.state)}`} data-testid="task-state">{stateName(task.state)}</span>
          </h1>
          <dl className="facts">
            <dt>id</dt><dd><code>{task.taskId}</code></dd>
            <dt>attempts</dt><dd>{task.attempts}/{task.maxAttempts}</dd>
            <dt>placement</dt><dd><code>{placementText(task.placement)}</code></dd>
            <dt>submitted</dt><dd>{when(task.createdAt)?.toISOString()}</dd>
            {task.lease && (
              <>
                <dt>lease</dt>
                <dd>
                  on <Link to={`/agents/${task.lease.agentId}`}>{task.lease.agentId}</Link>, fencing token{" "}
                  {String(task.lease.fencingToken)}
                </dd>
              </>
            )}
            {task.error && (
              <>
                <dt>error</dt>
                <dd><pre>{JSON.stringify(toJson(TaskErrorSchema, task.error), null, 2)}</pre></dd>
              </>
            )}
            {task.result && (
              <>
                <dt>result</dt>
                <dd><pre>{JSON.stringify(task.result, null, 2)}</pre></dd>
              </>
            )}
          </dl>
          {!TERMINAL.includes(task.state) && (
            <div className="actions">
              <button onClick={cancel} disabled={task.cancelRequested}>
                {task.cancelRequested ? "cancel requested" : "cancel"}
              </button>
            </div>
          )}
        </>
      )}
      <h2>Timeline</h2>
      <ol className="timeline" data-testid="timeline">
        {events.map((e) => (
          <li key={String(e.sequence)}>
            <time>{when(e.occurredAt)?.toISOString()}</time> <b>{e.kind}</b> → {stateName(e.state)}
            {e.agentId && <> on <Link to={`/agents/${e.agentId}`}>{e.agentId.slice(0, 8)}</Link></>}
            {e.message && <span className="note"> {e.message}</span>}
          </li>
        ))}
      </ol>
      {explained && (
        <>
          <h2>Why here</h2>
          <p data-testid="explanation">{explained.summary}</p>
          {explained.verdicts.length > 0 && (
            <table>
              <thead><tr><th>agent</th><th>eligible</th><th>reason</th></tr></thead>
              <tbody>
                {explained.verdicts.slice(0, 200).map((v) => (
                  <tr key={v.agentId}>
                    <td><Link to={`/agents/${v.agentId}`}>{v.agentName}</Link></td>
                    <td>{v.eligible ? `yes, rank ${v.rank}` : v.capable ? "capable, busy" : "no"}</td>
                    <td>{v.reason}</td>
                  </tr>
                ))}
              </tbody>
            </table>
          )}
        </>
      )}
      <h2>Output</h2>
      <pre className="output" data-testid="output">
        {output.map((c, i) => (
          <span key={i} className={c.stream === OutputStream.STDERR ? "stderr" : c.stream === OutputStream.LOG ? "log" : "stdout"}>
            {c.droppedBytes > 0n && <span className="dropped">[{String(c.droppedBytes)} bytes dropped]\n</span>}
            {c.text}
          </span>
        ))}
      </pre>
    </section>
  );
}
