"""The iteration runner of each kind of run, chosen by the run plan (``RunPlan.runner``).

The plan decides once how a run's iterations go (mindrl/run_plan.py, ``runner_for``);
this table names the class that runs them.
"""

from __future__ import annotations

from mindrl.config.layout import DISAGGREGATED, OFFLINE
from mindrl.run_plan import CONTINUOUS, ONLINE, PARTIAL_ROLLOUT
from trainers.driver.async_iteration import DisaggregatedRunner
from trainers.driver.continuous import ContinuousRunner
from trainers.driver.iteration import IterationRunner
from trainers.driver.offline import OfflineIterationRunner
from trainers.driver.partial_rollout import PartialRolloutRunner
from trainers.driver.state import RunState

#: ``RunPlan.runner`` -> the runner class: the online RL loop (sync or streaming), partial
#: rollout's rounds, the disaggregated runner with rollout workers of their own (and its
#: continuous form, whose workers never wait for a batch), and the offline one for
#: stored pairs.
RUNNERS: dict[str, type[IterationRunner]] = {
    ONLINE: IterationRunner,
    PARTIAL_ROLLOUT: PartialRolloutRunner,
    DISAGGREGATED: DisaggregatedRunner,
    CONTINUOUS: ContinuousRunner,
    OFFLINE: OfflineIterationRunner,
}


def make_runner(run: RunState) -> IterationRunner:
    """The runner the plan of ``run`` names."""
    return RUNNERS[run.plan.runner](run)
