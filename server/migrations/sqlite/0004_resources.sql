-- Consumable resources: a lease holds slots (one unless its task asks for
-- more) and, for a task with a resource request, a claim (JSON: amounts and
-- the GPU ids assigned). Capacity is counted as the slots live leases hold.
-- An agent's `resources` section is read beside its document (what a grant
-- that claims resources checks against).
ALTER TABLE leases ADD COLUMN slots INTEGER NOT NULL DEFAULT 1 CHECK (slots >= 1);
ALTER TABLE leases ADD COLUMN claim TEXT;
ALTER TABLE agents ADD COLUMN resources TEXT GENERATED ALWAYS AS (json_extract(document, '$.resources')) VIRTUAL;
