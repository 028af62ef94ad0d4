-- A task's retry policy (JSON: initial and maximum backoff, multiplier,
-- jitter); NULL for a task that names none and backs off by the default.
ALTER TABLE tasks ADD COLUMN retry TEXT;
