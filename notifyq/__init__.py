"""notifyq: a durable job queue in MySQL 8.0+ / MariaDB 10.6+."""

from notifyq.config import Config, load as load_config
from notifyq.errors import NotifyqError
from notifyq.jobs import Job, Status
from notifyq.producer import Producer
from notifyq.service import ConsumeOptions, ConsumerService

__all__ = ["Config", "ConsumeOptions", "ConsumerService", "Job", "NotifyqError", "Producer",
           "Status", "load_config"]
