-- Deadlines, all opt-in (NULL: none): a task's start timeout (it must be
-- granted within this long of becoming due, which is its not_before_ms
-- while queued), execution timeout (the longest an attempt may hold its
-- lease, from the grant) and cancel grace, with the deadline a cancel set;
-- an agent's drain deadline. The sweep reads them through partial indexes
-- that stay empty while nobody uses a deadline.
ALTER TABLE tasks ADD COLUMN start_timeout_ms INTEGER;
ALTER TABLE tasks ADD COLUMN execution_timeout_ms INTEGER;
ALTER TABLE tasks ADD COLUMN cancel_grace_ms INTEGER;
ALTER TABLE tasks ADD COLUMN cancel_deadline_ms INTEGER;
ALTER TABLE agents ADD COLUMN drain_deadline_ms INTEGER;

CREATE INDEX tasks_start_deadline ON tasks ((not_before_ms + start_timeout_ms))
    WHERE state = 'queued' AND start_timeout_ms IS NOT NULL;
CREATE INDEX tasks_timed_live ON tasks (id)
    WHERE execution_timeout_ms IS NOT NULL AND state IN ('leased', 'running');
CREATE INDEX tasks_cancel_deadline ON tasks (cancel_deadline_ms)
    WHERE cancel_deadline_ms IS NOT NULL AND state IN ('leased', 'running');
CREATE INDEX agents_drain_deadline ON agents (drain_deadline_ms)
    WHERE drain_deadline_ms IS NOT NULL;
