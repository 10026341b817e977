"""Quantized exports on the runtimes that run them: LiteRT's GPU accelerator, GL delegate, XNNPACK, ORT.

A demo-size model trained briefly on a bigram language (`edge_targets.train_briefly`), exported
in int8 / int4 / float16 with its quality gate (held-out rows of the same language), then each file
run by its GPU runtime: the int8 `gpu` file fully on LiteRT's GPU accelerator (float32 and its
float16 mode), the int8 `gl` file on the GL delegate with no refusal, the int4 `gpu` file on the
accelerator; the logits the GPU computes must keep the held-out cross-entropy within the limit of
the export (1 %) of the float32 file's on the CPU. Sizes: every int8 file, host table included, is
at most 0.35x its float32 export.
"""

import numpy as np
import pytest
from edge_targets import DEMO, LENGTH, bigram_language, bigram_rows, demo_model, feeds_of
from stacks import once_on_keras2, once_on_keras3

from keras_posenc import export
from keras_posenc.export import generator, host_table, runners
from keras_posenc.export.quality import next_token_cross_entropy

MAX_INT8_RATIO = 0.35
ROWS = 24  # held-out rows of the bigram language: 24 x 47 next tokens


@pytest.fixture(scope="module")
def trained():
    return demo_model({"table": "full"})


@pytest.fixture(scope="module")
def held_out():
    language = bigram_language(DEMO["vocab_size"], seed=0)
    rows = bigram_rows(language, np.random.default_rng(123), ROWS)
    rows[::3, LENGTH // 2:] = 0  # every third row right-padded
    return rows


@pytest.fixture(scope="module")
def exported(trained, held_out, edge):
    """`exported(target, quantize)`: the export of the trained model with its quality gate, made once."""
    made = {}

    def export_once(target, quantize):
        if (target, quantize) not in made:
            made[(target, quantize)] = export.export_and_check(
                trained, sequence_length=LENGTH, target=target, quantize=quantize, eval_token_ids=held_out,
                litert_python=edge.litertlm_python())
        return made[(target, quantize)]

    return export_once


def _bytes(result):
    table = 0 if result.host_table is None else host_table.table_bytes(result.host_table)
    return len(result.models[0]) + table


def _loss(logits, ids):
    return next_token_cross_entropy(np.asarray(logits, np.float64).reshape(*ids.shape, -1), ids, pad_id=0)[0]


@pytest.mark.parametrize("target", ["gpu", "gl", "cpu"])
def test_int8_files_are_a_third_of_float32_and_keep_the_held_out_loss(exported, held_out, target):
    float32, int8 = exported(target, None), exported(target, "int8")
    assert int8.failures() == []
    quality = int8.report["quality"]
    assert quality["tokens"] == int((held_out[:, 1:] != 0).sum())
    assert quality["loss_increase"] <= 0.01 and quality["agreement"] >= 0.9
    assert _bytes(int8) <= MAX_INT8_RATIO * _bytes(float32)
    if int8.host_table is not None:  # int8 rows with one float32 scale a row
        assert int8.host_table["codes"].dtype == np.int8
        assert int8.host_table["scales"].shape == (DEMO["vocab_size"], 1)


def _gpu_logits(edge, path, ids, table, fp16):
    run = edge.run_litert(path, feeds_of(ids, None, range(len(ids)), np.int32, table), accelerator="gpu",
                          fp16=fp16)
    assert run.returncode == 0 and run.info["fully_accelerated"], run.log[-3000:]
    return run.output


@pytest.mark.parametrize("quantize", ["int8", "int4"])
def test_quantized_gpu_file_runs_fully_on_litert_gpu_with_its_quality(trained, held_out, edge, tflite_file,
                                                                      exported, quantize):
    result = exported("gpu", quantize)
    path = tflite_file(f"gpu-{quantize}", result.models[0])
    rows = host_table.dequantized_table(result.host_table)  # what the kit feeds
    float_rows = feeds_of(held_out, None, range(ROWS), np.int32, export.host_embedding_table(trained))
    reference = _loss(edge.run_litert(tflite_file("gpu-f32", exported("gpu", None).models[0]), float_rows,
                                      accelerator="cpu").output, held_out)
    for fp16 in (False, True):
        loss = _loss(_gpu_logits(edge, path, held_out, rows, fp16), held_out)
        print(f"gpu {quantize} fp16={fp16}: held-out loss {loss:.4f} vs float32 {reference:.4f}")
        if quantize == "int8":
            assert loss <= 1.01 * reference
        else:  # int4: reported by the export, and the GPU computes what the export measured
            assert loss == pytest.approx(result.report["quality"]["loss_quantized"], rel=1e-2)


def test_int8_gl_file_runs_on_the_gl_delegate_with_its_quality(held_out, edge, tflite_file, exported):
    result = exported("gl", "int8")
    path = tflite_file("gl-int8", result.models[0])
    rows = host_table.dequantized_table(result.host_table)
    feeds = feeds_of(held_out, None, range(ROWS), np.float32, rows)
    loss_float = result.report["quality"]["loss_float"]
    for fp16 in (False, True):
        run = edge.run_gl(path, feeds, rows=ROWS, fp16=fp16)
        assert run.returncode == 0 and edge.refusals(run.log) == [], run.log[-3000:]
        loss = _loss(run.output, held_out)
        print(f"gl int8 fp16={fp16}: held-out loss {loss:.4f} vs float32 {loss_float:.4f}")
        assert loss <= 1.01 * loss_float


def test_int4_is_refused_on_gl_before_conversion(trained):
    with pytest.raises(ValueError, match="refused for target='gl': the GL delegate does not run 4-bit"):
        export.to_tflite(trained, sequence_length=LENGTH, target="gl", quantize="int4")


def test_int4_cpu_file_runs_on_xnnpack_with_its_reported_loss(held_out, edge, tflite_file, exported):
    float32, result = exported("cpu", None), exported("cpu", "int4")
    ops = export.op_counts(result.models[0])
    assert "EMBEDDING_LOOKUP" in ops and "GATHER" in ops  # the token table quantized, positions gathered
    quality = result.report["quality"]
    print(f"cpu int4: {_bytes(result) / _bytes(float32):.3f}x, loss {quality['loss_increase']:+.2%}")
    assert _bytes(result) <= 0.25 * _bytes(float32)
    run = edge.run_litert(tflite_file("cpu-int4", result.models[0]),
                          feeds_of(held_out, None, range(ROWS), np.int32), accelerator="cpu")
    assert run.returncode == 0, run.log[-3000:]
    assert _loss(run.output, held_out) == pytest.approx(quality["loss_quantized"], rel=1e-4)


@pytest.mark.parametrize("quantize", ["float16", "int8"])
def test_tensorrt_onnx_in_onnxruntime_keeps_the_held_out_loss(exported, quantize):
    float32, result = exported("tensorrt", None), exported("tensorrt", quantize)
    assert result.failures() == []
    assert result.report["quality"]["loss_increase"] <= 0.01
    assert _bytes(result) <= (0.55 if quantize == "float16" else MAX_INT8_RATIO) * _bytes(float32)


# Each runtime's int8 prefill/decode files come from one converter (an export, a quality check and a
# free-running text on an emulated GPU each): LiteRT's GPU accelerator from TensorFlow 2.21's, the GL
# delegate from TensorFlow 2.12's, the one Jetson's TFLite goes with.
@pytest.mark.parametrize("target", [
    pytest.param("gpu", marks=once_on_keras3("LiteRT's GPU accelerator gets TensorFlow 2.21's int8 files")),
    pytest.param("gl", marks=once_on_keras2("the GL delegate gets TensorFlow 2.12's int8 files, as Jetson"))])
def test_int8_prefill_decode_runs_on_the_gpu_runtimes_with_the_keras_tokens(trained, held_out, edge,
                                                                             tmp_path, target):
    from edge_generate import NEW_TOKENS, PROMPT, run_kit_on_litert

    keras_ids = trained.generate(PROMPT, NEW_TOKENS).ids[0].tolist()
    result = export.export_generation(trained, prompt_length=16, cache_length=LENGTH, target=target,
                                      quantize="int8", eval_token_ids=held_out,
                                      litert_python=edge.litertlm_python())
    assert result.failures() == [], result.lines
    assert result.report["quality"]["loss_increase"] <= 0.01
    out = str(tmp_path / f"gen-{target}.tflite")
    paths = result.save(out)
    assert out + ".embeddings.npz" in paths  # int8 rows, read by the kit
    if target == "gpu":  # the kit, GPU-only on LiteRT's accelerator, dequantizing the rows it feeds
        ids, _, stdout = run_kit_on_litert(edge, out, "fp32", tmp_path)
        assert "fully accelerated: True" in stdout
    else:
        rows = host_table.dequantized_table(result.host_table)
        gl = edge.run_gl_generate(generator.tflite_paths(out), PROMPT, NEW_TOKENS, pad_id=0, table=rows)
        assert gl.returncode == 0 and edge.refusals(gl.log) == [], gl.log[-3000:]
        ids = gl.output[0]
    _assert_greedy_through_a_near_tie(trained, keras_ids, ids, target)


# A float32 margin (logits) that int8 weights may overturn: the greedy pick of the int8 files may
# differ from Keras's only where float32's best two logits are this close.
NEAR_TIE = 0.5


def _assert_greedy_through_a_near_tie(trained, keras_ids, ids, target):
    """A free-running int8 text is Keras's up to where it first differs, and float32 was near a tie there.

    From that step on, the texts go their own ways; which near-tie flips depends on the CPU's
    roundings in training, so nothing after it is compared.
    """
    from edge_generate import PROMPT

    first = next((step for step, (pick, kept) in enumerate(zip(ids, keras_ids)) if pick != kept), None)
    if first is None:
        assert ids == keras_ids, target
        return
    logits = np.asarray(trained(np.array([PROMPT + keras_ids], np.int32)), np.float64)[0, len(PROMPT) - 1:]
    margin = logits[first, keras_ids[first]] - logits[first, ids[first]]
    assert margin <= NEAR_TIE, (target, first, margin)


@once_on_keras3("onnxruntime quantizes the ONNX files whichever stack exported them; the float32 ONNX "
                "prefill/decode files of both stacks run in edge_generate_onnx.py")
def test_int8_tensorrt_prefill_decode_keeps_the_keras_tokens_on_onnxruntime(trained, held_out, edge):
    """The two ONNX models quantized to int8 QDQ, calibrated on the float32 models' own greedy runs.

    Fed Keras's greedy tokens, the int8 files pick Keras's token at >= 95% of the steps, and where
    they do not, float32 itself was at a near-tie (a free-running greedy text would go its own way
    from there: which near-tie flips depends on the CPU's roundings in training).
    """
    from edge_generate import NEW_TOKENS, PROMPT

    result = export.export_generation(trained, prompt_length=16, cache_length=LENGTH, target="tensorrt",
                                      quantize="int8", eval_token_ids=held_out)
    assert result.failures() == [], result.lines
    quality = result.report["quality"]
    assert quality["loss_increase"] <= 0.01 and quality["generation_agreement"] >= 0.95
    keras_ids = trained.generate(PROMPT, NEW_TOKENS).ids[0].tolist()
    picks, _ = runners.greedy_generate(runners.OnnxSession(*result.models), PROMPT, NEW_TOKENS,
                                         forced_ids=keras_ids)
    logits = np.asarray(trained(np.array([PROMPT + keras_ids], np.int32)), np.float64)[0, len(PROMPT) - 1:-1]
    assert logits.argmax(axis=-1).tolist() == keras_ids
    flips = [step for step, (pick, kept) in enumerate(zip(picks, keras_ids)) if pick != kept]
    assert len(flips) <= 0.05 * NEW_TOKENS, flips
    margins = [logits[step, keras_ids[step]] - logits[step, picks[step]] for step in flips]
    assert all(margin <= NEAR_TIE for margin in margins), margins
