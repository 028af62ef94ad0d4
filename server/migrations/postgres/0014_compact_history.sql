-- A history row may stand for the steps a whole fresh attempt takes before
-- its end. With `implied_steps` 2 it stands for accepted (LEASED, "the agent
-- acknowledged the lease") and started (RUNNING, "the agent started the
-- task") at the two sequences before its own; with 1, for started alone at
-- the one before; by the row's agent and lease, at its time. A quick task's
-- accepted, started and end, reported together, take one row instead of
-- three; readers expand it (the store's history reader), so the history
-- reads the same either way. A column with a constant default rewrites
-- nothing, and the check, NOT VALID, holds for new rows without reading the
-- old ones (all 0).
ALTER TABLE task_events ADD COLUMN implied_steps smallint NOT NULL DEFAULT 0;
ALTER TABLE task_events ADD CONSTRAINT task_events_implied_steps
    CHECK (implied_steps BETWEEN 0 AND 2) NOT VALID;
