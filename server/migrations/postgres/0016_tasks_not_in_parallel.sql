-- The queue table is never read by a parallel plan. A parallel scan takes
-- every core from the dispatch beside it, and the planner chose them where
-- they cost most: the sweep's search for tasks past their start deadline
-- found the partial index empty (no task had a start timeout), had no
-- statistics for its expression, guessed a third of the table, and started
-- two workers every second beside a million queued tasks (5-7 ms alone,
-- 20-80 ms beside the bench; 0.09 ms as a plain index scan). The task
-- gauge's count takes 300 ms of one core instead of 170 ms of three.
ALTER TABLE tasks SET (parallel_workers = 0);
