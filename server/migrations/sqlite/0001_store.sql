-- The task store: agents, tasks, leases and the append-only task history.
-- Times are Unix milliseconds (INTEGER) supplied by the server's clock, never
-- column defaults; JSON documents are TEXT; ids are 16-byte BLOBs.

CREATE TABLE agents (
    id                 BLOB PRIMARY KEY,
    namespace          TEXT    NOT NULL,
    name               TEXT    NOT NULL,
    document           TEXT   NOT NULL,
    provenance         TEXT   NOT NULL,
    rejections         TEXT   NOT NULL,
    reported           TEXT   NOT NULL,
    operator_overrides TEXT   NOT NULL,
    generation         INTEGER  NOT NULL CHECK (generation >= 0),
    status             TEXT    NOT NULL CHECK (status IN ('ready', 'degraded', 'draining', 'offline')),
    status_reasons     TEXT   NOT NULL,
    capacity           INTEGER  NOT NULL CHECK (capacity >= 0),
    -- Leases held now, maintained in the transaction of every grant and lease
    -- end, so the capacity check is one row lock.
    active_leases      INTEGER  NOT NULL CHECK (active_leases >= 0),
    drained            INTEGER NOT NULL,
    labels             TEXT   NOT NULL,
    runner             TEXT    NOT NULL,
    session_epoch      INTEGER  NOT NULL CHECK (session_epoch >= 0),
    last_seen_at_ms    INTEGER  NOT NULL,
    registered_at_ms   INTEGER  NOT NULL,
    updated_at_ms      INTEGER  NOT NULL,
    UNIQUE (namespace, name)
);

CREATE TABLE tasks (
    id               BLOB    PRIMARY KEY,
    namespace        TEXT    NOT NULL,
    kind             TEXT    NOT NULL,
    payload          TEXT   NOT NULL,
    placement        TEXT   NOT NULL,
    priority         INTEGER NOT NULL,
    state            TEXT    NOT NULL CHECK (state IN ('queued', 'leased', 'running', 'succeeded', 'failed', 'canceled')),
    attempts         INTEGER  NOT NULL CHECK (attempts >= 0),
    max_attempts     INTEGER  NOT NULL CHECK (max_attempts >= 1),
    lease_ttl_ms     INTEGER  NOT NULL CHECK (lease_ttl_ms > 0),
    idempotency_key  TEXT,
    not_before_ms    INTEGER  NOT NULL,
    result           TEXT,
    error            TEXT,
    -- The last token issued; each grant takes this + 1.
    fencing_token    INTEGER  NOT NULL CHECK (fencing_token >= 0),
    lease_id         BLOB,
    agent_id         BLOB,
    cancel_requested INTEGER NOT NULL,
    cancel_reason    TEXT,
    progress         TEXT,
    labels           TEXT   NOT NULL,
    created_at_ms    INTEGER  NOT NULL,
    updated_at_ms    INTEGER  NOT NULL
);

CREATE UNIQUE INDEX tasks_idempotency_key ON tasks (namespace, idempotency_key)
    WHERE idempotency_key IS NOT NULL;
-- The dispatcher's candidate list.
CREATE INDEX tasks_queue ON tasks (priority DESC, created_at_ms, id) WHERE state = 'queued';
CREATE INDEX tasks_by_namespace ON tasks (namespace, created_at_ms DESC, id DESC);

CREATE TABLE leases (
    id             BLOB    PRIMARY KEY,
    task_id        BLOB    NOT NULL REFERENCES tasks (id),
    agent_id       BLOB    NOT NULL REFERENCES agents (id),
    fencing_token  INTEGER  NOT NULL,
    state          TEXT    NOT NULL CHECK (state IN ('granted', 'active', 'completed', 'released', 'expired')),
    acked          INTEGER NOT NULL,
    granted_at_ms  INTEGER  NOT NULL,
    expires_at_ms  INTEGER  NOT NULL,
    ended_at_ms    INTEGER,
    -- How the lease ended by the agent's report, to recognise a repeat.
    outcome        TEXT,
    UNIQUE (task_id, fencing_token)
);

-- Belt and braces: a task never has two live leases.
CREATE UNIQUE INDEX leases_one_live_per_task ON leases (task_id) WHERE state IN ('granted', 'active');
CREATE INDEX leases_live_by_agent ON leases (agent_id) WHERE state IN ('granted', 'active');
CREATE INDEX leases_live_by_expiry ON leases (expires_at_ms) WHERE state IN ('granted', 'active');

CREATE TABLE task_events (
    task_id        BLOB   NOT NULL REFERENCES tasks (id),
    sequence       INTEGER NOT NULL,
    kind           TEXT   NOT NULL,
    state          TEXT   NOT NULL,
    message        TEXT   NOT NULL,
    agent_id       BLOB,
    lease_id       BLOB,
    occurred_at_ms INTEGER NOT NULL,
    PRIMARY KEY (task_id, sequence)
);

CREATE TRIGGER task_events_no_update BEFORE UPDATE ON task_events
BEGIN
    SELECT RAISE(ABORT, 'task_events is append-only');
END;

CREATE TRIGGER task_events_no_delete BEFORE DELETE ON task_events
BEGIN
    SELECT RAISE(ABORT, 'task_events is append-only');
END;
