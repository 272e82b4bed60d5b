"""How many cases the tier runs, and from which seed.

``OUTBOX_MODEL_EXAMPLES``: cases per profile and database (default 4, what ``.ci/run`` runs);
``OUTBOX_MODEL_SEED``: the seed of the generator (default: a random one, printed in the test
session's header and in every failure); ``OUTBOX_MODEL_SHRINK=1``: let Hypothesis shrink a
failing case (minutes of real runs; the nox session ``model`` turns it on).
"""

from __future__ import annotations

import os
import random

from hypothesis import HealthCheck, Phase, settings

DEFAULT_EXAMPLES = 4
EXAMPLES = int(os.environ.get("OUTBOX_MODEL_EXAMPLES", DEFAULT_EXAMPLES))
SEED = int(os.environ.get("OUTBOX_MODEL_SEED") or random.SystemRandom().randrange(1 << 32))
SHRINK = os.environ.get("OUTBOX_MODEL_SHRINK") == "1"
KILLED_EXAMPLES = max(1, EXAMPLES // 6)
"""Cases per database of the variant that kills ``outbox work`` processes (seconds each)."""

# Each case is a real run on a real database: no deadline, no example database (the seed says
# what ran), and no shrinking unless asked for.
MODEL = settings(
    max_examples=EXAMPLES,
    deadline=None,
    database=None,
    derandomize=False,
    print_blob=True,
    phases=(Phase.explicit, Phase.generate, *((Phase.shrink,) if SHRINK else ())),
    suppress_health_check=[
        HealthCheck.function_scoped_fixture,
        HealthCheck.too_slow,
        HealthCheck.data_too_large,
    ],
)
KILLED = settings(MODEL, max_examples=KILLED_EXAMPLES)
