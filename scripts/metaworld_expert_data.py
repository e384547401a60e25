"""Roll Meta-World's scripted expert out through MetaWorldVectorEnv and save its
(state, action) pairs: the set a behaviour-cloning step trains the policy's start on.

    .venv/bin/python scripts/metaworld_expert_data.py --task push-v3 --episodes 300 \\
        --out expert_push.npz

Prints the expert's success rate measured through the vector environment (near 1.0
when the environment is wired right) and writes ``states`` [T, 39], ``actions``
[T, 1, 4], ``instruction_ids`` [T, L], ``episode`` [T] and ``success`` [episodes] to
``--out``: a demonstration set for ``env.clone_data`` (mindrl/envs/demonstrations.py).
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np

from mindrl.envs.demonstrations import record_expert
from mindrl.envs.metaworld_env import MetaWorldVectorEnv


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--task", default="push-v3")
    parser.add_argument("--episodes", type=int, default=300)
    parser.add_argument("--num-envs", type=int, default=8)
    parser.add_argument("--num-processes", type=int, default=2)
    parser.add_argument("--horizon", type=int, default=200)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", required=True, help="the .npz file to write")
    args = parser.parse_args()
    start = time.perf_counter()
    env = MetaWorldVectorEnv(
        num_envs=args.num_envs,
        chunk_size=1,
        horizon=args.horizon,
        seed=args.seed,
        task=args.task,
        num_processes=args.num_processes,
    )
    try:
        data = record_expert(env, args.episodes)
    finally:
        env.close()
    np.savez_compressed(args.out, **data)
    lengths = np.bincount(data["episode"])
    summary = {
        "task": args.task,
        "episodes": int(data["success"].size),
        "success_rate": float(data["success"].mean()),
        "pairs": int(data["states"].shape[0]),
        "mean_episode_length": float(lengths.mean()),
        "seconds": round(time.perf_counter() - start, 1),
        "out": args.out,
    }
    print(json.dumps(summary))


if __name__ == "__main__":  # workers are spawned: they re-import this file as a module
    main()
