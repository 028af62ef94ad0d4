-- The raw SQL floor: claim one queued job (its own transaction), then mark
-- it done (another), as a worker that holds a lease while it works would.
UPDATE jobs SET state = 'running', started_at = now()
 WHERE id = (SELECT id FROM jobs WHERE state = 'queued' ORDER BY id LIMIT 1 FOR UPDATE SKIP LOCKED)
 RETURNING id \gset
UPDATE jobs SET state = 'done', finished_at = now() WHERE id = :id;
