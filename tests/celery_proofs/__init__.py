"""The Celery executor proven with real brokers and real ``celery worker`` and ``celery beat``
processes, on PostgreSQL and MariaDB."""
