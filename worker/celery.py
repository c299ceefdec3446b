"""The module-level app for Celery's own command line, the layout Celery's guide uses
(``proj/celery.py``): ``celery -A evalq.worker.celery flower`` or ``... inspect ping``."""

from evalq.shared.settings import get_settings
from evalq.worker.bootstrap import create_worker_app

app = create_worker_app(get_settings())
