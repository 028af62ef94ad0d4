-- Tokens that can be revoked, rotated and expire, that know when they were
-- last used, and that may be bound to the agent names they register.
-- A token is valid while neither revoked_at_ms nor expires_at_ms has
-- passed; a rotation schedules the old token's revocation (its grace) and
-- stores the new one under the same name, so a name is unique among the
-- tokens not yet given a revocation time. SQLite cannot drop the table's
-- UNIQUE constraint in place: the table is rebuilt.
CREATE TABLE tokens_new (
    hash            TEXT PRIMARY KEY,
    name            TEXT NOT NULL,
    namespace       TEXT NOT NULL,
    role            TEXT NOT NULL CHECK (role IN ('agent', 'submitter', 'operator')),
    created_at_ms   BIGINT NOT NULL,
    expires_at_ms   BIGINT,
    revoked_at_ms   BIGINT,
    last_used_at_ms BIGINT,
    agent_names     TEXT NOT NULL DEFAULT ''
);
INSERT INTO tokens_new (hash, name, namespace, role, created_at_ms)
    SELECT hash, name, namespace, role, created_at_ms FROM tokens;
DROP TABLE tokens;
ALTER TABLE tokens_new RENAME TO tokens;
CREATE UNIQUE INDEX tokens_current_name ON tokens (namespace, name) WHERE revoked_at_ms IS NULL;

-- Which token registered each agent: another token may not take over a
-- name whose agent is online (see the register upsert).
ALTER TABLE agents ADD COLUMN registered_by TEXT NOT NULL DEFAULT '';
