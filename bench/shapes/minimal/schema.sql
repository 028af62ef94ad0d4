-- The smallest shape that keeps Switchyard's guarantees in PostgreSQL, for
-- `bench/pgcost --shapes`: one task row that every step updates in place (no
-- indexed column changes, and free room on its page, so that its updates can
-- be HOT: about three in four are), queue membership and live leases in
-- tables of their own (a row inserted and deleted each), and the quick
-- attempt's history in the task row. Not Switchyard's schema: a yardstick
-- for it.
CREATE TABLE tasks (
    id uuid PRIMARY KEY,
    namespace text NOT NULL,
    kind text NOT NULL,
    payload jsonb NOT NULL,
    placement jsonb NOT NULL,
    priority int4 NOT NULL,
    state text NOT NULL,
    attempts int4 NOT NULL,
    fencing_token int8 NOT NULL,
    lease_id uuid,
    agent_id uuid,
    lease_expires_at_ms int8,
    acked bool,
    history jsonb,
    result jsonb,
    created_at_ms int8 NOT NULL,
    updated_at_ms int8 NOT NULL
) WITH (fillfactor = 60);
CREATE INDEX tasks_by_namespace ON tasks (namespace, created_at_ms DESC, id DESC);
CREATE TABLE queue (task_id uuid PRIMARY KEY, priority int4 NOT NULL, rank int8 NOT NULL);
CREATE INDEX queue_order ON queue (priority DESC, rank, task_id);
CREATE TABLE live_leases (task_id uuid PRIMARY KEY, agent_id uuid NOT NULL, expires_at_ms int8 NOT NULL);
CREATE INDEX live_by_agent ON live_leases (agent_id);
CREATE INDEX live_by_expiry ON live_leases (expires_at_ms);
