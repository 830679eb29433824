"""Testing voice agents with calltape: invariants of a recorded call, exploration under barge-in, and
the pytest plugin.

``assert_invariants`` (:mod:`calltape.testing.invariants`) runs the very rules of ``calltape check``
plus the section 2 invariants of the context; :mod:`calltape.testing.explore` runs a scenario once per
instant a barge-in or drop could land; the pytest plugin (:mod:`calltape.testing.plugin`) adds the
``calltape_store`` fixture.
"""

from calltape.testing.invariants import assert_invariants, context_violations, invariant_violations, timeline_text

__all__ = ["assert_invariants", "context_violations", "invariant_violations", "timeline_text"]
