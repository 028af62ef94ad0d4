-- The head of the queue (a batch) leased to one agent: the lease in the task
-- row (its fencing token one up), the task rows LEASED, a live lease row and
-- a history row each.
WITH q AS (
    SELECT id FROM tasks WHERE state = 'queued'
    ORDER BY priority DESC, created_at_ms + fair_offset, id
    LIMIT :batch FOR UPDATE SKIP LOCKED
), u AS (
    UPDATE tasks t SET state = 'leased', fencing_token = t.fencing_token + 1,
    lease_id = gen_random_uuid(), agent_id = '00000000-0000-0000-0000-000000000001',
    lease_expires_at_ms = 1, acked = false, updated_at_ms = 2
    FROM q WHERE t.id = q.id RETURNING t.id, t.agent_id, t.lease_id
), l AS (
    INSERT INTO live_leases SELECT id, agent_id, 1 FROM u
)
INSERT INTO task_events (task_id, sequence, kind, state, message, agent_id, lease_id,
    occurred_at_ms)
SELECT id, 2, 'leased', 'leased', 'leased to agent x with fencing token 1', agent_id,
    lease_id, 2 FROM u;
