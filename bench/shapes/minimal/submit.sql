-- A batch of tasks (pgbench variable `batch`) submitted: their rows, and
-- their places in the queue.
WITH s AS (SELECT gen_random_uuid() AS id FROM generate_series(1, :batch)),
ins AS (
    INSERT INTO tasks
    SELECT id, 'default', 'bench', '{"n": 191, "submitted_us": 24588}',
    '{"policy": "spread", "preferences": [], "capabilities": [], "requirements": [{"key": "software.node.version", "values": ["^20"], "operator": "VERSION"}], "required_tags": ["linux", "docker"]}',
    0, 'queued', 0, 0, NULL, NULL, NULL, NULL, NULL, NULL,
    (extract(epoch FROM clock_timestamp()) * 1000)::int8,
    (extract(epoch FROM clock_timestamp()) * 1000)::int8
    FROM s RETURNING id, created_at_ms
)
INSERT INTO queue SELECT id, 0, created_at_ms FROM ins;
