"""The module-level app for Celery's own command line, the layout Celery's guide uses
(``proj/celery.py``): ``celery -A worker.celery flower`` or ``... inspect ping``."""

from shared.settings import get_settings
from worker.bootstrap import create_worker_app

app = create_worker_app(get_settings())
