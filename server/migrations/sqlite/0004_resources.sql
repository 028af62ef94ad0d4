-- Consumable resources: a lease holds slots (one unless its task asks for
-- more) and, for a task with a resource request, a claim (JSON: amounts and
-- the GPU ids assigned). Capacity is counted as the slots live leases hold.
ALTER TABLE leases ADD COLUMN slots INTEGER NOT NULL DEFAULT 1 CHECK (slots >= 1);
ALTER TABLE leases ADD COLUMN claim TEXT;
