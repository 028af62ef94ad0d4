-- A batch of whole quick attempts settled: the live leases gone, each task
-- succeeded with its accepted and started steps kept in its row.
WITH l AS (
    DELETE FROM live_leases WHERE task_id IN (
        SELECT task_id FROM live_leases LIMIT :batch FOR UPDATE SKIP LOCKED)
    RETURNING task_id
)
UPDATE tasks t SET state = 'succeeded', lease_id = NULL, agent_id = NULL,
lease_expires_at_ms = NULL, acked = NULL,
history = '[{"kind": "accepted"}, {"kind": "started"}]', result = '{}', updated_at_ms = 3
FROM l WHERE t.id = l.task_id;
