import importlib.util
import json
import os

SECRET_KEY = "tests-only"
DEBUG = False
USE_TZ = True
INSTALLED_APPS = ["django.contrib.contenttypes", "notifyq.contrib.django", "shop"]
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
DATABASES = {
    "default": {
        "ENGINE": "django.db.backends.mysql",
        "HOST": os.environ.get("NQ_DJANGO_HOST", "127.0.0.1"),
        "PORT": os.environ.get("NQ_DJANGO_PORT", "3306"),
        "USER": os.environ.get("NQ_DJANGO_USER", "root"),
        "PASSWORD": os.environ.get("NQ_DJANGO_PASSWORD", ""),
        "NAME": os.environ.get("NQ_DJANGO_NAME", "nq_django"),
        "TEST": {"NAME": os.environ.get("NQ_DJANGO_TEST_NAME")},
        # "none": persistent connections (CONN_MAX_AGE = None), else seconds (Django's default 0)
        "CONN_MAX_AGE": (None if os.environ.get("NQ_DJANGO_CONN_MAX_AGE") == "none"
                         else int(os.environ.get("NQ_DJANGO_CONN_MAX_AGE", "0"))),
    }
}
NOTIFYQ = {
    "DATABASE": "default",
    "QUEUES": {"orders": {"max_attempts": 3}},
    "CONFIG": json.loads(os.environ.get("NQ_DJANGO_NOTIFYQ_CONFIG", "{}")),
}
LOGGING_CONFIG = None

# Django's task framework, where the project has it (Django 6, or Django 5 with the django-tasks
# backport, an app of its own): notifyq is its backend (shop/dtasks.py, tests/apps/test_django_tasks.py).
if importlib.util.find_spec("django.tasks") or importlib.util.find_spec("django_tasks"):
    if not importlib.util.find_spec("django.tasks"):
        INSTALLED_APPS.append("django_tasks")
    TASKS = {
        "default": {
            "BACKEND": "notifyq.contrib.django.tasks.NotifyqBackend",
            "QUEUES": ["default", "mail"],
            "OPTIONS": json.loads(os.environ.get("NQ_DJANGO_TASKS_OPTIONS", "{}")),
        },
    }
