"""The placement decision without Ray: the roles that share a device, their shares and
Ray CPU slots, the planner's choice of roles to offload, the device-count refusal."""

from __future__ import annotations

import pytest

from backends.device.cuda import CudaDevice
from mindrl.planner.capacity import host_bytes
from mindrl.planner.offload import plan_offload
from mindrl.workers.placement import PlacementError, check_capacity, device_share
from tests.foundation.plans import DISAGGREGATED, TINY, dry_run
from tests.foundation.plans import config_and_plan as plan_of
from trainers.driver.setup import cpu_slots

#: One tiny device of 5.9 MB: the actor's update (5.48 MB planned) fits, and nothing more.
SMALL_DEVICE = int(0.0055 * 2**30)


def test_every_model_role_has_a_process_on_every_training_device():
    _, ppo = plan_of("ppo", "algorithm.kl_coef=0.05")
    assert ppo.layout.device_processes() == [("actor", "reference", "critic")] * 2
    _, disaggregated = plan_of("grpo", *DISAGGREGATED)
    assert disaggregated.layout.device_processes() == [("actor",), ("rollout",)]


def test_a_rollout_worker_holds_the_devices_of_its_generation_tp_group_in_one_bundle():
    from mindrl.config.layout import DeviceBundle

    _, ppo = plan_of("ppo", "algorithm.kl_coef=0.05")
    assert ppo.layout.bundles() == [DeviceBundle(("actor", "reference", "critic"))] * 2
    layout = ["resources.devices_per_node=6", "rollout.devices=4", "rollout.engine=vllm"]
    _, tp2 = plan_of("grpo", *DISAGGREGATED, *layout, "rollout.tp=2")
    assert (
        tp2.layout.bundles()
        == [DeviceBundle(("actor",))] * 2 + [DeviceBundle(("rollout",), devices=2)] * 2
    )
    # Per device the planner still sees every rollout device generate.
    assert tp2.layout.device_processes() == [("actor",)] * 2 + [("rollout",)] * 4


def test_a_cpu_run_reserves_one_slot_per_device_and_reward_worker_whatever_its_roles():
    config, ppo = plan_of("ppo", "algorithm.kl_coef=0.05")
    assert cpu_slots(config, ppo) == 2 + 1  # three roles share each of the two devices
    config, grpo = plan_of("grpo")
    assert cpu_slots(config, grpo) == 3


def test_k_shares_of_a_device_never_add_up_to_more_than_the_device():
    assert device_share(1) == 1.0
    assert device_share(3) == pytest.approx(0.3333)
    assert 3 * device_share(3) <= 1.0 and 7 * device_share(7) <= 1.0


def test_a_plan_that_needs_more_devices_than_the_cluster_names_both_counts():
    _, plan = plan_of("grpo", *DISAGGREGATED)
    check_capacity(plan.layout, CudaDevice(), 2.0)  # exactly enough
    with pytest.raises(PlacementError) as err:
        check_capacity(plan.layout, CudaDevice(), 1.0)
    assert str(err.value) == (
        "the plan needs 2 cuda devices (1 training + 1 generating; resources.nodes x "
        "resources.devices_per_node), the Ray cluster has 1 (GPU); lower "
        "resources.devices_per_node or resources.nodes, or add devices to the cluster"
    )


def test_roles_stay_resident_where_every_stage_fits():
    config, plan = plan_of("ppo", "algorithm.kl_coef=0.05")
    assert plan_offload(config, plan, 80 * 2**30, host_bytes(config)).offloaded_roles == ()


def test_the_fit_check_offloads_the_reference_first_then_the_critic():
    config, grpo = plan_of("grpo", "algorithm.kl_coef=0.05")
    assert plan_offload(config, grpo, SMALL_DEVICE, 2**40).offloaded_roles == ("reference",)
    config, ppo = plan_of("ppo", "algorithm.kl_coef=0.05")
    offloaded = plan_offload(config, ppo, SMALL_DEVICE, 2**40).offloaded_roles
    assert offloaded == ("reference", "critic")


def test_the_dry_run_shows_the_processes_per_device_and_what_waits_on_the_host():
    sets = ["algorithm.kl_coef=0.05", f"resources.device_memory_gib={SMALL_DEVICE / 2**30}"]
    plan = dry_run("ppo", TINY, *sets)
    assert plan["device_processes"] == [
        {
            "devices": 2,
            "processes": ["actor", "reference", "critic"],
            "offloaded": ["reference", "critic"],
        }
    ]
    memory = plan["memory"]
    assert set(memory["other_roles"]) == set()  # nothing resident beside the actor
    assert memory["offloaded_roles"]["critic"] > memory["offloaded_roles"]["reference"] > 0
    assert memory["host_offload_bytes"] == 2 * sum(memory["offloaded_roles"].values())
