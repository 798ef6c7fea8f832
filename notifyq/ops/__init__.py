"""Operators' tools as a library: admin actions on jobs (admin.py), the status report
(status.py, one server's) and Prometheus metrics (metrics.py). Imports store and the ground floor only.
"""
