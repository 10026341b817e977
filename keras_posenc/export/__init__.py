"""Export for edge runtimes: `--target gpu | gl | cpu | tensorrt`, per-backend verdicts, parity.

Read in this order:

- `targets`: one frozen `Target` per target; every difference between targets is a field there;
  `kinds`: one frozen `Kind` per export kind (window, prefill/decode, `.litertlm`, genai,
  translator);
- `pipeline`: `export(model, kind, target=...)`, the one pass of every kind, and one wrapper per
  kind (`export_and_check`, `export_generation`, `export_litertlm`, `export_genai`,
  `export_translation`); each kind's build in `window_export`, `generation_export`,
  `litertlm_bundle`, `genai`, `translation_export` (`translator`: the encode/decode signatures of
  a `Seq2SeqTransformer`); one `ExportResult`
  (`result`: `failures()`, `save()`);
- `contract`: tensor names, FILE.json keys and file names, written beside each export for the kit;
- `model_spec`: loading, `ModelSpec`, the float32 rebuild; `conversion`: `to_tflite` / `to_onnx`
  (`onnx_graph`: every ONNX file's constants folded, outputs named by the contract, static
  shapes); `generator`: the prefill/decode signatures; `litertlm` (LiteRT-LM's contract) and `litertlm_bundle`
  (`export_litertlm`: the `.litertlm` bundle, checked on LiteRT-LM's engine);
- `formulations`: the table `{(target, layer class): function}`, applied by `formulation`; the
  functions in `gather` (cpu, tensorrt), `gl`, `gpu`, from the building blocks of `shader_ops`
  (also used by `gl_generate`, the shader prefill/decode graphs);
- `quantization`: the table of quantization recipes per target and file kind (`--quantize`),
  `host_table` (the host token table in the export's precision), `quality` (a quantized file's
  held-out loss and greedy agreement against float32), `litert_python` (LiteRT's tools in their
  own Python) and `litert_runtime` (what runs there: LiteRT Quantizer, an interpreter server);
- `runners`: what runs a file here (TFLite's interpreter, onnxruntime, the prefill/decode
  sessions and their greedy loop);
- `parity`, `cost`, `verdicts`, `flatbuffer`: the checks and figures of a file.
"""

from keras_posenc.export.conversion import EMBEDDINGS, ONNX_OPSET, QUANTIZE_MODES, to_onnx, to_tflite
from keras_posenc.export.cost import graph_cost, onnx_cost
from keras_posenc.export.flatbuffer import TfliteFile, op_counts, operators
from keras_posenc.export.kinds import GENAI, KINDS, LITERTLM, PREFILL_DECODE, TRANSLATE, WINDOW, Kind, kind_of
from keras_posenc.export.model_spec import (
                                            HOST_EMBEDDINGS,
                                            ModelSpec,
                                            default_embedding,
                                            host_embedding_table,
                                            load_model,
                                            longest_sequence,
)
from keras_posenc.export.parity import (
                                            check_onnx_parity,
                                            check_parity,
                                            cost_summary,
                                            export_report,
                                            format_cost,
                                            format_report,
                                            runtime_metadata,
                                            sample_token_batch,
                                            weight_bytes,
)
from keras_posenc.export.pipeline import (
                                            EXPORT_TOLERANCE,
                                            ExportResult,
                                            export,
                                            export_and_check,
                                            export_genai,
                                            export_generation,
                                            export_litertlm,
                                            export_translation,
)
from keras_posenc.export.quantization import PRECISIONS, RECIPES, Recipe, recipe_for
from keras_posenc.export.result import check_folder
from keras_posenc.export.runners import interpreter_class, run_interpreter, run_onnx
from keras_posenc.export.targets import DEFAULT_TARGET, TARGETS, Target, target_of
from keras_posenc.export.verdicts import (
                                            BACKENDS,
                                            GL_SHADER_OPS,
                                            GPU_PARSER_OPS,
                                            analyzer_report,
                                            gpu_incompatible_ops,
                                            verdict_line,
)

__all__ = [
    "BACKENDS", "DEFAULT_TARGET", "EMBEDDINGS", "EXPORT_TOLERANCE", "ExportResult", "GENAI", "KINDS", "Kind",
    "LITERTLM", "PREFILL_DECODE", "TRANSLATE", "WINDOW",
    "TfliteFile", "check_folder", "export", "export_and_check", "export_genai", "export_generation",
    "export_litertlm", "export_translation", "kind_of",
    "GL_SHADER_OPS", "GPU_PARSER_OPS", "HOST_EMBEDDINGS", "ONNX_OPSET",
    "PRECISIONS", "QUANTIZE_MODES", "RECIPES", "Recipe", "TARGETS", "Target", "ModelSpec", "analyzer_report",
    "check_onnx_parity",
    "check_parity", "cost_summary", "default_embedding", "export_report", "format_cost", "format_report",
    "gpu_incompatible_ops", "graph_cost", "host_embedding_table", "interpreter_class", "load_model",
    "longest_sequence",
    "onnx_cost", "op_counts", "operators", "run_interpreter", "run_onnx", "runtime_metadata",
    "recipe_for", "sample_token_batch", "target_of", "to_onnx", "to_tflite", "verdict_line", "weight_bytes",
]
