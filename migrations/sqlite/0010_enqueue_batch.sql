-- Switchyard schema, version 10 (sqlite): nothing changes. On Postgres, version 10 adds the
-- function that runs the inbound batch in one call
-- (migrations/postgres/0010_enqueue_batch.sql); SQLite runs the batch in the pod, on its one
-- writer connection, and both schemas keep one version number.
SELECT 1;
