-- Deadlines, fair share and concurrency limits, all opt-in.
--
-- Deadlines (NULL: none). A task's start timeout (it must be
-- granted within this long of becoming due, which is its not_before_ms
-- while queued), execution timeout (the longest an attempt may hold its
-- lease, from the grant) and cancel grace (how long a cancel-requested lease
-- may go on), with the deadline a cancel set; an agent's drain deadline.
-- Each sweep reads only the rows with a deadline, through partial indexes
-- that stay empty while nobody uses one.
--
-- Fair share: a task's fairness key and weight (NULL: none) and its offset
-- from its submit time in the queue's order. The queue is read by priority,
-- then rank (created_at_ms + fair_offset), then id: a task without a key has
-- offset 0 and keeps its submit order (a replica of the release before
-- inserts it so); a keyed task's rank is its key's place in a weighted round
-- robin, found through two partial indexes of keyed waiting tasks only.
-- The queue's index follows the new order (replicas of the release before
-- read their pages by a sort until they are replaced).
--
-- Concurrency limits: a task's concurrency key (NULL: none) and each key's
-- limit of running tasks (concurrency_keys, set by submits), counted from
-- the key's LEASED and RUNNING tasks through a partial index. A grant locks
-- the keys it would count (and, with a limit per namespace, an advisory
-- lock per namespace) after the agents, in key order, so no two replicas'
-- grants exceed a limit.
--
-- The submit function gains the three timeouts, the fairness arrays and the
-- concurrency keys before the time, as an overload: replicas of the release
-- before keep calling the function of 0008 while a rolling upgrade replaces
-- them (their tasks have none of these). Everything else in it is as it was.
ALTER TABLE tasks ADD COLUMN start_timeout_ms int8, ADD COLUMN execution_timeout_ms int8,
    ADD COLUMN cancel_grace_ms int8, ADD COLUMN cancel_deadline_ms int8;
ALTER TABLE agents ADD COLUMN drain_deadline_ms int8;

CREATE INDEX tasks_start_deadline ON tasks ((not_before_ms + start_timeout_ms))
    WHERE state = 'queued' AND start_timeout_ms IS NOT NULL;
CREATE INDEX tasks_timed_live ON tasks (id)
    WHERE execution_timeout_ms IS NOT NULL AND state IN ('leased', 'running');
CREATE INDEX tasks_cancel_deadline ON tasks (cancel_deadline_ms)
    WHERE cancel_deadline_ms IS NOT NULL AND state IN ('leased', 'running');
CREATE INDEX agents_drain_deadline ON agents (drain_deadline_ms)
    WHERE drain_deadline_ms IS NOT NULL;

ALTER TABLE tasks ADD COLUMN fairness_key text, ADD COLUMN fairness_weight int8,
    ADD COLUMN fair_offset int8 NOT NULL DEFAULT 0;
DROP INDEX tasks_queue;
CREATE INDEX tasks_queue ON tasks (priority DESC, (created_at_ms + fair_offset), id)
    WHERE state = 'queued';
CREATE INDEX tasks_fair_last ON tasks (namespace, priority, fairness_key, (created_at_ms + fair_offset))
    WHERE state = 'queued' AND fairness_key IS NOT NULL;
CREATE INDEX tasks_fair_head ON tasks (namespace, priority, (created_at_ms + fair_offset))
    WHERE state = 'queued' AND fairness_key IS NOT NULL;
-- The fair clock of each namespace and priority: the rank of the last keyed
-- task granted there. A key with nothing waiting starts no earlier, so
-- keyed tasks left behind it (parked ones) hold no newcomer back.
CREATE TABLE fair_clock (
    namespace text NOT NULL,
    priority  int4 NOT NULL,
    rank      int8 NOT NULL,
    PRIMARY KEY (namespace, priority)
);

ALTER TABLE tasks ADD COLUMN concurrency_key text;
CREATE INDEX tasks_running_by_key ON tasks (namespace, concurrency_key)
    WHERE concurrency_key IS NOT NULL AND state IN ('leased', 'running');
CREATE TABLE concurrency_keys (
    namespace     text NOT NULL,
    key           text NOT NULL,
    max_running   int8 NOT NULL CHECK (max_running >= 1),
    updated_at_ms int8 NOT NULL,
    PRIMARY KEY (namespace, key)
);

CREATE FUNCTION switchyard_submit_batch(
    ids uuid[], namespaces text[], kinds text[], payloads text[], placements text[],
    priorities int4[], max_attempts int8[], lease_ttls int8[], idempotency_keys text[],
    not_befores int8[], labels text[], agent_ids uuid[], lease_ids uuid[], retries text[],
    start_timeouts int8[], execution_timeouts int8[], cancel_graces int8[], fairness_keys text[],
    fairness_weights int8[], fair_offsets int8[], concurrency_keys text[], now_ms int8
) RETURNS TABLE (id uuid, leased boolean, known boolean)
LANGUAGE plpgsql VOLATILE AS $$
#variable_conflict use_column
BEGIN
    IF cardinality($12) = 1 THEN
        PERFORM 1 FROM agents a WHERE a.id = $12[1] FOR UPDATE;
    ELSE
        PERFORM 1 FROM agents a WHERE a.id = ANY($12) ORDER BY a.id FOR UPDATE;
    END IF;
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
        SELECT s.id, 1, 'submitted', 'queued', 'submitted', NULL, NULL, $22
        FROM s JOIN ins ON ins.id = s.id
        UNION ALL
        SELECT s.id, 2, 'leased', 'leased', 'leased to agent ' || s.agent_id::text ||
        ' with fencing token 1', s.agent_id, s.lease_id, $22
        FROM s JOIN ins ON ins.id = s.id WHERE ins.leased
    )
    SELECT ins.id, ins.leased, p.known FROM ins JOIN s ON s.id = ins.id JOIN plan p ON p.ord = s.ord;
END;
$$;
