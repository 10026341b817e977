"""`--quantize float16 | int8 | int4`: the recipe table, refusals before conversion, host rows, generation.

The runtimes' own checks (LiteRT's GPU accelerator, the GL delegate, LiteRT-LM's engine, int4 on
XNNPACK, onnxruntime) are in tests/edge/edge_quantize.py; these run the TFLite-converter recipes
in-process and everything that needs no runtime.
"""

import json
import os
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf
from tiny_lm import tiny_lm

from keras_posenc import export
from keras_posenc.backend import is_keras3
from keras_posenc.export import contract, generator, host_table, quantization, runners
from keras_posenc.export.kinds import PREFILL_DECODE
from keras_posenc.export.result import MIN_GENERATION_AGREEMENT, ExportResult

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
KIT = os.path.join(ROOT, "export", "jetson")
LENGTH = 12
VOCAB = 64


@pytest.fixture(scope="module")
def lm():
    return tiny_lm(VOCAB, seed=5)


def _held_out(rows=8, seed=2):
    rng = np.random.default_rng(seed)
    ids = rng.integers(5, VOCAB, size=[rows, LENGTH]).astype(np.int32)
    ids[::2, LENGTH - 3:] = 0
    return ids


# The table --------------------------------------------------------------------------------------
def test_every_target_and_kind_names_a_recipe_or_a_reason_for_each_precision():
    kinds = {(target, kind) for target in export.TARGETS for kind in ("window", "prefill_decode")}
    kinds |= {(name, "litertlm") for name, target in export.TARGETS.items() if target.litertlm_backend}
    kinds |= {(target, "translate") for target in export.TARGETS}  # every target exports a translator
    table = {(target.name, kind.name): recipes for (target, kind), recipes in quantization.RECIPES.items()}
    assert set(table) == kinds  # no genai recipes: its folders are float32
    for key, recipes in table.items():
        assert set(recipes) == set(quantization.PRECISIONS), key
        for precision, recipe in recipes.items():
            if isinstance(recipe, str):  # a refusal says what the runtime said, and what to use instead
                assert "use --" in recipe, key
            else:
                assert recipe.precision == precision
                assert recipe.host_bits == {"float16": 16, "int8": 8, "int4": 4}[precision]
                assert (recipe.tool == quantization.LITERT_QUANTIZER) == bool(recipe.configs)
                assert (recipe.runtime == "onnxruntime") == (key[0] == "tensorrt")
    # int4 where a runtime executes it, refused elsewhere; float16 and int8 everywhere.
    runnable = {key for key, recipes in table.items() if not isinstance(recipes["int4"], str)}
    assert runnable == {("cpu", "window"), ("gpu", "window"), ("cpu", "litertlm")}
    assert all(not isinstance(r[p], str) for r in quantization.RECIPES.values() for p in ("float16", "int8"))


def test_precisions_and_the_older_name():
    assert quantization.precision_of("dynamic_int8") == "int8"
    assert [quantization.precision_of(mode) for mode in quantization.QUANTIZE_MODES] == [
        None, "float16", "int8", "int4", "int8"]
    with pytest.raises(ValueError, match=r"`quantize` must be one of .* got quantize='int3'"):
        quantization.precision_of("int3")
    assert quantization.recipe_for("cpu", None) is None
    assert quantization.recipe_for("cpu", "dynamic_int8") is quantization.recipe_for("cpu", "int8")


@pytest.mark.parametrize("target,quantize,kind,reason", [
    ("gl", "int4", "window", "the GL delegate does not run 4-bit weights"),
    ("gl", "int4", "prefill_decode", "the GL delegate does not run 4-bit weights"),
    ("tensorrt", "int4", "window", "takes MatMul weights only"),
    ("cpu", "int4", "prefill_decode", "input->type != kTfLiteFloat32"),
    ("gpu", "int4", "prefill_decode", "constant matrices"),
    ("gpu", "int4", "litertlm", "constant matrices"),
])
def test_refused_combinations_name_the_target_precision_and_reason(target, quantize, kind, reason):
    match = f"--quantize {quantize} is refused for target='{target}': .*{reason}"
    with pytest.raises(ValueError, match=match):
        quantization.recipe_for(target, quantize, kind)


def test_a_refusal_comes_before_any_conversion(lm, monkeypatch):
    def no_conversion(*args, **kwargs):
        raise AssertionError("converted before refusing")

    monkeypatch.setattr(tf.lite.TFLiteConverter, "from_concrete_functions", no_conversion)
    monkeypatch.setattr(tf.lite.TFLiteConverter, "from_saved_model", no_conversion)
    with pytest.raises(ValueError, match="refused for target='gl'"):
        export.to_tflite(lm, sequence_length=LENGTH, target="gl", quantize="int4")
    with pytest.raises(ValueError, match="refused for target='cpu'"):
        generator.to_tflite_generator(lm, prompt_length=4, cache_length=12, target="cpu", quantize="int4")
    with pytest.raises(ValueError, match="refused for target='gl'"):
        export.export_and_check(lm, sequence_length=LENGTH, target="gl", quantize="int4")


def test_litert_quantizer_recipes_need_the_litert_python(no_litert_python_variables):
    if export.litert_python.runtime_python(module="litert_quantizer") is not None:
        pytest.skip("litert-quantizer is importable in this Python")
    match = ("--quantize int4 on target='cpu' is made by LiteRT Quantizer 0.11, which is not installed here: "
             ".*pip install .*litert-quantizer==0.11.0")
    with pytest.raises(ValueError, match=match):
        quantization.recipe_for("cpu", "int4")
    recipe = quantization.recipes_of("gl", "window")["int8"]
    assert recipe.tool == quantization.TFLITE_CONVERTER and recipe.runtime == "litert"
    if not is_keras3():  # TF 2.12's interpreter computes it wrong: its check needs LiteRT's
        with pytest.raises(ValueError, match="is checked by ai-edge-litert's interpreter"):
            quantization.recipe_for("gl", "int8")


# Host rows --------------------------------------------------------------------------------------
def _reference_rows(table, bits, block):
    """Symmetric codes per block, in float64, one row and block at a time."""
    largest = 127 if bits == 8 else 7
    out = np.zeros_like(table, dtype=np.float64)
    for r, row in enumerate(np.asarray(table, np.float64)):
        for start in range(0, len(row), block):
            part = row[start:start + block]
            scale = np.float32(np.abs(part).max() / largest) if np.abs(part).max() > 0 else np.float32(1.0)
            codes = np.clip(np.rint(part / np.float64(scale)), -largest, largest)
            out[r, start:start + block] = codes * np.float64(scale)
    return out


@pytest.mark.parametrize("bits,block", [(8, 64), (4, 32)])
def test_host_rows_are_symmetric_codes_with_a_scale_per_block(bits, block):
    rng = np.random.default_rng(bits)
    table = rng.standard_normal([50, 64]).astype(np.float32) * rng.uniform(0.1, 5, [50, 1]).astype(np.float32)
    table[3] = 0.0  # an all-zero row: scale 1, codes 0
    stored = host_table.quantize_table(table, bits)
    assert int(stored["bits"]) == bits and int(stored["block"]) == block
    assert stored["scales"].shape == (50, 64 // block) and stored["scales"].dtype == np.float32
    assert stored["codes"].shape == (50, 64 if bits == 8 else 32)
    rows = host_table.dequantized_table(stored)
    np.testing.assert_allclose(rows, _reference_rows(table, bits, block), rtol=0, atol=1e-6)
    assert np.all(rows[3] == 0) and np.all(stored["scales"][3] == 1.0)
    peak = np.abs(table).reshape(50, -1, block).max(axis=-1)  # the error is at most half a step
    half_step = peak / (127 if bits == 8 else 7) / 2
    assert np.all(np.abs(rows - table).reshape(50, -1, block).max(axis=-1) <= half_step + 1e-6)
    ids = np.array([[7, 3], [49, 0]])
    np.testing.assert_array_equal(host_table.dequantize_rows(stored, ids), rows[ids])
    expected_bytes = 50 * 64 * bits // 8 + 50 * (64 // block) * 4 + 8
    assert host_table.table_bytes(stored) == expected_bytes


def test_int4_codes_are_packed_low_nibble_first():
    table = np.array([[7.0, -7.0] + [0.0] * 30, [-1.0, 2.0] + [0.0] * 30])
    stored = host_table.quantize_table(table, 4)
    assert stored["codes"][0, 0] == (7 | ((-7 & 0xF) << 4))  # 7 in the low nibble, -7 (0b1001) in the high
    assert stored["codes"][1, 0] == ((-3 & 0xF) | (7 << 4))  # -1 / (2 / 7) = -3.4999..: -3
    np.testing.assert_allclose(host_table.dequantized_table(stored), _reference_rows(table, 4, 32), atol=1e-6)
    with pytest.raises(ValueError, match=r"`bits` must be one of \(8, 4\), got bits=6"):
        host_table.quantize_table(np.ones([2, 32]), 6)
    with pytest.raises(ValueError, match=r"^int4 host rows take blocks of 32 values: d_model=40 is not a "
                                         r"multiple of it\.$"):
        host_table.quantize_table(np.ones([2, 40]), 4)


def test_rows_come_from_the_saved_file_and_float_tables_as_float32(tmp_path):
    table = np.random.default_rng(4).standard_normal([10, 32]).astype(np.float32)
    stored = host_table.quantize_table(table, 8)
    np.savez(str(tmp_path / "t.npz"), **stored)
    ids = np.array([[9, 0, 4]])
    with np.load(str(tmp_path / "t.npz")) as saved:  # what the exporter wrote, read back as np.load gives it
        expected = host_table.dequantize_rows(stored, ids)
        np.testing.assert_array_equal(host_table.dequantize_rows(saved, ids), expected)
    half = table.astype(np.float16)  # --quantize float16 keeps float16 rows: fed as float32
    rows = host_table.dequantize_rows(half, ids)
    assert rows.dtype == np.float32 and np.array_equal(rows, half[ids].astype(np.float32))
    assert host_table.table_bytes(half) == 10 * 32 * 2 and host_table.table_bytes(table) == 10 * 32 * 4


@pytest.mark.parametrize("bits", [8, 4])
def test_the_kit_reads_the_rows_the_exporter_wrote(tmp_path, bits):
    rng = np.random.default_rng(0)
    stored = host_table.quantize_table(rng.standard_normal([40, 64]).astype(np.float32), bits)
    table = str(tmp_path / "m.tflite.embeddings.npz")
    np.savez(table, **stored)
    ids = rng.integers(0, 40, [2, 5])
    np.save(str(tmp_path / "ids.npy"), ids)
    metadata = {"embedding_table": os.path.basename(table),
                "files": {os.path.basename(table): contract.file_record(table)}}
    (tmp_path / "export.json").write_text(json.dumps({"contract": contract.document(), "metadata": metadata}))
    script = ("import json, sys, numpy as np; sys.path.insert(0, sys.argv[1]); "
              "import kit_contract, kit_embeddings; spec = json.load(open(sys.argv[2])); "
              "folder = sys.argv[3]; "
              "export = kit_contract.Export(folder + '/m.tflite', spec['contract'], spec['metadata']); "
              "table = kit_embeddings.HostTable(export); "
              "np.save(folder + '/rows.npy', table.rows(np.load(folder + '/ids.npy')))")
    done = subprocess.run([sys.executable, "-c", script, KIT, str(tmp_path / "export.json"), str(tmp_path)],
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    expected = host_table.dequantize_rows(stored, ids)
    np.testing.assert_array_equal(np.load(str(tmp_path / "rows.npy")), expected)


# Window exports with the TFLite converter (in-process) -----------------------------------------------
def test_cpu_int8_quantizes_the_token_lookup_and_reports_its_recipe(lm, tmp_path):
    result = export.export_and_check(lm, sequence_length=LENGTH, target="cpu", quantize="int8",
                                     eval_token_ids=_held_out())
    flat = result.models[0]
    assert "EMBEDDING_LOOKUP" in export.op_counts(flat)
    assert result.quantize == "int8" and result.failures() == []
    assert result.lines[0].startswith("Quantized by TFLite converter: int8 weights")
    paths = result.save(str(tmp_path / "q.tflite"))
    metadata = json.load(open(paths[-2]))
    assert metadata["quantize"] == "int8"
    assert metadata["quantization"] == {"precision": "int8", "tool": "TFLite converter",
                                        "weights": quantization.recipes_of("cpu", "window")["int8"].weights,
                                        "runtime": "tflite"}
    assert metadata["quality"]["tokens"] == int((_held_out()[:, 1:] != 0).sum())
    float32 = export.to_tflite(lm, sequence_length=LENGTH, target="cpu")
    # int8 matrices save 3 of every 4 bytes of the weights (the graph and the float biases stay).
    assert len(float32) - len(flat) >= 0.6 * export.weight_bytes(lm)


def test_gpu_float16_keeps_a_float16_host_table(lm, tmp_path):
    result = export.export_and_check(lm, sequence_length=LENGTH, target="gpu", quantize="float16",
                                     embedding="host", eval_token_ids=_held_out())
    assert result.host_table.dtype == np.float16
    np.testing.assert_array_equal(result.host_table, export.host_embedding_table(lm).astype(np.float16))
    assert result.failures() == [] and result.report["quality"]["loss_increase"] < 1e-3
    paths = result.save(str(tmp_path / "h.tflite"))
    assert str(tmp_path / "h.tflite.embeddings.npy") in paths
    assert np.load(str(tmp_path / "h.tflite.embeddings.npy")).dtype == np.float16
    assert any("Embedding: host (float16 rows)" in line for line in result.lines)


def test_an_int8_host_table_is_saved_as_rows_and_scales(lm, tmp_path):
    recipe = quantization.recipes_of("gpu", "window")["int8"]
    stored = quantization.stored_host_table(export.host_embedding_table(lm), recipe)
    result = ExportResult("gpu", "int8", "host", (b"TFL3",), {"parity": 0.0}, [], {}, host_table=stored)
    paths = result.save(str(tmp_path / "g.tflite"))
    table = str(tmp_path / "g.tflite.embeddings.npz")
    assert table in paths and not os.path.exists(str(tmp_path / "g.tflite.embeddings.npy"))
    with np.load(table) as saved:
        np.testing.assert_array_equal(saved["codes"], stored["codes"])
    metadata = json.load(open(str(tmp_path / "g.tflite.json")))
    assert metadata["embedding_table"] == "g.tflite.embeddings.npz"
    assert set(metadata["files"]) == {"g.tflite", "g.tflite.embeddings.npz"}
    assert contract.document()["files"]["embeddings_quantized_suffix"] == ".embeddings.npz"


# Generation -------------------------------------------------------------------------------------
def test_cpu_int8_prefill_decode_reports_loss_and_greedy_agreement(lm):
    result = export.export_generation(lm, prompt_length=6, cache_length=16, target="cpu", quantize="int8",
                                      eval_token_ids=_held_out(), check_tokens=8)
    quality = result.report["quality"]
    assert result.quantize == "int8" and result.metadata["quantize"] == "int8"
    assert quality["prompts"] == 1 + 4  # the check prompt and four held-out rows' first tokens
    assert 0.0 <= quality["generation_agreement"] <= 1.0 and quality["rows"] == 8
    assert quality["loss_quantized"] == pytest.approx(quality["loss_float"] * (1 + quality["loss_increase"]))
    assert result.failures() == [] or not quality["same_greedy_tokens"]
    assert any(line.startswith("Greedy generation on 5 prompts x 8 tokens") for line in result.lines)


def test_teacher_forcing_feeds_the_given_tokens(lm):
    session = runners.TfliteSession(generator.to_tflite_generator(lm, prompt_length=6, cache_length=16,
                                                                  target="cpu"))
    own, _ = runners.greedy_generate(session, [5, 6, 7], 5)
    forced = [9, 10, 11, 12, 13]
    picks, logits = runners.greedy_generate(session, [5, 6, 7], 5, forced_ids=forced)
    assert picks[0] == own[0]  # the first pick comes from the prompt alone
    keras_logits = np.asarray(lm(np.array([[5, 6, 7] + forced[:4]], np.int32)))[0, 2:]
    np.testing.assert_allclose(logits, keras_logits, atol=1e-4)  # each step saw the forced token
    assert picks == [int(np.argmax(np.where(np.arange(VOCAB) == 0, -np.inf, row))) for row in keras_logits]


@pytest.mark.parametrize("same,agreement,failed", [
    (True, 0.0, False),  # float32's tokens: nothing else is asked
    (False, MIN_GENERATION_AGREEMENT, False),
    (False, MIN_GENERATION_AGREEMENT - 1e-9, True),
    (False, None, True),  # no measurement: tokens must be the model's
])
def test_quantized_generation_passes_with_the_same_tokens_or_the_agreement(same, agreement, failed):
    quality = None if agreement is None else {"generation_agreement": agreement, "loss_increase": 0.0,
                                              "loss_float": 3.0, "loss_quantized": 3.0}
    report = {"same_tokens": same, "parity": 0.5, "tokens_checked": 8, "quality": quality,
              "max_loss_increase": 0.01}
    failures = ExportResult("cpu", "int8", "graph", (b"",), report, [], {}, kind=PREFILL_DECODE).failures()
    assert bool(failures) == failed
    if failed and agreement is not None:
        assert failures == [f"FAILED: the quantized file's greedy tokens differ from float32's, and fed "
                            f"float32's tokens it picks the same token at {agreement:.1%} of the steps (at "
                            "least 95% needed)."]


# The command line --------------------------------------------------------------------------------
def test_the_command_refuses_a_combination_in_one_line(tmp_path, lm, capsys):
    from keras_posenc.app import cli

    path = str(tmp_path / "lm.keras")
    lm.save(path) if is_keras3() else lm.save(path, save_format="keras_v3")
    status = cli.main(["export", path, "--out", str(tmp_path / "x.tflite"), "--sequence-length", "8",
                       "--target", "gl", "--quantize", "int4"])
    error = capsys.readouterr().err.strip().splitlines()
    assert status == 2 and len(error) == 1
    assert "--quantize int4 is refused for target='gl'" in error[0]
    assert not os.path.exists(str(tmp_path / "x.tflite"))
    status = cli.main(["export", path, "--out", str(tmp_path / "g.tflite"), "--generate", "--cache-length",
                       "16", "--target", "cpu", "--quantize", "int8", "--litertlm-python", sys.executable])
    printed = capsys.readouterr().out
    assert status == 0, printed
    metadata = json.load(open(str(tmp_path / "g.tflite.json")))
    assert metadata["quantize"] == "int8" and metadata["quantization"]["tool"] == "TFLite converter"
    assert "Quantized by TFLite converter" in printed


def test_the_kit_refuses_a_litert_only_file_on_an_older_interpreter(tmp_path, lm):
    result = export.export_and_check(lm, sequence_length=LENGTH, target="cpu", quantize="int8")
    out = str(tmp_path / "k.tflite")
    result.save(out)
    metadata = json.load(open(out + ".json"))
    metadata["quantization"]["runtime"] = "litert"  # as a gl/gpu int8 or an int4 file says
    json.dump(metadata, open(out + ".json", "w"))
    done = subprocess.run([sys.executable, os.path.join(KIT, "run_tflite.py"), out, "--runtime",
                           "interpreter", "--iterations", "1", "--warmup", "0"], capture_output=True,
                          text=True)
    if is_keras3():  # TensorFlow 2.21's interpreter computes them right
        assert done.returncode == 0, done.stderr
    else:
        assert done.returncode == 1
        assert done.stderr.strip().splitlines()[-1] == (
            f"{out} holds int8 weights ({metadata['quantization']['weights']}) that tensorflow 2.12 does not "
            "compute right on the CPU: run it with ai-edge-litert (pip install ai-edge-litert; the default "
            "--runtime auto uses it) or TensorFlow >= 2.21, or with --delegate on the GPU.")
