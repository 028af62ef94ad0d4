-- Deadlines, fair share and concurrency limits, all opt-in. Deadlines (NULL: none): a task's start timeout (it must be
-- granted within this long of becoming due, which is its not_before_ms
-- while queued), execution timeout (the longest an attempt may hold its
-- lease, from the grant) and cancel grace, with the deadline a cancel set;
-- an agent's drain deadline. The sweep reads them through partial indexes
-- that stay empty while nobody uses a deadline.
ALTER TABLE tasks ADD COLUMN start_timeout_ms INTEGER;
ALTER TABLE tasks ADD COLUMN execution_timeout_ms INTEGER;
ALTER TABLE tasks ADD COLUMN cancel_grace_ms INTEGER;
ALTER TABLE tasks ADD COLUMN cancel_deadline_ms INTEGER;
ALTER TABLE agents ADD COLUMN drain_deadline_ms INTEGER;

CREATE INDEX tasks_start_deadline ON tasks ((not_before_ms + start_timeout_ms))
    WHERE state = 'queued' AND start_timeout_ms IS NOT NULL;
CREATE INDEX tasks_timed_live ON tasks (id)
    WHERE execution_timeout_ms IS NOT NULL AND state IN ('leased', 'running');
CREATE INDEX tasks_cancel_deadline ON tasks (cancel_deadline_ms)
    WHERE cancel_deadline_ms IS NOT NULL AND state IN ('leased', 'running');
CREATE INDEX agents_drain_deadline ON agents (drain_deadline_ms)
    WHERE drain_deadline_ms IS NOT NULL;

-- Fair share: a task's fairness key and weight (NULL: none) and its offset
-- from its submit time in the queue's order: priority, then rank
-- (created_at_ms + fair_offset), then id. A task without a key has offset 0
-- and keeps its submit order; a keyed task's rank is its key's place in a
-- weighted round robin, found through two partial indexes of keyed waiting
-- tasks only.
ALTER TABLE tasks ADD COLUMN fairness_key TEXT;
ALTER TABLE tasks ADD COLUMN fairness_weight INTEGER;
ALTER TABLE tasks ADD COLUMN fair_offset INTEGER NOT NULL DEFAULT 0;
DROP INDEX tasks_queue;
CREATE INDEX tasks_queue ON tasks (priority DESC, (created_at_ms + fair_offset), id)
    WHERE state = 'queued';
CREATE INDEX tasks_fair_last ON tasks (namespace, priority, fairness_key, (created_at_ms + fair_offset))
    WHERE state = 'queued' AND fairness_key IS NOT NULL;
CREATE INDEX tasks_fair_head ON tasks (namespace, priority, (created_at_ms + fair_offset))
    WHERE state = 'queued' AND fairness_key IS NOT NULL;
-- The fair clock of each namespace and priority: the rank of the last keyed
-- task granted there (a newcomer key starts no earlier).
CREATE TABLE fair_clock (
    namespace TEXT    NOT NULL,
    priority  INTEGER NOT NULL,
    rank      INTEGER NOT NULL,
    PRIMARY KEY (namespace, priority)
);

-- Concurrency limits: a task's concurrency key (NULL: none) and each key's
-- limit of running tasks, counted from the key's LEASED and RUNNING tasks
-- through a partial index (one writer: no lock needed).
ALTER TABLE tasks ADD COLUMN concurrency_key TEXT;
CREATE INDEX tasks_running_by_key ON tasks (namespace, concurrency_key)
    WHERE concurrency_key IS NOT NULL AND state IN ('leased', 'running');
CREATE TABLE concurrency_keys (
    namespace     TEXT    NOT NULL,
    key           TEXT    NOT NULL,
    max_running   INTEGER NOT NULL CHECK (max_running >= 1),
    updated_at_ms INTEGER NOT NULL,
    PRIMARY KEY (namespace, key)
);
