// One agent: its status and why, its capability document as a tree with
// the tier each value came from (secrets arrive redacted), its leases,
// and drain / undrain for operators. Followed live: each change the fleet
// stream reports for this agent reloads it.
import { useCallback, useEffect, useState } from "react";
import type { JsonValue } from "@bufbuild/protobuf";

import {
  admin,
  ago,
  describe,
  namespace,
  statusName,
  tierName,
  when,
  type Agent,
  type Lease,
  Tier,
} from "../api";
import { useNow, useStream } from "../live";
import { Link } from "../nav";

function Tree(props: { value: JsonValue; path: string; tiers: Map<string, Tier> }) {
  const { value, path, tiers } = props;
  if (value !== null && typeof value === "object") {
    const entries = Array.isArray(value)
      ? value.map((v, i) => [String(i), v] as const)
      : Object.entries(value);
    return (
      <ul className="tree">
        {entries.map(([k, v]) => {
          const child = path ? `${path}.${k}` : k;
          const leaf = v === null || typeof v !== "object";
          const tier = tiers.get(child);
          return (
            <li key={k} data-path={child}>
              <span className="key">{k}</span>
              {leaf ? (
                <>
                  {": "}
                  <span className="value">{JSON.stringify(v)}</span>
                  {tier !== undefined && <span className={`tier ${tierName(tier)}`}>{tierName(tier)}</span>}
                </>
              ) : (
                <Tree value={v} path={child} tiers={tiers} />
              )}
            </li>
          );
        })}
      </ul>
    );
  }
  return <span className="value">{JSON.stringify(value)}</span>;
}

export function AgentPage(props: { id: string }) {
  const [agent, setAgent] = useState<Agent>();
  const [leases, setLeases] = useState<Lease[]>([]);
  const [error, setError] = useState<string>();
  const [reason, setReason] = useState("");
  const now = useNow();
  const load = useCallback(async () => {
    try {
      const r = await admin.getAgent({ agentId: props.id });
      setAgent(r.agent);
      setLeases(r.leases);
      setError(undefined);
    } catch (err) {
      setError(describe(err));
    }
  }, [props.id]);
  useEffect(() => {
    void load();
  }, [load]);
  const streamError = useStream(
    (signal) => admin.watchAgents({ namespace: namespace() }, { signal }),
    (m) => {
      if (m.agents.some((a) => a.agentId === props.id) || m.removedAgentIds.includes(props.id)) void load();
    },
    [props.id],
  );
  const act = async (drain: boolean) => {
    try {
      if (drain) await admin.drainAgent({ agentId: props.id, reason: reason || "drained from the console" });
      else await admin.undrainAgent({ agentId: props.id });
      await load();
    } catch (err) {
      setError(describe(err));
    }
  };
  const tiers = new Map((agent?.capabilities?.provenance ?? []).map((p) => [p.path, p.tier]));
  return (
    <section>
      <p><Link to="/">← fleet</Link></p>
      {error && <p className="error" role="alert">{error}</p>}
      {!error && streamError && <p className="error" role="alert">{streamError}</p>}
      {agent && (
        <>
          <h1>
            {agent.name}{" "}
            <span className={`badge ${agent.drained ? "draining" : statusName(agent.status)}`} data-testid="agent-status">
              {agent.drained ? "draining" : statusName(agent.status)}
            </span>
          </h1>
          {agent.statusReasons.length > 0 && (
            <ul className="reasons">{agent.statusReasons.map((r) => <li key={r}>{r}</li>)}</ul>
          )}
          <dl className="facts">
            <dt>load</dt><dd>{agent.activeLeases}/{agent.capacity}</dd>
            <dt>kinds</dt><dd>{agent.handledKinds.join(" ") || "—"}</dd>
            <dt>runner</dt><dd>{agent.runner}</dd>
            <dt>last heartbeat</dt><dd>{ago(when(agent.lastSeenAt), now)}</dd>
            <dt>registered</dt><dd>{when(agent.registeredAt)?.toISOString()}</dd>
            <dt>session epoch</dt><dd>{String(agent.sessionEpoch)}</dd>
            <dt>labels</dt><dd>{Object.entries(agent.labels).map(([k, v]) => <code key={k}>{k}={v}</code>)}</dd>
          </dl>
          <div className="actions">
            {agent.drained ? (
              <button onClick={() => act(false)}>undrain</button>
            ) : (
              <>
                <input placeholder="why (shown as its status reason)" value={reason} onChange={(e) => setReason(e.target.value)} />
                <button onClick={() => act(true)}>drain</button>
              </>
            )}
          </div>
          <h2>Leases</h2>
          {leases.length === 0 ? (
            <p className="note">none</p>
          ) : (
            <table>
              <thead><tr><th>task</th><th>fencing token</th><th>expires</th></tr></thead>
              <tbody>
                {leases.map((l) => (
                  <tr key={l.leaseId}>
                    <td><Link to={`/tasks/${l.taskId}`}>{l.taskId}</Link></td>
                    <td>{String(l.fencingToken)}</td>
                    <td>{when(l.expiresAt)?.toISOString()}</td>
                  </tr>
                ))}
              </tbody>
            </table>
          )}
          <h2>Capability document <small>generation {String(agent.capabilities?.generation ?? 0)}</small></h2>
          <div className="document" data-testid="document">
            <Tree value={agent.capabilities?.document ?? {}} path="" tiers={tiers} />
          </div>
        </>
      )}
    </section>
  );
}
