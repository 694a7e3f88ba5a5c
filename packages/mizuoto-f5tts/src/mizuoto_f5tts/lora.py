"""F5-TTS's LoRA: which of its layers take adapters, and what the engine gives
:class:`~mizuoto.adapters.AdapterHost` (the module adapters attach under, the base weights'
identity, a turn of the engine's scheduling held while swapping, the fingerprint naming the adapter). Loading,
checks and hot-swap are the core's; training is ``mizuoto train -e f5tts --method lora``."""

from __future__ import annotations

import attrs
import torch

from mizuoto.adapters import Adapter, AdapterHost, LoRATargets
from mizuoto.errors import InvalidOption

#: LoRA on the backbone (``model.transformer``: the DiT, or E2's UNetT): by default every
#: block's attention projections (``to_q``, ``to_k``, ``to_v``, ``to_out.0``) and feed-forward
#: layers (``ff.0.0`` in, ``ff.2`` out): they hold nearly all of a block's weights and decide
#: the voice's timbre and prosody. The text embedding's ConvNeXt, the input projection, the
#: time MLP, the AdaLN modulations and the output projection may take adapters too, when named.
LORA_TARGETS = LoRATargets(
    default=("to_q", "to_k", "to_v", "to_out.0", "ff.0.0", "ff.2"),
    allowed=("transformer_blocks.*", "layers.*", "input_embed.*", "time_embed.*",
             "text_embed.*", "norm_out.*", "proj_out"),
    module="transformer")


class F5Adapters(AdapterHost):
    """The LoRA half of :class:`~mizuoto_f5tts.engine.F5Engine` (its ``model``, ``placement``,
    ``scheduling`` and ``_base_info``/``_info`` are the engine's)."""

    lora_targets = LORA_TARGETS

    def lora_root(self) -> torch.nn.Module:
        if self.placement.fast_profile:
            raise InvalidOption("engines.f5tts.fast", "a LoRA needs the float linear layers "
                                "the fast profile replaced or casts: load with "
                                "engines.f5tts.fast=off")
        return self.model.transformer

    def base_fingerprint(self) -> str:
        return self._base_info.fingerprint

    def adapter_turn(self):
        return self.scheduling  # a turn: between two requests' chunks

    def adapter_changed(self, adapter: Adapter | None) -> None:
        """The fingerprint (``info``, saved voices) names base and adapter."""
        self._info = self._base_info if adapter is None else attrs.evolve(
            self._base_info, fingerprint=f"{self._base_info.fingerprint}+lora:"
                                         f"{adapter.digest[:32]}")
