-- Registrations that replaced a live session of the same name: two runners
-- sharing one name replace each other in a loop, and the server says so.
-- takeovers counts such registrations while each comes within ten minutes
-- of the one before; replaced_runner is the runner the last one replaced.
ALTER TABLE agents ADD COLUMN takeovers INTEGER NOT NULL DEFAULT 0;
ALTER TABLE agents ADD COLUMN last_takeover_at_ms BIGINT;
ALTER TABLE agents ADD COLUMN replaced_runner TEXT NOT NULL DEFAULT '';
