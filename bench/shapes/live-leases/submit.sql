-- A batch of tasks (pgbench variable `batch`) submitted, as into Switchyard's
-- schema: one plain INSERT of their rows.
INSERT INTO tasks (id, namespace, kind, payload, placement, priority, state, attempts,
    max_attempts, lease_ttl_ms, not_before_ms, fencing_token, cancel_requested, labels,
    created_at_ms, updated_at_ms)
SELECT gen_random_uuid(), 'default', 'bench', '{"n": 191, "submitted_us": 24588}',
    '{"policy": "spread", "preferences": [], "capabilities": [], "requirements": [{"key": "software.node.version", "values": ["^20"], "operator": "VERSION"}], "required_tags": ["linux", "docker"]}',
    0, 'queued', 0, 3, 30000, 0, 0, false, '{}', m.ms, m.ms
FROM generate_series(1, :batch),
    (SELECT (extract(epoch FROM clock_timestamp()) * 1000)::int8 AS ms) AS m;
