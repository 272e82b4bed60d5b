"""The examples in the docs (README.md, docs/*.md, docs/sinks/*.md) run as they are written.

Python: every ``python`` code block compiles, and every name it imports from outbox exists. A
block *runs* when every name it uses is defined in it or is one the docs use throughout without
defining it (``PRELUDE``: ``app``, ``Base``, ``Mapped``, the buffer models the pages name, ...):
it is executed, on a fresh SQLite file, in a namespace of its own that starts with the prelude,
so that every option, class and argument it names is the code's (a prelude model the block
defines itself is left out). The blocks that name something else (a ``session``, a
``request``, an alembic ``context``) or import the reader's own modules (``myapp``) are
fragments, compiled and import-checked only. A block that registers a ready-made broker sink
(RabbitMQ, NATS JetStream, Redis Streams) runs with its broker URL replaced by the test
server's, and its sinks are then started and stopped as a worker does, against the exchange
``orders`` and the stream ``ORDERS`` (on ``orders.>``) the docs name, made for the test when
missing; an HTTP sink is built and registered, not started (its API is the reader's).

The command: every ``outbox`` command line in a shell block (``sh``, ``bash``, ``console``)
names a command that exists, with options it has; so does an inline code span or a line of
another block that begins with ``outbox`` and a command's name or an option (``outbox tables
are up to date`` is output); so does the command of a ``crontab`` line and a container's
``command:`` or ``args:`` list in a ``yaml`` block (a Kubernetes CronJob); so does each row of
the command table of docs/operations.md.
"""

from __future__ import annotations

import ast
import asyncio
import builtins
import importlib.util
import json
import re
import shlex
import sys
import types
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import click
import pytest

from outbox import Outbox
from outbox.cli import main
from outbox.cli._main import register_all
from outbox.worker import Worker
from tests.sinks.kinds import nats as nats_kind
from tests.sinks.kinds import rabbitmq as rabbitmq_kind
from tests.sinks.kinds import redis as redis_kind

register_all()  # every command in `main.commands`, as the pages name them
ROOT = Path(__file__).resolve().parents[2]
PAGES = [
    ROOT / "README.md",
    *sorted((ROOT / "docs").glob("*.md")),
    *sorted((ROOT / "docs" / "sinks").glob("*.md")),
]

# The names the docs use without defining them, as a reader would have them.
PRELUDE = """
import os
import uuid

import httpx
from sqlalchemy import Index, String, text
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

import outbox
from outbox import Batch, BufferMixin, Outbox, RetryPolicy, Urgency


class Base(DeclarativeBase): ...


class ContactActivityEvent(BufferMixin, Base):
    __tablename__ = "contact_activity_events"
    activity_id: Mapped[int]
    contact_id: Mapped[int]


class ContactChange(BufferMixin, Base):
    __tablename__ = "contact_changes"
    contact_id: Mapped[int]
    account_id: Mapped[int]


class ContactEvent(BufferMixin, Base):
    __tablename__ = "contact_events"
    contact_id: Mapped[int]


class OrderEvent(BufferMixin, Base):
    __tablename__ = "order_events"
    order_id: Mapped[int]
    customer_id: Mapped[int]
    region: Mapped[str] = mapped_column(String(20))


class OrderPlaced(BufferMixin, Base):
    __tablename__ = "order_placed_events"
    order_id: Mapped[int]


def order_records(events):
    return [{"order_id": e.order_id} for e in events]


URL = "https://api.example.com/v1/contacts/bulk"
FULFILMENT_URL = "https://fulfilment.example.com/v1/orders"
token = password = "secret"
app = Outbox(DATABASE_URL)
"""


@dataclass(frozen=True)
class Block:
    """A fenced code block of a page."""

    page: str
    line: int
    language: str
    text: str

    @property
    def name(self) -> str:
        return f"{self.page}:{self.line}"


def _blocks() -> list[Block]:
    found = []
    for page in PAGES:
        text = page.read_text(encoding="utf-8")
        for match in re.finditer(r"^```(\w*)\n(.*?)^```", text, re.DOTALL | re.MULTILINE):
            line = text.count("\n", 0, match.start()) + 1
            found.append(Block(str(page.relative_to(ROOT)), line, match.group(1), match.group(2)))
    return found


BLOCKS = _blocks()
PYTHON = [b for b in BLOCKS if b.language == "python"]


def _bound_and_used(tree: ast.AST) -> tuple[set[str], set[str]]:
    """The names a block defines (anywhere in it) and those it reads."""
    bound: set[str] = set()
    used: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import | ast.ImportFrom):
            bound.update((a.asname or a.name).split(".")[0] for a in node.names)
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            bound.add(node.name)
        elif isinstance(node, ast.arg):
            bound.add(node.arg)
        elif isinstance(node, ast.ExceptHandler) and node.name:
            bound.add(node.name)
        elif isinstance(node, ast.Name):
            (used if isinstance(node.ctx, ast.Load) else bound).add(node.id)
    return bound, used


PRELUDE_NAMES = _bound_and_used(ast.parse(PRELUDE))[0] | {"DATABASE_URL"}


def _free_names(block: Block) -> set[str]:
    bound, used = _bound_and_used(ast.parse(block.text))
    return used - bound - set(dir(builtins))


def _imports_the_readers_own(block: Block) -> bool:
    """Whether the block imports a module that is the reader's (not installed here)."""
    for node in ast.walk(ast.parse(block.text)):
        if isinstance(node, ast.Import):
            modules = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            modules = [node.module or ""]
        else:
            continue
        if any(importlib.util.find_spec(m.split(".")[0]) is None for m in modules):
            return True
    return False


def _runs(block: Block) -> bool:
    return _free_names(block) <= PRELUDE_NAMES and not _imports_the_readers_own(block)


def _prelude_for(block: Block) -> ast.Module:
    """The prelude less the models the block defines itself."""
    defined = _bound_and_used(ast.parse(block.text))[0]
    prelude = ast.parse(PRELUDE)
    prelude.body = [
        node
        for node in prelude.body
        if not (isinstance(node, ast.ClassDef) and node.name in defined)
    ]
    return prelude


@pytest.mark.parametrize("block", PYTHON, ids=[b.name for b in PYTHON])
def test_a_python_block_compiles_and_imports_what_exists(block: Block) -> None:
    """Valid Python; each name it imports from outbox is there."""
    tree = ast.parse(block.text, filename=block.name)
    missing = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "outbox":
            module = __import__(node.module or "", fromlist=["_"])
            missing += [
                f"{node.module}.{a.name}" for a in node.names if not hasattr(module, a.name)
            ]
    assert [] == missing


RUNNABLE = [b for b in PYTHON if _runs(b)]


# A broker's URL in a block, and the test server's that replaces it.
_BROKER_URL = re.compile(r"\b(amqps?|nats|redis)://[^\"'\s]*")
_TEST_SERVERS = {
    "amqp": rabbitmq_kind.RABBITMQ_URL,
    "amqps": rabbitmq_kind.RABBITMQ_URL,
    "nats": nats_kind.NATS_URL,
    "redis": redis_kind.redis_url(),
}
# The topology the docs' sink examples name, as the reader's own would be.
DOCS_EXCHANGE = "orders"
DOCS_STREAM = "ORDERS"


@pytest.fixture(scope="module")
def docs_topology() -> Iterator[None]:
    """The exchange and the stream the docs name, on the test servers; those made here are
    deleted after."""
    made_exchange = not _rabbitmq_exchange_exists(DOCS_EXCHANGE)
    if made_exchange:
        asyncio.run(rabbitmq_kind.declare(DOCS_EXCHANGE))
    made_stream = not asyncio.run(_nats_stream_exists(DOCS_STREAM))
    if made_stream:
        asyncio.run(nats_kind.create(DOCS_STREAM, subjects=["orders.>"]))
    yield
    if made_exchange:
        asyncio.run(rabbitmq_kind.delete(DOCS_EXCHANGE))
    if made_stream:
        asyncio.run(nats_kind.delete(DOCS_STREAM))


def _rabbitmq_exchange_exists(name: str) -> bool:
    import pika
    import pika.exceptions

    connection = pika.BlockingConnection(pika.URLParameters(rabbitmq_kind.RABBITMQ_URL))
    try:
        connection.channel().exchange_declare(name, passive=True)
    except pika.exceptions.ChannelClosedByBroker:
        return False
    finally:
        if connection.is_open:
            connection.close()
    return True


async def _nats_stream_exists(name: str) -> bool:
    import nats
    import nats.js.errors

    client = await nats.connect(nats_kind.NATS_URL, connect_timeout=5, allow_reconnect=False)
    try:
        await client.jetstream().stream_info(name)
    except nats.js.errors.NotFoundError:
        return False
    finally:
        await client.close()
    return True


@pytest.mark.parametrize("block", RUNNABLE, ids=[b.name for b in RUNNABLE])
def test_a_complete_python_block_runs(
    block: Block, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """It runs after the prelude, on SQLite; the broker sinks it registers start against the
    test servers."""
    brokers = _BROKER_URL.search(block.text) is not None
    text = _BROKER_URL.sub(lambda m: _TEST_SERVERS[m.group(1)], block.text)
    if brokers:
        request.getfixturevalue("docs_topology")
    # A module of its own: SQLAlchemy reads a model's annotations in its module's namespace.
    module = types.ModuleType(f"docs_block_{block.line}")
    module.DATABASE_URL = f"sqlite:///{tmp_path}/docs.sqlite3"  # type: ignore[attr-defined]
    sys.modules[module.__name__] = module
    try:
        # The code run is the prelude above and the docs' own blocks, nothing from outside.
        exec(compile(_prelude_for(block), "<prelude>", "exec"), module.__dict__)  # noqa: S102
        exec(compile(text, block.name, "exec"), module.__dict__)  # noqa: S102
    finally:
        del sys.modules[module.__name__]
    if brokers:
        apps = {id(v): v for v in vars(module).values() if isinstance(v, Outbox)}
        for app in apps.values():
            worker = Worker(app)
            worker.start_handlers()
            worker.stop_handlers()


def test_the_docs_have_complete_python_blocks() -> None:
    """The rule above finds blocks to run: a prelude that grew stale would leave none."""
    assert len(RUNNABLE) >= len(PYTHON) // 3


# --- the command ---------------------------------------------------------------------------

SHELL = ("sh", "bash", "shell", "console")
# What ends a command on a line: a comment, a pipe, the next command, prose.
_END = re.compile(r"\s(#|\||&&|;|\.\.\.)|[)`]")


@dataclass(frozen=True)
class CommandLine:
    """An ``outbox`` command line the docs give."""

    where: str
    words: tuple[str, ...]


def _command_lines() -> list[CommandLine]:
    found = []
    for page in PAGES:
        name = str(page.relative_to(ROOT))
        text = page.read_text(encoding="utf-8")
        lines = [(False, m.group(1)) for m in re.finditer(r"`([^`\n]+)`", text)]
        for block in (b for b in BLOCKS if b.page == name):
            strict = block.language in SHELL and block.language != ""
            lines += [(strict, line) for line in block.text.splitlines()]
            lines += [(True, line) for line in _scheduled_commands(block)]
        for strict, line in lines:
            match = re.match(r"\s*(?:\$ )?(?:\S*/)?outbox((?: +\S+)+)", line)
            if match is None:
                continue
            words = tuple(_split(_END.split(match.group(1))[0]))
            if strict or words[0].startswith("-") or words[0] in main.commands:
                found.append(CommandLine(name, words))
    return found


def _scheduled_commands(block: Block) -> list[str]:
    """The command lines a crontab entry runs (after its five time fields, each part of a
    ``&&``), and a container's ``command: [...]`` or ``args: [...]`` in a YAML block."""
    found = []
    if block.language == "crontab":
        for line in block.text.splitlines():
            fields = line.split(None, 5)
            if len(fields) == 6 and not line.lstrip().startswith("#"):
                found += [part.strip() for part in re.split(r"&&|;", fields[5])]
    elif block.language in ("yaml", "yml"):
        for match in re.finditer(r"^\s*(?:command|args):\s*(\[.*\])\s*$", block.text, re.M):
            found.append(shlex.join(json.loads(match.group(1))))
    return [line for line in found if re.match(r"(?:\S*/)?outbox\s", line)]


def _split(text: str) -> list[str]:
    try:
        return shlex.split(text)
    except ValueError:
        return text.split()


# The command's own options that take a value (--app, --database, ...), from the command itself.
GLOBAL_WITH_VALUE = {
    name
    for param in main.params
    if isinstance(param, click.Option) and not param.is_flag and not param.count
    for name in param.opts
}


def _resolve(words: tuple[str, ...]) -> tuple[click.Command, list[str]]:
    """The command the words name and the options they give it; raises naming what is not
    there."""
    command: click.Command = main
    options: list[str] = []
    rest = list(words)
    while rest:
        word = rest.pop(0)
        if word.startswith("-"):
            option = word.split("=")[0]
            options.append(option)
            if command is main and option in GLOBAL_WITH_VALUE and "=" not in word and rest:
                rest.pop(0)
            continue
        if isinstance(command, click.Group):
            sub = command.commands.get(word)
            if sub is None:
                raise LookupError(f"no command {word!r} under {command.name!r}")
            _check_options(command, options)
            command, options = sub, []
            continue
        # An argument or an option's value: nothing to check.
    _check_options(command, options)
    return command, options


def _check_options(command: click.Command, options: list[str]) -> None:
    known = {o for p in command.params for o in (*p.opts, *p.secondary_opts)}
    known |= {"--help"}
    unknown = [o for o in options if o not in known and not re.fullmatch(r"-\d.*", o)]
    if unknown:
        raise LookupError(f"{command.name!r} has no option {', '.join(unknown)}")


COMMANDS = _command_lines()


@pytest.mark.parametrize(
    "line", COMMANDS, ids=[f"{c.where}: outbox {' '.join(c.words)}" for c in COMMANDS]
)
def test_a_command_line_in_the_docs_names_a_command_and_options_that_exist(
    line: CommandLine,
) -> None:
    """`outbox ...` as the docs write it: the command exists and takes the options named."""
    _resolve(line.words)


def _table_rows() -> list[str]:
    text = (ROOT / "docs" / "operations.md").read_text(encoding="utf-8")
    table = text.split("| command | what it does |")[1].split("\n\n")[0]
    return [row.split("|")[1].strip() for row in table.splitlines()[2:] if row.startswith("|")]


@pytest.mark.parametrize("cell", _table_rows())
def test_the_command_table_names_commands_and_options_that_exist(cell: str) -> None:
    """Each row of docs/operations.md's table of commands: the commands exist, with the
    options the row names (``a / b`` is a second command of the same group)."""
    cell = cell.replace("\\|", "|")
    for span in re.findall(r"`([^`]+)`", cell):
        group: tuple[str, ...] = ()
        for part in span.split(" / "):
            words = [w for w in re.split(r"[\s\[\]()|]+", part) if w]
            if words[0] in main.commands:
                path = (words[0],)
                command = main.commands[words[0]]
                group = path if isinstance(command, click.Group) else ()
                words = words[1:]
            else:
                path = group
            names = [w for w in words if re.fullmatch(r"[a-z][a-z-]*", w)][:1]
            options = [o for w in words if w.startswith("-") for o in w.split("/")]
            command, _ = _resolve(path)
            if isinstance(command, click.Group) and names:
                path = (*path, *names)
            _resolve((*path, *options))
