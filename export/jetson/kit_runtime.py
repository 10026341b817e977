"""How the kit's runners open a `.tflite`: LiteRT's `CompiledModel`, or the classic `Interpreter`.

Kept beside run_tflite.py and run_generate.py (copy them to the device together); it imports
only the runtime that is asked for. Two failures of a runtime's native code are one line on stderr
and exit status 1, never a traceback: a runtime built against NumPy 1.x meeting NumPy 2
(`numpy_abi_guard`), and a `--delegate` library that does not load (`load_gpu_delegate`).
"""

import contextlib
import gc
import os
import platform
import struct
import sys
import tempfile

from kit_contract import fail

# What NumPy 2 prints (with a traceback, before an error or a crash) when a module compiled against
# NumPy 1.x uses its C API: tflite-runtime 2.14 (every release on PyPI) does, when an Interpreter is made.
NUMPY_1_BANNER = b"compiled using NumPy 1.x"


@contextlib.contextmanager
def numpy_abi_guard(where):
    """Runs a runtime's import and load with file descriptor 2 captured. NumPy 2's refusal of a module
    built against NumPy 1.x becomes one line naming numpy and the fix, and exit status 1; anything
    else the block printed is passed on, and its errors are raised as they were.

    `where["runtime"]`: the runtime's name for the message (the block sets it once it knows it).
    """
    sys.stderr.flush()
    saved = os.dup(2)
    captured = tempfile.TemporaryFile()
    os.dup2(captured.fileno(), 2)
    raised = None
    try:
        yield where
    except BaseException as error:  # noqa: B036 - re-raised below, after the captured output
        raised = error
    finally:
        sys.stderr.flush()
        os.dup2(saved, 2)
        os.close(saved)
        captured.seek(0)
        printed = captured.read()
        captured.close()
    if NUMPY_1_BANNER in printed:
        import numpy

        fail(f"{where.get('runtime', 'the TFLite runtime')} was built against NumPy 1.x and cannot run with "
             f"numpy {numpy.__version__}, installed here: pip install \"numpy<2\" "
             "(see export/jetson/README.md).")
    view = memoryview(printed)
    while view:
        view = view[os.write(2, view):]
    if raised is not None:
        raise raised


# ELF e_machine values of the platforms a delegate library may be built for.
ELF_MACHINES = {0x03: "x86", 0x28: "arm (32-bit)", 0x3E: "x86_64", 0xB7: "aarch64", 0xF3: "riscv"}


def elf_machine(path):
    """The platform an ELF file was built for (`ELF_MACHINES`, or a number), or None for a file without
    an ELF header."""
    with open(path, "rb") as f:
        head = f.read(20)
    if len(head) < 20 or head[:4] != b"\x7fELF":
        return None
    code = struct.unpack_from("<H" if head[5] == 1 else ">H", head, 18)[0]
    return ELF_MACHINES.get(code, f"ELF machine {code}")


def this_machine():
    """This machine's platform, named as `ELF_MACHINES` names them."""
    machine = platform.machine().lower()
    return {"amd64": "x86_64", "arm64": "aarch64", "i686": "x86", "i386": "x86"}.get(machine, machine)


def delegate_failure(library, error):
    """One line saying why `library` did not load as a TFLite delegate (`error`: what loading raised)."""
    flag = f"--delegate {library}"
    if not os.path.exists(library):
        if os.sep in library:
            return f"{flag}: file not found."
        return (f"{flag}: not a file here, nor a library on the loader's path (give its path, e.g. "
                f"./{library}).")
    if os.path.isdir(library):
        return f"{flag}: a folder, not a delegate library."
    machine = elf_machine(library)
    if machine is None:
        return f"{flag}: not a shared library (no ELF header)."
    if machine != this_machine() and isinstance(error, OSError):
        return (f"{flag}: built for {machine}, but this machine is {this_machine()}: build the delegate "
                "for this platform (export/jetson/README.md).")
    if isinstance(error, AttributeError):
        return (f"{flag}: not a TFLite delegate (it has no tflite_plugin_create_delegate); build "
                "libtensorflowlite_gpu_delegate.so as export/jetson/README.md shows.")
    reason = " ".join(str(error).split()) or type(error).__name__
    if isinstance(error, OSError):
        return f"{flag}: the loader refused it: {reason}"
    return f"{flag}: the delegate did not start: {reason}"


def load_gpu_delegate(load, library):
    """`load(library)` (tflite-runtime's or TensorFlow's `load_delegate`); one line on stderr and exit
    status 1 when the library is missing, not a delegate, built for another platform or does not start.

    A library name without a path that is a file here is loaded from here (the loader would search only
    its own path for it).
    """
    if os.sep not in library and os.path.isfile(library):
        library = os.path.join(os.curdir, library)
    hook = sys.unraisablehook
    # A Delegate whose library did not load fails once more in its __del__ (it has no _library).
    sys.unraisablehook = lambda unraisable: None
    try:
        try:
            return load(library)
        except Exception as error:  # noqa: BLE001 - every loading failure becomes the line below
            reason = delegate_failure(library, error)
        gc.collect()
    finally:
        sys.unraisablehook = hook
    fail(reason)


def compiled_model(path, accelerator, threads, precision):
    """ai-edge-litert's `CompiledModel` of `path`: CPU (XNNPACK), or GPU-only on the LiteRT GPU
    accelerator (`precision` "fp32" enforces float32; "fp16" lets the GPU compute in half).

    Raises ImportError without ai-edge-litert, RuntimeError when a GPU-only compile fails.
    """
    with numpy_abi_guard({"runtime": "ai-edge-litert"}):
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
    optional delegate library (e.g. libtensorflowlite_gpu_delegate.so, `load_gpu_delegate`)."""
    with numpy_abi_guard({"runtime": "tflite-runtime"}) as where:
        try:
            from tflite_runtime.interpreter import Interpreter, load_delegate
            name = "tflite_runtime"
        except ImportError:
            where["runtime"] = "tensorflow"
            try:
                import tensorflow as tf
            except ImportError:
                raise SystemExit("No TFLite runtime: pip install ai-edge-litert (JetPack 6) or "
                                 "tflite-runtime (JetPack 5).") from None
            Interpreter, load_delegate = tf.lite.Interpreter, tf.lite.experimental.load_delegate
            name = "tensorflow"
        delegates = [load_gpu_delegate(load_delegate, delegate)] if delegate else None
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
