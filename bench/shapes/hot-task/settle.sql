-- A batch of whole quick attempts settled, as in Switchyard's schema (the
-- task rows updated in place): the leases ended, one history row each
-- (implying accepted and started), the task rows SUCCEEDED.
WITH c AS (
    SELECT l.id AS lease_id, l.task_id FROM leases l WHERE l.state IN ('granted', 'active')
    LIMIT :batch FOR UPDATE SKIP LOCKED
), e AS (
    UPDATE leases l SET state = 'completed', outcome = 'succeeded', acked = true,
    ended_at_ms = 3 FROM c WHERE l.id = c.lease_id
), h AS (
    INSERT INTO task_events (task_id, sequence, kind, state, message, agent_id, lease_id,
        occurred_at_ms, implied_steps)
    SELECT task_id, 5, 'succeeded', 'succeeded', 'done',
        '00000000-0000-0000-0000-000000000001', lease_id, 3, 2 FROM c
)
UPDATE tasks t SET state = 'succeeded', attempts = 1, result = '{}', lease_id = NULL,
agent_id = NULL, updated_at_ms = 3 FROM c WHERE t.id = c.task_id;
