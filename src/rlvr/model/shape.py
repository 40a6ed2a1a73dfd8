"""What size calculations (the memory plan, FLOP counts) need of a model's config: its shape."""

from __future__ import annotations

from dataclasses import dataclass

LINEARS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


@dataclass(frozen=True)
class ModelShape:
    """What the plan needs of a model's config (Llama-style names)."""

    layers: int
    hidden: int
    intermediate: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    tied: bool = True
    attention_bias: bool = False

    def module_dims(self) -> dict[str, tuple[int, int]]:
        """(in, out) features of each linear of one decoder layer."""
        h, i = self.hidden, self.intermediate
        q, kv = self.heads * self.head_dim, self.kv_heads * self.head_dim
        dims = [(h, q), (h, kv), (h, kv), (q, h), (h, i), (h, i), (i, h)]
        return dict(zip(LINEARS, dims, strict=True))

    @property
    def params(self) -> int:
        dims = self.module_dims()
        per_layer = sum(a * b for a, b in dims.values()) + 2 * self.hidden  # + two RMSNorms
        if self.attention_bias:
            per_layer += dims["q_proj"][1] + 2 * dims["k_proj"][1]
        embed = self.vocab * self.hidden
        return embed * (1 if self.tied else 2) + self.layers * per_layer + self.hidden

    def lora_params(self, rank: int, targets: tuple[str, ...] | str) -> int:
        """Adapter parameters: ``rank x (in + out)`` per targeted linear per layer."""
        dims = self.module_dims()
        names = list(dims) if targets == "all-linear" else [t for t in targets if t in dims]
        return self.layers * sum(rank * sum(dims[n]) for n in names)


def shape_from_config(config) -> ModelShape:
    """A `ModelShape` from a transformers config (``AutoConfig``)."""
    heads = config.num_attention_heads
    return ModelShape(
        layers=config.num_hidden_layers,
        hidden=config.hidden_size,
        intermediate=config.intermediate_size,
        heads=heads,
        kv_heads=getattr(config, "num_key_value_heads", None) or heads,
        head_dim=getattr(config, "head_dim", None) or config.hidden_size // heads,
        vocab=config.vocab_size,
        tied=bool(getattr(config, "tie_word_embeddings", False)),
        attention_bias=bool(getattr(config, "attention_bias", False)),
    )
