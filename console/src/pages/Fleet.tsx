// The fleet: every agent of the namespace (those a selector picks), with
// status and why, load and capacity, labels, kinds and last heartbeat,
// followed live through WatchAgents.
import { useMemo, useRef, useState } from "react";

import { admin, ago, namespace, statusName, when, AgentStatus, type Agent } from "../api";
import { useNow, useStream } from "../live";
import { Link } from "../nav";

/** Rows drawn at most: a selector narrows a larger fleet. */
const SHOWN = 200;

export function FleetPage() {
  const [selector, setSelector] = useState("");
  const [applied, setApplied] = useState("");
  const [agents, setAgents] = useState<Map<string, Agent>>(new Map());
  const [synced, setSynced] = useState(false);
  const now = useNow();
  // The first listing comes in several messages, in name order: the first
  // is drawn at once (it holds the rows the table shows), the rest gathered
  // here and drawn once whole, instead of once per message.
  const pending = useRef<Map<string, Agent> | null>(null);
  const error = useStream(
    (signal) => {
      pending.current = new Map();
      setAgents(new Map());
      setSynced(false);
      return admin.watchAgents({ namespace: namespace(), selector: applied }, { signal });
    },
    (m) => {
      if (pending.current) {
        const firstMessage = pending.current.size === 0;
        for (const a of m.agents) pending.current.set(a.agentId, a);
        for (const id of m.removedAgentIds) pending.current.delete(id);
        if (m.synced) {
          setAgents(pending.current);
          pending.current = null;
          setSynced(true);
        } else if (firstMessage) {
          setAgents(new Map(pending.current));
        }
        return;
      }
      if (m.agents.length === 0 && m.removedAgentIds.length === 0) return;
      setAgents((prev) => {
        const next = new Map(prev);
        for (const a of m.agents) next.set(a.agentId, a);
        for (const id of m.removedAgentIds) next.delete(id);
        return next;
      });
    },
    [applied],
  );
  // By name, compared by code point (the locale's collation costs more,
  // 10,000 names at a time, and is not the order the store lists them in).
  const sorted = useMemo(
    () => [...agents.values()].sort((a, b) => (a.name < b.name ? -1 : a.name > b.name ? 1 : 0)),
    [agents],
  );
  const counts = useMemo(() => {
    const c = new Map<string, number>();
    for (const a of agents.values()) {
      const s = a.drained ? "draining" : statusName(a.status);
      c.set(s, (c.get(s) ?? 0) + 1);
    }
    return c;
  }, [agents]);
  const load = sorted.reduce((n, a) => n + a.activeLeases, 0);
  const capacity = sorted.reduce((n, a) => n + (a.status === AgentStatus.OFFLINE ? 0 : a.capacity), 0);
  return (
    <section>
      <h1>Fleet</h1>
      <form
        className="filter"
        onSubmit={(e) => {
          e.preventDefault();
          setApplied(selector.trim());
        }}
      >
        <input
          name="selector"
          placeholder="selector, e.g. docker, os.family = linux, software.node.version@^20"
          value={selector}
          onChange={(e) => setSelector(e.target.value)}
        />
        <button type="submit">filter</button>
      </form>
      {error && <p className="error" role="alert">{error}</p>}
      <p className="summary" data-testid="fleet-summary">
        {synced ? `${agents.size} agents` : `loading… ${agents.size} so far`}
        {[...counts.entries()].map(([s, n]) => (
          <span key={s} className={`badge ${s}`}>{n} {s}</span>
        ))}
        <span>load {load}/{capacity}</span>
      </p>
      <table className="agents">
        <thead>
          <tr>
            <th>agent</th><th>status</th><th>load</th><th>labels</th><th>kinds</th><th>runner</th><th>last heartbeat</th>
          </tr>
        </thead>
        <tbody>
          {sorted.slice(0, SHOWN).map((a) => (
            <tr key={a.agentId} data-agent={a.name}>
              <td><Link to={`/agents/${a.agentId}`}>{a.name}</Link></td>
              <td>
                <span className={`badge ${a.drained ? "draining" : statusName(a.status)}`}>
                  {a.drained ? "draining" : statusName(a.status)}
                </span>
                {a.statusReasons.length > 0 && <div className="reasons">{a.statusReasons.join("; ")}</div>}
              </td>
              <td>
                <meter min={0} max={Math.max(1, a.capacity)} value={a.activeLeases} /> {a.activeLeases}/{a.capacity}
              </td>
              <td>{Object.entries(a.labels).map(([k, v]) => <code key={k}>{k}={v}</code>)}</td>
              <td>{a.handledKinds.join(" ")}</td>
              <td>{a.runner}</td>
              <td title={when(a.lastSeenAt)?.toISOString()}>{ago(when(a.lastSeenAt), now)}</td>
            </tr>
          ))}
        </tbody>
      </table>
      {sorted.length > SHOWN && (
        <p className="note">Showing the first {SHOWN} of {sorted.length} agents by name: a selector narrows the list.</p>
      )}
    </section>
  );
}
