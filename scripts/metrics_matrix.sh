#!/usr/bin/env bash
# Run every shipped trainer and every way a run runs for a few iterations on the CPU, one
# run folder each under OUT, so that a change claiming to alter no behaviour is checked by
#
#   bash scripts/metrics_matrix.sh /tmp/before        # on the commit before
#   bash scripts/metrics_matrix.sh /tmp/after         # on the change
#   .venv/bin/python scripts/compare_metrics.py /tmp/before /tmp/after
#
# Every run is seeded (the environment's secrets too: RecallEnv draws them unseeded unless
# told), so on the CPU its losses, rewards and counts repeat bit for bit; compare_metrics.py
# leaves out the timings. Runs whose batches depend on timing are named `timed-*` and do
# not repeat themselves even on one commit: continuous generation decides at run time
# which finished groups train, and the episode loop batches the turns whose steps came
# back (each engine call seeded by its first episode). Compare those by their counts only. ITERATIONS (default 10) and ONLY (a
# regular expression over the run names) narrow the matrix.
set -euo pipefail
cd "$(dirname "$0")/.."

out=${1:?usage: bash scripts/metrics_matrix.sh OUT_DIR}
iterations=${ITERATIONS:-10}
only=${ONLY:-.}
train=(.venv/bin/python -m trainers.driver.cli)
disaggregated=(rollout.placement=disaggregated rollout.devices=1 actor.parallel.tp=1
  reference.parallel.tp=1 critic.parallel.tp=1)

# name | trainer | config | overrides
runs=(
  "grpo|grpo|configs/tiny.yaml|"
  "grpo-stream|grpo|configs/tiny.yaml|dock.pipeline=stream"
  "grpo-kl|grpo|configs/tiny.yaml|algorithm.kl_coef=0.01"
  "grpo-validation|grpo|configs/tiny.yaml|data.val_source=synthetic:tiny data.val_every=5"
  "grpo-partial|grpo|configs/tiny.yaml|rollout.partial_rollout_budget=2"
  "grpo-disaggregated|grpo|configs/tiny.yaml|${disaggregated[*]}"
  "grpo-async|grpo|configs/tiny.yaml|${disaggregated[*]} rollout.max_staleness=1"
  "timed-grpo-continuous|grpo|configs/tiny.yaml|${disaggregated[*]} rollout.max_staleness=1 rollout.continuous=true"
  "ppo|ppo|configs/tiny.yaml|"
  "dapo|dapo|configs/tiny.yaml|"
  "dapo-stream|dapo|configs/tiny.yaml|dock.pipeline=stream"
  "pf_ppo|pf_ppo|configs/tiny.yaml|"
  "reinforce_pp|reinforce_pp|configs/tiny.yaml|"
  "rloo|rloo|configs/tiny.yaml|"
  "gspo|gspo|configs/tiny.yaml|"
  "dr_grpo|dr_grpo|configs/tiny.yaml|"
  "timed-env-grpo|grpo|configs/tiny_env.yaml|env.kwargs.seed=7"
  "timed-env-ppo|ppo|configs/tiny_env.yaml|env.kwargs.seed=7"
  "dpo|dpo|configs/tiny_dpo.yaml|"
)

mkdir -p "$out"
for entry in "${runs[@]}"; do
  IFS='|' read -r name trainer config overrides <<<"$entry"
  [[ $name =~ $only ]] || continue
  start=$SECONDS
  # shellcheck disable=SC2086  # the overrides are words on purpose
  if "${train[@]}" --trainer "$trainer" --config "$config" iterations="$iterations" \
    checkpoint.every=0 logging.backends=[] "logging.dir=$out/$name" \
    $overrides >"$out/$name.log" 2>&1; then
    echo "$name: ok ($((SECONDS - start)) s)"
  else
    echo "$name: FAILED ($((SECONDS - start)) s), see $out/$name.log"
  fi
done
