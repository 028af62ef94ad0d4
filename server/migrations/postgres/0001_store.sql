-- The task store: agents, tasks, leases and the append-only task history.
-- Times are Unix milliseconds (BIGINT) supplied by the server's clock, never
-- column defaults; JSON documents are jsonb.

CREATE TABLE agents (
    id                 uuid PRIMARY KEY,
    namespace          text    NOT NULL,
    name               text    NOT NULL,
    document           jsonb   NOT NULL,
    provenance         jsonb   NOT NULL,
    rejections         jsonb   NOT NULL,
    reported           jsonb   NOT NULL,
    operator_overrides jsonb   NOT NULL,
    generation         bigint  NOT NULL CHECK (generation >= 0),
    status             text    NOT NULL CHECK (status IN ('ready', 'degraded', 'draining', 'offline')),
    status_reasons     jsonb   NOT NULL,
    capacity           bigint  NOT NULL CHECK (capacity >= 0),
    -- Leases held now, maintained in the transaction of every grant and lease
    -- end, so the capacity check is one row lock.
    active_leases      bigint  NOT NULL CHECK (active_leases >= 0),
    drained            boolean NOT NULL,
    labels             jsonb   NOT NULL,
    runner             text    NOT NULL,
    session_epoch      bigint  NOT NULL CHECK (session_epoch >= 0),
    last_seen_at_ms    bigint  NOT NULL,
    registered_at_ms   bigint  NOT NULL,
    updated_at_ms      bigint  NOT NULL,
    UNIQUE (namespace, name)
);

CREATE TABLE tasks (
    id               uuid    PRIMARY KEY,
    namespace        text    NOT NULL,
    kind             text    NOT NULL,
    payload          jsonb   NOT NULL,
    placement        jsonb   NOT NULL,
    priority         integer NOT NULL,
    state            text    NOT NULL CHECK (state IN ('queued', 'leased', 'running', 'succeeded', 'failed', 'canceled')),
    attempts         bigint  NOT NULL CHECK (attempts >= 0),
    max_attempts     bigint  NOT NULL CHECK (max_attempts >= 1),
    lease_ttl_ms     bigint  NOT NULL CHECK (lease_ttl_ms > 0),
    idempotency_key  text,
    not_before_ms    bigint  NOT NULL,
    result           jsonb,
    error            jsonb,
    -- The last token issued; each grant takes this + 1.
    fencing_token    bigint  NOT NULL CHECK (fencing_token >= 0),
    lease_id         uuid,
    agent_id         uuid,
    cancel_requested boolean NOT NULL,
    cancel_reason    text,
    progress         jsonb,
    labels           jsonb   NOT NULL,
    created_at_ms    bigint  NOT NULL,
    updated_at_ms    bigint  NOT NULL
);

CREATE UNIQUE INDEX tasks_idempotency_key ON tasks (namespace, idempotency_key)
    WHERE idempotency_key IS NOT NULL;
-- The dispatcher's candidate list.
CREATE INDEX tasks_queue ON tasks (priority DESC, created_at_ms, id) WHERE state = 'queued';
CREATE INDEX tasks_by_namespace ON tasks (namespace, created_at_ms DESC, id DESC);

CREATE TABLE leases (
    id             uuid    PRIMARY KEY,
    task_id        uuid    NOT NULL REFERENCES tasks (id),
    agent_id       uuid    NOT NULL REFERENCES agents (id),
    fencing_token  bigint  NOT NULL,
    state          text    NOT NULL CHECK (state IN ('granted', 'active', 'completed', 'released', 'expired')),
    acked          boolean NOT NULL,
    granted_at_ms  bigint  NOT NULL,
    expires_at_ms  bigint  NOT NULL,
    ended_at_ms    bigint,
    -- How the lease ended by the agent's report, to recognise a repeat.
    outcome        text,
    UNIQUE (task_id, fencing_token)
);

-- Belt and braces: a task never has two live leases.
CREATE UNIQUE INDEX leases_one_live_per_task ON leases (task_id) WHERE state IN ('granted', 'active');
CREATE INDEX leases_live_by_agent ON leases (agent_id) WHERE state IN ('granted', 'active');
CREATE INDEX leases_live_by_expiry ON leases (expires_at_ms) WHERE state IN ('granted', 'active');

CREATE TABLE task_events (
    task_id        uuid   NOT NULL REFERENCES tasks (id),
    sequence       bigint NOT NULL,
    kind           text   NOT NULL,
    state          text   NOT NULL,
    message        text   NOT NULL,
    agent_id       uuid,
    lease_id       uuid,
    occurred_at_ms bigint NOT NULL,
    PRIMARY KEY (task_id, sequence)
);

CREATE FUNCTION task_events_append_only() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'task_events is append-only';
END;
$$;

CREATE TRIGGER task_events_append_only BEFORE UPDATE OR DELETE ON task_events
    FOR EACH ROW EXECUTE FUNCTION task_events_append_only();
