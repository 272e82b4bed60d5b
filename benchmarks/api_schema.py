"""The API's request bodies declared with pydantic v2 against msgspec: what each costs to import,
to validate a typical body, and in memory on a hostile one.

The same bodies are declared with both (``_api_schema_pydantic``, ``_api_schema_msgspec``): a
selection with its action's fields (``POST /groups/discard``) and a batch of ingest
(``POST /handlers/{handler}/events``).

1. Import: a fresh interpreter imports the module that declares the bodies (the library and
   the declarations), ``--imports`` times; the median, less an interpreter that imports
   nothing.
2. Validation: the selection body and a batch of 1,000 events, each from the Python objects
   ``json.loads`` makes (as the API reads a body: its own parser checks numbers and nesting
   first) and from the body's bytes (the library's own parser); microseconds per body, the
   median of ``--repeat`` rounds.
3. Hostile bodies within the API's 16 MiB: an array nested as deep as the bytes allow, one
   string of 16 MiB, 16 MiB of tiny events (past the 5,000 a batch takes) and an object of
   16 MiB of keys; each in a process of its own, from the bytes and through ``json.loads``:
   the peak resident memory the call adds (``VmHWM`` after ``clear_refs``), and how it ends.

    python -m benchmarks.api_schema --imports 15 --repeat 200
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

from benchmarks._common import command_line, write

LIBRARIES = ("pydantic", "msgspec")
LIMIT = 16 * 1024 * 1024
"""``outbox.web._limits.MAX_BODY_BYTES``: no body past it is read."""
HOSTILE = ("deep", "huge-string", "many-events", "wide-object")


def selection_body() -> dict[str, Any]:
    return {
        "handler": ["mails"],
        "status": ["dead"],
        "older_than": 3600,
        "error": "timeout",
        "dry_run": True,
        "reason": "the provider is down",
    }


def ingest_body(events: int = 1_000) -> dict[str, Any]:
    return {
        "events": [
            {
                "key": f"order-{n}",
                "values": {
                    "account": f"account-{n % 97}",
                    "amount": "12.50",
                    "ref": str(uuid.UUID(int=n)),
                    "data": {"n": n, "tags": ["a", "b"], "note": None},
                },
            }
            for n in range(events)
        ]
    }


def hostile_body(case: str) -> bytes:
    """A body of at most :data:`LIMIT` bytes, hostile in the way ``case`` names."""
    if case == "deep":
        depth = (LIMIT - 20) // 2
        return b'{"reason": ' + b"[" * depth + b"]" * depth + b"}"
    if case == "huge-string":
        return b'{"reason": "' + b"x" * (LIMIT - 20) + b'"}'
    if case == "many-events":
        event = b'{"key":"k","values":{}},'
        count = (LIMIT - 20) // len(event)
        return b'{"events": [' + (event * count)[:-1] + b"]}"
    if case == "wide-object":
        keys = b",".join(b'"k%d":0' % n for n in range((LIMIT - 60) // 12))
        return b'{"events": [{"key": "k", "values": {' + keys + b"}}]}"
    raise ValueError(case)


def _module(library: str) -> Any:
    if library == "pydantic":
        from benchmarks import _api_schema_pydantic

        return _api_schema_pydantic
    from benchmarks import _api_schema_msgspec

    return _api_schema_msgspec


def validators(library: str) -> tuple[Any, Any]:
    """(from Python objects, from bytes): each takes the model and the body."""
    if library == "pydantic":
        return (lambda model, body: model.model_validate(body)), (
            lambda model, raw: model.model_validate_json(raw)
        )
    import msgspec

    return (lambda model, body: msgspec.convert(body, model)), (
        lambda model, raw: msgspec.json.decode(raw, type=model)
    )


# --- 1. import -------------------------------------------------------------------------------


def import_seconds(statement: str, runs: int) -> float:
    code = f"import time; t = time.perf_counter(); {statement}; print(time.perf_counter() - t)"
    seconds = []
    for _ in range(runs):
        done = subprocess.run(
            [sys.executable, "-c", code],
            capture_output=True,
            text=True,
            check=True,
            cwd=Path(__file__).resolve().parents[1],
        )
        seconds.append(float(done.stdout))
    return statistics.median(seconds)


# --- 2. validation ---------------------------------------------------------------------------


def per_body_us(call: Any, repeat: int) -> float:
    """Microseconds ``call`` takes, the median of ``repeat`` rounds (a round: enough calls to
    last about a millisecond)."""
    start = time.perf_counter()
    call()
    once = max(time.perf_counter() - start, 1e-7)
    number = max(1, int(0.001 / once))
    rounds = []
    for _ in range(repeat):
        start = time.perf_counter()
        for _ in range(number):
            call()
        rounds.append((time.perf_counter() - start) / number)
    return round(statistics.median(rounds) * 1e6, 1)


def validation(repeat: int) -> dict[str, dict[str, float]]:
    bodies = {"selection": selection_body(), "ingest_1000": ingest_body()}
    found: dict[str, dict[str, float]] = {}
    for library in LIBRARIES:
        module = _module(library)
        from_objects, from_bytes = validators(library)
        models = {"selection": module.Selection, "ingest_1000": module.Batch}
        for name, body in bodies.items():
            raw = json.dumps(body).encode()
            model = models[name]
            found.setdefault(name, {})
            found[name][f"{library}_objects_us"] = per_body_us(
                lambda m=model, b=body, f=from_objects: f(m, b), repeat
            )
            found[name][f"{library}_bytes_us"] = per_body_us(
                lambda m=model, r=raw, f=from_bytes: f(m, r), repeat
            )
    for name, body in bodies.items():
        raw = json.dumps(body).encode()
        found[name]["json_loads_us"] = per_body_us(lambda r=raw: json.loads(r), repeat)
    return found


# --- 3. hostile bodies -----------------------------------------------------------------------


def _kib(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise LookupError(field)


def child(library: str, case: str, path: str) -> dict[str, Any]:
    """In a process of its own: the peak memory one hostile body adds, and its outcome."""
    module = _module(library)
    from_objects, from_bytes = validators(library)
    model = module.Selection if case in ("deep", "huge-string") else module.Batch
    raw = hostile_body(case)
    Path("/proc/self/clear_refs").write_text("5")  # the peak from here on
    before = _kib("VmRSS")
    start = time.perf_counter()
    try:
        if path == "bytes":
            from_bytes(model, raw)
        else:
            from_objects(model, json.loads(raw))
        outcome = "accepted"
    except RecursionError:
        outcome = "RecursionError"
    except Exception as error:
        outcome = f"{type(error).__name__}: {str(error).splitlines()[0][:80]}"
    seconds = time.perf_counter() - start
    return {
        "peak_added_mib": round((_kib("VmHWM") - before) / 1024, 1),
        "ms": round(seconds * 1000, 1),
        "outcome": outcome,
    }


def hostile() -> dict[str, dict[str, Any]]:
    found: dict[str, dict[str, Any]] = {}
    for case in HOSTILE:
        for library in LIBRARIES:
            for path in ("bytes", "json.loads"):
                done = subprocess.run(
                    [sys.executable, "-m", "benchmarks.api_schema", "--child", library, case, path],
                    capture_output=True,
                    text=True,
                    check=True,
                    cwd=Path(__file__).resolve().parents[1],
                )
                found.setdefault(case, {})[f"{library} ({path})"] = json.loads(done.stdout)
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--imports", type=int, default=15, help="fresh interpreters per import")
    parser.add_argument("--repeat", type=int, default=200, help="rounds per validation figure")
    parser.add_argument("--child", nargs=3, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(*args.child)))
        return
    baseline = import_seconds("pass", args.imports)
    imports = {
        library: round(
            (import_seconds(f"import benchmarks._api_schema_{library}", args.imports) - baseline)
            * 1000,
            1,
        )
        for library in LIBRARIES
    }
    del args.child
    results = {
        "command": command_line("benchmarks.api_schema", args),
        "import_ms": imports,
        "validation": validation(args.repeat),
        "hostile": hostile(),
    }
    print(json.dumps(results, indent=2))
    write("api_schema", results)


if __name__ == "__main__":
    main()
