"""The buffer the model tier writes to: events with an optional key (an account)."""

from __future__ import annotations

from sqlalchemy import create_engine
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from outbox import BufferMixin, schema


class ModelBase(DeclarativeBase):
    pass


class ModelEvent(BufferMixin, ModelBase):
    __tablename__ = "model_events"
    account: Mapped[int | None] = mapped_column(nullable=True)
    n: Mapped[int]


def reset(url: str) -> None:
    """Drop and create the framework's tables and the tier's buffer."""
    engine = create_engine(url)
    with engine.begin() as conn:
        ModelBase.metadata.drop_all(conn)
        schema.metadata.drop_all(conn)
        schema.metadata.create_all(conn)
        ModelBase.metadata.create_all(conn)
    engine.dispose()
