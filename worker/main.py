"""Module-level app for the ``celery`` command line: ``celery -A worker.main worker``."""

from shared.settings import get_settings
from worker.app import create_worker_app

app = create_worker_app(get_settings())
