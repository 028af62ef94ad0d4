-- A batch of whole quick attempts settled: the live leases gone, one
-- history row each with the ended lease's id (implying accepted and
-- started), the task rows SUCCEEDED.
WITH l AS (
    DELETE FROM live_leases WHERE task_id IN (
        SELECT task_id FROM live_leases LIMIT :batch FOR UPDATE SKIP LOCKED)
    RETURNING task_id
), c AS (
    SELECT t.id, t.lease_id, t.agent_id FROM tasks t JOIN l ON l.task_id = t.id
), u AS (
    UPDATE tasks t SET state = 'succeeded', attempts = 1, result = '{}', lease_id = NULL,
    agent_id = NULL, lease_expires_at_ms = NULL, acked = NULL, updated_at_ms = 3
    FROM c WHERE t.id = c.id
)
INSERT INTO task_events (task_id, sequence, kind, state, message, agent_id, lease_id,
    occurred_at_ms, implied_steps)
SELECT id, 5, 'succeeded', 'succeeded', 'done', agent_id, lease_id, 3, 2 FROM c;
