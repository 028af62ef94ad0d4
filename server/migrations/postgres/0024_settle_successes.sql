-- Whole fresh attempts that succeeded (a quick task's accepted, started and
-- success, reported together) settled in one call: the report batch's
-- transaction took five round trips for them (begin, the tasks' lock, the
-- leases' read, the write, commit), about one statement a task live, half
-- of all a task's statements.
--
-- The call locks the named tasks in id order (every writer of a task locks
-- it first, so its lease cannot change after), then in a fresh snapshot
-- settles each attempt whose task is still LEASED at the reported fencing
-- token and whose lease is still GRANTED to the reporter at that token: the
-- checks `plan_whole_attempt` makes of a success, made as the lease's
-- update. From the leases it ended it writes what the general statement
-- (`WHOLE_ATTEMPTS`) writes for one: the lease COMPLETED (acknowledged,
-- ended now, outcome succeeded), one history row implying accepted and
-- started, the task SUCCEEDED with its result. It answers the tasks it
-- settled; the server applies the rest of the batch as before. A shortfall
-- between the leases ended and the history rows or tasks written refuses
-- the call: nothing is written.
--
-- Every row it reads, it reads by key. Its plans are kept as the submit
-- function's are (migration 0020), made at a connection's first call, often
-- its warm-up on tables still small; at that size the planner chose a pass
-- over `tasks` for the lock and for the checks, and kept both as the table
-- grew. Sequential scans are therefore off for the function. A lease's
-- state is matched against a column (`held`), not a constant, as in
-- `WHOLE_ATTEMPTS`: the planner then reads each lease by its key rather
-- than through a partial index holding every lease ended since the last
-- VACUUM.
CREATE FUNCTION switchyard_settle_successes(
    lease_ids uuid[], task_ids uuid[], agent_ids uuid[], tokens int8[], results text[],
    now_ms int8
) RETURNS SETOF uuid
LANGUAGE plpgsql VOLATILE SET plan_cache_mode = force_generic_plan SET enable_seqscan = off AS $$
#variable_conflict use_column
DECLARE
    n_ended bigint;
    n_written bigint;
    settled_ids uuid[];
BEGIN
    PERFORM 1 FROM tasks t WHERE t.id = ANY($2) ORDER BY t.id FOR UPDATE;
    WITH u AS MATERIALIZED (
        SELECT u.*, 'granted'::text AS held
        FROM UNNEST($1, $2, $3, $4, $5) AS u(lease_id, task_id, agent_id, token, result)
    ), ended AS (
        UPDATE leases l SET state = 'completed', outcome = 'succeeded', acked = TRUE,
        ended_at_ms = $6
        FROM u JOIN tasks t ON t.id = u.task_id
        WHERE l.id = u.lease_id AND l.state = u.held AND l.task_id = u.task_id
        AND l.agent_id = u.agent_id AND l.fencing_token = u.token
        AND t.state = 'leased' AND t.fencing_token = u.token
        RETURNING l.id AS lease_id, l.task_id, l.agent_id, u.result
    ), history AS (
        INSERT INTO task_events (task_id, sequence, kind, state, message, agent_id, lease_id,
        occurred_at_ms, implied_steps)
        SELECT e.task_id,
        COALESCE((SELECT MAX(s.sequence) FROM task_events s WHERE s.task_id = e.task_id), 1) + 3,
        'succeeded', 'succeeded', 'the agent reported success', e.agent_id, e.lease_id, $6, 2
        FROM ended e
        RETURNING task_id
    ), done AS (
        UPDATE tasks t SET state = 'succeeded', result = COALESCE(e.result::jsonb, t.result),
        lease_id = NULL, agent_id = NULL, updated_at_ms = $6
        FROM ended e WHERE t.id = e.task_id RETURNING t.id
    )
    SELECT (SELECT COUNT(*) FROM ended), (SELECT COUNT(*) FROM history),
        (SELECT array_agg(done.id) FROM done)
    INTO n_ended, n_written, settled_ids;
    IF n_written <> n_ended OR COALESCE(cardinality(settled_ids), 0) <> n_ended THEN
        RAISE EXCEPTION 'settling successes: % leases ended, % history rows, % tasks settled',
            n_ended, n_written, COALESCE(cardinality(settled_ids), 0);
    END IF;
    RETURN QUERY SELECT s FROM UNNEST(settled_ids) AS s;
END;
$$;
