"""The ablation's RoPE-scaling variants: trained as plain RoPE, evaluated past T with s = L / T."""

import numpy as np
import pytest

from keras_posenc.app import ablation


def _rotary(model):
    return model.encoder.encoder_layers[0].rotary


@pytest.mark.parametrize("name, scaling", [("rope-ntk", "ntk"), ("rope-yarn", "yarn"),
                                           ("rope-llama3", "llama3")])
def test_scaled_variants_are_plain_rope_at_t_and_scaled_past_it(name, scaling):
    config = ablation.QUICK
    t = config.max_length
    model = ablation.build_model(config, 50, name)
    assert _rotary(model).scaling == scaling and _rotary(model).scaling_factor == 1.0
    assert ablation._eval_model(model, config, 50, name, t) is model
    tokens = np.random.default_rng(0).integers(3, 50, size=[2, 4 * t]).astype(np.int32)
    # A scaling factor of 1 is the identity: the variant trains exactly what `rope` trains.
    rope = ablation.build_model(config, 50, "rope")
    rope.set_weights(model.get_weights())
    np.testing.assert_allclose(np.asarray(model(tokens)), np.asarray(rope(tokens)), atol=1e-6)
    for multiple in (2, 4):
        evaluated = ablation._eval_model(model, config, 50, name, multiple * t)
        assert _rotary(evaluated).scaling_factor == multiple
        assert _rotary(evaluated).original_length == (None if scaling == "ntk" else t)
        for got, expected in zip(evaluated.get_weights(), model.get_weights()):
            np.testing.assert_array_equal(got, expected)
        # Untrained and tiny (2 rotated pairs), the scaled model still computes something else.
        window = tokens[:, :multiple * t]
        difference = np.asarray(evaluated(window)) - np.asarray(model(window))
        assert np.max(np.abs(difference)) > 1e-6


def test_ablate_takes_position_as_the_variant_list():
    from keras_posenc.app import cli

    args = cli.build_parser().parse_args(["ablate", "--position", "rope", "rope-ntk", "rope-yarn", "alibi"])
    assert args.variants == ["rope", "rope-ntk", "rope-yarn", "alibi"]
    for name in ("rope", "rope-ntk", "rope-yarn", "alibi"):
        assert cli.build_parser().parse_args(["train", "--position", name]).position == name
