"""Position-embedding diagnostics of a trained model.

- `pe_value_range`: min/max of the position table. Sinusoidal rows lie in
  [-1, 1] (times a language scale); values outside point at a broken table
  or at raw indices used as embeddings.
- `plot_pe_heatmap`: the table as a `[position, dimension]` image.
- `positional_contribution`: the first attention sublayer run on
  `token + PE` and on `token` alone; the ratio
  `||att(tok + PE) - att(tok)|| / ||att(tok + PE)||`, averaged over real
  tokens. The number is reported, not judged.
- `attention_by_distance`: the mean attention weight a query gives a key at
  distance `|i - j|`, per layer, averaged over heads, queries and probe
  sentences.

Example:

>>> from keras_posenc.layers import SinusoidalPositionEmbedding
>>> layer = SinusoidalPositionEmbedding(max_length=32)
>>> r = pe_value_range(position_table(layer, depth=8))
>>> r["min"] >= -1.0, r["max"] <= 1.0, r["ok"]
(True, True, True)

References:
    - `docs/articles-behind-the-tools.md`: the source articles these probes
      come from.
"""

import os

import numpy as np
import tensorflow as tf

from keras_posenc.app import dataset as data_lib
from keras_posenc.app import run_folder
from keras_posenc.app._plotting import pyplot, save_figure
from keras_posenc.app.text_generation import load_model_file
from keras_posenc.files import write_json
from keras_posenc.layers.encoder_layer import merge_attention_masks

__all__ = [
    "attention_by_distance", "inspect_model", "pe_value_range", "plot_attention_by_distance",
    "plot_pe_heatmap", "position_table", "positional_contribution", "probe_batch",
]


def position_table(position_layer, depth=None, length=None):
    """The `[length, depth]` rows a position layer adds at positions 0..length-1 (float64).

    The layer is called on zeros, so the result is exactly what it adds to
    token embeddings (language 0 for layers with `num_languages`).

    Args:
        position_layer: a built or unbuilt position layer of
            `keras_posenc.layers`.
        depth: int, embedding width (default: the layer's `depth`).
        length: int, number of positions (default: the layer's
            `max_length`).

    Returns:
        float64 numpy array `[length, depth]`.

    Example:

    >>> from keras_posenc import sinusoidal_table
    >>> from keras_posenc.layers import SinusoidalPositionEmbedding
    >>> table = position_table(SinusoidalPositionEmbedding(max_length=10), depth=4)
    >>> table.shape, np.allclose(table, sinusoidal_table(10, 4, dtype="float64"), atol=1e-6)
    ((10, 4), True)
    """
    length = length or position_layer.max_length
    depth = depth or position_layer.depth
    zeros = tf.zeros([1, length, depth])
    if getattr(position_layer, "num_languages", None):
        rows = position_layer(zeros, language_ids=tf.zeros([1], tf.int32))
    else:
        rows = position_layer(zeros)
    return rows.numpy()[0].astype(np.float64)


def pe_value_range(table, *, bound=1.0, tolerance=1e-5):
    """Min, max, mean |value| of a PE table; `ok` when every value is within `±bound`.

    Args:
        table: array-like `[length, depth]`, e.g. from `position_table`.
        bound: float, largest allowed magnitude (1 for sin/cos; the largest
            language scale when the layer scales per language).
        tolerance: float, slack on `bound` for rounding.

    Returns:
        dict with float `min`, `max`, `mean_abs`, `bound` and bool `ok`.

    Example: a raw position index used as the embedding (`p` on every
    dimension) is flagged.

    >>> pe_value_range(np.arange(4.0)[:, None] * np.ones([1, 2]))
    {'min': 0.0, 'max': 3.0, 'mean_abs': 1.5, 'bound': 1.0, 'ok': False}

    References:
        - `docs/articles-behind-the-tools.md` (where this probe comes from).
    """
    table = np.asarray(table, np.float64)
    low, high = float(table.min()), float(table.max())
    return {"min": low, "max": high, "mean_abs": float(np.abs(table).mean()), "bound": bound,
            "ok": bool(low >= -bound - tolerance and high <= bound + tolerance)}


def plot_pe_heatmap(table, path, title="position embedding"):
    """Saves the table as a heatmap PNG (rows: positions, columns: dimensions); returns the path.

    Args:
        table: array `[length, depth]`.
        path: str, the PNG file to write.
        title: str, the plot title.

    Returns:
        str, `path`.

    Example:

    >>> import tempfile
    >>> from keras_posenc import sinusoidal_table
    >>> path = plot_pe_heatmap(sinusoidal_table(16, 8), os.path.join(tempfile.mkdtemp(), "pe.png"))
    >>> open(path, "rb").read(4)
    b'\\x89PNG'
    """
    plt = pyplot()

    fig, ax = plt.subplots(figsize=(7, 4.5))
    image = ax.imshow(table, aspect="auto", cmap="RdBu_r", vmin=-np.abs(table).max(),
                      vmax=np.abs(table).max(), interpolation="nearest")
    ax.set_xlabel("dimension")
    ax.set_ylabel("position")
    ax.set_title(title)
    fig.colorbar(image, ax=ax)
    return save_figure(fig, path)


def _attention_input(encoder_layer, x):
    return encoder_layer.attention_norm(x) if encoder_layer.norm_first else x


def positional_contribution(encoder, token_ids, language_ids=None):
    """Relative change of the first attention output when PE is removed.

    Returns the mean over real query tokens of
    `||att(tok + PE) - att(tok)|| / ||att(tok + PE)||`, where `tok` is the
    scaled token embedding and the mask is causal plus padding.

    Args:
        encoder: a built `keras_posenc.Encoder`.
        token_ids: int tensor `[batch, length]`, padding = `encoder.pad_id`.
        language_ids: optional int tensor, for a position layer with
            `num_languages`.

    Returns:
        float, the mean ratio (0 when the position layer adds nothing).

    Example:

    >>> from keras_posenc import Encoder
    >>> tokens = tf.constant([[2, 5, 6, 7], [2, 8, 0, 0]])
    >>> kwargs = dict(num_layers=1, d_model=8, num_heads=2, dff=16, vocab_size=20, max_length=8)
    >>> positional_contribution(Encoder(position="none", **kwargs), tokens)
    0.0
    >>> positional_contribution(Encoder(position="sinusoidal", **kwargs), tokens) > 0
    True

    References:
        - `docs/articles-behind-the-tools.md` (where this probe comes from).
    """
    embedding = encoder.embedding
    mask = tf.not_equal(token_ids, encoder.pad_id)
    with_pe = embedding(token_ids, language_ids=language_ids, training=False)
    # The embedding is `tok + PE`; the position layer on zeros gives the same PE rows.
    pe = embedding.position_embedding(tf.zeros_like(with_pe), language_ids=language_ids, mask=mask,
                                      training=False)
    tokens_only = with_pe - pe
    merged = merge_attention_masks(tf.shape(token_ids)[1], mask=mask, use_causal_mask=True)
    layer = encoder.encoder_layers[0]
    outputs = []
    for x in (with_pe, tokens_only):
        x = _attention_input(layer, tf.identity(x))
        outputs.append(layer.attention(x, x, attention_mask=merged, training=False))
    full, without = (o.numpy().astype(np.float64) for o in outputs)
    ratio = np.linalg.norm(full - without, axis=-1) / np.maximum(np.linalg.norm(full, axis=-1), 1e-12)
    return float(ratio[mask.numpy()].mean())


def attention_by_distance(encoder, token_ids, language_ids=None):
    """Mean attention weight per query-key distance `|i - j|`, one array per layer.

    Entry `d` of a layer's array averages, over heads and over every real
    query that has a real key at distance `d`, the weight on that key. With
    a causal mask only keys `j <= i` exist.

    Args:
        encoder, token_ids, language_ids: as for `positional_contribution`.

    Returns:
        list (one per encoder layer) of float64 arrays `[length]`; NaN at
        distances no real query-key pair has.

    Example: every query's weights sum to 1 and `T - d` causal pairs have
    distance `d`, so the count-weighted sum over distances is `T`.

    >>> from keras_posenc import Encoder
    >>> encoder = Encoder(num_layers=2, d_model=8, num_heads=2, dff=16, vocab_size=20, max_length=8)
    >>> per_layer = attention_by_distance(encoder, tf.constant([[2, 5, 6, 7, 8]]))
    >>> len(per_layer), per_layer[0].shape, round(float(np.sum(per_layer[0] * np.arange(5, 0, -1))), 4)
    (2, (5,), 5.0)

    References:
        - `docs/articles-behind-the-tools.md` (where this probe comes from).
    """
    mask = tf.not_equal(token_ids, encoder.pad_id)
    length = int(token_ids.shape[1])
    merged = merge_attention_masks(length, mask=mask, use_causal_mask=True)
    x = encoder.embedding(token_ids, language_ids=language_ids, training=False)
    distance = np.abs(np.arange(length)[:, None] - np.arange(length)[None, :])
    valid = merged.numpy()  # [B, T, T] query-key pairs that exist
    real_query = mask.numpy()[:, :, None]
    per_layer = []
    for layer in encoder.encoder_layers:
        # The layer's own attention, RoPE and ALiBi included.
        next_x, scores = layer(x, attention_mask=merged, training=False, return_attention_scores=True)
        weights = scores.numpy().astype(np.float64).mean(axis=1)  # [B, T, T] averaged over heads
        keep = valid & real_query
        sums = np.bincount(np.broadcast_to(distance, keep.shape)[keep], weights=weights[keep],
                           minlength=length)
        counts = np.bincount(np.broadcast_to(distance, keep.shape)[keep], minlength=length)
        per_layer.append(np.where(counts > 0, sums / np.maximum(counts, 1), np.nan))
        x = next_x
    return per_layer


def plot_attention_by_distance(per_layer, path, max_distance=32):
    """Saves the mean attention weight against distance, one line per layer; returns `path`.

    Args:
        per_layer: list of arrays `[length]`, from `attention_by_distance`.
        path: str, where the PNG goes.
        max_distance: int, largest distance shown.

    Example:

    >>> import tempfile
    >>> weights = [np.array([0.5, 0.3, 0.2]), np.array([0.6, 0.25, 0.15])]
    >>> path = plot_attention_by_distance(weights, os.path.join(tempfile.mkdtemp(), "att.png"))
    >>> os.path.getsize(path) > 0
    True
    """
    plt = pyplot()

    fig, ax = plt.subplots(figsize=(7, 4))
    for i, values in enumerate(per_layer):
        shown = values[:max_distance + 1]
        ax.plot(np.arange(len(shown)), shown, marker="o", ms=3, label=f"layer {i}")
    ax.set_xlabel("distance |i - j| (query i, key j <= i)")
    ax.set_ylabel("mean attention weight")
    ax.set_yscale("log")
    ax.legend()
    return save_figure(fig, path)


def probe_batch(sp_model, texts, max_length, num_languages=None):
    """Token ids (and zero language ids when needed) of probe sentences, framed as in training.

    Args:
        sp_model: bytes, the serialized SentencePiece model of the run.
        texts: list of str, the probe sentences (one batch).
        max_length: int, longest sequence (the model's `max_length`).
        num_languages: int or None; when set, language ids (all 0) are
            returned too.

    Returns:
        `(token_ids, language_ids)`: int32 `[len(texts), length]` padded with
        `PAD_ID` to the longest row, and zeros of that shape or None.

    Example:

    >>> sp_model = data_lib.train_sentencepiece(["the cat sat on the mat"] * 20, vocab_size=16)
    >>> token_ids, language_ids = probe_batch(sp_model, ["the cat", "the cat sat on the mat"], 6)
    >>> token_ids.shape, language_ids, int(token_ids[0, 0]) == data_lib.BOS_ID
    (TensorShape([2, 6]), None, True)
    """
    ds = data_lib.lm_dataset(list(texts), sp_model, max_length=max_length, batch_size=len(texts),
                             shuffle=False, bucket_lengths=None)
    features, _ = next(iter(ds))
    token_ids = features["token_ids"]
    language_ids = tf.zeros_like(token_ids) if num_languages else None
    return token_ids, language_ids


def inspect_model(model_path, out, texts=None, num_texts=32):
    """Runs every diagnostic on a `model.keras` saved by `train`; writes PNGs and `inspect.json`.

    Args:
        model_path: str, a `model.keras` written by `keras_posenc.app.train.train`
            (the `spm.model` beside it tokenizes the probe sentences).
        out: str, output folder for `pe_heatmap.png`,
            `attention_by_distance.png` and `inspect.json`.
        texts: list of str, probe sentences (default: the first
            `num_texts` lines of the embedded corpus).
        num_texts: int, number of default probe sentences.

    Returns:
        dict: `summary` (what `inspect.json` holds: `pe_range`,
        `positional_contribution_ratio`, `attention_by_distance` for
        distances 0-16, ...) and `artifacts` (the written paths).

    Raises:
        ValueError: the model file or the `spm.model` beside it is missing.

    Example: loading a trained model takes seconds, so this is exercised by
    `tests/test_cli.py::test_inspect_prints_diagnostics_and_writes_plots`.
    From the command line::

        keras-posenc inspect runs/demo/model.keras --out runs/demo/inspect

    References:
        - `docs/articles-behind-the-tools.md` (where this probe comes from).
    """
    from keras_posenc import models  # noqa: F401  registers CausalLM for loading

    if not os.path.isfile(model_path):
        raise ValueError(f"Model file not found: model={model_path!r}.")
    sp_model = run_folder.read_tokenizer(model_path)
    if sp_model is None:
        raise ValueError(f"No SentencePiece model next to the model: expected "
                         f"{run_folder.tokenizer_path(model_path)!r}.")
    model = load_model_file(model_path)
    encoder = model.encoder
    if not texts:
        texts = data_lib.read_text_corpus(data_lib.default_corpus_path())[:num_texts]
    os.makedirs(out, exist_ok=True)
    position_layer = encoder.embedding.position_embedding
    table = position_table(position_layer, depth=encoder.d_model)
    token_ids, language_ids = probe_batch(sp_model, texts, encoder.max_length,
                                          position_layer.num_languages)
    per_layer = attention_by_distance(encoder, token_ids, language_ids)
    bound = 1.0
    if position_layer.num_languages:
        bound = float(np.abs(position_layer.language_scale.numpy()).max())
    summary = {
        "model": model_path,
        "position": encoder.position,
        "pe_range": pe_value_range(table, bound=bound) if encoder.position == "sinusoidal"
        else pe_value_range(table, bound=float("inf")),
        "positional_contribution_ratio": positional_contribution(encoder, token_ids, language_ids),
        "attention_by_distance": [[None if np.isnan(v) else float(v) for v in layer[:17]]
                                  for layer in per_layer],
        "probe_sentences": len(texts),
    }
    artifacts = [
        plot_pe_heatmap(table, os.path.join(out, "pe_heatmap.png"), title=f"{encoder.position} PE"),
        plot_attention_by_distance(per_layer, os.path.join(out, "attention_by_distance.png")),
    ]
    report_path = os.path.join(out, "inspect.json")
    write_json(report_path, summary)
    artifacts.append(report_path)
    return {"summary": summary, "artifacts": artifacts}
