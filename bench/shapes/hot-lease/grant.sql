-- The `hot-lease` shape: `hot-task` and `live-leases` together (both their
-- schemas; `hot-task`'s submit, `live-leases`' settle: `SHAPE_PLANS` in
-- bench/pgcost). Its grant: the head of the queue (a batch) leased to one
-- agent: out of the queue, the lease in the task row (its fencing token one
-- up, in place), a live lease row and a history row each.
WITH q AS (
    DELETE FROM queue WHERE task_id IN (
        SELECT task_id FROM queue ORDER BY priority DESC, rank, task_id
        LIMIT :batch FOR UPDATE SKIP LOCKED)
    RETURNING task_id
), u AS (
    UPDATE tasks t SET state = 'leased', fencing_token = t.fencing_token + 1,
    lease_id = gen_random_uuid(), agent_id = '00000000-0000-0000-0000-000000000001',
    lease_expires_at_ms = 1, acked = false, updated_at_ms = 2
    FROM q WHERE t.id = q.task_id RETURNING t.id, t.agent_id, t.lease_id
), l AS (
    INSERT INTO live_leases SELECT id, agent_id, 1 FROM u
)
INSERT INTO task_events (task_id, sequence, kind, state, message, agent_id, lease_id,
    occurred_at_ms)
SELECT id, 2, 'leased', 'leased', 'leased to agent x with fencing token 1', agent_id,
    lease_id, 2 FROM u;
