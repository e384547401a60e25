"""Human-readable rendering of a plan (rich tables)."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table

GB = 1e9

#: Width of the plan's tables when the output is not a terminal: rich would use 80
#: columns there and cut the figures ("1,342.… GB") of a dry run piped to a file or a log.
PIPED_WIDTH = 200


def gb(value: float) -> str:
    return f"{value / GB:,.2f} GB"


def plan_console() -> Console:
    """The terminal's console, or a wide one when standard output is piped."""
    console = Console()
    return console if console.is_terminal else Console(width=PIPED_WIDTH)


def render_plan(plan: dict, console: Console | None = None) -> None:
    console = console or plan_console()
    console.print(
        f"[bold]mindrl plan[/bold]: {plan['trainer']} on {plan['world_size']} {plan['device']} "
        f"device(s) = {plan['nodes']} node(s) x {plan['devices_per_node']}; model "
        f"{plan['model']['family']} {plan['model']['params'] / 1e9:,.2f}B params "
        f"({plan['model']['dtype']})"
    )
    console.print(placement_table(plan))
    if plan.get("environments"):
        console.print(environments_line(plan["environments"]))
    console.print(processes_table(plan))
    console.print(layout_table(plan))
    console.print(memory_table(plan))
    if plan["memory"].get("rollout_devices"):
        console.print(disaggregated_memory_table(plan))
    console.print(flow_table(plan))
    if plan["nodes"] > 1:
        console.print(link_table(plan))
    if plan["checkpoint"]["roles"]:
        console.print(checkpoint_table(plan))
    for problem in plan["fit_problems"]:
        console.print(f"[bold red]does not fit:[/bold red] {problem}")
    if not plan["fit_problems"]:
        swap = ", the swap in host memory" if plan["generates"] else ""
        console.print(f"[green]fits:[/green] every stage fits in device memory{swap}")


def environments_line(envs: dict) -> str:
    """Where an embodied run's simulators step, in one line."""
    on_devices = envs.get("device") == "accelerator"
    beside = "a share of its rank's device" if on_devices else "one CPU slot each"
    apart = "devices" if on_devices else "CPUs"
    where = {
        "hybrid": f"stepped by {envs['env_workers']} environment worker(s), one beside each "
        f"actor rank ({beside})",
        "disaggregated": f"stepped by {envs['env_workers']} environment worker(s) on {apart} "
        "reserved apart from the actor's (one placement group, spread over the nodes)",
    }.get(
        envs["placement"],
        "stepped in the actor ranks' own processes" + (" on their devices" if on_devices else ""),
    )
    return (
        f"environments: {envs['num_envs']} {envs['class']}, {envs['per_rank']} per actor "
        f"rank, {where}, in {envs['pipeline_stages']} pipeline stage(s) ({envs['placement']})"
    )


def placement_table(plan: dict) -> Table:
    """One row per run of nodes that host the same things (48 nodes stay readable)."""
    mode = plan["mode"]
    title = {
        "collocated": "roles collocated on every device, which trains and generates in turn",
        "disaggregated": "disaggregated: some devices train, the others generate; "
        f"rollout.max_staleness {plan.get('max_staleness', 0)}",
        "offline": "roles collocated on every device, which only trains: stored samples, "
        "nothing generates",
    }[mode]
    table = Table(title=f"placement ({title})")
    for col in ("nodes", "ranks", "roles", "does", "TD warehouse", "TD controllers"):
        table.add_column(col)
    for run in node_runs(plan["placement"]):
        first, last = run[0], run[-1]
        nodes = str(first["node"]) if len(run) == 1 else f"{first['node']}-{last['node']}"
        does = [w for w, on in (("train", first["trains"]), ("generate", first["generates"])) if on]
        table.add_row(
            nodes,
            f"{first['ranks'][0]}-{last['ranks'][1]}",
            ", ".join(first["roles"]),
            " + ".join(does),
            "one per node" if first["td_warehouse"] else "-",
            ", ".join(first["td_controllers"]) or "-",
        )
    return table


def processes_table(plan: dict) -> Table:
    """Which worker processes share a device, each with its share of it, and where each
    role's state waits between its stages (the fit check's decision)."""
    table = Table(title="worker processes per device (one Ray bundle per device)")
    for col in ("devices", "processes", "share each", "offloaded to host between its stages"):
        table.add_column(col)
    for kind in plan["device_processes"]:
        processes = kind["processes"]
        table.add_row(
            str(kind["devices"]),
            ", ".join(processes),
            f"1/{len(processes)} device",
            ", ".join(kind["offloaded"]) or "none: every role stays on the device",
        )
    return table


def node_runs(placement: list[dict]) -> list[list[dict]]:
    def key(node: dict) -> tuple:
        return (tuple(node["roles"]), node["td_warehouse"], tuple(node["td_controllers"]))

    runs: list[list[dict]] = []
    for node in placement:
        if runs and key(runs[-1][-1]) == key(node):
            runs[-1].append(node)
        else:
            runs.append([node])
    return runs


def layout_table(plan: dict) -> Table:
    table = Table(title="parallel layouts")
    for col in ("stage", "TP", "PP", "CP", "DP", "EP", "ETP", "EDP"):
        table.add_column(col, justify="right")
    for role, lay in plan["training_layouts"].items():
        table.add_row(
            f"{role} (train)", *(str(lay[k]) for k in ("tp", "pp", "cp", "dp", "ep", "etp", "edp"))
        )
    gen = plan["generation_layout"]
    if plan["generates"]:
        row = (gen["tp"], 1, 1, gen["dp"], gen["ep"], 1, "-")
        table.add_row("generation", *map(str, row))
    return table


def training_rows(mem: dict) -> list[tuple[str, int]]:
    """The training stage's items: the actor's update and the roles resident beside it."""
    train = mem["training"]
    return [
        ("train: weights", train["weights"]),
        ("train: grads", train["grads"]),
        ("train: optimizer state", train["optimizer"]),
        (f"train: activations ({micro_batch_label(train)})", train["activations"]),
        ("train: optimizer step temporaries", train["step_temporaries"]),
        ("train: actor total (update peak)", train["total"]),
        *(
            (("train: engine kept awake (no swap)", mem["engine_in_update"]),)
            if mem.get("engine_in_update")
            else ()
        ),
        *(
            (("each process: math libraries' workspace", mem["workspace"]),)
            if mem.get("workspace")
            else ()
        ),
        *((f"{role}: resident (all stages)", size) for role, size in mem["other_roles"].items()),
        ("train: stage total", mem["training_stage_total"]),
    ]


def micro_batch_label(train: dict) -> str:
    """What the planned micro-batch is: its tokens, and the budget that sized it."""
    label = f"one micro-batch of {train.get('micro_batch_tokens', 0):,} tokens"
    budget = train.get("max_tokens_per_micro_batch")
    return label if budget is None else f"{label}, budget {budget:,}"


def offloaded_rows(mem: dict) -> list[tuple[str, int]]:
    """Host bytes per device of the roles offloaded between their stages (not on the
    device beside the actor's stages; brought back for their own)."""
    return [
        (f"{role}: on the host between its stages", size)
        for role, size in mem.get("offloaded_roles", {}).items()
    ]


def memory_table(plan: dict) -> Table:
    if plan["memory"]["generation_naive"] is None:  # no generation engine to size
        return training_memory_table(plan)
    mem = plan["memory"]
    naive, swap = mem["generation_naive"], mem["generation_swap"]
    table = Table(title=f"per-device memory (device: {gb(mem['device_bytes'])})")
    table.add_column("item")
    table.add_column("naive", justify="right")
    table.add_column("allgather-swap", justify="right")
    rows = [
        *((name, size, size) for name, size in training_rows(mem)),  # swap changes no row
        ("gen: weight shard", naive["shard"], swap["shard"]),
        ("gen: resident model state", naive["resident_training"], swap["resident_training"]),
        ("gen: KV-cache budget", naive["kv_cache_budget"], swap["kv_cache_budget"]),
        ("gen: engine working memory", naive["working"], swap["working"]),
    ]
    rows += [(name, size, size) for name, size in offloaded_rows(mem)]
    for name, a, b in rows:
        table.add_row(name, gb(a), gb(b))
    tokens = (
        naive["kv_cache_budget"] // naive["kv_bytes_per_token"],
        swap["kv_cache_budget"] // swap["kv_bytes_per_token"],
    )
    table.add_row("gen: KV-cache tokens", f"{max(tokens[0], 0):,}", f"{max(tokens[1], 0):,}")
    if mem.get("rollout"):  # the configured resharding only (swap or not)
        steps = mem["rollout"]
        on = plan["allgather_swap"]
        for step in ("reshard", "load", "generate", "swap_in"):
            value = gb(steps[step])
            table.add_row(
                f"rollout stage (actor): {step}", "-" if on else value, value if on else "-"
            )
        table.add_row(
            "rollout stage total (+ resident roles)",
            *(
                (gb(mem["rollout_stage_total"]), "-")
                if not on
                else ("-", gb(mem["rollout_stage_total"]))
            ),
        )
    table.add_row("redundant weight bytes (Eq. 3)", gb(mem["redundant_bytes"]), gb(0))
    table.add_row("swapped to host per iteration", "-", gb(mem["swap_bytes"]))
    table.add_row(
        f"host memory pinned per node (of {gb(mem['host_bytes'])})",
        gb(mem.get("host_offload_bytes", 0)),
        gb(mem["host_swap_bytes"] + mem.get("host_offload_bytes", 0)),
    )
    return table


def training_memory_table(plan: dict) -> Table:
    """A run without a generation engine (one that generates nothing, or an embodied
    policy generating with its training model): the training stage alone (no KV cache,
    no swap)."""
    mem = plan["memory"]
    generation = (
        "generation: the training model's own forward" if plan["generates"] else "no generation"
    )
    table = Table(title=f"per-device memory (device: {gb(mem['device_bytes'])}; {generation})")
    table.add_column("item")
    table.add_column("bytes", justify="right")
    for name, size in training_rows(mem) + offloaded_rows(mem):
        table.add_row(name, gb(size))
    return table


def disaggregated_memory_table(plan: dict) -> Table:
    """Per-device memory of the two kinds of device a disaggregated run has."""
    mem, rollout = plan["memory"], plan["memory"]["rollout_devices"]
    table = Table(title="per-device memory, disaggregated (no swap: nothing else generates)")
    table.add_column("devices")
    table.add_column("item")
    table.add_column("bytes", justify="right")
    table.add_row("train", "stage total (actor + resident roles)", gb(mem["training_stage_total"]))
    table.add_row("generate", "weight shard", gb(rollout["shard"]))
    table.add_row("generate", "KV-cache budget", gb(rollout["kv_cache_budget"]))
    tokens = max(rollout["kv_cache_budget"], 0) // max(rollout["kv_bytes_per_token"], 1)
    table.add_row("generate", "KV-cache tokens", f"{tokens:,}")
    table.add_row("generate", "peak (+ the next weights as they arrive)", gb(rollout["peak"]))
    return table


def flow_table(plan: dict) -> Table:
    flow = plan["sample_flow"]
    table = Table(title="sample flow of one iteration (paper Eq. 2, 100 MB/s between hosts)")
    table.add_column("endpoint")
    table.add_column("bytes", justify="right")
    table.add_column("dispatch time", justify="right")
    table.add_row(
        "centralized buffer",
        f"{flow['central_bytes'] / 2**30:,.3f} GiB",
        f"{flow['central_seconds']:,.2f} s",
    )
    table.add_row(
        f"dock: busiest of {flow['warehouses']} warehouse(s)",
        f"{flow['dock_endpoint_bytes'] / 2**30:,.3f} GiB",
        f"{flow['dock_endpoint_seconds']:,.2f} s",
    )
    table.add_row(
        f"dock: metadata ({flow['controllers']} controllers)",
        f"{flow['dock_metadata_bytes'] / 2**20:,.3f} MiB",
        "-",
    )
    return table


def link_table(plan: dict) -> Table:
    """The sample flow on each node's link (mindrl.planner.report.layout_link_flow)."""
    flow = plan["link_flow"]
    table = Table(
        title="sample flow per node link, one iteration at the maximum lengths (warehouse "
        "per node; controllers, driver and reward workers on node 0)"
    )
    for col in ("node", "up (leaves the node)", "down (enters it)"):
        table.add_column(col, justify="right")
    for node, (up, down) in enumerate(zip(flow["up"], flow["down"], strict=True)):
        table.add_row(str(node), f"{up / 2**10:,.1f} KiB", f"{down / 2**10:,.1f} KiB")
    payload = flow["payload"] / max(sum(flow["up"]), 1)
    table.caption = (
        f"{flow['calls']} calls between nodes; payload {payload:.0%} of the bytes, the "
        "rest Ray's framing of each call (mindrl.planner.sample_flow.CALL_BYTES)"
    )
    return table


def checkpoint_table(plan: dict) -> Table:
    """What a checkpoint writes, per trained role and per rank, how long a node's disk takes,
    and the HF export's size and memory."""
    ckpt = plan["checkpoint"]
    disk = ckpt["disk_bytes_per_s"] / GB
    how = "in the background after a host copy" if ckpt["background"] else "synchronously"
    table = Table(
        title=f"checkpoint: each rank writes its part, all at once, {how}",
        caption=f"write time at {disk:,.0f} GB/s per node; the HF export is written by one "
        f"process holding one tensor at a time ({size(ckpt['hf_largest_tensor'])} at most)",
    )
    for col in ("what", "weights", "Adam moments", "fp32 main", "whole", "per rank", "per node"):
        table.add_column(col, justify="left" if col == "what" else "right")
    table.add_column("write time", justify="right")
    for role in ckpt["roles"]:
        sizes = ("weights", "moments", "main_weights", "total", "per_rank")
        table.add_row(role["role"], *(size(role[k]) for k in sizes), "", "")
    table.add_row("all trained roles", "", "", "", "", "", size(ckpt["per_node"]), seconds(ckpt))
    table.add_row("HF export (actor)", size(ckpt["hf_bytes"]), "", "", "", "", "", "")
    return table


def size(value: float) -> str:
    """Bytes as GB, or MB below 1 GB."""
    return gb(value) if value >= GB else f"{value / 1e6:,.1f} MB"


def seconds(ckpt: dict) -> str:
    return f"{ckpt['write_seconds']:,.1f} s"
