-- The head of the queue (a batch) leased to one agent: out of the queue, the
-- lease in the task row (its fencing token one up), a live lease row.
WITH q AS (
    DELETE FROM queue WHERE task_id IN (
        SELECT task_id FROM queue ORDER BY priority DESC, rank, task_id
        LIMIT :batch FOR UPDATE SKIP LOCKED)
    RETURNING task_id
), u AS (
    UPDATE tasks t SET state = 'leased', fencing_token = t.fencing_token + 1,
    lease_id = gen_random_uuid(), agent_id = '00000000-0000-0000-0000-000000000001',
    lease_expires_at_ms = 1, acked = false, updated_at_ms = 2
    FROM q WHERE t.id = q.task_id RETURNING t.id, t.agent_id
)
INSERT INTO live_leases SELECT id, agent_id, 1 FROM u;
