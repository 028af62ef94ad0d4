-- A task's output (stdout, stderr and its handler's log), as its runners sent
-- it while they held its lease. The output is one range of bytes, attempt
-- after attempt: a row holds [at_byte, end_byte); a gap before a row is what
-- was dropped there (by the runner's bounds, or by the server's per-task
-- bound, oldest first); a row with empty text marks its own range dropped.
-- The task's last row carries its mark: the lease token and the runner's
-- sequence of the last chunk (a resent chunk is recognised by them) and
-- kept_bytes, the bytes of text kept for the task in all.
CREATE TABLE task_output (
    task_id       BLOB    NOT NULL,
    at_byte       INTEGER NOT NULL CHECK (at_byte >= 0),
    end_byte      INTEGER NOT NULL,
    kept_bytes    INTEGER NOT NULL CHECK (kept_bytes >= 0),
    namespace     TEXT    NOT NULL,
    lease_id      BLOB    NOT NULL,
    fencing_token INTEGER NOT NULL,
    sequence      INTEGER NOT NULL,
    stream        TEXT    NOT NULL CHECK (stream IN ('stdout', 'stderr', 'log')),
    text          TEXT    NOT NULL,
    written_at_ms INTEGER NOT NULL,
    PRIMARY KEY (task_id, at_byte),
    CHECK (end_byte >= at_byte)
);

-- The namespace's bound walks its oldest tasks' kept output.
CREATE INDEX task_output_kept ON task_output (namespace, task_id) WHERE text <> '';

-- Bytes of output kept per namespace, in shards chosen by task, so that the
-- report batches of different tasks seldom wait on one row.
CREATE TABLE output_usage (
    namespace TEXT    NOT NULL,
    shard     INTEGER NOT NULL,
    bytes     INTEGER NOT NULL,
    PRIMARY KEY (namespace, shard)
);
