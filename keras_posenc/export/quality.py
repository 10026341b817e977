"""What quantization costs a language model: its quantized file against its float32 file on real text.

A parity bound on logits says little about a quantized file: int8 weights move every logit a
little, and what a user sees is the loss on text and the tokens it picks. `quantization_quality`
runs both files on the same held-out token rows and reports, over the real (non-padding) next
tokens: the cross-entropy of each file, its relative increase, the share of positions whose
greedy token (argmax) is the same, and the largest logit difference. `pipeline.export_and_check`
runs it for every quantized export of a model that outputs next-token logits, and
`ExportResult.failures` fails an export whose loss rises by more than `max_loss_increase`.
"""

import numpy as np

from keras_posenc.export.parity import run_file
from keras_posenc.export.targets import TFLITE

__all__ = ["DEFAULT_MAX_LOSS_INCREASE", "format_generation_quality", "format_quality",
           "next_token_cross_entropy", "outputs_next_token_logits", "quality_prompts", "quantization_quality"]

# The largest relative rise of held-out cross-entropy a quantized export may cost (1 %).
DEFAULT_MAX_LOSS_INCREASE = 0.01


def outputs_next_token_logits(spec, output_shape):
    """True when the model's output `[batch, length, vocab]` is next-token logits over its own vocabulary."""
    return (spec.vocab_size is not None and spec.pad_id is not None and len(output_shape) == 3
            and int(output_shape[-1]) == spec.vocab_size)


def next_token_cross_entropy(logits, token_ids, pad_id):
    """Mean cross-entropy (nats, float64) of each real token given the logits at the position before it.

    Args:
        logits: float array `[n, T, V]`: position `t` predicts token `t + 1`.
        token_ids: int array `[n, T]`.
        pad_id: int, the padding id: padding targets are not counted.

    Returns:
        `(loss, count)`: a Python float and the number of targets counted.

    Example:

    >>> logits = np.log(np.array([[[0.5, 0.25, 0.25], [1 / 3, 1 / 3, 1 / 3]]]))
    >>> loss, count = next_token_cross_entropy(logits, np.array([[2, 1]]), pad_id=0)
    >>> round(loss, 6), round(float(np.log(4)), 6), count
    (1.386294, 1.386294, 1)
    """
    logits = np.asarray(logits, np.float64)[:, :-1]
    targets = np.asarray(token_ids)[:, 1:]
    real = targets != pad_id
    if not real.any():
        raise ValueError("The held-out rows have no real next token (all padding after the first position).")
    top = logits.max(axis=-1, keepdims=True)
    log_normalizer = np.log(np.exp(logits - top).sum(axis=-1)) + top[..., 0]
    picked = np.take_along_axis(logits, targets[..., None].astype(np.int64), axis=-1)[..., 0]
    losses = (log_normalizer - picked)[real]
    return float(losses.mean()), int(real.sum())


def quantization_quality(spec, float_file, quantized_file, token_ids, language_ids=None, *,
                         file_format=TFLITE, quantized_table=None, interpreter=None):
    """The quantized file against the float32 file on held-out rows: losses, greedy agreement, logit error.

    Args:
        spec: the `ModelSpec` both files were exported from.
        float_file, quantized_file: the two files (TFLite flatbuffers, or ONNX models with
            `file_format=ONNX`), of the same inputs.
        token_ids: int array `[n, spec.sequence_length]` of real text, right-padded with
            `spec.pad_id` (the run's eval split).
        language_ids: as `spec.feeds` needs them.
        file_format: their `FileFormat` (`parity.run_file` runs them).
        quantized_table: the float32 rows an `embedding="host"` quantized file is fed (its
            table dequantized); the float32 file gets `host_embedding_table(spec.model)`.
        interpreter: the interpreter class for both files (`quantization.interpreter_for`).

    Returns:
        None when the model's output is not next-token logits (`outputs_next_token_logits`),
        else a dict: `rows`, `tokens` (real next tokens counted), `loss_float`, `loss_quantized`,
        `loss_increase` (relative, `loss_quantized / loss_float - 1`), `agreement` (share of
        real positions with the same argmax), `max_abs_diff` (logits at real positions).
    """
    token_ids = np.asarray(token_ids)
    if token_ids.ndim != 2 or token_ids.shape[1] != spec.sequence_length:
        raise ValueError(f"`token_ids` must be an int array [n, {spec.sequence_length}], "
                         f"got shape {token_ids.shape}.")
    feeds = spec.feeds(token_ids, language_ids=language_ids)
    float_logits = run_file(spec, float_file, feeds, file_format=file_format,
                            interpreter=interpreter).astype(np.float64)
    if not outputs_next_token_logits(spec, float_logits.shape):
        return None
    quantized_logits = run_file(spec, quantized_file, feeds, file_format=file_format, table=quantized_table,
                                interpreter=interpreter).astype(np.float64)
    loss_float, tokens = next_token_cross_entropy(float_logits, token_ids, spec.pad_id)
    loss_quantized, _ = next_token_cross_entropy(quantized_logits, token_ids, spec.pad_id)
    real = token_ids != spec.pad_id
    same = float_logits.argmax(-1) == quantized_logits.argmax(-1)
    return {
        "rows": int(token_ids.shape[0]),
        "tokens": tokens,
        "loss_float": loss_float,
        "loss_quantized": loss_quantized,
        "loss_increase": loss_quantized / loss_float - 1.0,
        "agreement": float(same[real].mean()),
        "max_abs_diff": float(np.abs(quantized_logits - float_logits)[real].max()),
    }


def format_quality(quality, max_loss_increase):
    """The report line of `quantization_quality`'s dict."""
    return (f"Held-out text ({quality['rows']} rows, {quality['tokens']} next tokens): cross-entropy "
            f"{quality['loss_quantized']:.4f} quantized vs {quality['loss_float']:.4f} float32 "
            f"({quality['loss_increase']:+.2%}, limit {max_loss_increase:+.2%}); greedy agreement "
            f"{quality['agreement']:.1%}; max abs logit diff {quality['max_abs_diff']:.3g}")


def quality_prompts(eval_token_ids, pad_id, prompt_length, count=4, length=8):
    """The first `length` real tokens (at most `prompt_length`) of the first `count` held-out rows."""
    if eval_token_ids is None:
        return []
    prompts = []
    for row in np.asarray(eval_token_ids)[:count]:
        real = [int(token) for token in row if token != pad_id][:min(length, prompt_length)]
        if real:
            prompts.append(real)
    return prompts


def format_generation_quality(quality, max_loss_increase):
    """The report lines' text of `generation_quality`'s dict."""
    line = (f"Greedy generation on {quality['prompts']} prompts x {quality['greedy_tokens']} tokens: "
            f"{'same tokens as' if quality['same_greedy_tokens'] else 'TOKENS DIFFER from'} the float32 "
            f"file; fed float32's tokens, it picks the same token at {quality['generation_agreement']:.1%} "
            "of the steps")
    if "loss_increase" in quality:
        line += "; " + format_quality(quality, max_loss_increase)
    return line
