"""Standard networks as their parameter tensors, layer by layer, for the training estimator.

A :class:`Model` is the list of a network's trainable tensors in forward (layer) order,
each with its element count and the multiply-accumulates per sample of the layer that
owns it. :mod:`topoplan.estimate` fuses the gradients into buckets in reverse order (the
order backward produces them) and spreads the backward time over the layers by their
multiply-accumulates. The shapes are written out here from the published architecture
definitions; nothing is downloaded or imported from a model zoo.

| name | tensors | parameters | definition |
|---|---:|---:|---|
| ``resnet50`` | 161 | 25,557,032 | He et al. 2016, torchvision ``resnet50`` (v1.5: stride in the 3x3) |
| ``resnet152`` | 467 | 60,192,808 | He et al. 2016, torchvision ``resnet152`` |
| ``bert-large`` | 391 | 335,141,888 | Devlin et al. 2019, BERT-large: ``BertModel`` (embeddings, 24 layers, pooler) |
| ``gpt2-1.5b`` | 580 (+1 empty) | 1,557,611,200 | Radford et al. 2019, GPT-2 XL (48 layers, d 1600; the LM head tied to ``wte``) |

References
----------
He, Zhang, Ren, Sun, "Deep Residual Learning for Image Recognition", CVPR 2016, table 1.
Devlin, Chang, Lee, Toutanova, "BERT: Pre-training of Deep Bidirectional Transformers for
Language Understanding", NAACL 2019 (L=24, H=1024, A=16; vocabulary 30,522, 512 positions).
Radford et al., "Language Models are Unsupervised Multitask Learners", OpenAI 2019, table 2
(1542M: 48 layers, d_model 1600; vocabulary 50,257, context 1024).
"""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import EstimateError

__all__ = ["Tensor", "Model", "MODELS", "get_model", "uniform_model", "resnet", "bert_large",
           "gpt2_xl"]


@dataclass(frozen=True, slots=True)
class Tensor:
    """One trainable tensor: ``numel`` elements; ``macs`` multiply-accumulates per sample
    in the forward pass of its layer (0 for norms and biases, whose cost is small)."""

    name: str
    numel: int
    macs: int = 0


@dataclass(frozen=True, slots=True)
class Model:
    """A network as its trainable tensors in forward order; ``sample`` names one sample
    (an image, a sequence)."""

    name: str
    tensors: tuple[Tensor, ...]
    sample: str = "sample"

    @property
    def params(self) -> int:
        return sum(t.numel for t in self.tensors)


def resnet(blocks: tuple[int, int, int, int], name: str, *, image: int = 224,
           classes: int = 1000) -> Model:
    """A bottleneck ResNet (ResNet-50: ``(3, 4, 6, 3)``; ResNet-152: ``(3, 8, 36, 3)``).

    torchvision's layout: convolutions without bias, each followed by a batch norm
    (weight and bias), the stride of a stage's first block in its 3x3 convolution (v1.5,
    the same parameters as v1), a 1x1 projection on the shortcut of each stage's first block.
    """
    tensors: list[Tensor] = []

    def conv(label: str, cin: int, cout: int, k: int, out_hw: int) -> None:
        numel = cin * cout * k * k
        tensors.append(Tensor(f"{label}.weight", numel, numel * out_hw * out_hw))
        tensors.append(Tensor(f"{label.replace('conv', 'bn')}.weight", cout))
        tensors.append(Tensor(f"{label.replace('conv', 'bn')}.bias", cout))

    hw = image // 2
    conv("conv1", 3, 64, 7, hw)
    hw //= 2  # max pool
    cin = 64
    for stage, count in enumerate(blocks):
        width = 64 << stage
        for b in range(count):
            stride = 2 if stage > 0 and b == 0 else 1
            prefix = f"layer{stage + 1}.{b}"
            conv(f"{prefix}.conv1", cin, width, 1, hw)
            hw //= stride
            conv(f"{prefix}.conv2", width, width, 3, hw)
            conv(f"{prefix}.conv3", width, 4 * width, 1, hw)
            if b == 0:
                numel = cin * 4 * width
                tensors.append(Tensor(f"{prefix}.downsample.0.weight", numel, numel * hw * hw))
                tensors.append(Tensor(f"{prefix}.downsample.1.weight", 4 * width))
                tensors.append(Tensor(f"{prefix}.downsample.1.bias", 4 * width))
            cin = 4 * width
    tensors.append(Tensor("fc.weight", cin * classes, cin * classes))
    tensors.append(Tensor("fc.bias", classes))
    return Model(name, tuple(tensors), "image")


def _linear(tensors: list[Tensor], label: str, fan_in: int, fan_out: int, tokens: int,
            extra_macs: int = 0) -> None:
    tensors.append(Tensor(f"{label}.weight", fan_in * fan_out, fan_in * fan_out * tokens
                          + extra_macs))
    tensors.append(Tensor(f"{label}.bias", fan_out))


def _norm(tensors: list[Tensor], label: str, width: int) -> None:
    tensors.append(Tensor(f"{label}.weight", width))
    tensors.append(Tensor(f"{label}.bias", width))


def bert_large(*, seq_len: int = 128) -> Model:
    """BERT-large as ``BertModel``: embeddings, 24 encoder layers, pooler (no pre-training
    heads). ``seq_len`` sets the multiply-accumulates per sequence; the attention
    products (``2 seq^2 H`` per layer) are charged to the attention output projection."""
    hidden, layers, inner, vocab = 1024, 24, 4096, 30522
    t: list[Tensor] = [Tensor("embeddings.word_embeddings.weight", vocab * hidden),
                       Tensor("embeddings.position_embeddings.weight", 512 * hidden),
                       Tensor("embeddings.token_type_embeddings.weight", 2 * hidden)]
    _norm(t, "embeddings.LayerNorm", hidden)
    for i in range(layers):
        p = f"encoder.layer.{i}"
        for part in ("query", "key", "value"):
            _linear(t, f"{p}.attention.self.{part}", hidden, hidden, seq_len)
        _linear(t, f"{p}.attention.output.dense", hidden, hidden, seq_len,
                2 * seq_len * seq_len * hidden)
        _norm(t, f"{p}.attention.output.LayerNorm", hidden)
        _linear(t, f"{p}.intermediate.dense", hidden, inner, seq_len)
        _linear(t, f"{p}.output.dense", inner, hidden, seq_len)
        _norm(t, f"{p}.output.LayerNorm", hidden)
    _linear(t, "pooler.dense", hidden, hidden, 1)
    return Model("bert-large", tuple(t), "sequence")


def gpt2_xl(*, seq_len: int = 1024) -> Model:
    """GPT-2 1.5B (XL): token and position embeddings, 48 pre-norm layers, final norm.

    The LM head shares ``wte`` (no tensor of its own); its matmul is charged to a
    zero-element entry at the end, so ``wte``'s gradient is ready only when backward is
    done, as in the real network.
    """
    d, layers, vocab = 1600, 48, 50257
    t: list[Tensor] = [Tensor("wte.weight", vocab * d), Tensor("wpe.weight", 1024 * d)]
    for i in range(layers):
        p = f"h.{i}"
        _norm(t, f"{p}.ln_1", d)
        _linear(t, f"{p}.attn.c_attn", d, 3 * d, seq_len)
        _linear(t, f"{p}.attn.c_proj", d, d, seq_len, 2 * seq_len * seq_len * d)
        _norm(t, f"{p}.ln_2", d)
        _linear(t, f"{p}.mlp.c_fc", d, 4 * d, seq_len)
        _linear(t, f"{p}.mlp.c_proj", 4 * d, d, seq_len)
    _norm(t, "ln_f", d)
    t.append(Tensor("lm_head (tied to wte)", 0, vocab * d * seq_len))
    return Model("gpt2-1.5b", tuple(t), "sequence")


#: Known networks by canonical name.
MODELS = {
    "resnet50": lambda: resnet((3, 4, 6, 3), "resnet50"),
    "resnet152": lambda: resnet((3, 8, 36, 3), "resnet152"),
    "bert-large": bert_large,
    "gpt2-1.5b": gpt2_xl,
}
_ALIASES = {"resnet-50": "resnet50", "resnet-152": "resnet152", "bert_large": "bert-large",
            "bertlarge": "bert-large", "gpt2-xl": "gpt2-1.5b", "gpt-2-1.5b": "gpt2-1.5b",
            "gpt2_1.5b": "gpt2-1.5b", "gpt2-1.5": "gpt2-1.5b", "gpt-2": "gpt2-1.5b"}


def canonical(name: str) -> str:
    """The canonical model name for ``name`` (case and dashes forgiven); raises
    :class:`EstimateError` for an unknown one."""
    key = name.strip().lower().replace(" ", "")
    key = _ALIASES.get(key, key)
    if key not in MODELS:
        raise EstimateError(f"unknown model {name!r}; known: {', '.join(MODELS)} "
                            "(or give --params N)")
    return key


def get_model(name: str) -> Model:
    """The :class:`Model` named ``name`` (``resnet50``, ``ResNet-152``, ``bert-large``, ...)."""
    return MODELS[canonical(name)]()


def uniform_model(params: int | str, *, tensors: int = 100) -> Model:
    """``params`` parameters of an unknown network (a count, or ``"1.5B"``, ``"350M"``:
    :func:`~topoplan.units.parse_count`): ``tensors`` equal tensors of equal cost, so
    gradients become ready at an even pace during backward."""
    from ..units import parse_count
    try:
        params = parse_count(params)
    except ValueError as exc:
        raise EstimateError(f"--params: {exc}") from None
    n = min(tensors, params)
    sizes = [params // n + (1 if i < params % n else 0) for i in range(n)]
    return Model(f"{params:,} params", tuple(Tensor(f"t{i}", s, s) for i, s in enumerate(sizes)))
