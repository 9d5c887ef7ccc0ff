"""What a run stores per (epoch, sample): its record kinds, one module each, behind one
interface (`forgetkit.kinds.base`: `Kind`, `register_kind`, `kind_of`).

- `forgetkit.kinds.full`: every class's value ("logits" or "probs");
- `forgetkit.kinds.summary`: per-sample statistics (the label's logit, the largest other
  logit and its class, the log-sum-exp);
- `forgetkit.kinds.topk`: per token the target's logit, the log-sum-exp and the k largest
  logits with their token ids.
"""

from . import full, summary, topk  # noqa: F401 (each registers its kind)
from .base import (  # noqa: F401
    Kind,
    RecordKind,
    RecordOutputs,
    check_kind,
    kind_named,
    kind_of,
    kinds,
    register_kind,
)
