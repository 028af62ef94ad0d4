-- Switchyard's schema (migrated by the server first) with the task row's
-- updates free to be HOT: every index of `tasks` whose key or predicate
-- reads `state` is dropped, and queue membership kept in a table of its
-- own (a row inserted at submit, deleted at grant) in the queue's order.
-- Leases and history stay as they are. For `bench/pgcost --shapes`: how
-- much of the gap between Switchyard's schema and the smallest shape the
-- task row alone makes up. Not a schema the server can run on.
DROP INDEX tasks_queue, tasks_queue_groups, tasks_fair_last, tasks_fair_head,
    tasks_start_deadline, tasks_timed_live, tasks_cancel_deadline, tasks_running_by_key;
CREATE TABLE queue (
    task_id uuid PRIMARY KEY,
    priority int4 NOT NULL,
    rank int8 NOT NULL
);
CREATE INDEX queue_order ON queue (priority DESC, rank, task_id);
