-- The `hot-task` shape (Switchyard's schema, the task row's updates free to
-- be HOT, queue membership in a table of its own) with the lease in the
-- task row and live leases in a table of their own (a row inserted at
-- grant, deleted at settle) in place of a `leases` row inserted and
-- updated. History stays as it is (a row at grant, one at settle). For
-- `bench/pgcost --shapes`: between `hot-task` and `minimal`, what the
-- lease rows cost apart from the history rows. Not a schema the server
-- can run on.
DROP INDEX tasks_queue, tasks_queue_groups, tasks_fair_last, tasks_fair_head,
    tasks_start_deadline, tasks_timed_live, tasks_cancel_deadline, tasks_running_by_key;
CREATE TABLE queue (
    task_id uuid PRIMARY KEY,
    priority int4 NOT NULL,
    rank int8 NOT NULL
);
CREATE INDEX queue_order ON queue (priority DESC, rank, task_id);
ALTER TABLE tasks ADD COLUMN lease_expires_at_ms int8, ADD COLUMN acked bool;
CREATE TABLE live_leases (
    task_id uuid PRIMARY KEY,
    agent_id uuid NOT NULL,
    expires_at_ms int8 NOT NULL
);
CREATE INDEX live_by_agent ON live_leases (agent_id);
CREATE INDEX live_by_expiry ON live_leases (expires_at_ms);
