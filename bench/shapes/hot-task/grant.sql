-- The head of the queue (a batch) leased to one agent: out of the queue, a
-- lease row each, the task rows LEASED (in place), a history row each.
WITH q AS (
    DELETE FROM queue WHERE task_id IN (
        SELECT task_id FROM queue ORDER BY priority DESC, rank, task_id
        LIMIT :batch FOR UPDATE SKIP LOCKED)
    RETURNING task_id
), g AS (
    SELECT t.id AS task_id, gen_random_uuid() AS lease_id, t.fencing_token + 1 AS token
    FROM tasks t JOIN q ON q.task_id = t.id
), l AS (
    INSERT INTO leases (id, task_id, agent_id, fencing_token, state, acked, granted_at_ms,
        expires_at_ms, slots)
    SELECT lease_id, task_id, '00000000-0000-0000-0000-000000000001', token, 'granted',
        false, 1, 2, 1 FROM g
), u AS (
    UPDATE tasks t SET state = 'leased', fencing_token = g.token, lease_id = g.lease_id,
    agent_id = '00000000-0000-0000-0000-000000000001', updated_at_ms = 2
    FROM g WHERE t.id = g.task_id
)
INSERT INTO task_events (task_id, sequence, kind, state, message, agent_id, lease_id,
    occurred_at_ms)
SELECT task_id, 2, 'leased', 'leased', 'leased to agent x with fencing token 1',
    '00000000-0000-0000-0000-000000000001', lease_id, 2 FROM g;
