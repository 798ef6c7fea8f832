"""Processes and the CLI: click commands (cli.py, cli_jobs.py), the producer and consumer
processes (runner.py), daemon mode and sd_notify (daemon.py), the demo and the private server
it and the tests start (localserver.py). The top floor: may import every other part.
"""
