-- Tokens that can be revoked, rotated and expire, that know when they were
-- last used, and that may be bound to the agent names they register.
-- A token is valid while neither revoked_at_ms nor expires_at_ms has
-- passed; a rotation schedules the old token's revocation (its grace) and
-- stores the new one under the same name, so a name is unique among the
-- tokens not yet given a revocation time.
ALTER TABLE tokens ADD COLUMN expires_at_ms BIGINT;
ALTER TABLE tokens ADD COLUMN revoked_at_ms BIGINT;
ALTER TABLE tokens ADD COLUMN last_used_at_ms BIGINT;
ALTER TABLE tokens ADD COLUMN agent_names TEXT NOT NULL DEFAULT '';
ALTER TABLE tokens DROP CONSTRAINT tokens_namespace_name_key;
CREATE UNIQUE INDEX tokens_current_name ON tokens (namespace, name) WHERE revoked_at_ms IS NULL;

-- Which token registered each agent: another token may not take over a
-- name whose agent is online (see the register upsert).
ALTER TABLE agents ADD COLUMN registered_by TEXT NOT NULL DEFAULT '';
