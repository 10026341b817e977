"""How the kit's runners open a `.tflite`: LiteRT's `CompiledModel`, or the classic `Interpreter`.

Kept beside run_tflite.py and run_generate.py (copy them to the device together); it imports
only the runtime that is asked for.
"""

from kit_contract import fail


def compiled_model(path, accelerator, threads, precision):
    """ai-edge-litert's `CompiledModel` of `path`: CPU (XNNPACK), or GPU-only on the LiteRT GPU
    accelerator (`precision` "fp32" enforces float32; "fp16" lets the GPU compute in half).

    Raises ImportError without ai-edge-litert, RuntimeError when a GPU-only compile fails.
    """
    from ai_edge_litert.compiled_model import CompiledModel
    from ai_edge_litert.cpu_options import CpuOptions
    from ai_edge_litert.gpu_options import GpuOptions
    from ai_edge_litert.hardware_accelerator import HardwareAccelerator
    from ai_edge_litert.options import Options

    if accelerator == "gpu":
        options = Options(hardware_accelerators=HardwareAccelerator.GPU,
                          gpu_options=GpuOptions(enforce_f32=precision == "fp32"))
    else:
        options = Options(hardware_accelerators=HardwareAccelerator.CPU,
                          cpu_options=CpuOptions(num_threads=threads) if threads else None)
    return CompiledModel.from_file(path, options=options)


def interpreter(path, delegate, threads):
    """`(Interpreter of path, runtime name)`: tflite-runtime's, else TensorFlow's; `delegate` is an
    optional delegate library (e.g. libtensorflowlite_gpu_delegate.so)."""
    try:
        from tflite_runtime.interpreter import Interpreter, load_delegate
        name = "tflite_runtime"
    except ImportError:
        try:
            import tensorflow as tf
        except ImportError:
            raise SystemExit("No TFLite runtime: pip install ai-edge-litert (JetPack 6) or "
                             "tflite-runtime (JetPack 5).") from None
        Interpreter, load_delegate = tf.lite.Interpreter, tf.lite.experimental.load_delegate
        name = "tensorflow"
    delegates = [load_delegate(delegate)] if delegate else None
    kwargs = {"num_threads": threads} if threads else {}
    return Interpreter(model_path=path, experimental_delegates=delegates, **kwargs), name


# The oldest TensorFlow whose TFLite kernels were seen to compute every quantized export right
# (FILE.json's quantization runtime "litert"): TFLite 2.12's compute some hybrid CONV_2D of the
# gpu/gl int8 files wrong and run no 4-bit weights.
LITERT_RUNTIME_TENSORFLOW = (2, 21)


def classic_version():
    """`(name, (major, minor))` of the classic Interpreter's package: tflite-runtime's, else TensorFlow's."""
    try:
        import tflite_runtime as package
        name = "tflite_runtime"
    except ImportError:
        try:
            import tensorflow as package
        except ImportError:
            return None, None
        name = "tensorflow"
    parts = getattr(package, "__version__", "0.0").split(".")
    return name, tuple(int(part) for part in parts[:2] if part.isdigit())


def check_classic(export, delegate):
    """Refuses a quantized file that only LiteRT 2.x computes right on an older classic Interpreter's CPU."""
    recipe = export.get("quantization") or {}
    if recipe.get("runtime") != "litert" or delegate:
        return
    name, version = classic_version()
    if name is None:
        return  # no classic runtime at all: `interpreter` says what to install
    if name == "tflite_runtime" or (version or (0, 0)) < LITERT_RUNTIME_TENSORFLOW:
        shown = ".".join(str(part) for part in version or ())
        fail(f"{export.model} holds {recipe.get('precision')} weights ({recipe.get('weights')}) that "
             f"{name} {shown} does not compute right on the CPU: run it with ai-edge-litert "
             "(pip install ai-edge-litert; the default --runtime auto uses it) or TensorFlow >= "
             f"{'.'.join(str(part) for part in LITERT_RUNTIME_TENSORFLOW)}, or with --delegate on the GPU.")


def open_runtime(args, litert, classic, export=None):
    """The runtime the command line asks for: `litert(model, accelerator, threads, precision)` for
    ai-edge-litert (the default when it is installed and no `--delegate` is given), else
    `classic(model, delegate, threads)` for the Interpreter, with the delegate only on the GPU
    (`check_classic` first, with the model's `export`)."""
    if args.runtime == "litert" or (args.runtime == "auto" and not args.delegate):
        try:
            return litert(args.model, args.accelerator, args.threads, args.precision)
        except ImportError:
            if args.runtime == "litert":
                raise SystemExit("--runtime litert: pip install ai-edge-litert") from None
    if args.accelerator == "gpu" and not args.delegate:
        raise SystemExit("--accelerator gpu without ai-edge-litert needs --delegate "
                         "libtensorflowlite_gpu_delegate.so (see export/jetson/README.md).")
    delegate = args.delegate if args.accelerator == "gpu" else None
    if export is not None:
        check_classic(export, delegate)
    return classic(args.model, delegate, args.threads)
