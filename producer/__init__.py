"""evalq producer: submit, follow and export runs; the CLI; the demo.

The package imports nothing itself, so that a light module of it (the HTTP client,
:mod:`evalq.producer.clients.remote`) loads no Celery, Redis or pyarrow: submit with
:func:`evalq.producer.service.submit.submit` and
:class:`evalq.producer.service.submit.SubmitRequest`.
"""
