"""What a run stores per (epoch, sample): its record kinds, one module each.

- `forgetkit.kinds.summary`: per-sample statistics (the label's logit, the largest other
  logit and its class, the log-sum-exp);
- `forgetkit.kinds.topk`: per token the target's logit, the log-sum-exp and the k largest
  logits with their token ids.
"""
