-- Routing by what an agent can run: the task kinds each agent handles, how
-- many times each task was handed back without an attempt (bounded), and
-- which agents refused which task (they are not offered it again until they
-- change or register again).

ALTER TABLE agents ADD COLUMN handled_kinds jsonb NOT NULL DEFAULT '[]';
ALTER TABLE tasks ADD COLUMN releases bigint NOT NULL DEFAULT 0 CHECK (releases >= 0);

CREATE TABLE task_refusals (
    task_id        uuid   NOT NULL,
    agent_id       uuid   NOT NULL,
    reason         text   NOT NULL,
    refused_at_ms  bigint NOT NULL,
    PRIMARY KEY (task_id, agent_id)
);
CREATE INDEX task_refusals_by_agent ON task_refusals (agent_id);
