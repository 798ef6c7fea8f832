"""`manage.py notifyq COMMAND ...`: every `notifyq` command, with the database and settings of
the Django project (settings.NOTIFYQ), handlers inside Django's connection hygiene."""

from __future__ import annotations

import argparse

from django.core.management.base import BaseCommand

from notifyq.contrib.django.conf import get_config
from notifyq.contrib.django.enqueue import job_hygiene
from notifyq.run import cli


class Command(BaseCommand):
    help = "notifyq's commands (consume, produce, status, jobs ...) on the project's database."

    def add_arguments(self, parser):
        parser.add_argument("argv", nargs=argparse.REMAINDER, help="what follows `notifyq`, e.g. consume -q emails")

    def run_from_argv(self, argv):
        # Everything after `manage.py notifyq` is notifyq's own command line (--help included),
        # except Django's --settings/--pythonpath, which manage.py has already applied.
        self._called_from_command_line = True
        rest = argv[2:]
        cleaned = []
        skip = False
        for i, arg in enumerate(rest):
            if skip:
                skip = False
                continue
            if arg in ("--settings", "--pythonpath"):
                skip = True
                continue
            if arg.startswith(("--settings=", "--pythonpath=")):
                continue
            cleaned.append(arg)
        self.handle(argv=cleaned)

    def handle(self, *args, argv=(), **options):
        host = cli.Host(load=get_config, consume_options={"around_job": job_hygiene},
                        no_dsn="manage.py notifyq uses the database of settings.NOTIFYQ['DATABASE']")
        cli.main(list(argv), host=host)
