"""A key/value cache layer that decoding writes in place.

transformers' ``DynamicLayer`` grows by concatenation: every decode step allocates the layer's keys and
values anew and copies the whole cache into them, a cost that grows with the context (quadratic over a
completion). After the prefill the HF backend knows how many tokens a row can still add
(``max_new_tokens``), so each layer's keys and values move once into buffers with that much room, and
each step writes its token in place. Attention reads a view of the filled part: the same values in the
same order, so the logits are the same bit for bit (tested). Layers of any other type (sliding
windows, quantized or offloaded caches) are left as the model built them.

Why our own layer and not transformers' ``StaticCache``: a static cache attends over its whole
length at every step (masked), and its batch cannot shrink, while this backend drops finished rows.
"""

from __future__ import annotations

import torch
from transformers.cache_utils import DynamicLayer


class PreallocatedLayer(DynamicLayer):
    """A ``DynamicLayer`` whose keys and values live in buffers with room for ``room`` more tokens."""

    def __init__(self, keys: torch.Tensor, values: torch.Tensor, room: int) -> None:
        super().__init__()
        batch, heads, length, _ = keys.shape  # [B, kv heads, T, head dim]
        self._key_buffer = keys.new_empty(batch, heads, length + room, keys.shape[-1])
        self._value_buffer = values.new_empty(batch, heads, length + room, values.shape[-1])
        self._key_buffer[:, :, :length] = keys
        self._value_buffer[:, :, :length] = values
        self.length = length
        self.device, self.is_initialized = keys.device, True
        self._expose()

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        start, end = self.length, self.length + key_states.shape[-2]
        if end > self._key_buffer.shape[-2]:
            raise RuntimeError(f"the preallocated cache holds {self._key_buffer.shape[-2]} tokens; "
                               f"decoding asked for {end}")
        self._key_buffer[:, :, start:end] = key_states
        self._value_buffer[:, :, start:end] = value_states
        self.length = end
        self._expose()
        return self.keys, self.values

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        """Keep only the rows at ``indices`` (finished rows leave the batch)."""
        self._key_buffer = self._key_buffer[indices]
        self._value_buffer = self._value_buffer[indices]
        self._expose()

    def _expose(self) -> None:
        """``keys``/``values``, as transformers reads them: views of the filled part of the buffers."""
        self.keys = self._key_buffer[:, :, : self.length]
        self.values = self._value_buffer[:, :, : self.length]


def preallocate(cache, room: int) -> int:
    """Give every plain ``DynamicLayer`` of ``cache`` room for ``room`` more tokens; the count converted."""
    layers = getattr(cache, "layers", None)
    if layers is None:  # a cache class without per-layer objects (remote code): left as it is
        return 0
    converted = 0
    for index, layer in enumerate(layers):
        if type(layer) is DynamicLayer and layer.get_seq_length() > 0:  # not an empty or shared layer
            layers[index] = PreallocatedLayer(layer.keys, layer.values, room)
            converted += 1
    return converted
