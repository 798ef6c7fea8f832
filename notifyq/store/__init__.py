"""The store: the only part that runs SQL or imports the driver (MySQLdb).

db.py holds sessions and the one retry policy; queries.py the hot path (enqueue, claim, ack,
reap); bells.py the wake-up's bell statements; admin_queries.py the operators' and bookkeeping statements; schema.py migrations;
locks.py advisory-lock names; sql/ the statements themselves. Imports only the ground floor
(config, errors, jobs, logs).
"""
