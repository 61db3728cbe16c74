"""GLM-4.1V, 4.5V and 4.6V: ``<|begin_of_image|>`` + ``<|image|>`` run + ``<|end_of_image|>``.

Their language model uses its own 3-D positions (multimodal RoPE over half of each head's
dimensions, ``partial_rotary_factor`` 0.5): image tokens get (temporal, height, width)
positions and the text after an image continues from the largest of them, exactly the Qwen2-VL
scheme, computed by the model's own ``get_rope_index`` from the processor's
``mm_token_type_ids``. So the adapter is
:class:`~posdebias.adapters.families.qwen2_vl.Qwen2VLAdapter`
with GLM's marker tokens; GLM-4.5V (``glm4v_moe``) only swaps the MLPs for experts, and GLM-4.6V
(``glm46v``) is GLM-4.1V's language and vision configs under its own processor classes.
"""

from __future__ import annotations

from posdebias._markers import register_hook
from posdebias.adapters.families.qwen2_vl import Qwen2VLAdapter
from posdebias.adapters.hf.spans import SpanTokens


class Glm4vAdapter(Qwen2VLAdapter):
    """GLM-4.1V / GLM-4.5V / GLM-4.6V (``zai-org/GLM-4.1V-9B-Thinking``, ``zai-org/GLM-4.5V``,
    ``zai-org/GLM-4.6V``)."""

    name = "glm4v"
    model_types = ("glm4v", "glm4v_moe", "glm46v")
    summary = "GLM-4.1V / 4.5V / 4.6V (3-D positions from get_rope_index, begin/end of image)"

    def span_tokens(self) -> SpanTokens:
        return SpanTokens.named(
            self.model.config, "image_token_id", "image_start_token_id", "image_end_token_id"
        )


posdebias_register_adapters = register_hook(Glm4vAdapter)
