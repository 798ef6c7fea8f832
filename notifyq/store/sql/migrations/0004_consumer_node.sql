-- notifyq schema, version 4: the server a consumer holds its liveness lock on.
--
-- Advisory locks are local to one server: on a Galera cluster a lock held on node 1 reads as free
-- on node 2. A consumer records where its lock lives (CONCAT(@@hostname, ':', @@port) of its lock
-- session); a reaper judges by the lock only the consumers registered on its own server, and the
-- others by their heartbeat (last_seen). '' (rows from before this version): judged by the lock.
--
-- Added last, so the ALTER is instant; idempotent like 0002 (MySQL has no ADD COLUMN IF NOT EXISTS).
SET @nq_ddl = IF((SELECT COUNT(*) FROM information_schema.COLUMNS
                  WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = 'nq_consumer' AND COLUMN_NAME = 'node') = 0,
                 'ALTER TABLE nq_consumer ADD COLUMN node VARCHAR(320) NOT NULL DEFAULT ''''',
                 'DO 0');
PREPARE nq_stmt FROM @nq_ddl;
EXECUTE nq_stmt;
DEALLOCATE PREPARE nq_stmt;
