"""Consuming: the worker's claim -> run -> ack loop (worker.py, batch.py; what becomes of each job,
outcomes.py; the successes that ride the next claim, acking.py; its handler's timeout, timeout.py; job.transaction(), effects.py), the process that
supervises workers (service.py, its main loop supervisor.py; stall.py, summary.py, stats.py),
its presence on the database (presence.py, heartbeat.py), dead-peer recovery (reaper.py), jobs
of mixed duration (lineup.py), handlers (the Handler protocol, handler.py; Python callables,
handlers.py; commands, commands.py; tasks, tasks.py; the on_failure hook, reporting.py), the
job-retry policy (retry.py) and periodic jobs with retention (periodic.py). Imports produce
(periodic jobs enqueue; the lineup watch wakes as a producer does; complete_in's connection),
ops (retention's chunks), wakeup, store and the ground floor; never run.
"""
