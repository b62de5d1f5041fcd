"""A callback after each layer's attention: that layer's KV for the step is then in the cache.

Every attention backend writes the step's K/V into the paged cache before it
attends (the `paged_attention(q, k, v, k_cache, v_cache, meta, scale)`
contract of engine.attention), so right after it returns, layer L's blocks are
final while layers L+1.. are still to run. A prefill worker ships layer L
then, and the KV transfer overlaps the rest of the forward. On CUDA the write
is queued on the stream: whoever reads the cache in the callback synchronises
(a host copy does).
"""

from __future__ import annotations

from typing import Callable

from engine.kv_cache import KVCaches


class LayerDoneHook:
    """Wraps an attention function; calls `on_layer_done(layer)` after each call returns."""

    def __init__(self, attn_fn: Callable, kv_caches: KVCaches, on_layer_done: Callable[[int], None]):
        self.inner = attn_fn
        self.on_layer_done = on_layer_done
        # Layers are told apart by their cache tensor, not by call order, so a forward that skips
        # or repeats a layer cannot shift the numbering.
        self._layer_of = {k_cache.data_ptr(): layer for layer, (k_cache, _) in enumerate(kv_caches)}

    def __call__(self, q, k, v, k_cache, v_cache, meta, scale):
        out = self.inner(q, k, v, k_cache, v_cache, meta, scale)
        self.on_layer_done(self._layer_of[k_cache.data_ptr()])
        return out


def install_layer_hook(runner, on_layer_done: Callable[[int], None]) -> None:
    """Make `runner` (an engine ModelRunner) call `on_layer_done(layer)` as each layer's KV is written."""
    runner.attn_fn = LayerDoneHook(runner.attn_fn, runner.kv_caches, on_layer_done)
