"""Getting samples to workers: the Celery app, message sizing, the runs' backlogs and the weighted
fair dispatcher (its Lua in ``lua/``), and the broker glue."""
