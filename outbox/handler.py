"""A batch handler as registered (:class:`Handler`), how often it may see a group
(:class:`Delivery`), and the checks a registration passes before any group is run.

:meth:`outbox.Outbox.handler` and :meth:`~outbox.Outbox.add_handler` register handlers; every
option is checked here, where it is given, so that a wrong value is refused in one line naming
the handler and the option rather than failing every group later.
"""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field, replace
from enum import StrEnum
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from sqlalchemy import JSON, Float, Table, TypeDecorator
from sqlalchemy import inspect as sa_inspect
from sqlalchemy.types import TypeEngine

from outbox._core import handler_kind
from outbox._core.checks import MAX_WAIT_SECONDS, is_number
from outbox.batch import Batch
from outbox.breaker import CircuitBreaker
from outbox.buffer import BufferMixin
from outbox.exceptions import ConfigurationError
from outbox.ratelimit import RateLimit, Unit
from outbox.retry import RetryPolicy
from outbox.urgency import Urgency

if TYPE_CHECKING:
    from outbox.flags import FlagSource

MAX_BATCH_SIZE = 100_000
MAX_MAX_BATCHES = 10_000
# The buffer's own columns, which no option may name as an event's.
_BOOKKEEPING = ("id", "group_id", "created_at")
_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_.:-]{0,199}$")
EventT = TypeVar("EventT", bound=BufferMixin)


class Delivery(StrEnum):
    """How often a handler may see a group.

    ``AT_LEAST_ONCE`` (the default): a group whose attempt was interrupted (its worker died, its
    handler timed out) is handed over again; handlers must be idempotent.
    ``AT_MOST_ONCE``: for handlers that are not idempotent. A group whose attempt was
    interrupted is dead-lettered instead of being run again: it may or may not have been
    delivered, and running it twice is the one thing not allowed. A handler that raises still
    has its group retried: by raising, it said that it delivered nothing.
    """

    AT_LEAST_ONCE = "at_least_once"
    AT_MOST_ONCE = "at_most_once"


@dataclass(frozen=True, slots=True)
class Handler(Generic[EventT]):
    """A registered batch handler and its options (see :meth:`Outbox.handler`)."""

    name: str
    model: type[EventT]
    func: Callable[[Batch[EventT]], Awaitable[None] | None] = field(repr=False)
    batch_size: int
    urgency: Urgency
    retry: RetryPolicy
    archive: bool
    max_batches: int
    timeout: float | None = None
    expires_after: float | None = None
    delivery: Delivery = Delivery.AT_LEAST_ONCE
    max_wait: float | None = None
    concurrency: int | None = None
    circuit_breaker: CircuitBreaker | None = None
    rate_limit: RateLimit | Sequence[RateLimit] | None = None
    bisect: bool = False
    max_batch_bytes: int | None = None
    group_by: str | None = None
    ordering_key: str | None = None
    rate_limit_key: str | None = None
    coalesce: bool = False
    """Hand each group only the latest event of each ``ordering_key`` value; the others are
    archived as ``superseded``."""
    copy_to: tuple[type[Any], ...] = ()
    """Buffer models each succeeded group is copied into, in the transaction that removes it
    from this buffer: a fan-out (:meth:`Outbox.fanout`)."""
    flags: FlagSource | None = None
    """The business rows this handler works on, when it is a flag handler
    (:meth:`Outbox.flagged`): their flags are cleared when its groups succeed."""
    is_async: bool = field(init=False, repr=False, compare=False)
    """Whether ``func`` returns a coroutine (``async def`` and the like), decided once here."""
    rate_limits: tuple[RateLimit, ...] = field(init=False, repr=False, compare=False)
    """Every rate limit of the handler, each with the key it applies per (``rate_limit_key``
    for those that name none), the key named as the table names its column."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "is_async", handler_kind.is_async(self.func))
        object.__setattr__(self, "rate_limits", _rate_limits(self))

    @property
    def table(self) -> Table:
        """The buffer table the handler drains."""
        return self.model.__table__  # type: ignore[attr-defined, no-any-return]

    @property
    def tables(self) -> tuple[Table, ...]:
        """Every table the handler needs: its buffer, then those it copies into, or the
        business table of its flags."""
        business = () if self.flags is None else (self.flags.table,)
        return (self.table, *(model.__table__ for model in self.copy_to), *business)

    @property
    def claims_take_turns(self) -> bool:
        """Whether the handler's claims take turns across the fleet: an ordered handler's do,
        as two at once could each take rows of one key, the second past the first one's locked
        rows. A flag handler's need not: its buffer holds one row per key (the business row's,
        unique), so a claim only has to skip the rows another one locked."""
        return self.ordering_key is not None and self.flags is None


def delivery_of(value: Delivery | str) -> Delivery:
    try:
        return Delivery(value)
    except ValueError:
        choices = ", ".join(d.value for d in Delivery)
        raise ConfigurationError(f"delivery must be one of {choices}, got {value!r}") from None


# What each option of a handler must be (or None, but for those in _REQUIRED), checked before
# its value, so that a wrong kind of value is refused here rather than failing every group.
_OPTION_KINDS: dict[str, tuple[type, ...]] = {
    "batch_size": (int,),
    "max_batches": (int,),
    "urgency": (Urgency,),
    "delivery": (Delivery,),
    "retry": (RetryPolicy,),
    "archive": (bool,),
    "bisect": (bool,),
    "coalesce": (bool,),
    "concurrency": (int,),
    "max_batch_bytes": (int,),
    "timeout": (int, float),
    "expires_after": (int, float),
    "max_wait": (int, float),
    "circuit_breaker": (CircuitBreaker,),
    "group_by": (str,),
    "ordering_key": (str,),
    "rate_limit_key": (str,),
}
_REQUIRED = (
    "batch_size",
    "max_batches",
    "urgency",
    "delivery",
    "retry",
    "archive",
    "bisect",
    "coalesce",
)


def _check_kinds(handler: Handler[Any]) -> None:
    for option, kinds in _OPTION_KINDS.items():
        value = getattr(handler, option)
        if value is None and option not in _REQUIRED:
            continue
        # A bool is an int to isinstance, but True as a batch size is a mistake.
        if not isinstance(value, kinds) or (isinstance(value, bool) and bool not in kinds):
            names = " or ".join(kind.__name__ for kind in kinds)
            optional = "" if option in _REQUIRED else " or None"
            raise ConfigurationError(
                f"handler {handler.name!r}: {option} must be {names}{optional}, got {value!r}"
            )


# Column types a key option cannot have. group_by finds each key's rows by the value it read
# back, which a float may not equal once read (MariaDB's FLOAT is single precision) and a JSON
# document may not equal as stored; ordering_key compares a column with itself, which JSON
# cannot on PostgreSQL. rate_limit_key is read in Python only: any type will do.
_UNFIT_KEY_TYPES: dict[str, tuple[type[TypeEngine[Any]], ...]] = {
    "group_by": (Float, JSON),
    "ordering_key": (JSON,),
}
_WHY_UNFIT = {
    "group_by": "a float or JSON value read back may not compare equal to the stored one",
    "ordering_key": "JSON has no equality on every database",
}


def _underlying(column_type: TypeEngine[Any]) -> TypeEngine[Any]:
    """The type a TypeDecorator stores its values as (the type itself for any other)."""
    while isinstance(column_type, TypeDecorator):
        column_type = column_type.impl_instance
    return column_type


def _column_key(model: type[Any], name: str | None) -> str | None:
    """A column named by the model's attribute (``page``) or the table's column
    (``page_path``): the key the table knows it by (``table.c``), which its SQL uses."""
    if name is None or name in model.__table__.c:
        return name
    mapper = sa_inspect(model, raiseerr=False)
    attribute = None if mapper is None else mapper.attrs.get(name)
    columns: list[Any] = list(getattr(attribute, "columns", ()))
    if len(columns) == 1 and columns[0].table is model.__table__:
        return str(columns[0].key)
    return name


def validated(handler: Handler[Any]) -> Handler[Any]:
    """The handler, its options checked, its key columns named as the table names them."""
    _check_kinds(handler)
    model = handler.model
    if not (isinstance(model, type) and issubclass(model, BufferMixin)):
        raise ConfigurationError(
            f"{getattr(model, '__name__', model)!r} is not a buffer model: "
            "a handler's model must inherit outbox.BufferMixin"
        )
    if getattr(model, "__table__", None) is None:
        raise ConfigurationError(f"{model.__name__} is not a mapped model (no __table__)")
    if not _NAME.fullmatch(handler.name):
        raise ConfigurationError(
            f"handler name {handler.name!r} is not valid: letters, digits, _ . : -, "
            "starting with a letter or _, at most 200 characters"
        )
    if not 1 <= handler.batch_size <= MAX_BATCH_SIZE:
        raise ConfigurationError(
            f"handler {handler.name!r}: batch_size must be 1..{MAX_BATCH_SIZE}, "
            f"got {handler.batch_size}"
        )
    if not 1 <= handler.max_batches <= MAX_MAX_BATCHES:
        raise ConfigurationError(
            f"handler {handler.name!r}: max_batches must be 1..{MAX_MAX_BATCHES}, "
            f"got {handler.max_batches}"
        )
    if handler.concurrency is not None and handler.concurrency < 1:
        raise ConfigurationError(
            f"handler {handler.name!r}: concurrency must be >= 1 or None, "
            f"got {handler.concurrency!r}"
        )
    keys = {
        option: _column_key(model, getattr(handler, option))
        for option in ("group_by", "ordering_key", "rate_limit_key")
    }
    for option, column in keys.items():
        if column is not None and (column not in handler.table.c or column in _BOOKKEEPING):
            raise ConfigurationError(
                f"handler {handler.name!r}: {option} must name a column of "
                f"{handler.table.name!r} other than {', '.join(_BOOKKEEPING)} (its attribute "
                f"on {model.__name__}, or its name in the table), got {column!r}"
            )
    _check_rate_limits(handler)
    if handler.coalesce and keys["ordering_key"] is None:
        # Without one group of a key at a time, in id order, an older state could be
        # delivered after a newer one in a group that ran beside it.
        raise ConfigurationError(
            f"handler {handler.name!r}: coalesce=True needs ordering_key, the column whose "
            "latest event stands for the others"
        )
    if handler.coalesce and handler.bisect:
        raise ConfigurationError(
            f"handler {handler.name!r}: coalesce=True and bisect=True do not go together: a "
            "half would hand over a key's latest event without the events it stands for"
        )
    for option, unfit in _UNFIT_KEY_TYPES.items():
        column = keys[option]
        if column is None:
            continue
        column_type = _underlying(handler.table.c[column].type)
        if isinstance(column_type, unfit):
            raise ConfigurationError(
                f"handler {handler.name!r}: {option} cannot be {column!r}, a "
                f"{type(column_type).__name__} column: a key is compared in SQL, and "
                f"{_WHY_UNFIT[option]} (use an integer, string, enum, UUID or date column)"
            )
    if handler.max_batch_bytes is not None and handler.max_batch_bytes < 1:
        raise ConfigurationError(
            f"handler {handler.name!r}: max_batch_bytes must be >= 1 or None, "
            f"got {handler.max_batch_bytes!r}"
        )
    for option, zero_allowed in (("max_wait", True), ("timeout", False), ("expires_after", False)):
        value = getattr(handler, option)
        if value is not None and not (
            is_number(value)
            and (value > 0 or (zero_allowed and value == 0))
            and value <= MAX_WAIT_SECONDS
        ):
            lowest = ">= 0" if zero_allowed else "> 0"
            raise ConfigurationError(
                f"handler {handler.name!r}: {option} must be {lowest} seconds and at most a "
                f"year ({MAX_WAIT_SECONDS:.0f}), or None, got {value!r}"
            )
    refused = handler_kind.refusal(handler.name, handler.func)
    if refused is not None:
        raise ConfigurationError(refused)
    return replace(
        handler,
        group_by=keys["group_by"],
        ordering_key=keys["ordering_key"],
        rate_limit_key=keys["rate_limit_key"],
    )


def _given_limits(handler: Handler[Any]) -> tuple[RateLimit, ...] | None:
    """The limits as given: None when ``rate_limit`` is not a limit or a sequence of them."""
    given = handler.rate_limit
    if given is None:
        return ()
    if isinstance(given, RateLimit):
        return (given,)
    if isinstance(given, Sequence) and not isinstance(given, str):
        limits = tuple(given)
        if all(isinstance(limit, RateLimit) for limit in limits):
            return limits
    return None


def _rate_limits(handler: Handler[Any]) -> tuple[RateLimit, ...]:
    """The handler's limits, each with its key resolved (see ``Handler.rate_limits``)."""
    limits = _given_limits(handler) or ()
    if getattr(handler.model, "__table__", None) is None:
        return limits  # not a mapped model: refused at registration
    return tuple(
        replace(limit, key=_column_key(handler.model, limit.key or handler.rate_limit_key))
        if limit.key or handler.rate_limit_key
        else limit
        for limit in limits
    )


def _check_rate_limits(handler: Handler[Any]) -> None:
    """``rate_limit``: limits whose keys are columns of the buffer, and whose events windows
    each hold a whole group (a group larger than one could never be sent within it)."""
    if _given_limits(handler) is None:
        raise ConfigurationError(
            f"handler {handler.name!r}: rate_limit must be RateLimit, a sequence of RateLimit, "
            f"or None, got {handler.rate_limit!r}"
        )
    if handler.rate_limit_key is not None and not handler.rate_limits:
        raise ConfigurationError(
            f"handler {handler.name!r}: rate_limit_key needs a rate_limit to apply per key"
        )
    for limit in handler.rate_limits:
        if limit.key is not None and (
            limit.key not in handler.table.c or limit.key in _BOOKKEEPING
        ):
            raise ConfigurationError(
                f"handler {handler.name!r}: rate_limit's key must name a column of "
                f"{handler.table.name!r} other than {', '.join(_BOOKKEEPING)} (its attribute "
                f"on {handler.model.__name__}, or its name in the table), got {limit.key!r}"
            )
        for window in limit.windows():
            if window.unit is Unit.EVENTS and window.exact and window.capacity < handler.batch_size:
                raise ConfigurationError(
                    f"handler {handler.name!r}: rate_limit allows {window.capacity} events "
                    f"in {window.period:g} s, fewer than batch_size {handler.batch_size}: a "
                    f"full group could never be sent within it (lower batch_size)"
                )
