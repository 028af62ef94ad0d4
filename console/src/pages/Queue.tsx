// The queue: live tasks by state, queued tasks by reason, and the queued
// tasks grouped by kind and placement — how many wait, since when, and
// what matching says about them (which constraint fails on how many
// agents): what an operator or an autoscaler acts on. Followed live
// through WatchQueue; recent tasks below, each a link to its page.
import { useEffect, useState } from "react";

import {
  ago,
  describe,
  namespace,
  reasonName,
  stateName,
  tasks,
  when,
  QueuedReason,
  type QueueSummary,
  type Task,
} from "../api";
import { useNow, useStream } from "../live";
import { Link } from "../nav";
import { placementText } from "../place";

export function QueuePage() {
  const [summary, setSummary] = useState<QueueSummary>();
  const [recent, setRecent] = useState<Task[]>([]);
  const [listError, setListError] = useState<string>();
  const now = useNow();
  const error = useStream(
    (signal) => tasks.watchQueue({ namespace: namespace() }, { signal }),
    (m) => setSummary(m.summary),
    [],
  );
  // The newest tasks, read again whenever the summary changes.
  useEffect(() => {
    tasks
      .listTasks({ namespace: namespace(), pageSize: 20 })
      .then((r) => {
        setRecent(r.tasks);
        setListError(undefined);
      })
      .catch((err) => setListError(describe(err)));
  }, [summary]);
  return (
    <section>
      <h1>Queue</h1>
      {error && <p className="error" role="alert">{error}</p>}
      {summary && (
        <>
          <div className="counts" data-testid="queue-counts">
            {summary.states.length === 0 && <span className="note">nothing queued or running</span>}
            {summary.states.map((s) => (
              <span key={s.state} className={`count state-${stateName(s.state)}`}>
                <b>{s.count.toLocaleString("en")}</b> {stateName(s.state)}
              </span>
            ))}
            {summary.queuedReasons.map((r) => (
              <span key={r.reason} className={`count reason-${reasonName(r.reason).replaceAll(" ", "-")}`}>
                <b>{r.count.toLocaleString("en")}</b> {reasonName(r.reason)}
              </span>
            ))}
            {summary.explained && (
              <span className="count">
                <b>{summary.agentsTakingWork.toLocaleString("en")}</b> of {summary.agentsRegistered.toLocaleString("en")} agents
                taking work
              </span>
            )}
          </div>
          <h2>Waiting, by placement</h2>
          {summary.groups.length === 0 ? (
            <p className="note" data-testid="no-groups">No task waits.</p>
          ) : (
            <table className="groups">
              <thead>
                <tr><th>kind</th><th>placement</th><th>tasks</th><th>waiting since</th><th>reason</th><th>why</th></tr>
              </thead>
              <tbody>
                {summary.groups.map((g, i) => (
                  <tr
                    key={i}
                    data-testid="queue-group"
                    data-reason={summary.explained ? reasonName(g.reason) : "matching"}
                  >
                    <td><code>{g.kind}</code></td>
                    <td><code>{placementText(g.placement)}</code></td>
                    <td>
                      {g.tasks.toLocaleString("en")}
                      {g.notYetDue > 0n && <div className="note">{g.notYetDue.toLocaleString("en")} not yet due</div>}
                    </td>
                    <td title={when(g.oldestSubmittedAt)?.toISOString()}>{ago(when(g.oldestSubmittedAt), now)}</td>
                    <td>
                      {summary.explained ? (
                        <span className={`badge ${g.reason === QueuedReason.PARKED ? "parked" : "waiting"}`}>
                          {g.reason === QueuedReason.UNSPECIFIED ? "being placed" : reasonName(g.reason)}
                        </span>
                      ) : (
                        <span className="note">matching…</span>
                      )}
                    </td>
                    <td className="explanation">
                      {g.explanation}
                      {summary.explained && (
                        <div className="note">{g.capableAgents} capable, {g.eligibleAgents} with room</div>
                      )}
                    </td>
                  </tr>
                ))}
              </tbody>
            </table>
          )}
          {summary.moreGroups > 0 && <p className="note">and {summary.moreGroups} smaller groups</p>}
        </>
      )}
      <h2>Recent tasks</h2>
      {listError && <p className="error">{listError}</p>}
      <table>
        <thead><tr><th>task</th><th>kind</th><th>state</th><th>attempts</th><th>submitted</th></tr></thead>
        <tbody>
          {recent.map((t) => (
            <tr key={t.taskId}>
              <td><Link to={`/tasks/${t.taskId}`}>{t.taskId}</Link></td>
              <td><code>{t.kind}</code></td>
              <td><span className={`badge state-${stateName(t.state)}`}>{stateName(t.state)}</span></td>
              <td>{t.attempts}/{t.maxAttempts}</td>
              <td>{ago(when(t.createdAt), now)}</td>
            </tr>
          ))}
        </tbody>
      </table>
    </section>
  );
}
