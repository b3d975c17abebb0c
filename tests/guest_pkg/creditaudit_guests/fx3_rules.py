"""A credit rule whose credits turn NaN only on batches larger than the door's tiny ones
(tests/test_non_finite_credits.py): it passes the door, trains as backprop does, and the
run's diagnostics on the evaluation set meet its NaN credits.
"""

import torch

from creditaudit.methods.bp import BP

# The rule suite's batches have 9 samples (creditaudit.testing.common.BATCH); the tests'
# evaluation sets have more than this.
DOOR_BATCH = 32


class NaNOnBigBatches(BP):
    """Backprop, except that ``credits()`` returns NaN for batches of more than 32."""

    name, label = "fx3-nan-rule", "NaN credits past the door"

    def credits(self, x, y):
        credits = super().credits(x, y)
        if x.shape[0] > DOOR_BATCH:
            return [torch.full_like(a, float("nan")) for a in credits]
        return credits
