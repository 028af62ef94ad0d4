-- Leases and history no longer carry foreign keys. Their checks were the
-- largest single cost of a lease on PostgreSQL: every lease row looked up and
-- share-locked its task and its agent, and every history row its task (six
-- checks per task run), about a sixth of the database's CPU with the queue
-- busy. Only the store writes these tables, always in a statement that joins
-- the task and agent rows it has just locked or inserted, and nothing is ever
-- deleted, so no row can point at a task or agent that does not exist. The
-- fault suite checks exactly that after every run (tests/chaos/invariants.py).
ALTER TABLE leases DROP CONSTRAINT leases_task_id_fkey;
ALTER TABLE leases DROP CONSTRAINT leases_agent_id_fkey;
ALTER TABLE task_events DROP CONSTRAINT task_events_task_id_fkey;
