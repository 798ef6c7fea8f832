import notifyq

from shop.models import Order


@notifyq.task(queue="orders", max_attempts=2, priority=5)
def make_order(name: str, *, copies: int = 1) -> None:
    for _ in range(copies):
        Order.objects.create(name=name)
