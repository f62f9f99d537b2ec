"""Hypothesis examples per second of the core properties (one benchmark round runs a
property for a fixed number of examples; examples/s = EXAMPLES / mean)."""

import pytest
from hypothesis import HealthCheck, settings

from tests.core import test_contrastive, test_momentum, test_step

EXAMPLES = 20
PROPERTIES = {
    "I2/I3/I8/I9 step invariants": test_step.test_step_invariants,
    "I6 both orders": test_step.test_paper_and_lab_orders_are_bitwise_identical,
    "I7 EMA law": test_momentum.test_ema_law_over_parameters,
    "I4 masking": test_contrastive.test_masked_entries_have_probability_zero_and_the_rest_equal_q_dot_key_over_t,  # noqa: E501
}


@pytest.mark.parametrize("name", list(PROPERTIES))
def test_property_examples(benchmark, name):
    benchmark.group = f"hypothesis: {EXAMPLES} examples of a core property"
    benchmark.extra_info["examples"] = EXAMPLES
    run = settings(max_examples=EXAMPLES, derandomize=True, database=None, deadline=None,
                   suppress_health_check=list(HealthCheck))(PROPERTIES[name])
    benchmark.pedantic(run, rounds=3, iterations=1)
