"""2-D sin-cos tables (MAE's layout), the bicubic resize and SinusoidalPositionEmbedding2D."""

import numpy as np
import pytest
from layer_test_helper import run_layer_test

import keras_posenc
from keras_posenc.layers import SinusoidalPositionEmbedding2D
from keras_posenc.tables import resize_table_2d


def mae_table(grid_size, embed_dim, cls_token=False):
    """MAE's util/pos_embed.py get_2d_sincos_pos_embed, written again in numpy float64."""
    def one_dim(dim, pos):
        omega = np.arange(dim // 2, dtype=np.float64) / (dim / 2.0)
        omega = 1.0 / 10000 ** omega
        out = np.einsum("m,d->md", pos.reshape(-1), omega)
        return np.concatenate([np.sin(out), np.cos(out)], axis=1)

    grid_h = np.arange(grid_size, dtype=np.float64)
    grid_w = np.arange(grid_size, dtype=np.float64)
    grid = np.stack(np.meshgrid(grid_w, grid_h), axis=0).reshape([2, 1, grid_size, grid_size])
    emb = np.concatenate([one_dim(embed_dim // 2, grid[0]), one_dim(embed_dim // 2, grid[1])], axis=1)
    if cls_token:
        emb = np.concatenate([np.zeros([1, embed_dim]), emb], axis=0)
    return emb


@pytest.mark.parametrize("cls_token", [False, True])
def test_table_equals_mae_formula(cls_token):
    table = keras_posenc.sinusoidal_table_2d(14, 14, 768, cls_token=cls_token)
    assert table.shape == (14 * 14 + cls_token, 768) and table.dtype == np.float32
    assert np.max(np.abs(table - mae_table(14, 768, cls_token))) <= 1e-6


def test_first_half_is_the_column_and_tokens_are_row_major():
    height, width, depth = 3, 5, 8
    table = keras_posenc.sinusoidal_table_2d(height, width, depth, dtype="float64")
    one_dim = keras_posenc.sinusoidal_table_2d(1, max(height, width), depth, dtype="float64")[:, :depth // 2]
    for r in range(height):
        for c in range(width):
            np.testing.assert_array_equal(table[r * width + c, :depth // 2], one_dim[c])
            np.testing.assert_array_equal(table[r * width + c, depth // 2:], one_dim[r])


def test_invalid_table_arguments():
    with pytest.raises(ValueError, match=r"multiple of 4 .*got depth=6"):
        keras_posenc.sinusoidal_table_2d(2, 2, 6)
    with pytest.raises(ValueError, match="height"):
        keras_posenc.sinusoidal_table_2d(0, 2, 8)
    with pytest.raises(ValueError, match=r"must have shape \[17, depth\]"):
        resize_table_2d(np.zeros([16, 8]), 4, 4, 8, 8, cls_token=True)


def torch_bicubic(image, new_height, new_width):
    """torch's upsample_bicubic2d (align_corners=False, A=-0.75), pixel by pixel."""
    a = -0.75

    def kernel(x):
        x = abs(x)
        if x <= 1:
            return ((a + 2) * x - (a + 3)) * x * x + 1
        if x < 2:
            return ((a * x - 5 * a) * x + 8 * a) * x - 4 * a
        return 0.0

    height, width = image.shape[:2]
    out = np.zeros((new_height, new_width) + image.shape[2:])
    for oy in range(new_height):
        sy = (oy + 0.5) * height / new_height - 0.5
        for ox in range(new_width):
            sx = (ox + 0.5) * width / new_width - 0.5
            y0, x0 = int(np.floor(sy)), int(np.floor(sx))
            for dy in range(-1, 3):
                for dx in range(-1, 3):
                    y = min(max(y0 + dy, 0), height - 1)
                    x = min(max(x0 + dx, 0), width - 1)
                    out[oy, ox] += kernel(sy - (y0 + dy)) * kernel(sx - (x0 + dx)) * image[y, x]
    return out


@pytest.mark.parametrize("new_grid", [(7, 7), (3, 5), (4, 4)])
def test_resize_equals_pixelwise_bicubic_and_keeps_the_cls_row(new_grid):
    rng = np.random.default_rng(0)
    table = rng.normal(size=(1 + 4 * 4, 6))
    resized = resize_table_2d(table, 4, 4, *new_grid, cls_token=True)
    np.testing.assert_array_equal(resized[0], table[0])
    expected = torch_bicubic(table[1:].reshape(4, 4, 6), *new_grid).reshape(-1, 6)
    np.testing.assert_allclose(resized[1:], expected, atol=1e-12)
    if new_grid == (4, 4):
        np.testing.assert_allclose(resized, table, atol=1e-12)


@pytest.mark.parametrize("cls_token", [False, True])
def test_layer_adds_the_table(cls_token, tmp_path):
    x = np.random.default_rng(1).normal(size=(2, 12 + cls_token, 8)).astype(np.float32)
    y = run_layer_test(SinusoidalPositionEmbedding2D, {"height": 3, "width": 4, "cls_token": cls_token},
                       x, expected_output_shape=x.shape, expected_num_trainable_weights=0,
                       mixed_precision_atol=5e-3, tmp_dir=tmp_path)
    expected = x + keras_posenc.sinusoidal_table_2d(3, 4, 8, cls_token=cls_token)
    np.testing.assert_allclose(np.asarray(y), expected, atol=1e-6)


def test_layer_rejects_a_wrong_token_count():
    with pytest.raises(ValueError, match=r"\[batch, 13, depth\] for a 3x4 grid plus a class token"):
        SinusoidalPositionEmbedding2D(3, 4, cls_token=True)(np.zeros([1, 12, 8], np.float32))
    with pytest.raises(ValueError, match="multiple of 4"):
        SinusoidalPositionEmbedding2D(3, 4)(np.zeros([1, 12, 6], np.float32))
