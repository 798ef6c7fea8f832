"""The store: the only part that runs SQL or imports the driver (MySQLdb).

db.py holds sessions; driver.py the driver's errors, the one retry policy and how values cross
the wire; pipeline.py what a session sends ahead of its replies; writer.py which Galera node a
process writes through. queries.py runs the hot path (claim, ack, retry, extend), inserts.py an
enqueue's INSERTs, dedup.py its dedup keys, completion.py and results.py a job completed in
the handler's own transaction and its kept result; liveness.py consumer registration and the
reaper's questions; bells.py and advisory.py the wake-up's statements and advisory locks,
locks.py their names; admin_queries.py the operators' and bookkeeping statements; testing.py
notifyq.testing's; schema.py migrations; sql/ the statements themselves. Imports only the
ground floor (config, errors, jobs).
"""
