-- The queue by placement group (namespace, kind and placement, hashed):
-- the dispatcher finds where the queue goes on past its parked tasks by
-- taking each group once, not by reading every parked task.
CREATE INDEX tasks_queue_groups ON tasks
    ((md5(namespace || chr(31) || kind || chr(31) || placement::text)::uuid),
     priority DESC, (created_at_ms + fair_offset), id)
    WHERE state = 'queued';
