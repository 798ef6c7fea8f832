-- notifyq schema, version 2: crash suspects.
--
-- suspect = 1: the job was in a consumer's hands when that consumer died or stalled (its claim
-- was taken back). It is claimed alone from then on, so that if it crashes its consumer again,
-- the crash is charged to it and to no other job. See the README's delivery contract.
--
-- Added last, so the ALTER is instant (no table rebuild) on MySQL 8.0.12+ and MariaDB 10.3+.
-- MySQL has no ADD COLUMN IF NOT EXISTS: the column is added only when information_schema does not
-- list it yet, so an `init` interrupted after this statement can simply be run again.
SET @nq_ddl = IF((SELECT COUNT(*) FROM information_schema.COLUMNS
                  WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = 'nq_job' AND COLUMN_NAME = 'suspect') = 0,
                 'ALTER TABLE nq_job ADD COLUMN suspect TINYINT UNSIGNED NOT NULL DEFAULT 0',
                 'DO 0');
PREPARE nq_stmt FROM @nq_ddl;
EXECUTE nq_stmt;
DEALLOCATE PREPARE nq_stmt;
