"""The web application: async endpoints that write orders and their events in one transaction.

``POST /orders`` adds an ``Order`` and its ``OrderPlaced`` event to an ``AsyncSession``;
``POST /orders/bulk`` writes many orders, and their events with ``outbox.add_events_async``. Both
then take the quantities from stock, and an order that stock cannot cover is refused with
``409``: its transaction rolls back, the events already written with it, so the fulfilment
service never hears of it. Nothing here talks to the fulfilment service: the outbox worker does
(``outbox_app.py``), beside uvicorn.

Run it with ``uvicorn examples.fastapi_orders.app:app``.
"""

from __future__ import annotations

import os
import uuid
from collections import Counter
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from typing import Annotated

from fastapi import Depends, FastAPI, HTTPException
from pydantic import BaseModel, Field
from sqlalchemy import insert, select, update
from sqlalchemy.ext.asyncio import AsyncSession

from examples.fastapi_orders.database import engine, sessions
from examples.fastapi_orders.models import Base, Order, OrderPlaced, Product
from outbox import add_events_async

# Development only: create the tables and a small catalogue at start-up. In production the
# application's migrations own the schema: set CREATE_TABLES=0.
CREATE_TABLES_ENV = "CREATE_TABLES"
# "signed-print" has one left: the second order of it is refused, and rolled back.
CATALOGUE = {"mug": 1_000_000, "poster": 1_000_000, "signed-print": 1}
MAX_BULK_ORDERS = 1000


class OrderIn(BaseModel):
    """An order as a client places it."""

    customer: str = Field(min_length=1, max_length=100)
    sku: str = Field(min_length=1, max_length=40)
    quantity: int = Field(gt=0, le=1000)
    country: str = Field(pattern=r"^[A-Z]{2}$", description="ISO 3166 code, e.g. DE")


class OrderOut(OrderIn):
    """An order as it was written."""

    order_id: uuid.UUID


class BulkIn(BaseModel):
    """Many orders, written in one transaction: all of them, or none."""

    orders: list[OrderIn] = Field(min_length=1, max_length=MAX_BULK_ORDERS)


class BulkOut(BaseModel):
    """The ids of the orders written, in the order they were given."""

    order_ids: list[uuid.UUID]


@asynccontextmanager
async def lifespan(app: FastAPI) -> AsyncIterator[None]:
    """Create the tables in development; close the engine's connections at shutdown."""
    if os.environ.get(CREATE_TABLES_ENV, "1") == "1":
        await create_tables()
    yield
    await engine.dispose()


async def create_tables() -> None:
    """The application's tables (the buffer included) and the catalogue, where missing.

    outbox's own tables are not among them: ``outbox migrate`` creates those.
    """
    async with engine.begin() as conn:
        await conn.run_sync(Base.metadata.create_all)
    async with sessions.begin() as session:
        existing = set(await session.scalars(select(Product.sku)))
        session.add_all(
            Product(sku=sku, stock=stock) for sku, stock in CATALOGUE.items() if sku not in existing
        )


app = FastAPI(title="Orders", lifespan=lifespan)


async def session() -> AsyncIterator[AsyncSession]:
    """One session per request; each endpoint opens its own transaction in it."""
    async with sessions() as session:
        yield session


SessionDependency = Annotated[AsyncSession, Depends(session)]


@app.get("/health")
async def health() -> dict[str, str]:
    """Up, tables created."""
    return {"status": "ok"}


@app.post("/orders", status_code=201)
async def place_order(order: OrderIn, session: SessionDependency) -> OrderOut:
    """Write one order and its ``OrderPlaced`` event in one transaction; ``409`` if out of stock."""
    order_id = uuid.uuid4()
    fields = order.model_dump()
    async with session.begin():
        session.add(Order(id=order_id, **fields))
        session.add(OrderPlaced(order_id=order_id, **fields))
        await reserve_stock(session, {order.sku: order.quantity})
    return OrderOut(order_id=order_id, **fields)


@app.post("/orders/bulk", status_code=201)
async def place_orders(bulk: BulkIn, session: SessionDependency) -> BulkOut:
    """Write many orders and their events in one transaction; ``409`` if any is out of stock."""
    ids = [uuid.uuid4() for _ in bulk.orders]
    fields = [order.model_dump() for order in bulk.orders]
    quantities: Counter[str] = Counter()
    for order in bulk.orders:
        quantities[order.sku] += order.quantity
    async with session.begin():
        # Each is one executemany: no ORM object per order or per event.
        await session.execute(
            insert(Order), [{"id": i, **f} for i, f in zip(ids, fields, strict=True)]
        )
        await add_events_async(
            session, OrderPlaced, [{"order_id": i, **f} for i, f in zip(ids, fields, strict=True)]
        )
        await reserve_stock(session, quantities)
    return BulkOut(order_ids=ids)


async def reserve_stock(session: AsyncSession, quantities: Mapping[str, int]) -> None:
    """Take ``quantities`` (sku -> how many) from stock, or raise ``409`` (``404``: no such sku).

    Runs after the orders and their events are written, in the same transaction: raising rolls
    all of them back. Each decrement is one ``UPDATE ... RETURNING``, which locks the product's
    row until the commit, so two requests never sell the last one twice.
    """
    await session.flush()
    # Sorted: concurrent requests lock products in the same order, so they cannot deadlock.
    for sku in sorted(quantities):
        left = await session.scalar(
            update(Product)
            .where(Product.sku == sku)
            .values(stock=Product.stock - quantities[sku])
            .returning(Product.stock)
        )
        if left is None:
            raise HTTPException(404, f"no product {sku!r}")
        if left < 0:
            raise HTTPException(409, f"{sku!r} is out of stock")
