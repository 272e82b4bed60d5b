"""Celery orders: a Celery shop's own tasks write orders and their events; outbox, installed on
the same Celery application, publishes the events to RabbitMQ in groups."""
