from django.apps import AppConfig


class NotifyqConfig(AppConfig):
    name = "notifyq.contrib.django"
    label = "notifyq"
    verbose_name = "notifyq"

    def ready(self) -> None:
        # @notifyq.task's enqueue() puts on the project's database (asked when first used: while
        # tests run, that is the test database).
        from notifyq.tasks import default_registry
        from notifyq.contrib.django.conf import get_config

        default_registry.configure(get_config)
