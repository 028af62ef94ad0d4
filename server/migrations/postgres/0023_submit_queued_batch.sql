-- A batch of submits none of which has an agent reserved (a backlog's,
-- or any submitted while no agent here has room) is one plain insert of
-- its tasks, queued: the batch's general statement (migration 0019) also
-- counts the reserved agents' live leases, numbers each agent's tasks,
-- and writes leases and history, each a step of its plan that a call
-- pays for however few of its tasks are leased. The answers are those the
-- general statement gives such a batch (not leased, no agent known).
--
-- Replaced rather than added: the signature and the answers are those of
-- migration 0019, so a binary rolled back calls it unchanged; the setting
-- of migration 0020 is restated, as replacing a function drops its
-- settings.
CREATE OR REPLACE FUNCTION switchyard_submit_tasks(
    ids uuid[], namespaces text[], kinds text[], payloads text[], placements text[],
    priorities int4[], max_attempts int8[], lease_ttls int8[], idempotency_keys text[],
    not_befores int8[], labels text[], agent_ids uuid[], lease_ids uuid[], retries text[],
    start_timeouts int8[], execution_timeouts int8[], cancel_graces int8[], fairness_keys text[],
    fairness_weights int8[], fair_offsets int8[], concurrency_keys text[], now_ms int8
) RETURNS TABLE (id uuid, leased boolean, known boolean)
LANGUAGE plpgsql VOLATILE SET plan_cache_mode = force_generic_plan AS $$
#variable_conflict use_column
BEGIN
    IF cardinality($1) = 1 THEN
        IF $12[1] IS NOT NULL THEN
            PERFORM 1 FROM agents a WHERE a.id = $12[1] FOR UPDATE;
        END IF;
        RETURN QUERY
        WITH live AS (
            SELECT COALESCE(SUM(l.slots), 0) AS n FROM leases l
            WHERE l.agent_id = $12[1] AND l.state IN ('granted', 'active')
        ), plan AS (
            SELECT a.id IS NOT NULL AS known,
            COALESCE((SELECT live.n FROM live) + 1 <= a.capacity, FALSE) AS leased
            FROM (SELECT $12[1] AS agent_id) s LEFT JOIN agents a ON a.id = s.agent_id
        ), ins AS (
            INSERT INTO tasks (id, namespace, kind, payload, placement, priority, state, attempts,
            max_attempts, lease_ttl_ms, idempotency_key, not_before_ms, fencing_token, lease_id,
            agent_id, cancel_requested, labels, retry, start_timeout_ms, execution_timeout_ms,
            cancel_grace_ms, fairness_key, fairness_weight, fair_offset, concurrency_key, created_at_ms,
            updated_at_ms)
            SELECT $1[1], $2[1], $3[1], $4[1]::jsonb, $5[1]::jsonb, $6[1],
            CASE WHEN p.leased THEN 'leased' ELSE 'queued' END, 0, $7[1], $8[1],
            $9[1], $10[1], CASE WHEN p.leased THEN 1 ELSE 0 END,
            CASE WHEN p.leased THEN $13[1] END, CASE WHEN p.leased THEN $12[1] END, FALSE,
            $11[1]::jsonb, $14[1], $15[1], $16[1], $17[1], $18[1], $19[1], $20[1], $21[1], $22, $22
            FROM plan p
            ON CONFLICT (namespace, idempotency_key) WHERE idempotency_key IS NOT NULL DO NOTHING
            RETURNING tasks.id, tasks.state = 'leased' AS leased
        ), new_leases AS (
            INSERT INTO leases (id, task_id, agent_id, fencing_token, state, acked, granted_at_ms,
            expires_at_ms)
            SELECT $13[1], ins.id, $12[1], 1, 'granted', FALSE, $22, $22 + $8[1]
            FROM ins WHERE ins.leased
        ), history AS (
            INSERT INTO task_events (task_id, sequence, kind, state, message, agent_id, lease_id,
            occurred_at_ms)
            SELECT ins.id, 2, 'leased', 'leased', 'leased to agent ' || $12[1]::text ||
            ' with fencing token 1', $12[1], $13[1], $22
            FROM ins WHERE ins.leased
        )
        SELECT ins.id, ins.leased, p.known FROM ins, plan p;
        RETURN;
    END IF;
    IF cardinality(array_remove($12, NULL)) = 0 THEN
        -- No agent reserved: every task is queued, and nothing else is
        -- read or written.
        RETURN QUERY
        INSERT INTO tasks (id, namespace, kind, payload, placement, priority, state, attempts,
        max_attempts, lease_ttl_ms, idempotency_key, not_before_ms, fencing_token, lease_id,
        agent_id, cancel_requested, labels, retry, start_timeout_ms, execution_timeout_ms,
        cancel_grace_ms, fairness_key, fairness_weight, fair_offset, concurrency_key, created_at_ms,
        updated_at_ms)
        SELECT s.id, s.namespace, s.kind, s.payload::jsonb, s.placement::jsonb, s.priority,
        'queued', 0, s.max_attempts, s.lease_ttl_ms, s.idempotency_key, s.not_before_ms, 0, NULL,
        NULL, FALSE, s.labels::jsonb, s.retry, s.start_timeout_ms, s.execution_timeout_ms,
        s.cancel_grace_ms, s.fairness_key, s.fairness_weight, s.fair_offset, s.concurrency_key,
        $22, $22
        FROM UNNEST($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $14, $15, $16, $17, $18, $19,
        $20, $21) WITH ORDINALITY AS s(id, namespace, kind, payload, placement, priority,
        max_attempts, lease_ttl_ms, idempotency_key, not_before_ms, labels, retry,
        start_timeout_ms, execution_timeout_ms, cancel_grace_ms, fairness_key, fairness_weight,
        fair_offset, concurrency_key, ord)
        ORDER BY s.ord
        ON CONFLICT (namespace, idempotency_key) WHERE idempotency_key IS NOT NULL DO NOTHING
        RETURNING tasks.id, FALSE, FALSE;
        RETURN;
    END IF;
    PERFORM 1 FROM agents a WHERE a.id = ANY($12) ORDER BY a.id FOR UPDATE;
    RETURN QUERY
    WITH s AS (
        SELECT * FROM UNNEST($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17, $18, $19, $20, $21)
        WITH ORDINALITY AS s(id, namespace, kind, payload, placement, priority, max_attempts,
        lease_ttl_ms, idempotency_key, not_before_ms, labels, agent_id, lease_id, retry,
        start_timeout_ms, execution_timeout_ms, cancel_grace_ms, fairness_key, fairness_weight,
        fair_offset, concurrency_key, ord)
    ), live AS (
        SELECT l.agent_id, SUM(l.slots) AS n FROM leases l
        WHERE l.agent_id = ANY($12) AND l.state IN ('granted', 'active') GROUP BY l.agent_id
    ), plan AS (
        SELECT s.ord, a.id IS NOT NULL AS known,
        COALESCE(COALESCE(live.n, 0) + ROW_NUMBER() OVER (PARTITION BY s.agent_id ORDER BY s.ord)
        <= a.capacity, FALSE) AS leased
        FROM s LEFT JOIN agents a ON a.id = s.agent_id LEFT JOIN live ON live.agent_id = s.agent_id
    ), ins AS (
        INSERT INTO tasks (id, namespace, kind, payload, placement, priority, state, attempts,
        max_attempts, lease_ttl_ms, idempotency_key, not_before_ms, fencing_token, lease_id,
        agent_id, cancel_requested, labels, retry, start_timeout_ms, execution_timeout_ms,
        cancel_grace_ms, fairness_key, fairness_weight, fair_offset, concurrency_key, created_at_ms,
        updated_at_ms)
        SELECT s.id, s.namespace, s.kind, s.payload::jsonb, s.placement::jsonb, s.priority,
        CASE WHEN p.leased THEN 'leased' ELSE 'queued' END, 0, s.max_attempts, s.lease_ttl_ms,
        s.idempotency_key, s.not_before_ms, CASE WHEN p.leased THEN 1 ELSE 0 END,
        CASE WHEN p.leased THEN s.lease_id END, CASE WHEN p.leased THEN s.agent_id END, FALSE,
        s.labels::jsonb, s.retry, s.start_timeout_ms, s.execution_timeout_ms, s.cancel_grace_ms,
        s.fairness_key, s.fairness_weight, s.fair_offset, s.concurrency_key, $22, $22
        FROM s JOIN plan p ON p.ord = s.ord ORDER BY s.ord
        ON CONFLICT (namespace, idempotency_key) WHERE idempotency_key IS NOT NULL DO NOTHING
        RETURNING tasks.id, tasks.state = 'leased' AS leased
    ), new_leases AS (
        INSERT INTO leases (id, task_id, agent_id, fencing_token, state, acked, granted_at_ms,
        expires_at_ms)
        SELECT s.lease_id, s.id, s.agent_id, 1, 'granted', FALSE, $22, $22 + s.lease_ttl_ms
        FROM s JOIN ins ON ins.id = s.id WHERE ins.leased
    ), history AS (
        INSERT INTO task_events (task_id, sequence, kind, state, message, agent_id, lease_id,
        occurred_at_ms)
        SELECT s.id, 2, 'leased', 'leased', 'leased to agent ' || s.agent_id::text ||
        ' with fencing token 1', s.agent_id, s.lease_id, $22
        FROM s JOIN ins ON ins.id = s.id WHERE ins.leased
    )
    SELECT ins.id, ins.leased, p.known FROM ins JOIN s ON s.id = ins.id JOIN plan p ON p.ord = s.ord;
END;
$$;
