-- The whole successes' call (migration 0024) read every task once a call.
-- Its plans are kept, made at a connection's first call, often on tables
-- still small or on statistics that say few tasks are LEASED; its check of
-- each task's state and token, a join of the batch to `tasks`, then became
-- a hash join whose inner side was a pass over the whole of `tasks_pkey`
-- (sequential scans being off) filtered on the state: 1,605 pages for a
-- batch of ten among 3,553 tasks, seen in a live run. With hash joins off
-- as well the planner made it a nested loop with that pass outermost, and
-- with the batch's ids as the index's condition instead, a lookup of the
-- whole batch for each of its rows.
--
-- The check is now a subquery of each lease the call would end, which
-- PostgreSQL runs for that row alone, looking the task up by its key
-- whatever the statistics say. Hash and merge joins are off for the call,
-- so its two joins (the leases it ends, the tasks it settles) are nested
-- loops; in every plan seen, made on empty tables and on full ones, each
-- is driven from the batch's side and looks its rows up by key.
--
-- Replaced rather than added: the signature and the answers are those of
-- migration 0024; its settings are restated, as replacing a function drops
-- them.
CREATE OR REPLACE FUNCTION switchyard_settle_successes(
    lease_ids uuid[], task_ids uuid[], agent_ids uuid[], tokens int8[], results text[],
    now_ms int8
) RETURNS SETOF uuid
LANGUAGE plpgsql VOLATILE SET plan_cache_mode = force_generic_plan SET enable_seqscan = off
SET enable_hashjoin = off SET enable_mergejoin = off AS $$
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
        FROM u
        WHERE l.id = u.lease_id AND l.state = u.held AND l.task_id = u.task_id
        AND l.agent_id = u.agent_id AND l.fencing_token = u.token
        AND (SELECT t.state = 'leased' AND t.fencing_token = u.token
            FROM tasks t WHERE t.id = u.task_id)
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
