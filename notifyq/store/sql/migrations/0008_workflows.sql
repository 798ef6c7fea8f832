-- notifyq schema, version 8: workflows (a job that waits for others: dependencies, chains,
-- batches with callbacks).
--
-- nq_edge: one row per (parent, child): the child waits until the parent ends. `state` says
-- where the edge is: 0 waiting, 2 the parent is done, 3 the parent ended dead or cancelled;
-- 1 and 4 live only inside the transaction that ends the parent (marked, not yet counted on the
-- child), so a retried ack never counts an edge twice. The child's queue is kept on the edge:
-- the ack that releases children bumps their queues' signals without reading the children.
-- The edges outlive their parents (a child's progress reads them); the sweep drops a child's once
-- the child is gone.
CREATE TABLE IF NOT EXISTS nq_edge (
    parent_id    BIGINT UNSIGNED   NOT NULL,
    child_id     BIGINT UNSIGNED   NOT NULL,
    child_queue  VARCHAR(64)       NOT NULL,
    state        TINYINT UNSIGNED  NOT NULL DEFAULT 0,
    PRIMARY KEY (parent_id, child_id),
    -- A child's parents: its progress, its parents' results, retention
    KEY ix_child (child_id),
    -- The sweep's scans: waiting edges (state 0), settled ones of children gone (2, 3)
    KEY ix_state (state, parent_id)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;

-- A waiting job (status 6): waits_on counts the parents not yet ended; after_mode says when it
-- runs (0: every parent done; 1: every parent ended, whatever the outcome: run anyway,
-- on_complete; 2: every parent ended and one at least dead or cancelled: on_dead);
-- parents_failed counts the parents that ended dead or cancelled. Instant ALTERs (MySQL
-- 8.0.12+, MariaDB 10.3+), each only when not there yet, so an interrupted `init` can simply
-- run again.
SET @nq_ddl = IF((SELECT COUNT(*) FROM information_schema.COLUMNS
                  WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = 'nq_job' AND COLUMN_NAME = 'waits_on') = 0,
                 'ALTER TABLE nq_job ADD COLUMN waits_on INT UNSIGNED NOT NULL DEFAULT 0, ADD COLUMN after_mode TINYINT UNSIGNED NOT NULL DEFAULT 0, ADD COLUMN parents_failed INT UNSIGNED NOT NULL DEFAULT 0',
                 'DO 0');
PREPARE nq_stmt FROM @nq_ddl;
EXECUTE nq_stmt;
DEALLOCATE PREPARE nq_stmt;
