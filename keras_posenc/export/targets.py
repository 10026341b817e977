"""The export targets, one frozen `Target` each: every difference between targets is a field here.

- `gpu` (default): the LiteRT GPU accelerator (WebGPU/Vulkan, JetPack 6) and the OpenCL GPU
  delegate. int32 inputs, one-hot lookups by constant weights, attention by BATCH_MATMUL and
  LayerNorm by MEAN (`keras_posenc.export.gpu`). Any batch size.
- `gl`: the classic GPU delegate's OpenGL ES backend (Jetson with tflite-runtime): float32 inputs
  (GL has no CAST shader) and shader-only ops (`keras_posenc.export.gl`). Batch 1.
- `cpu`: XNNPACK, GATHER lookups (the smallest compute; `keras_posenc.export.gather`).
- `tensorrt`: ONNX (opset 17), static shapes, int32 ids, for `trtexec --onnx`.

The formulation each target gives each layer class is the table of
`keras_posenc.export.formulations`; code elsewhere reads a `Target`'s fields and never compares
target names.
"""

import dataclasses

from keras_posenc.validation import check_choice

__all__ = ["DEFAULT_TARGET", "FILE_FORMATS", "ONNX", "TARGETS", "TFLITE", "FileFormat", "Target", "target_of"]


@dataclasses.dataclass(frozen=True)
class FileFormat:
    """A model file format: its name and file ending; what runs it is keyed by the object.

    Attributes:
        name: str, "tflite" or "onnx".
        suffix: str, the file ending.
    """

    name: str
    suffix: str


TFLITE = FileFormat("tflite", ".tflite")
ONNX = FileFormat("onnx", ".onnx")
FILE_FORMATS = (TFLITE, ONNX)


@dataclasses.dataclass(frozen=True)
class Target:
    """What one export target needs and allows.

    Attributes:
        name: str, the `--target` value.
        file_format: the `FileFormat` of its files (`TFLITE`, `ONNX`).
        input_dtype: "int32" or "float32" (`gl`: the GL backend has no CAST shader).
        max_batch: None (any batch) or the largest batch size the runtime takes.
        one_hot_lookup: bool, the token lookup is a one-hot product on the GPU (no GATHER), so
            the file may take the looked-up rows instead (`embedding="host"` is the default).
        host_embedding: bool, a window export may take `embedding="host"`.
        generation_host_embedding: bool, a prefill/decode export may take `embedding="host"`.
        keep_batch_matmul: bool, the converter keeps BATCH_MATMUL (the accelerator runs it).
        backends: the GPU backends whose verdict the export reports, the target's own first
            (`keras_posenc.export.verdicts.BACKENDS`); empty for ONNX.
        shader_generation: bool, the prefill/decode graphs are the shader-only ones of
            `keras_posenc.export.gl_generate` (else `Encoder.cached_step` with this target's
            token lookup).
        file_per_signature: bool, a prefill/decode export writes one file per signature (the GL
            delegate holds one compiled graph per interpreter).
        max_cache_length: None or the longest cache (positions are float16 integers on a GPU).
        runs_on: the kit accelerators (`--accelerator`) a file of this target is built for.
        litertlm_backend: None, or the LiteRT-LM engine backend ("cpu", "gpu") a `.litertlm`
            bundle of this target is built for (`keras_posenc.export.litertlm`).
        litertlm_activation: None, or the activation type a bundle asks the engine for: "fp32"
            on the CPU, "fp16" on the GPU (the engine's default there; the graphs are fp16-safe).
    """

    name: str
    file_format: FileFormat
    input_dtype: str
    max_batch: object
    one_hot_lookup: bool
    host_embedding: bool
    generation_host_embedding: bool
    keep_batch_matmul: bool
    backends: tuple
    shader_generation: bool
    file_per_signature: bool
    max_cache_length: object
    runs_on: tuple
    litertlm_backend: object = None
    litertlm_activation: object = None

    @property
    def suffix(self):
        """The file name ending of this target's exports."""
        return self.file_format.suffix

    def default_embedding(self, has_token_table):
        """"host" where the lookup is a one-hot product and the model has a token table, else "graph".

        `embedding="graph"` costs a GPU `T * vocab * d_model` multiply-adds for the one-hot lookup;
        "host" moves `T * d_model` floats instead of T ids and costs the GPU nothing. GATHER
        targets copy `T * d_model` floats: "graph".
        """
        return "host" if self.one_hot_lookup and has_token_table else "graph"


_FLOAT16_INTEGERS = 2048  # float16's last exact integer: positions and slots are floats on a GPU

TARGETS = {
    "gpu": Target("gpu", TFLITE, "int32", None, one_hot_lookup=True, host_embedding=True,
                  generation_host_embedding=True, keep_batch_matmul=True, backends=("webgpu", "opencl", "gl"),
                  shader_generation=True, file_per_signature=False, max_cache_length=_FLOAT16_INTEGERS,
                  runs_on=("gpu", "cpu"), litertlm_backend="gpu", litertlm_activation="fp16"),
    "gl": Target("gl", TFLITE, "float32", 1, one_hot_lookup=True, host_embedding=True,
                 generation_host_embedding=True, keep_batch_matmul=False, backends=("gl", "webgpu"),
                 shader_generation=True, file_per_signature=True, max_cache_length=_FLOAT16_INTEGERS,
                 runs_on=("gpu", "cpu")),
    "cpu": Target("cpu", TFLITE, "int32", None, one_hot_lookup=False, host_embedding=False,
                  generation_host_embedding=False, keep_batch_matmul=False, backends=("gl", "webgpu"),
                  shader_generation=False, file_per_signature=False, max_cache_length=None,
                  runs_on=("cpu",), litertlm_backend="cpu", litertlm_activation="fp32"),
    "tensorrt": Target("tensorrt", ONNX, "int32", None, one_hot_lookup=False, host_embedding=True,
                       generation_host_embedding=False, keep_batch_matmul=False, backends=(),
                       shader_generation=False, file_per_signature=True, max_cache_length=None,
                       runs_on=("gpu", "cpu")),
}

# The target of every export that names none: the CLI's, the pass's and each converter's.
DEFAULT_TARGET = "gpu"


def target_of(target):
    """The `Target` of a name (a `Target` is returned as it is); ValueError naming the choices.

    Example:

    >>> target_of("gl").input_dtype, target_of("gpu").max_batch
    ('float32', None)
    >>> target_of("npu")
    Traceback (most recent call last):
        ...
    ValueError: `target` must be one of ('gpu', 'gl', 'cpu', 'tensorrt'), got target='npu'.
    """
    if isinstance(target, Target):
        return target
    check_choice("target", target, TARGETS)
    return TARGETS[target]
