"""The five-kernel step (kernels/fused_decode_cuda.py): a layer in five kernels instead of
~20 MLX ops, eager or traced once with `mx.compile`, on weights dequantized once into the
model dtype. `FusedDecode` (engine/runner/fused.py) takes these steps where the one-launch
kernel does not run, and after that kernel timed out at a grid barrier.

A mixin over FusedDecode's fields: `model`, `ops`, `k` (the kernels), `compiled`,
`_traced`, `keep_hidden`, `taps` and `hidden`.
"""

from __future__ import annotations

from typing import Any

import mlx.core as mx

from engine.state import FullKV


class FiveKernelSteps:
    model: Any
    ops: Any
    k: Any
    tied: bool
    embed: Any
    stacked: list[mx.array]
    keep_hidden: bool
    taps: tuple[int, ...]
    hidden: mx.array | None
    _traced: dict[Any, Any]

    def _dense_copy(self) -> None:
        """The five kernels' weights: stacked [num_layers, ...] in the model dtype."""
        ops = self.ops

        def dense(w: Any) -> mx.array:
            return ops._dense(w).astype(ops.dtype)

        def f32(w: Any) -> mx.array:
            return w.astype(mx.float32)

        model, layers = self.model, self.model.layers
        self.stacked = [
            mx.stack([f32(layer.input_norm) for layer in layers]),
            mx.stack([dense(layer.mixer.qkv.w) for layer in layers]),
            mx.stack([dense(layer.mixer.o.w) for layer in layers]),
            mx.stack([f32(layer.post_norm) for layer in layers]),
            mx.stack([dense(layer.mlp.gate_up.w) for layer in layers]),
            mx.stack([dense(layer.mlp.down.w) for layer in layers]),
            f32(model.norm),
            dense(model.lm_head),
        ]
        mx.eval(*self.stacked)
        self.norm, self.head_w = self.stacked[6], self.stacked[7]
        self.layers = [tuple(w[i] for w in self.stacked[:6]) for i in range(len(layers))]

    def _layers(
        self, x: mx.array, pos: mx.array, caches: list[Any], write: Any, taps: tuple[int, ...] = ()
    ) -> tuple[mx.array, mx.array]:
        """The last layer's rows, and the kept rows: with `taps` those layers' side by
        side, else the last layer's again."""
        k, tapped = self.k, []
        for i, ((nw1, w_qkv, w_o, nw2, w_gu, w_down), cache) in enumerate(
            zip(self.layers, caches, strict=True)
        ):
            q, k_rows, v_rows = k.qkv(x, nw1, w_qkv, pos)
            keys, values = write(cache, k_rows, v_rows)
            h = k.residual(k.attend(q, keys, values, pos), w_o, x)
            x = k.residual(k.gate_up(h, nw2, w_gu), w_down, h)
            if i in taps:
                tapped.append(x)
        return x, (mx.concatenate(tapped, axis=-1) if taps else x)

    def _head(self, x: mx.array, logits: str) -> mx.array | None:
        if logits == "none":
            return None
        return self.k.head(x if logits == "all" else x[-1:], self.norm, self.head_w)

    def _embed(self, ids: mx.array) -> mx.array:
        if self.tied:  # the dense head is the dequantized table: one gather
            return self.head_w[ids].astype(mx.float32)
        return self.ops.embed(self.embed, ids).astype(mx.float32)

    def _eager_step(
        self, ids: mx.array, pos: mx.array, kvs: list[FullKV], logits: str, offset: int
    ) -> Any:
        def write(kv: FullKV, k_rows: mx.array, v_rows: mx.array) -> tuple[mx.array, mx.array]:
            keys = self.ops.write_rows(kv.keys, offset, k_rows)
            values = self.ops.write_rows(kv.values, offset, v_rows)
            kv.replace_buffers(keys, values, kv.length)
            return keys, values

        x, kept = self._layers(self._embed(ids), pos, kvs, write, self.taps)
        if self.keep_hidden:
            self.hidden = kept.astype(mx.float32)
        return self._head(x, logits)

    def _compiled_step(self, ids: mx.array, pos: mx.array, kvs: list[FullKV], logits: str) -> Any:
        key = (logits, self.taps)  # a trace's outputs: the rows it keeps
        fn = self._traced.get(key)
        if fn is None:
            fn = self._traced[key] = mx.compile(self._traceable(logits, self.taps))
        buffers = []
        for kv in kvs:
            buffers += [kv.keys, kv.values]
            kv.replace_buffers(None, None, kv.length)  # the step's outputs replace them: donate
        outputs = fn(ids, pos, *buffers)
        del buffers
        rest = outputs[1:] if logits != "none" else outputs
        if self.keep_hidden:
            self.hidden = rest[0].astype(mx.float32)
        rest = rest[1:]
        for i, kv in enumerate(kvs):
            kv.replace_buffers(rest[2 * i], rest[2 * i + 1], kv.length)
        return outputs[0] if logits != "none" else None

    def _traceable(self, logits: str, taps: tuple[int, ...] = ()) -> Any:
        def step(ids: mx.array, pos: mx.array, *buffers: mx.array) -> list[mx.array]:
            caches = [list(buffers[i : i + 2]) for i in range(0, len(buffers), 2)]

            def write(cache: list[Any], k_rows: mx.array, v_rows: mx.array) -> Any:
                cache[0] = mx.slice_update(cache[0], k_rows, pos, axes=(1,))
                cache[1] = mx.slice_update(cache[1], v_rows, pos, axes=(1,))
                return cache[0], cache[1]

            x, kept = self._layers(self._embed(ids), pos, caches, write, taps)
            out = self._head(x, logits)
            flat = [kept, *(a for cache in caches for a in cache)]  # the rows kept
            return flat if out is None else [out, *flat]

        return step
