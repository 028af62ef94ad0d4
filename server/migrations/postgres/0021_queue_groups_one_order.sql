-- The queue by placement group, in one ascending order: the group, the
-- priority negated (as int8, so that no priority overflows), the rank and
-- the id. The first task of a group after a place in the queue is then one
-- index probe by a row comparison that no other index can serve: with the
-- group index of migration 0015 (priority descending) the probe was a
-- range within the priority and another below it, and PostgreSQL, whose
-- estimate of the range was a row or two, sometimes served the range by
-- `tasks_queue` instead, reading every queued task of the priority past
-- the place, for each group (300-460 ms a probe past 20,000 busy tasks).
DROP INDEX tasks_queue_groups;
CREATE INDEX tasks_queue_groups ON tasks
    ((md5(namespace || chr(31) || kind || chr(31) || placement::text)::uuid),
     (-(priority::int8)), (created_at_ms + fair_offset), id)
    WHERE state = 'queued';
