"""Consuming: the worker's claim -> run -> ack loop (worker.py, batch.py), the process that supervises
workers (service.py), dead-peer recovery (reaper.py), handler loading, job-retry policy and
periodic jobs. Imports produce (periodic jobs enqueue), ops (metrics), wakeup, store and the
ground floor; never run.
"""
