"""outbox inside other people's processes: a Celery worker, a uvicorn app and a Flask app."""
