// "What if": a selector (and a kind) against the fleet as it is, through
// SimulatePlacement — which agents would take it, in rank order, and why
// each other one would not. Nothing is changed.
import { useState } from "react";

import { admin, describe, namespace, type SimulatePlacementResponse } from "../api";
import { Link } from "../nav";

export function WhatIfPage() {
  const [selector, setSelector] = useState("");
  const [kind, setKind] = useState("");
  const [answer, setAnswer] = useState<SimulatePlacementResponse>();
  const [error, setError] = useState<string>();
  const ask = async () => {
    try {
      const r = await admin.simulatePlacement({ namespace: namespace(), kind, placement: { selector } });
      setAnswer(r);
      setError(undefined);
    } catch (err) {
      setError(describe(err));
      setAnswer(undefined);
    }
  };
  return (
    <section>
      <h1>What if</h1>
      <form
        className="filter"
        onSubmit={(e) => {
          e.preventDefault();
          void ask();
        }}
      >
        <input name="selector" placeholder="selector, e.g. docker, needs memory: 4096, prefer: ssd" value={selector} onChange={(e) => setSelector(e.target.value)} />
        <input name="kind" placeholder="kind (any)" value={kind} onChange={(e) => setKind(e.target.value)} size={12} />
        <button type="submit">ask</button>
      </form>
      {error && <p className="error" role="alert">{error}</p>}
      {answer && (
        <>
          <p data-testid="whatif-summary">{answer.summary}</p>
          {answer.ranking && <p className="note">{answer.ranking}</p>}
          <table>
            <thead><tr><th>agent</th><th>verdict</th><th>why not</th></tr></thead>
            <tbody>
              {answer.verdicts.map((v) => (
                <tr key={v.agentId} className={v.eligible ? "eligible" : ""}>
                  <td><Link to={`/agents/${v.agentId}`}>{v.agentName}</Link></td>
                  <td>{v.eligible ? `takes it (rank ${v.rank})` : v.capable ? "could, when free" : "no"}</td>
                  <td>{v.reason}</td>
                </tr>
              ))}
            </tbody>
          </table>
        </>
      )}
    </section>
  );
}
