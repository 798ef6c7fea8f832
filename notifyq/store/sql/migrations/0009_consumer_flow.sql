-- notifyq schema, version 9: the flow settings a consumer applies, recorded with its registration.
--
-- flow: per queue the consumer consumes, the limits, fairness and rates its config gives it
-- (JSON: {"queue": {"limit": 0, "limit_per_key": 2, "key_limits": [["vip", 5]], "rate": "",
-- "rate_per_key": "3/1h", "fair": true}}), written at registration and again after a reload
-- changed them. Information only (the console's flow pages show what the live consumers apply
-- and where they disagree): no claim reads it. NULL: a consumer that does not record it (a
-- consumer of an older version still running through the upgrade), shown as unknown.
-- Added last, nullable, so the ALTER is instant (MySQL 8.0.12+, MariaDB 10.3+); only when not
-- there yet, so an interrupted `init` can simply run again.
SET @nq_ddl = IF((SELECT COUNT(*) FROM information_schema.COLUMNS
                  WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = 'nq_consumer' AND COLUMN_NAME = 'flow') = 0,
                 'ALTER TABLE nq_consumer ADD COLUMN flow MEDIUMTEXT NULL',
                 'DO 0');
PREPARE nq_stmt FROM @nq_ddl;
EXECUTE nq_stmt;
DEALLOCATE PREPARE nq_stmt;
