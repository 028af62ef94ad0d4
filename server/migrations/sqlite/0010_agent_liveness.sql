-- When each agent was last heard from, as its session refreshes it now and
-- then (every 30 s): a narrow row of its own, so that a fleet's refreshes do
-- not rewrite the wide agents row with its documents. An agent's last-seen
-- time is the later of this and agents.last_seen_at_ms (set when it
-- registers).
CREATE TABLE agent_liveness (
    agent_id        BLOB    PRIMARY KEY,
    last_seen_at_ms INTEGER NOT NULL
) WITHOUT ROWID;
