"""Tasks of Django's task framework (Django 6's django.tasks, or the django-tasks backport on
Django 5), run by notifyq (settings.TASKS): tests/apps/test_django_tasks.py."""
try:
    from django.tasks import task
except ImportError:
    from django_tasks import task

from shop.models import Order


class Refused(Exception):
    pass


@task
def greet(name: str, *, punct: str = "!") -> dict:
    return {"greeting": f"hello {name}{punct}"}


@task
async def agreet(name: str) -> str:
    return f"hello {name} (async)"


@task
def refuse(why: str) -> None:
    raise Refused(why)


@task(takes_context=True)
def which_attempt(context, fail_first: bool) -> dict:
    if fail_first and context.attempt == 1:
        raise ValueError("the first run fails")
    return {"attempt": context.attempt, "id": context.task_result.id}


@task(queue_name="mail")
def note(name: str) -> None:
    Order.objects.create(name=name)
