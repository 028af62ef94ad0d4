-- The submit function plans its statements once per connection (and again
-- only when a table's statistics change), never for one call. PL/pgSQL
-- keeps a plan per statement and connection, but PostgreSQL plans a
-- statement afresh for its first five runs and then keeps a plan only
-- while it costs no more than theirs. The batch's statement (`UNNEST` of
-- the call's arrays) takes as long to plan as a batch of fifteen takes to
-- run, and a live run planned about one call in four afresh (BENCHMARKS.md,
-- "Side by side: the submit function keeps one plan for each of its
-- statements").
-- The kept plan reads live leases by the partial index and runs a batch of
-- 15 or of 1,000 tasks in the time a call's own plan does.
--
-- A setting of the function, not a new one: the signature and the answers
-- are those of migration 0019, so a binary rolled back calls it unchanged.
ALTER FUNCTION switchyard_submit_tasks(
    uuid[], text[], text[], text[], text[], int4[], int8[], int8[], text[], int8[], text[],
    uuid[], uuid[], text[], int8[], int8[], int8[], text[], int8[], int8[], text[], int8
) SET plan_cache_mode = force_generic_plan;
