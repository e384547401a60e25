"""The record's reward keys (mindrl/rewards/report.py fills them): each domain's mean
reward, each reward function's outcome rates and latencies, the share that failed."""

#: ``reward/<domain>``: the mean reward of that domain's samples this iteration.
DOMAIN_PREFIX = "reward/"
#: ``reward_fn/<name>/<status>_rate``, ``reward_fn/<name>/latency_p50_s`` / ``_p99_s``.
FUNCTION_PREFIX = "reward_fn/"
#: The share of the iteration's scored samples whose reward failed.
FAILED_SHARE = "reward/failed_share"
#: Groups left out of the update because a sample's reward failed (reward.on_failure).
DROPPED_GROUPS = "reward/dropped_groups"
