-- Switchyard's schema (migrated by the server first, the task row's
-- indexes as they are) with the lease in the task row and live leases in a
-- table of their own (a row inserted at grant, deleted at settle) in place
-- of a `leases` row inserted and updated; history as it is. For
-- `bench/pgcost --shapes`: what the lease rows cost on their own, beside
-- `hot-lease`, which also frees the task row's updates. Not a schema the
-- server can run on.
ALTER TABLE tasks ADD COLUMN lease_expires_at_ms int8, ADD COLUMN acked bool;
CREATE TABLE live_leases (
    task_id uuid PRIMARY KEY,
    agent_id uuid NOT NULL,
    expires_at_ms int8 NOT NULL
);
CREATE INDEX live_by_agent ON live_leases (agent_id);
CREATE INDEX live_by_expiry ON live_leases (expires_at_ms);
