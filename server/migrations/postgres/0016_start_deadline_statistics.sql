-- Statistics for the start deadline's expression, over the whole table. Its
-- partial index (tasks_start_deadline) holds no task while none has a start
-- timeout, so ANALYZE sampled none for it and the planner guessed a third of
-- the table for the sweep's search, which made it a parallel scan on a large
-- queue. Knowing the expression is NULL everywhere, it plans the index scan.
CREATE STATISTICS tasks_start_deadline_expr ON (not_before_ms + start_timeout_ms) FROM tasks;
ANALYZE tasks;
