"""How the kit's runners open a `.tflite`: LiteRT's `CompiledModel`, or the classic `Interpreter`.

Kept beside run_tflite.py and run_generate.py (copy them to the device together); it imports
only the runtime that is asked for.
"""


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


def open_runtime(args, litert, classic):
    """The runtime the command line asks for: `litert(model, accelerator, threads, precision)` for
    ai-edge-litert (the default when it is installed and no `--delegate` is given), else
    `classic(model, delegate, threads)` for the Interpreter, with the delegate only on the GPU."""
    if args.runtime == "litert" or (args.runtime == "auto" and not args.delegate):
        try:
            return litert(args.model, args.accelerator, args.threads, args.precision)
        except ImportError:
            if args.runtime == "litert":
                raise SystemExit("--runtime litert: pip install ai-edge-litert") from None
    if args.accelerator == "gpu" and not args.delegate:
        raise SystemExit("--accelerator gpu without ai-edge-litert needs --delegate "
                         "libtensorflowlite_gpu_delegate.so (see export/jetson/README.md).")
    return classic(args.model, args.delegate if args.accelerator == "gpu" else None, args.threads)
