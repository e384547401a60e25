"""Shared machinery of the Llama-like families: HF tensors <-> canonical Megatron tensors.

"Canonical" Megatron names are those of the local layer spec with *global* layer and
expert indexes (``decoder.layers.{layer}.mlp.experts.local_experts.{expert}...``) and
full, unsharded tensors. In that layout:

* ``linear_qkv`` is group-interleaved: for each query group, its q heads, then its k
  head, then its v head. A contiguous split by query groups is therefore a TP split.
* ``linear_fc1`` is ``[gate; up]`` (two pieces, each TP-split on its own).
* vocabulary tensors are padded to a multiple of TP with zero rows (dropped for HF).
* the input / pre-MLP norms are ``input_layernorm`` / ``pre_mlp_layernorm`` also for
  models built with the TE layer spec (``layouts.local_spec_name``).

A family subclass only says how its HF names look; the tensor maths lives here.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping

import torch

from backends.megatron.layouts import is_extra_state, local_spec_name, local_spec_state_dict
from backends.megatron.spec import GPTSpec

Tensors = dict[str, torch.Tensor]


def interleave_qkv(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, spec: GPTSpec
) -> torch.Tensor:
    """HF ``q [heads*d, ...]``, ``k``/``v`` ``[groups*d, ...]`` -> Megatron fused qkv."""
    groups, d = spec.num_query_groups, spec.head_dim
    per_group = spec.num_attention_heads // groups
    q = q.reshape(groups, per_group * d, *q.shape[1:])
    k = k.reshape(groups, d, *k.shape[1:])
    v = v.reshape(groups, d, *v.shape[1:])
    return torch.cat([q, k, v], dim=1).reshape(-1, *q.shape[2:])


def split_qkv(qkv: torch.Tensor, spec: GPTSpec) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Inverse of :func:`interleave_qkv`."""
    groups, d = spec.num_query_groups, spec.head_dim
    per_group = spec.num_attention_heads // groups
    grouped = qkv.reshape(groups, (per_group + 2) * d, *qkv.shape[1:])
    q, k, v = torch.split(grouped, [per_group * d, d, d], dim=1)
    return (
        q.reshape(-1, *qkv.shape[1:]),
        k.reshape(-1, *qkv.shape[1:]),
        v.reshape(-1, *qkv.shape[1:]),
    )


def pad_rows(weight: torch.Tensor, rows: int) -> torch.Tensor:
    if weight.shape[0] == rows:
        return weight
    padding = weight.new_zeros(rows - weight.shape[0], *weight.shape[1:])
    return torch.cat([weight, padding])


class LlamaLikeFamily:
    """HF <-> canonical Megatron names for Llama-style decoders; subclasses rename.

    Class attributes say what a family is and builds (its name, HF architectures and
    ``model_type``, multi-latent attention) and give the HF module names that differ
    between families; the config's family choices, the model setup and the generation
    engines' HF config read them, never a family's name. Adding a family is its file and
    a line in ``FAMILIES`` (``families/__init__.py``).
    """

    name = "llama"
    hf_architectures: tuple[str, ...] = ()
    #: transformers' ``model_type`` (``AutoConfig.for_model``) of the HF config it reads.
    hf_model_type = "llama"
    #: Multi-latent attention (DeepSeek's): its options (MLA ranks, group-limited routing,
    #: YaRN) are read the family's way, from an HF config of DeepSeek's schema, which the
    #: config's model section is turned into first (mindrl/config/specs.py).
    mla = False
    #: A vision-language-action policy (``families/vla.py``): image and state tokens in
    #: front of the prompt, action ids at the end of the vocabulary; only the embodied
    #: loop trains it.
    vision_language_action = False
    hf_router = "mlp.gate"
    hf_experts = "mlp.experts"
    hf_shared_experts = "mlp.shared_experts"

    # ---- HF -> Megatron ------------------------------------------------------------
    def hf_to_megatron(self, hf: Tensors, spec: GPTSpec, tp: int = 1) -> Tensors:
        """Full HF state dict -> full canonical Megatron state dict (vocab padded for ``tp``)."""
        vocab = spec.padded_vocab_size(tp)
        out = {"embedding.word_embeddings.weight": pad_rows(hf["model.embed_tokens.weight"], vocab)}
        for layer in range(spec.num_layers):
            out.update(self._layer_to_megatron(hf, spec, layer))
        out["decoder.final_layernorm.weight"] = hf["model.norm.weight"]
        if not spec.tie_word_embeddings:
            out["output_layer.weight"] = pad_rows(hf["lm_head.weight"], vocab)
        return out

    def _layer_to_megatron(self, hf: Tensors, spec: GPTSpec, layer: int) -> Tensors:
        src, dst = f"model.layers.{layer}.", f"decoder.layers.{layer}."
        out = {
            dst + "input_layernorm.weight": hf[src + "input_layernorm.weight"],
            dst + "pre_mlp_layernorm.weight": hf[src + "post_attention_layernorm.weight"],
            dst + "self_attention.linear_proj.weight": hf[src + "self_attn.o_proj.weight"],
        }
        out.update(self._attention_to_megatron(hf, spec, src + "self_attn.", dst))
        out.update(self._mlp_to_megatron(hf, spec, layer))
        return out

    def _attention_to_megatron(self, hf: Tensors, spec: GPTSpec, attn: str, dst: str) -> Tensors:
        """Everything of one attention block but its output projection (GQA: fused qkv)."""
        out = {}
        for kind in ("weight", "bias") if spec.add_qkv_bias else ("weight",):
            q, k, v = (hf[f"{attn}{p}_proj.{kind}"] for p in "qkv")
            out[f"{dst}self_attention.linear_qkv.{kind}"] = interleave_qkv(q, k, v, spec)
        if spec.qk_layernorm:
            out[dst + "self_attention.q_layernorm.weight"] = hf[attn + "q_norm.weight"]
            out[dst + "self_attention.k_layernorm.weight"] = hf[attn + "k_norm.weight"]
        return out

    def _mlp_to_megatron(self, hf: Tensors, spec: GPTSpec, layer: int) -> Tensors:
        src, dst = f"model.layers.{layer}.", f"decoder.layers.{layer}.mlp."
        if layer not in spec.moe_layer_indexes():
            return _swiglu_to_megatron(hf, src + "mlp.", dst)
        out = {dst + "router.weight": hf[src + self.hf_router + ".weight"]}
        for expert in range(spec.num_experts):
            hf_expert = f"{src}{self.hf_experts}.{expert}."
            out.update(_swiglu_to_megatron(hf, hf_expert, f"{dst}experts.local_experts.{expert}."))
        if spec.moe_shared_expert_size:
            out.update(
                _swiglu_to_megatron(hf, f"{src}{self.hf_shared_experts}.", dst + "shared_experts.")
            )
        return out

    # ---- Megatron -> HF ------------------------------------------------------------
    def megatron_to_hf(self, full: Tensors, spec: GPTSpec) -> Tensors:
        """Full canonical Megatron state dict -> HF state dict (what generation engines load)."""
        return dict(self.iter_hf(full, spec))

    def iter_hf(
        self, full: Mapping[str, torch.Tensor], spec: GPTSpec
    ) -> Iterator[tuple[str, torch.Tensor]]:
        """Yield ``(hf_name, tensor)`` pairs for every HF parameter (a streaming variant).

        ``full`` may also use the TE layer spec's names and hold ``_extra_state`` entries.
        It may be a mapping that reads each tensor when asked (a checkpoint's): only the
        names are looked at up front, and each tensor is read once, when its turn comes.
        """
        if any(is_extra_state(n) or local_spec_name(n) != n for n in full):
            full = local_spec_state_dict(full)
        vocab = spec.vocab_size
        yield "model.embed_tokens.weight", full["embedding.word_embeddings.weight"][:vocab]
        for layer in range(spec.num_layers):
            yield from self._layer_to_hf(full, spec, layer)
        yield "model.norm.weight", full["decoder.final_layernorm.weight"]
        if not spec.tie_word_embeddings:
            yield "lm_head.weight", full["output_layer.weight"][:vocab]

    def _layer_to_hf(
        self, full: Tensors, spec: GPTSpec, layer: int
    ) -> Iterator[tuple[str, torch.Tensor]]:
        src, dst = f"decoder.layers.{layer}.", f"model.layers.{layer}."
        attn = dst + "self_attn."
        yield dst + "input_layernorm.weight", full[src + "input_layernorm.weight"]
        yield dst + "post_attention_layernorm.weight", full[src + "pre_mlp_layernorm.weight"]
        yield attn + "o_proj.weight", full[src + "self_attention.linear_proj.weight"]
        yield from self._attention_to_hf(full, spec, src, attn)
        yield from self._mlp_to_hf(full, spec, layer)

    def _attention_to_hf(
        self, full: Tensors, spec: GPTSpec, src: str, attn: str
    ) -> Iterator[tuple[str, torch.Tensor]]:
        """Inverse of :meth:`_attention_to_megatron`."""
        for kind in ("weight", "bias") if spec.add_qkv_bias else ("weight",):
            q, k, v = split_qkv(full[f"{src}self_attention.linear_qkv.{kind}"], spec)
            yield from (
                (f"{attn}{p}_proj.{kind}", t) for p, t in zip("qkv", (q, k, v), strict=True)
            )
        if spec.qk_layernorm:
            yield attn + "q_norm.weight", full[src + "self_attention.q_layernorm.weight"]
            yield attn + "k_norm.weight", full[src + "self_attention.k_layernorm.weight"]

    def _mlp_to_hf(
        self, full: Tensors, spec: GPTSpec, layer: int
    ) -> Iterator[tuple[str, torch.Tensor]]:
        src, dst = f"decoder.layers.{layer}.mlp.", f"model.layers.{layer}."
        if layer not in spec.moe_layer_indexes():
            yield from _swiglu_to_hf(full, src, dst + "mlp.")
            return
        yield dst + self.hf_router + ".weight", full[src + "router.weight"]
        for expert in range(spec.num_experts):
            mg_expert = f"{src}experts.local_experts.{expert}."
            if mg_expert + "linear_fc1.weight" not in full:
                continue  # a generation rank with expert parallelism holds only its own
            yield from _swiglu_to_hf(full, mg_expert, f"{dst}{self.hf_experts}.{expert}.")
        if spec.moe_shared_expert_size:
            yield from _swiglu_to_hf(
                full, src + "shared_experts.", f"{dst}{self.hf_shared_experts}."
            )

    # ---- LoRA adapters -> HF (PEFT) -------------------------------------------------
    def lora_to_hf(
        self, adapters: Mapping[str, torch.Tensor], spec: GPTSpec
    ) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
        """Full canonical adapters (``<linear>.lora.A`` ``[r, in]``, ``<linear>.lora.B``
        ``[out, r]``) -> HF linear module name -> ``(A, B)``, as PEFT names them.

        A fused Megatron linear is several HF linears stacked by rows (q/k/v in
        ``linear_qkv``, gate/up in ``linear_fc1``), and ``B @ A`` split by rows is ``B``
        split by rows times the same ``A``: each HF linear gets its rows of ``B``, split
        exactly as the weight is (:func:`split_qkv`, :func:`_swiglu_to_hf`), and a shared
        ``A``. The generation engines' hand-over and the PEFT export both read this.
        """
        prefixes = sorted({name.rsplit(".lora.", 1)[0] for name in adapters})
        out = {}
        for prefix in prefixes:
            a, b = adapters[f"{prefix}.lora.A"], adapters[f"{prefix}.lora.B"]
            for hf_name, rows in self._hf_linears_of(prefix, b, spec):
                out[hf_name] = (a, rows)
        return out

    def _hf_linears_of(
        self, prefix: str, rows: torch.Tensor, spec: GPTSpec
    ) -> Iterator[tuple[str, torch.Tensor]]:
        """The HF linears of the canonical linear ``prefix`` with their rows of ``rows``."""
        if prefix == "output_layer":
            yield "lm_head", rows[: spec.vocab_size]
            return
        layer, _, inner = prefix.removeprefix("decoder.layers.").partition(".")
        hf_layer = f"model.layers.{layer}."
        if inner == "self_attention.linear_qkv":
            for p, piece in zip("qkv", split_qkv(rows, spec), strict=True):
                yield f"{hf_layer}self_attn.{p}_proj", piece
            return
        if inner == "self_attention.linear_proj":
            yield f"{hf_layer}self_attn.o_proj", rows
            return
        block, _, leaf = inner.rpartition(".")
        hf_block = {"mlp": "mlp", "mlp.shared_experts": self.hf_shared_experts}.get(block)
        if hf_block is None or leaf not in ("linear_fc1", "linear_fc2"):
            raise ValueError(f"no HF linear is known for the adapted Megatron linear '{prefix}'")
        if leaf == "linear_fc2":
            yield f"{hf_layer}{hf_block}.down_proj", rows
            return
        gate, up = torch.chunk(rows, 2)
        yield f"{hf_layer}{hf_block}.gate_proj", gate
        yield f"{hf_layer}{hf_block}.up_proj", up

    # ---- HF config -> spec ---------------------------------------------------------
    def spec_from_hf_config(self, hf_config: dict, dtype: str = "float32") -> GPTSpec:
        """A :class:`GPTSpec` from an HF ``config.json`` dictionary of this family."""
        heads = hf_config["num_attention_heads"]
        fields = dict(
            family=self.name,
            num_layers=hf_config["num_hidden_layers"],
            hidden_size=hf_config["hidden_size"],
            num_attention_heads=heads,
            num_query_groups=hf_config.get("num_key_value_heads") or heads,
            ffn_hidden_size=hf_config["intermediate_size"],
            vocab_size=hf_config["vocab_size"],
            max_position_embeddings=hf_config.get("max_position_embeddings", 2048),
            head_dim=hf_config.get("head_dim"),
            rope_theta=float(hf_config.get("rope_theta") or _rope_theta(hf_config)),
            norm_eps=hf_config.get("rms_norm_eps", 1e-6),
            tie_word_embeddings=bool(hf_config.get("tie_word_embeddings", False)),
            dtype=dtype,
        )
        return GPTSpec(**(fields | self._extra_spec_fields(hf_config)))

    def _extra_spec_fields(self, hf_config: dict) -> dict:
        """Spec fields this family reads from its HF config (they override the common ones)."""
        return {}


def _rope_theta(hf_config: dict) -> float:
    # transformers 5 moved rope_theta into rope_parameters.
    params = hf_config.get("rope_parameters") or {}
    return params.get("rope_theta", 10000.0)


def _swiglu_to_megatron(hf: Tensors, src: str, dst: str) -> Tensors:
    gate, up = hf[src + "gate_proj.weight"], hf[src + "up_proj.weight"]
    return {
        dst + "linear_fc1.weight": torch.cat([gate, up]),
        dst + "linear_fc2.weight": hf[src + "down_proj.weight"],
    }


def _swiglu_to_hf(full: Tensors, src: str, dst: str) -> Iterator[tuple[str, torch.Tensor]]:
    gate, up = torch.chunk(full[src + "linear_fc1.weight"], 2)
    yield dst + "gate_proj.weight", gate
    yield dst + "up_proj.weight", up
    yield dst + "down_proj.weight", full[src + "linear_fc2.weight"]
