-- When each agent was last heard from, as its session refreshes it now and
-- then (every 30 s): a narrow row of its own, so that a fleet's refreshes
-- (a thousand a second at 30,000 agents) neither copy the wide agents row
-- with its documents nor lock it against dispatch. An agent's last-seen time
-- is the later of this and agents.last_seen_at_ms (set when it registers).
-- No foreign key: a row of an agent that is gone is never read.
CREATE TABLE agent_liveness (
    agent_id        uuid   PRIMARY KEY,
    last_seen_at_ms bigint NOT NULL
) WITH (fillfactor = 50);
