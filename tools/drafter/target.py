"""The target (the default model) in torch: transformers' LlamaForCausalLM built from
the GGUF's metadata and our dequantized weights, so the reference forward is
transformers' own, with hooks that capture decoder layers' outputs (the last one's is
the residual stream before the final norm; a drafter's context rows are made of the
layers it taps, by default that one alone).
"""

from __future__ import annotations

from contextlib import contextmanager
from pathlib import Path

import numpy as np
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from tools.drafter.gguf_target import GGUFFile, embedding_check, llama_config

# GGUF tensor names -> transformers' (per layer)
_LAYER_NAMES = {
    "attn_norm": "input_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_norm": "post_attention_layernorm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}


def unpermute_rows(w: np.ndarray, num_heads: int) -> np.ndarray:
    """Undo llama.cpp's Q/K row permutation (convert_hf_to_gguf.py `permute`), which puts
    each head's rotate-half pairs (i, i + hd/2) next to each other for ggml's rope."""
    rows = w.shape[0]
    return w.reshape(num_heads, rows // num_heads // 2, 2, -1).swapaxes(1, 2).reshape(w.shape)


class Target:
    """The frozen target: `model` (LlamaForCausalLM), its `embedding` table [V, D] float32,
    `eos_id`, `config` (the metadata's values) and `check` (the spec's target_check)."""

    def __init__(self, gguf_path: str | Path, device: str = "cpu", dtype=torch.float32) -> None:
        gguf = GGUFFile(gguf_path)
        if gguf.meta.get("general.architecture") != "llama":
            raise ValueError(
                f"{gguf_path}: a {gguf.meta.get('general.architecture')} model, not llama"
            )
        self.config = llama_config(gguf)
        cfg = self.config
        self.eos_id = cfg["eos_token_id"]
        hf_config = LlamaConfig(
            **{k: v for k, v in cfg.items() if k not in ("eos_token_id", "bos_token_id")},
            bos_token_id=cfg["bos_token_id"],
            eos_token_id=cfg["eos_token_id"],
            pad_token_id=cfg["eos_token_id"],
            attention_bias=False,
            mlp_bias=False,
            hidden_act="silu",
        )
        _check_rope_base(hf_config, cfg["rope_theta"])
        model = LlamaForCausalLM(hf_config)  # random weights, all replaced just below
        state = self._state_dict(gguf)
        self.embedding = state["model.embed_tokens.weight"]
        self.check = embedding_check(self.embedding.numpy())
        missing, unexpected = model.load_state_dict(state, strict=False)
        if unexpected or set(missing) - {"lm_head.weight"}:
            raise ValueError(f"{gguf_path}: weights do not fit: {missing} {unexpected}")
        model.tie_weights()
        self.model = model.to(device=device, dtype=dtype).eval().requires_grad_(False)
        self.device = torch.device(device)
        self._want: tuple[int, ...] = ()
        self._captured: dict[int, torch.Tensor] = {}
        for i, layer in enumerate(self.model.model.layers):
            layer.register_forward_hook(self._capture_layer(i))

    def _state_dict(self, gguf: GGUFFile) -> dict[str, torch.Tensor]:
        cfg = self.config
        state = {
            "model.embed_tokens.weight": gguf.tensor("token_embd.weight"),
            "model.norm.weight": gguf.tensor("output_norm.weight"),
        }
        if not cfg["tie_word_embeddings"]:
            state["lm_head.weight"] = gguf.tensor("output.weight")
        for i in range(cfg["num_hidden_layers"]):
            for gguf_name, hf_name in _LAYER_NAMES.items():
                w = gguf.tensor(f"blk.{i}.{gguf_name}.weight")
                if gguf_name == "attn_q":
                    w = unpermute_rows(w, cfg["num_attention_heads"])
                elif gguf_name == "attn_k":
                    w = unpermute_rows(w, cfg["num_key_value_heads"])
                state[f"model.layers.{i}.{hf_name}.weight"] = w
        return {k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in state.items()}

    def _capture_layer(self, index: int):
        def hook(_module, _inputs, output) -> None:
            if index in self._want:
                self._captured[index] = output[0] if isinstance(output, tuple) else output

        return hook

    @contextmanager
    def _capturing(self, layers: tuple[int, ...]):
        self._want, self._captured = layers, {}
        try:
            yield
        finally:
            self._want, self._captured = (), {}

    @torch.no_grad()
    def captures(self, tokens: torch.Tensor, layers: tuple[int, ...] = ()) -> torch.Tensor:
        """The outputs of decoder `layers` side by side (default: the last layer's, before
        the final norm), float32 [N, T, len(layers) * D], for right-padded tokens [N, T]
        (causal: padding after a row never reaches it). The last layer's rows are the
        last D columns when `layers` ends with it (`final_rows`)."""
        layers = layers or (len(self.model.model.layers) - 1,)
        with self._capturing(layers):
            self.model.model(input_ids=tokens.to(self.device), use_cache=False)
            missing = [i for i in layers if i not in self._captured]
            if missing:
                raise RuntimeError(f"the hooks of decoder layers {missing} did not fire")
            return torch.cat([self._captured[i].float() for i in layers], dim=-1)

    def final_rows(self, captures: torch.Tensor) -> torch.Tensor:
        """The last decoder layer's rows [..., D] of captures whose tapped layers end with it."""
        return captures[..., -self.config["hidden_size"] :]

    @torch.no_grad()
    def vocab_logits(self, rows: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        """The target's logits on token ids `ids` [N] from captured rows [..., D]: its
        final norm and LM head, as its own forward applies them after the last layer."""
        head = self.model.lm_head.weight[ids.to(self.device)]
        return self.model.model.norm(rows.to(self.device)).float() @ head.float().T


def _check_rope_base(config: LlamaConfig, base: float) -> None:
    """transformers 5 moved rope_theta into rope_parameters: make sure ours arrived."""
    params = getattr(config, "rope_parameters", None) or {}
    got = params.get("rope_theta", getattr(config, "rope_theta", None))
    if got is None or float(got) != base:
        raise ValueError(f"transformers took rope base {got}, the GGUF says {base}")
