"""Export for edge runtimes: `--target gpu | gl | cpu | tensorrt`, per-backend verdicts, parity.

Modules:

- `pipeline`: `export_and_check`, one pass of conversion, report, parity and metadata (what
  `keras-posenc export` prints);
- `conversion`: `to_tflite` / `to_onnx`, model inspection and the float32 rebuild;
- `emitters` and `gl`: the formulation of each keras_posenc layer per target, gathered
  explicitly (`emitters.Formulations.collect`) and applied by `Formulated` wrapper layers;
- `flatbuffer`: operators of a TFLite file, read with TensorFlow's flatbuffer utilities
  (`TfliteFile`: decoded once for every reader);
- `cost`: multiply-adds, constant bytes and the largest intermediate of a TFLite or ONNX file;
- `verdicts`: `gpu_incompatible_ops(tflite, backend="opencl" | "webgpu" | "gl")`;
- `parity`: the exported file against Keras (TFLite interpreter, onnxruntime) and the report
  that `keras-posenc export` prints.
"""

from keras_posenc.export.conversion import (
                                            EMBEDDINGS,
                                            HOST_EMBEDDINGS,
                                            ONNX_OPSET,
                                            QUANTIZE_MODES,
                                            ModelSpec,
                                            default_embedding,
                                            host_embedding_table,
                                            load_model,
                                            to_onnx,
                                            to_tflite,
)
from keras_posenc.export.cost import graph_cost, onnx_cost
from keras_posenc.export.flatbuffer import TfliteFile, op_counts, operators
from keras_posenc.export.parity import (
                                            check_onnx_parity,
                                            check_parity,
                                            cost_summary,
                                            export_report,
                                            format_cost,
                                            format_report,
                                            interpreter_class,
                                            run_interpreter,
                                            run_onnx,
                                            runtime_metadata,
                                            sample_token_batch,
                                            weight_bytes,
)
from keras_posenc.export.pipeline import EXPORT_TOLERANCE, ExportResult, export_and_check
from keras_posenc.export.targets import TARGETS, Target, target_of
from keras_posenc.export.verdicts import (
                                            BACKENDS,
                                            GL_SHADER_OPS,
                                            GPU_PARSER_OPS,
                                            analyzer_report,
                                            gpu_incompatible_ops,
                                            verdict_line,
)

__all__ = [
    "BACKENDS", "EMBEDDINGS", "EXPORT_TOLERANCE", "ExportResult", "TfliteFile", "export_and_check",
    "GL_SHADER_OPS", "GPU_PARSER_OPS", "HOST_EMBEDDINGS", "ONNX_OPSET",
    "QUANTIZE_MODES", "TARGETS", "Target", "ModelSpec", "analyzer_report", "check_onnx_parity",
    "check_parity", "cost_summary", "default_embedding", "export_report", "format_cost", "format_report",
    "gpu_incompatible_ops", "graph_cost", "host_embedding_table", "interpreter_class", "load_model",
    "onnx_cost", "op_counts", "operators", "run_interpreter", "run_onnx", "runtime_metadata",
    "sample_token_batch", "target_of", "to_onnx", "to_tflite", "verdict_line", "weight_bytes",
]
