import pytest

pytestmark = pytest.mark.ray


def test_shared_cluster_has_three_alive_nodes(ray_cluster):
    import ray

    alive = [n for n in ray.nodes() if n["Alive"]]
    assert len(alive) == 3
