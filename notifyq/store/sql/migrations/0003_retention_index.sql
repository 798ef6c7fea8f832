-- notifyq schema, version 2: an index for retention, so a purge pass reads only the jobs it
-- deletes (the id-paged read it replaces walked every job of the table to find them).
-- done/dead jobs always carry finished_at; pending jobs' NULLs sort first and are never read.
-- Idempotent on MySQL 8 and MariaDB alike (MySQL has no ADD INDEX IF NOT EXISTS): an
-- interrupted `notifyq init` runs it again.
SET @nq_ddl = IF((SELECT COUNT(*) FROM information_schema.STATISTICS
                  WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = 'nq_job' AND INDEX_NAME = 'ix_finished') = 0,
                 'ALTER TABLE nq_job ADD INDEX ix_finished (queue, status, finished_at)', 'DO 0');
PREPARE nq_ddl FROM @nq_ddl;
EXECUTE nq_ddl;
DEALLOCATE PREPARE nq_ddl;
