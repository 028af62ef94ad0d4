-- The raw SQL floor's jobs table; bench/run fills it with :jobs queued rows.
CREATE TABLE jobs (
  id bigserial PRIMARY KEY,
  state text NOT NULL DEFAULT 'queued',
  payload jsonb NOT NULL DEFAULT '{}',
  created_at timestamptz NOT NULL DEFAULT now(),
  started_at timestamptz,
  finished_at timestamptz
);
CREATE INDEX jobs_queued ON jobs (id) WHERE state = 'queued';
INSERT INTO jobs (payload) SELECT jsonb_build_object('n', g) FROM generate_series(1, :jobs) g;
VACUUM ANALYZE jobs;
