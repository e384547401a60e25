"""The iteration runner of each kind of run, chosen by the run plan (``RunPlan.runner``).

The plan decides once how a run's iterations go (mindrl/run_plan.py, ``runner_for``);
this table names the part that varies: the batch source (trainers/driver/iteration.py,
``BatchSource``) that draws each iteration's batch, overlaps what may run beside
training and keeps what outlives the update. :class:`IterationRunner` runs the rest the
same way for every kind (an offline run's source puts stored pairs, and its plan has no
advantage stage).
"""

from __future__ import annotations

from collections.abc import Callable

from mindrl.config.layout import DISAGGREGATED, OFFLINE
from mindrl.run_plan import CONTINUOUS, EMBODIED, ONLINE, PARTIAL_ROLLOUT
from trainers.driver.async_iteration import DisaggregatedSource
from trainers.driver.continuous import ContinuousSource
from trainers.driver.embodied import EmbodiedRunner
from trainers.driver.iteration import BatchSource, IterationRunner, OnlineSource
from trainers.driver.offline import offline_runner
from trainers.driver.partial_rollout import PartialRolloutSource
from trainers.driver.state import RunState

#: ``RunPlan.runner`` -> the batch source of an online kind: the RL loop on the actor
#: ranks (sync or streaming), partial rollout's rounds, the disaggregated rollout
#: workers with one batch ahead (and their continuous form, whose workers never wait for
#: a batch).
SOURCES: dict[str, Callable[[IterationRunner], BatchSource]] = {
    ONLINE: OnlineSource,
    PARTIAL_ROLLOUT: PartialRolloutSource,
    DISAGGREGATED: DisaggregatedSource,
    CONTINUOUS: ContinuousSource,
}


def make_runner(run: RunState) -> IterationRunner:
    """The runner the plan of ``run`` names."""
    if run.plan.runner == OFFLINE:
        return offline_runner(run)
    if run.plan.runner == EMBODIED:
        return EmbodiedRunner(run)
    return IterationRunner(run, SOURCES[run.plan.runner])
