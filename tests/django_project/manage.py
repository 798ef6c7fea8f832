#!/usr/bin/env python
"""The Django project of tests/apps/test_django.py: its database comes from NQ_DJANGO_* variables."""
import os
import sys

if __name__ == "__main__":
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "project.settings")
    from django.core.management import execute_from_command_line

    execute_from_command_line(sys.argv)
