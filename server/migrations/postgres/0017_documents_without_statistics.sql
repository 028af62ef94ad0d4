-- The task's documents (payload, placement, labels, result, error, progress)
-- take no part in the planner's statistics. No statement filters on them by
-- value (the parked placements are a hashed NOT IN, whose estimate does not
-- use them; labels are matched in the server), but ANALYZE sampled and
-- sorted every one of them, JSON value by JSON value: most of what analyzing
-- `tasks` cost, and the keeper and autovacuum analyze it again as the queue
-- churns. The index on the placement's hash keeps statistics of its own.
ALTER TABLE tasks
    ALTER COLUMN payload SET STATISTICS 0,
    ALTER COLUMN placement SET STATISTICS 0,
    ALTER COLUMN labels SET STATISTICS 0,
    ALTER COLUMN result SET STATISTICS 0,
    ALTER COLUMN error SET STATISTICS 0,
    ALTER COLUMN progress SET STATISTICS 0;
