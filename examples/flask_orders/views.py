"""The web side: ``POST /orders`` writes an order and its event in one ``db.session`` transaction.

The view adds the ``Order`` and its ``OrderPlaced`` event to the session, then takes the
quantity from stock. An order that stock cannot cover is refused with ``409``: the session
rolls back, the event already written with it, so the fulfilment service never hears of it.
Nothing here talks to the fulfilment service: the outbox worker does (``shipping.py``).
"""

from __future__ import annotations

import re
import uuid
from typing import Any

from flask import Blueprint, request
from sqlalchemy import select

from examples.flask_orders.models import Order, OrderPlaced, Product, db

orders = Blueprint("orders", __name__)

COUNTRY = re.compile(r"^[A-Z]{2}$")  # ISO 3166 code, e.g. DE
MAX_QUANTITY = 1000


class RefusedError(Exception):
    """A request the shop cannot take: its HTTP status and why."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


@orders.post("/orders")
def place_order() -> tuple[dict[str, Any], int]:
    """Write one order and its ``OrderPlaced`` event in one transaction; ``409`` if out of stock."""
    try:
        fields = _order_fields(request.get_json(silent=True))
    except RefusedError as refused:
        return {"error": refused.message}, refused.status
    order_id = uuid.uuid4()
    db.session.add(Order(id=order_id, **fields))
    db.session.add(OrderPlaced(order_id=order_id, **fields))
    try:
        _take_from_stock(fields["sku"], fields["quantity"])
    except RefusedError as refused:
        # Both rows were flushed already: the rollback takes the event back with the order.
        db.session.rollback()
        return {"error": refused.message}, refused.status
    db.session.commit()  # the order and its event, or neither
    return {"order_id": str(order_id), **fields}, 201


def _order_fields(body: object) -> dict[str, Any]:
    """The order's fields from the request's JSON; a 400 ``RefusedError`` names a wrong one."""
    if not isinstance(body, dict):
        raise RefusedError(400, "expected a JSON object")
    fields = {}
    for name in ("customer", "sku", "country"):
        value = body.get(name)
        if not (isinstance(value, str) and 0 < len(value) <= 100):
            raise RefusedError(400, f"{name}: expected a string of 1 to 100 characters")
        fields[name] = value
    if not COUNTRY.match(fields["country"]):
        raise RefusedError(400, "country: expected an ISO 3166 code, e.g. DE")
    quantity = body.get("quantity")
    if not (type(quantity) is int and 0 < quantity <= MAX_QUANTITY):
        raise RefusedError(400, f"quantity: expected a whole number from 1 to {MAX_QUANTITY}")
    return {**fields, "quantity": quantity}


def _take_from_stock(sku: str, quantity: int) -> None:
    """Take ``quantity`` of ``sku`` from stock, or raise ``RefusedError`` (404, 409).

    The product's row is locked until the commit (``FOR UPDATE``; on SQLite the transaction
    holds the write lock), so two requests never sell the last one twice.
    """
    product = db.session.scalar(select(Product).where(Product.sku == sku).with_for_update())
    if product is None:
        raise RefusedError(404, f"no product {sku!r}")
    if product.stock < quantity:
        raise RefusedError(409, f"{sku!r} is out of stock")
    product.stock -= quantity
