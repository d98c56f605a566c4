"""Hypothesis profiles for every test directory of the repository (tests/, plugins/*/tests).

* ``ci`` -- what the nox sessions (the README's test command, .ci/run) use: the same
  examples on every run, no example database, and a reproduction blob on failure. A
  suite that must stay green on a clean clone cannot depend on which random
  examples a run happens to draw; exploring is a separate activity.
* ``explore`` -- fresh randomness (and 1000 examples where a test does not set its
  own number), for looking for bugs: ``HYPOTHESIS_PROFILE=explore python3 dev.py test``.
* ``default`` -- Hypothesis' own defaults (plain ``pytest`` runs).
"""

from __future__ import annotations

import os


try:
    from hypothesis import settings
except ImportError:  # a session without hypothesis has no property-based tests either
    pass
else:
    settings.register_profile("ci", derandomize=True, database=None, print_blob=True)
    settings.register_profile("explore", max_examples=1000)
    settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "default"))
