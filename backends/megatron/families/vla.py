"""Vision-language-action family: the project's GPT reading an image, a state and an
instruction, and writing a chunk of actions as action tokens (OpenVLA / OpenVLA-OFT).

One row is ``[image patches | state | instruction tokens | action tokens]``, fed to
Megatron's ``GPTModel`` as ``decoder_input`` (the embeddings of the whole row):

* the image (uint8 ``[H, W, 3]``) is cut into ``patch_size`` squares, each linearly
  embedded, plus a learned position per patch;
* the robot state (``[S]``) is one linearly projected token;
* the instruction's ids and the action ids use the GPT's own word embeddings;
* the last :data:`ACTION_BINS` ids of the vocabulary are the action bins: id
  ``vocab_size - 256 + bin`` is bin ``bin`` of one action dimension, uniform over
  ``[-1, 1]`` (the environment side's ``ActionTokenizer`` maps bins to actions).

A chunk is ``C`` actions of ``A`` dimensions: ``C * A`` action tokens. The logits at
position ``prompt_end - 1 + j`` give action token ``j``'s distribution, in both decodes:

* ``autoregressive`` (OpenVLA): the inputs at the action positions are the action ids
  drawn so far; the tokens are drawn one at a time.
* ``parallel`` (OFT): the inputs at the action positions are learned placeholders
  (:attr:`VLAHeads.action_queries`); one forward draws every token of the chunk.

So both decodes read the first token off the last prompt position, and the update
scores a chunk with the very row generation built (placeholders or drawn ids). Only the
256 action ids are ever drawn: the distribution is the action logits (others dropped),
divided by the temperature, cut to the top k (:func:`action_log_probs`), the same
function in generation and in the update. The value head (PPO's critic, sharing the
actor's trunk) reads the hidden state of the last prompt position: one value per chunk,
or one per action of it (``VLASpec.values_per_chunk``).

The extra modules live in ``GPTModel.vla`` (replicated over TP; :class:`VLAHeads`), so
the engine's canonical names, gathers and loads cover them as replicated weights.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import nn

from backends.device import get_device
from backends.megatron.cpu_compat import megatron_compat
from backends.megatron.families.base import LlamaLikeFamily
from backends.megatron.logit_window import logits_at, output_layer_of
from backends.megatron.logprobs import at_least_float32
from backends.megatron.spec import GPTSpec, ParallelSpec

#: Action ids at the end of the vocabulary: bins of one action dimension over [-1, 1].
ACTION_BINS = 256
DECODES = ("autoregressive", "parallel")
#: How the action bins' logits are made: ``tokens``, the GPT's output layer at the 256
#: action ids (OpenVLA: each bin's logit its own row, so an update on one bin moves no
#: other); ``gaussian``, a head reading each action position's hidden state as a mean and
#: a scale, the bins' logits the log-density of that normal at the bins' centres (the
#: bins keep their order: raising one raises its neighbours, as a continuous policy's
#: gradient does, which 256 independent rows need ~256 times the samples to learn).
ACTION_HEADS = ("tokens", "gaussian")
#: The gaussian head's scale at initialisation, in the bins' [-1, 1] units: about the
#: spread of a uniform draw (0.58), so a new policy explores the whole range.
INITIAL_SCALE = 0.5
#: Its scale's bounds: a quarter bin (the distribution is then one bin) to the initial
#: scale. Not wider: a normal much wider than [-1, 1] is flat over the bins and gives its
#: mean almost no gradient, and behaviour cloning settled there (its NLL at the uniform's
#: for 600 steps) where capped at 0.5 it found the target by step 300. A clamp: a scale
#: past the cap has no gradient until the head's output comes back under it (a smooth
#: sigmoid bound instead cloned BatchedReach to 0.81 success where the clamp gives
#: 0.94, seed 1234; docs/guide/environments.md).
SCALE_BOUNDS = (0.25 * 2.0 / ACTION_BINS, INITIAL_SCALE)
#: The keypoints' spatial softmax's inverse temperature at initialisation (learned after).
INITIAL_SHARPNESS = 10.0
#: Sampling noise: one generator for the batch, or one per row (per environment: a row's
#: draws then do not depend on which other rows share its batch).
Generators = torch.Generator | Sequence[torch.Generator] | None


class VLAFamily(LlamaLikeFamily):
    """The VLA policy's trunk: Llama names (no HF checkpoint of this family exists yet)."""

    name = "vla"
    hf_architectures = ()
    vision_language_action = True


@dataclass(frozen=True)
class VLASpec:
    """What a VLA policy reads and writes (the GPT trunk is a :class:`GPTSpec`).

    Attributes:
        image_size: square RGB images of ``image_size`` pixels a side.
        patch_size: pixels a side of one image patch (divides ``image_size``).
        keypoints: spatial-softmax keypoint tokens after the patches (0: none).
        state_dim: robot state dimensions ``S``.
        action_dims: action dimensions ``A`` (each one action token).
        chunk_size: actions per chunk ``C``.
        decode: ``autoregressive`` (OpenVLA) or ``parallel`` (OFT).
        action_head: ``tokens`` or ``gaussian`` (:data:`ACTION_HEADS`).
        values_per_chunk: the value head's outputs per chunk: 1, the value of the
            chunk's observation, or ``chunk_size``, one per action (RLinf-VLA's
            action-level value: output ``j`` estimates the return from the chunk's
            ``j``-th action on, read from the same observation).
    """

    image_size: int = 32
    patch_size: int = 8
    keypoints: int = 0
    state_dim: int = 8
    action_dims: int = 4
    chunk_size: int = 2
    decode: str = "autoregressive"
    action_head: str = "tokens"
    values_per_chunk: int = 1

    def __post_init__(self) -> None:
        if self.image_size % self.patch_size:
            raise ValueError(
                f"VLASpec.patch_size={self.patch_size} does not divide image_size={self.image_size}"
            )
        if self.decode not in DECODES:
            raise ValueError(f"VLASpec.decode '{self.decode}' is unknown; choose one of {DECODES}")
        if self.action_head not in ACTION_HEADS:
            raise ValueError(
                f"VLASpec.action_head '{self.action_head}' is unknown; choose one of {ACTION_HEADS}"
            )
        if self.values_per_chunk not in (1, self.chunk_size):
            raise ValueError(
                f"VLASpec.values_per_chunk={self.values_per_chunk}: one value per chunk (1) "
                f"or per action ({self.chunk_size})"
            )

    @property
    def num_patches(self) -> int:
        return (self.image_size // self.patch_size) ** 2

    @property
    def action_tokens(self) -> int:
        """Tokens of one chunk, ``C * A``."""
        return self.chunk_size * self.action_dims


#: The default policy: ~1.4 M parameters with :class:`VLASpec`'s defaults.
DEFAULT_TRUNK = GPTSpec(
    family=VLAFamily.name,
    num_layers=6,
    hidden_size=128,
    num_attention_heads=4,
    num_query_groups=4,
    ffn_hidden_size=384,
    vocab_size=64 + ACTION_BINS,
)


@dataclass(frozen=True)
class ActionSampling:
    """How action tokens are drawn, and so what the update scores: the action logits
    divided by ``temperature``, then only the ``top_k`` largest kept (``None``: all)."""

    temperature: float = 1.0
    top_k: int | None = None

    def __post_init__(self) -> None:
        if self.temperature <= 0:
            raise ValueError(
                f"ActionSampling.temperature={self.temperature}: the policy's log-probs "
                "need a temperature > 0"
            )
        if self.top_k is not None and not 1 <= self.top_k <= ACTION_BINS:
            raise ValueError(f"ActionSampling.top_k={self.top_k} is outside 1..{ACTION_BINS}")


@dataclass(frozen=True)
class VLAObservation:
    """One chunk step's inputs for ``n`` environments.

    Attributes:
        images: uint8 ``[n, H, W, 3]``.
        states: float ``[n, S]``.
        prompt_ids: int64 ``[n, T]`` the instructions' token ids, all below the action
            ids; rows of one batch have one width (pad them: the pad is part of the
            prompt for generation and update alike).
    """

    images: torch.Tensor
    states: torch.Tensor
    prompt_ids: torch.Tensor


@dataclass(frozen=True)
class VLAChunk:
    """A generated chunk: ``action_ids [n, C*A]`` (vocabulary ids; token ``j`` is
    dimension ``j % A`` of action ``j // A``, so ``reshape(n, C, A)`` gives the actions'
    ids), their ``logprobs [n, C*A]`` under the sampling distribution and the chunk's
    ``values [n, V]`` (``V = values_per_chunk``)."""

    action_ids: torch.Tensor
    logprobs: torch.Tensor
    values: torch.Tensor


class VLAHeads(nn.Module):
    """The VLA's modules besides the GPT: image patch and state embeddings, the
    parallel decode's action placeholders, the value head and, for ``action_head:
    gaussian``, the action head (all replicated over TP)."""

    def __init__(self, hidden_size: int, vla: VLASpec, dtype: torch.dtype) -> None:
        super().__init__()
        patch_pixels = 3 * vla.patch_size**2
        self.patch_size = vla.patch_size
        self.patch_embedding = nn.Linear(patch_pixels, hidden_size, dtype=dtype)
        self.patch_positions = nn.Parameter(0.02 * torch.randn(vla.num_patches, hidden_size))
        self.keypoints = KeypointEncoder(vla, hidden_size) if vla.keypoints else None
        self.state_projection = nn.Linear(vla.state_dim, hidden_size, dtype=dtype)
        # The state enters as (state - centre) / half_range: identity until a range is
        # set (VLAPolicy.set_state_range), then each dimension's range maps to [-1, 1],
        # as OpenVLA normalises its proprioception by its data's bounds. Weights, not
        # statistics: checkpointed and resharded with the parameters (WEIGHT_BUFFERS).
        self.register_buffer("state_centre", torch.zeros(vla.state_dim, dtype=dtype))
        self.register_buffer("state_half_range", torch.ones(vla.state_dim, dtype=dtype))
        self.action_queries = nn.Parameter(0.02 * torch.randn(vla.action_tokens, hidden_size))
        self.value_head = nn.Linear(hidden_size, vla.values_per_chunk, dtype=dtype)
        if vla.action_head == "gaussian":
            self.action_head = nn.Linear(hidden_size, 2, dtype=dtype)  # mean, log scale
            with torch.no_grad():
                self.action_head.weight.mul_(0.1)  # start near the centre, at the scale below
                self.action_head.bias.copy_(torch.tensor([0.0, math.log(INITIAL_SCALE)]))
        self.to(dtype)

    def prefix(
        self, images: torch.Tensor, states: torch.Tensor, instruction: torch.Tensor
    ) -> torch.Tensor:
        """``[n, patches + keypoints + 1, h]``: the image's patch embeddings, its keypoint tokens
        (``instruction``: the mean embedding of the instruction's words), the state."""
        dtype = self.patch_positions.dtype
        pixels = images.to(dtype) / 127.5 - 1.0  # uint8 -> [-1, 1]
        n, height, width, channels = pixels.shape
        p = self.patch_size
        patches = pixels.reshape(n, height // p, p, width // p, p, channels)
        patches = patches.permute(0, 1, 3, 2, 4, 5).reshape(n, -1, p * p * channels)
        image = self.patch_embedding(patches) + self.patch_positions
        scaled = (states.to(dtype) - self.state_centre) / self.state_half_range
        state = self.state_projection(scaled).unsqueeze(1)
        if self.keypoints is None:
            return torch.cat([image, state], dim=1)
        return torch.cat([image, self.keypoints(pixels, instruction), state], dim=1)

    def gaussian_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """``[W, n, h]`` hidden states at the action positions -> ``[n, W, 256]`` bin
        logits: the log-density (up to a constant) of each position's normal, mean
        ``tanh`` of the head's first output, scale the exponential of its second
        (within :data:`SCALE_BOUNDS`), at the bins' centres in [-1, 1]."""
        out = at_least_float32(self.action_head(hidden)).transpose(0, 1)
        mean = torch.tanh(out[..., :1])
        scale = out[..., 1:].exp().clamp(*SCALE_BOUNDS)
        return -0.5 * ((bin_centres(out) - mean) / scale) ** 2


def bin_centres(like: torch.Tensor) -> torch.Tensor:
    """The 256 bins' centres on [-1, 1] (the action tokenizer's grid), as ``like``."""
    edges = torch.linspace(-1.0, 1.0, ACTION_BINS + 1, dtype=like.dtype, device=like.device)
    return (edges[:-1] + edges[1:]) / 2


class KeypointEncoder(nn.Module):
    """Keypoint tokens of an image, conditioned on the instruction: a two-layer
    convolution whose hidden features the instruction scales and shifts (FiLM, as RT-1's
    image encoder), ``K`` feature maps, each turned by a spatial softmax into the
    expected (x, y) of its peak in the workspace's coordinates ([-1, 1], x right, y up)
    (Levine, Finn, Darrell and Abbeel 2016).

    Why: with only a linear patch embedding, finding *where* the named object is is left
    to attention over the patches, which this small policy does not learn in the time a
    CPU run has (cloned from an oracle, it located neither one coloured target nor the
    named one of three in 300 steps, docs/guide/environments.md). A keypoint is a
    coordinate from the first forward, and the instruction's FiLM makes a map follow the
    named colour, so the named target's position is one token's content.
    """

    def __init__(self, vla: VLASpec, hidden_size: int, channels: int = 16) -> None:
        super().__init__()
        self.hidden = nn.Conv2d(3, channels, 3, padding=1)
        self.instruction_norm = nn.LayerNorm(hidden_size)
        self.film = nn.Linear(hidden_size, 2 * channels)
        self.maps = nn.Conv2d(channels, vla.keypoints, 1)
        # The softmax's inverse temperature, learned (Levine et al.). At 1 a new encoder's
        # maps are nearly flat over the pixels, so a keypoint barely moves with the image
        # and the policy gets no gradient towards finding things for ~200 steps; at
        # INITIAL_SHARPNESS a map's peak is where it responds most from the start.
        self.log_sharpness = nn.Parameter(torch.tensor(math.log(INITIAL_SHARPNESS)))
        centres = (torch.arange(vla.image_size) + 0.5) * 2.0 / vla.image_size - 1.0
        ys, xs = torch.meshgrid(-centres, centres, indexing="ij")
        self.register_buffer("grid", torch.stack([xs, ys], dim=-1).reshape(-1, 2), persistent=False)
        self.projection = nn.Linear(2, hidden_size)
        self.identity = nn.Parameter(0.02 * torch.randn(vla.keypoints, hidden_size))

    def forward(self, pixels: torch.Tensor, instruction: torch.Tensor) -> torch.Tensor:
        """``pixels [n, H, W, 3]`` in [-1, 1] and the instruction's mean word embedding
        ``[n, h]`` -> ``[n, K, h]`` keypoint tokens."""
        features = torch.relu(self.hidden(pixels.permute(0, 3, 1, 2)))
        scale, shift = self.film(self.instruction_norm(instruction)).chunk(2, dim=-1)
        features = features * (1.0 + scale[..., None, None]) + shift[..., None, None]
        maps = self.maps(torch.relu(features)).flatten(2) * self.log_sharpness.exp()  # [n, K, H*W]
        where = torch.softmax(maps, dim=-1) @ self.grid.to(maps.dtype)  # [n, K, 2]
        return self.projection(where) + self.identity


def build_vla(spec: GPTSpec, vla: VLASpec, parallel: ParallelSpec, seed: int = 0) -> nn.Module:
    """This rank's VLA policy: a ``GPTModel`` with :class:`VLAHeads` as ``model.vla``.

    Megatron groups must exist (``builder.initialize_parallel``). Pipeline and context
    parallelism are refused: the row's prefix is built on the first stage's embedding
    and CP's packed-row split does not know the image tokens.
    """
    from backends.megatron.builder import build_gpt

    if parallel.pp > 1 or parallel.cp > 1:
        raise ValueError("the vla family runs with pp=1 and cp=1 (tensor and data parallel only)")
    if spec.vocab_size <= ACTION_BINS:
        raise ValueError(
            f"the vla family needs vocab_size > {ACTION_BINS} (its last {ACTION_BINS} ids "
            f"are action bins); got {spec.vocab_size}"
        )
    model = build_gpt(spec, parallel, seed=seed)
    # The row's embeddings are gathered whole here and scattered over sequence-parallel
    # ranks once, with the image and state tokens (:meth:`VLAPolicy._hidden`).
    model.embedding.word_embeddings.reduce_scatter_embeddings = False
    device = next(model.parameters()).device
    torch.manual_seed(seed + 1)  # the same heads on every rank and at every layout
    model.vla = VLAHeads(spec.hidden_size, vla, spec.torch_dtype).to(device)
    return model


def action_log_probs(action_logits: torch.Tensor, sampling: ActionSampling) -> torch.Tensor:
    """``[..., 256]`` log-probs of the action bins under ``sampling`` (the top-k cut's
    bins get probability 0 through the dtype's lowest logit, which keeps gradients
    finite where ``-inf`` would make them NaN)."""
    logits = at_least_float32(action_logits) / sampling.temperature
    if sampling.top_k is not None and sampling.top_k < ACTION_BINS:
        kth = logits.topk(sampling.top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, torch.finfo(logits.dtype).min)
    return torch.log_softmax(logits, dim=-1)


class VLAPolicy:
    """Scores and generates action chunks with a model of :func:`build_vla`.

    Under TP every rank computes the same action log-probs (the action logits are
    gathered over TP) and, given the same generator seed, draws the same tokens.
    """

    def __init__(self, model: nn.Module, spec: GPTSpec, vla: VLASpec) -> None:
        self.model, self.spec, self.vla = model, spec, vla

    @property
    def first_action_id(self) -> int:
        """The id of bin 0; bin ``b`` is ``first_action_id + b``."""
        return self.spec.vocab_size - ACTION_BINS

    @torch.no_grad()
    def set_state_range(self, low: torch.Tensor, high: torch.Tensor) -> None:
        """Read each state dimension's ``[low, high]`` as ``[-1, 1]`` from now on (a
        dimension whose range is empty is only shifted). Why: a robot's raw state mixes
        metres of absolute position with the centimetres that matter (Meta-World's hand
        to puck); an MLP cloned offline from the raw floats succeeded in 0.06-0.38 of
        sampled episodes, from the same data scaled by its range in 0.94-1.0
        (docs/guide/environments.md)."""
        heads = self.model.vla
        low, high = (bound.to(heads.state_centre) for bound in (low, high))
        half = (high - low) / 2
        heads.state_centre.copy_((high + low) / 2)
        heads.state_half_range.copy_(torch.where(half > 1e-6, half, torch.ones_like(half)))

    def score(
        self,
        observation: VLAObservation,
        action_ids: torch.Tensor,
        sampling: ActionSampling,
        decode: str | None = None,
    ) -> dict[str, torch.Tensor]:
        """The update's view of generated chunks (differentiable): ``logprobs`` and
        ``entropy`` ``[n, C*A]`` of ``action_ids`` under ``sampling``, ``values [n, V]``."""
        decode = decode or self.vla.decode
        self._check(observation)
        logits, values = self._action_logits(
            observation, self._action_inputs(action_ids[:, :-1], decode), 0, action_ids.shape[1]
        )
        log_probs = action_log_probs(logits, sampling)
        bins = (action_ids - self.first_action_id).to(log_probs.device)
        chosen = log_probs.gather(-1, bins.unsqueeze(-1)).squeeze(-1)
        probs = log_probs.exp()
        entropy = -(probs * log_probs).sum(-1)
        return {"logprobs": chosen, "entropy": entropy, "values": values}

    def backward(self, loss: torch.Tensor) -> None:
        """Gradients of ``loss`` (a scalar of :meth:`score`'s outputs), summed over the
        data-parallel replicas and where Megatron's rule sums over TP: ready to step."""
        from backends.megatron.optim import reduce_gradients

        with megatron_compat(get_device()):
            loss.backward()
            reduce_gradients(self.model)

    @torch.no_grad()
    def generate(
        self,
        observation: VLAObservation,
        sampling: ActionSampling,
        generator: Generators = None,
        decode: str | None = None,
    ) -> VLAChunk:
        """Draw one chunk per row: ``C*A`` action ids, their log-probs and the values
        (CPU tensors). ``generator``: one for the batch, or one per row.

        ``autoregressive`` recomputes the whole row for each token (the training engine
        has no KV cache); ``parallel`` runs one forward.
        """
        decode = decode or self.vla.decode
        self._check(observation)
        self.model.eval()
        tokens = self.vla.action_tokens
        if decode == "parallel":
            logits, values = self._action_logits(
                observation, self._action_inputs(None, decode), 0, tokens
            )
            bins, logprobs = _draw(action_log_probs(logits, sampling), generator)
            return VLAChunk(bins + self.first_action_id, logprobs, values.cpu())
        n = observation.prompt_ids.shape[0]
        ids = torch.empty(n, 0, dtype=torch.long)
        drawn_logprobs, values = [], None
        for token in range(tokens):
            logits, step_values = self._action_logits(
                observation, self._action_inputs(ids, decode), token, 1
            )
            values = step_values if values is None else values
            bins, logprobs = _draw(action_log_probs(logits, sampling), generator)
            ids = torch.cat([ids, bins.cpu() + self.first_action_id], dim=1)
            drawn_logprobs.append(logprobs)
        return VLAChunk(ids, torch.cat(drawn_logprobs, dim=1), values.cpu())

    @torch.no_grad()
    def values(self, observation: VLAObservation) -> torch.Tensor:
        """The value head's ``[n, V]`` (CPU) at each observation, as :meth:`generate` reads
        it (at the prompt's last position, before any action): one forward of the
        prompt alone, for bootstrapping an episode cut off by its horizon."""
        self._check(observation)
        self.model.eval()
        none = torch.empty(observation.prompt_ids.shape[0], 0, dtype=torch.long)
        _, values = self._action_logits(
            observation, self._action_inputs(none, "autoregressive"), 0, 1
        )
        return values.cpu()

    # ---- the forward --------------------------------------------------------------
    def _check(self, observation: VLAObservation) -> None:
        """Observations of the shapes this policy was built for, instructions in text ids."""
        images, states, prompt_ids = observation.images, observation.states, observation.prompt_ids
        n, size = prompt_ids.shape[0], self.vla.image_size
        if images.dtype != torch.uint8 or tuple(images.shape) != (n, size, size, 3):
            raise ValueError(
                f"images are {images.dtype} {tuple(images.shape)}; this policy reads uint8 "
                f"[{n}, {size}, {size}, 3]"
            )
        if tuple(states.shape) != (n, self.vla.state_dim):
            raise ValueError(
                f"states are {tuple(states.shape)}; this policy reads [{n}, {self.vla.state_dim}]"
            )
        if prompt_ids.numel() and not 0 <= int(prompt_ids.min()) <= int(prompt_ids.max()) < (
            self.first_action_id
        ):
            raise ValueError(
                f"instruction ids must lie in [0, {self.first_action_id}): the ids above are "
                "action bins"
            )

    def _action_inputs(self, known_ids: torch.Tensor | None, decode: str) -> torch.Tensor:
        """``[n or 1, m, h]`` inputs at the action positions: the known ids' embeddings
        (autoregressive) or the chunk's placeholders but the last (parallel; the last
        token's input is read by no later position)."""
        if decode not in DECODES:
            raise ValueError(f"decode '{decode}' is unknown; choose one of {DECODES}")
        if decode == "parallel":
            return self.model.vla.action_queries[: self.vla.action_tokens - 1].unsqueeze(0)
        device = self.model.vla.action_queries.device
        if known_ids.shape[1] == 0:
            return self.model.vla.action_queries[:0].unsqueeze(0)
        return self.model.embedding.word_embeddings(known_ids.to(device))

    def _action_logits(
        self, observation: VLAObservation, action_inputs: torch.Tensor, first: int, count: int
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Action logits ``[n, count, 256]`` of tokens ``first .. first + count - 1`` and,
        with ``first == 0``, the values ``[n, V]`` (read at the same, last prompt position)."""
        vla = self.model.vla
        device = vla.action_queries.device
        prompt_ids = observation.prompt_ids.to(device)
        n = prompt_ids.shape[0]
        words = self.model.embedding.word_embeddings(prompt_ids)
        images, states = observation.images.to(device), observation.states.to(device)
        prefix = vla.prefix(images, states, words.mean(dim=1))
        row = torch.cat([prefix, words, action_inputs.expand(n, -1, -1)], dim=1)
        prompt_end = prefix.shape[1] + prompt_ids.shape[1]
        positions = torch.arange(first, first + count, device=device) + prompt_end - 1
        hidden_at_window = {}

        def keep_hidden(module: nn.Module, args: tuple) -> None:
            hidden_at_window["hidden"] = args[0]  # [W, n, h], gathered by logits_at

        window = positions.unsqueeze(0).expand(n, -1)
        with megatron_compat(get_device()), logits_at(self.model, window):
            handle = output_layer_of(self.model).register_forward_pre_hook(keep_hidden)
            try:
                logits = self.model(None, None, None, decoder_input=self._hidden(row))
            finally:
                handle.remove()
            if self.vla.action_head == "gaussian":
                logits = vla.gaussian_logits(hidden_at_window["hidden"])
            else:
                logits = self._action_columns(logits)
        values = None
        if first == 0:
            # The head reads the trunk's features without training them: its loss moves no
            # policy weight (a head trained through the trunk from its random start undid
            # a cloned policy within ten PPO iterations, docs/guide/environments.md).
            features = hidden_at_window["hidden"][0].detach()
            values = at_least_float32(vla.value_head(features))
        return logits, values

    def _hidden(self, row: torch.Tensor) -> torch.Tensor:
        """``[n, s, h]`` row embeddings -> ``[s, n, h]`` decoder input, right-padded to a
        multiple of TP and split over it under sequence parallelism (causal attention:
        the pads change no real position)."""
        from megatron.core.tensor_parallel import scatter_to_sequence_parallel_region

        hidden = row.transpose(0, 1)
        config = self.model.config
        if config.sequence_parallel:
            pad = -hidden.shape[0] % config.tensor_model_parallel_size
            hidden = torch.nn.functional.pad(hidden, (0, 0, 0, 0, 0, pad))
            hidden = scatter_to_sequence_parallel_region(hidden)
        return hidden.contiguous()

    def _action_columns(self, logits: torch.Tensor) -> torch.Tensor:
        """Vocab-parallel logits ``[n, W, V / tp]`` -> the action ids' ``[n, W, 256]``."""
        from megatron.core.tensor_parallel import gather_from_tensor_model_parallel_region

        if self.model.config.tensor_model_parallel_size > 1:
            logits = gather_from_tensor_model_parallel_region(logits)
        return at_least_float32(logits[..., self.first_action_id : self.spec.vocab_size])


def _draw(log_probs: torch.Tensor, generator: Generators) -> tuple[torch.Tensor, torch.Tensor]:
    """One bin per ``[n, W]`` slot from ``log_probs [n, W, 256]``, and its log-prob (CPU)."""
    probs = log_probs.detach().exp().cpu()
    if generator is None or isinstance(generator, torch.Generator):
        drawn = torch.multinomial(probs.flatten(0, 1), 1, generator=generator)
    else:
        if len(generator) != len(probs):
            raise ValueError(f"{len(generator)} generators for {len(probs)} rows; give one per row")
        drawn = torch.cat(
            [
                torch.multinomial(row, 1, generator=g)
                for row, g in zip(probs, generator, strict=True)
            ]
        )
    drawn = drawn.reshape(probs.shape[:2])
    return drawn, log_probs.detach().cpu().gather(-1, drawn.unsqueeze(-1)).squeeze(-1)
