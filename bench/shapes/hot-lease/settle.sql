-- A batch of whole quick attempts settled: the live leases gone, one
-- history row each (implying accepted and started), the task rows
-- SUCCEEDED (in place).
WITH l AS (
    DELETE FROM live_leases WHERE task_id IN (
        SELECT task_id FROM live_leases LIMIT :batch FOR UPDATE SKIP LOCKED)
    RETURNING task_id
), u AS (
    UPDATE tasks t SET state = 'succeeded', attempts = 1, result = '{}', lease_id = NULL,
    agent_id = NULL, lease_expires_at_ms = NULL, acked = NULL, updated_at_ms = 3
    FROM l WHERE t.id = l.task_id RETURNING t.id, l.task_id
)
INSERT INTO task_events (task_id, sequence, kind, state, message, agent_id, lease_id,
    occurred_at_ms, implied_steps)
SELECT id, 5, 'succeeded', 'succeeded', 'done', '00000000-0000-0000-0000-000000000001',
    NULL, 3, 2 FROM u;
