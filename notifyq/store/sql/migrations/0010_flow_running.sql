-- notifyq schema, version 10 (PROTOTYPE, branch keyed-proto: measured, not shipped): each key's
-- running jobs kept in its nq_flow_key row, off nq_job's hot pages. A limited claim adds its grant
-- to its keys' rows (held FOR UPDATE by its KeyGate) in its transaction; an ack or failure of a
-- limited queue's keyed jobs subtracts in its own. Other paths that end a run (reap, cancel,
-- give-back, purge) do not: the counter drifts there.
SET @nq_ddl = IF((SELECT COUNT(*) FROM information_schema.COLUMNS
                  WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = 'nq_flow_key' AND COLUMN_NAME = 'running') = 0,
                 'ALTER TABLE nq_flow_key ADD COLUMN running INT NOT NULL DEFAULT 0',
                 'DO 0');
PREPARE nq_stmt FROM @nq_ddl;
EXECUTE nq_stmt;
DEALLOCATE PREPARE nq_stmt;
-- The "+w" variant (measured apart): the job's key in ix_state after its id, so the head read
-- (flow_head_keys) is index-only. Uncomment to make it:
-- ALTER TABLE nq_job DROP INDEX ix_state, ADD INDEX ix_state (status, queue, prio_key, sort_at, id, job_key);
