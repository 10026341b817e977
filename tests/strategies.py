"""Hypothesis strategies of the property tests (tests/test_properties*.py).

Shapes, layouts and configurations are drawn by hypothesis (so a failure shrinks to the smallest
layout that shows it); float contents come from a numpy generator seeded by a drawn integer
(shrinking float noise teaches nothing). `reference_position_ids` is the plain-loop oracle of
position numbering that every property compares against.
"""

import numpy as np
from hypothesis import strategies as st

from keras_posenc.layers.rope_scaling import DYNAMIC_SCALINGS
from keras_posenc.layers.rotary_embedding import ROTARY_LAYOUTS, ROTARY_SCALINGS
from keras_posenc.layers.token_and_position_embedding import POSITION_LAYERS
from keras_posenc.tables import LAYOUTS, TABLE_KINDS

# Scalings whose frequencies depend on the call's length (Hugging Face "dynamic" NTK re-bases on
# the current length, "longrope" switches factor lists past the original context): shifting
# every position by k changes that length, so the relative property does not apply to them.
RELATIVE_SCALINGS = tuple(s for s in ROTARY_SCALINGS if s not in DYNAMIC_SCALINGS)
# Extra constructor arguments a scaling needs beyond `scaling_factor` and `original_length`.
SCALING_ARGUMENTS = {}

POLICIES = ("float32", "mixed_float16", "mixed_bfloat16", "bfloat16")
seeds = st.integers(0, 2**16)
depths = st.integers(1, 9)  # odd depths included
bases = st.sampled_from([2.0, 100.0, 10000.0, 123456.0]) | st.floats(1.5, 1e6)
policies = st.sampled_from(POLICIES)


def reference_position_ids(mask, segments=None, offset=0):
    """Real tokens numbered `offset, offset + 1, ...` per row, restarting where the segment id
    changes; padding 0. A plain loop, written from the docstring of `position_ids`."""
    mask = np.asarray(mask, bool)
    segments = np.zeros(mask.shape, int) if segments is None else np.asarray(segments)
    offsets = np.broadcast_to(np.asarray(offset), mask.shape[:1])
    ids = np.zeros(mask.shape, np.int64)
    for b in range(mask.shape[0]):
        count = 0
        for t in range(mask.shape[1]):
            if t and segments[b, t] != segments[b, t - 1]:
                count = 0
            if mask[b, t]:
                ids[b, t] = offsets[b] + count
                count += 1
    return ids


@st.composite
def row_masks(draw, real, length):
    """A bool `[length]` mask with exactly `real` True entries: left, right, both-sided or any padding."""
    pad = length - real
    kind = draw(st.sampled_from(["left", "right", "both", "scattered"]))
    if kind == "scattered":
        where = draw(st.sets(st.integers(0, length - 1), min_size=real, max_size=real))
        return np.isin(np.arange(length), sorted(where))
    left = {"left": pad, "right": 0}.get(kind)
    if left is None:
        left = draw(st.integers(0, pad))
    return (np.arange(length) >= left) & (np.arange(length) < left + real)


@st.composite
def padded_batches(draw, max_real, max_batch=3, max_pad=5, min_real=1):
    """`(lengths, mask)`: row b holds `lengths[b]` real tokens, placed by `row_masks` in a common length."""
    batch = draw(st.integers(1, max_batch))
    lengths = draw(st.lists(st.integers(min_real, max_real), min_size=batch, max_size=batch))
    length = max(lengths) + draw(st.integers(0, max_pad))
    mask = np.stack([draw(row_masks(n, length)) for n in lengths])
    return lengths, mask


@st.composite
def any_masks_and_segments(draw, max_batch=4, max_length=12):
    """Any bool mask `[B, T]` and any int segment ids `[B, T]` (few values: runs and reuses)."""
    batch = draw(st.integers(1, max_batch))
    length = draw(st.integers(1, max_length))
    flat = st.lists(st.booleans(), min_size=batch * length, max_size=batch * length)
    mask = np.array(draw(flat)).reshape(batch, length)
    values = st.lists(st.integers(0, 3), min_size=batch * length, max_size=batch * length)
    segments = np.array(draw(values), np.int32).reshape(batch, length)
    return mask, segments


offsets_for = lambda batch: st.integers(0, 40) | st.lists(  # noqa: E731
    st.integers(0, 40), min_size=batch, max_size=batch).map(lambda v: np.array(v, np.int32))


@st.composite
def segment_layouts(draw, max_segments=3, max_segment_length=5, max_pad=3):
    """`(lengths, segment_ids)` of one packed row: sequences of `lengths` back to back, distinct
    ids from 1 on, then padding with segment id 0."""
    lengths = draw(st.lists(st.integers(1, max_segment_length), min_size=1, max_size=max_segments))
    pad = draw(st.integers(0, max_pad))
    ids = np.concatenate([np.full(n, i + 1) for i, n in enumerate(lengths)] + [np.zeros(pad, int)])
    return lengths, ids.astype(np.int32)


@st.composite
def position_layer_configs(draw, kinds=tuple(POSITION_LAYERS), depth=None, languages=True):
    """`(kind, kwargs)` of an additive position layer: every table kind, base, layout, scale,
    language count, overflow mode and zero_padding choice."""
    kind = draw(st.sampled_from(kinds))
    kwargs = {"zero_padding": draw(st.booleans())}
    if kind == "sinusoidal":
        kwargs.update(base=draw(bases), layout=draw(st.sampled_from(LAYOUTS)),
                      table=draw(st.sampled_from(TABLE_KINDS)))
        if kwargs["table"] == "interpolated" and depth is not None and depth >= 2:
            kwargs["stored_dims"] = 2 * draw(st.integers(1, depth // 2))
    elif kind == "integer":
        kwargs["scale"] = draw(st.none() | st.sampled_from([0.0, 0.5, 1.0, -0.25]))
    elif kind == "learned":
        kwargs["initializer"] = "random_normal" if draw(st.booleans()) else None
    if POSITION_LAYERS[kind].can_extend and draw(st.booleans()):
        kwargs["overflow"] = "extend"
    if languages and kind != "none" and draw(st.booleans()):  # "none" has nothing to scale
        kwargs["num_languages"] = draw(st.integers(1, 3))
    return kind, kwargs


@st.composite
def rope_configs(draw):
    """kwargs of `RotaryEmbedding` for every scaling whose frequencies do not depend on the call length."""
    scaling = draw(st.sampled_from(RELATIVE_SCALINGS))
    kwargs = {"max_wavelength": draw(bases), "layout": draw(st.sampled_from(ROTARY_LAYOUTS)),
              "scaling": scaling}
    if scaling is not None:
        kwargs.update(scaling_factor=draw(st.floats(1.0, 16.0)), original_length=draw(st.integers(2, 64)),
                      **SCALING_ARGUMENTS.get(scaling, {}))
    return kwargs


def token_ids_for(rng, mask, vocab_size, pad_id):
    """Token ids `[B, T]`: pad_id where `mask` is False, any other id of the vocabulary elsewhere."""
    ids = rng.integers(0, vocab_size - 1, size=mask.shape)
    ids = np.where(ids >= pad_id, ids + 1, ids)
    return np.where(mask, ids, pad_id).astype(np.int32)
