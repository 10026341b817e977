#!/usr/bin/env bash
# Bootstraps the CPU-emulated GPU runtimes of `make test-edge` into a git-ignored cache folder:
#
#   $CACHE/mesa/            Mesa 25 lavapipe (Vulkan on the CPU) + the Vulkan loader, from Debian
#                           packages extracted with dpkg -x (the system's apt setup is left as it is)
#   $CACHE/venv-litert/     ai-edge-litert 2.3.0: the LiteRT GPU accelerator (WebGPU over Vulkan)
#   $CACHE/venv-mediapipe/  mediapipe 0.10.21: the classic TFLite GPU delegate, OpenGL ES backend
#   $CACHE/venv-litertlm/   the LiteRT Python of the exporter (keras_posenc/export/litert_python.py):
#                           litert-lm-builder + litert-lm-api + litert-lm 0.18.1 (packs `.litertlm`
#                           bundles, runs LiteRT-LM's Engine), litert-quantizer 0.11.0 (int4) and
#                           ai-edge-litert 2.3.0's interpreter (checks quantized files); their protos
#                           need protobuf >= 6.31, which .venv's TF 2.12 lock cannot take: a venv
#                           of its own
#   $CACHE/onnx-site/       tf2onnx + onnx + onnxruntime (its quantization tools make the tensorrt
#                           float16 and int8 exports; 1.23.2: 1.19's static quantizer fails on
#                           Softmax outputs it does not quantize) (+ onnxconverter-common, for the
#                           float16 copy of the tensorrt export; + polygraphy and onnx-graphsurgeon,
#                           whose constant folding must find nothing left to fold in an export),
#                           put on the path of .venv (TF 2.12)
#   $CACHE/onnx-site-py312/ the same for .venv-keras3 (TF 2.21, Python 3.12; tf2onnx 1.17.0), when
#                           that venv exists (or KERAS3_PY names a Python 3.12 with TF 2.21)
#   $CACHE/venv-genai/      onnxruntime-genai 0.18.0 (ONNX Runtime's generation loop, CPU) with the
#                           onnxruntime 1.31.0 it loads and numpy: runs the `--format genai` folders
#                           (tests/edge/runtime/probe_genai.py), no TensorFlow
#   $CACHE/venv-tflite-py38/  the Jetson kit's device side on JetPack 5: Python 3.8 with only
#                           tflite-runtime 2.14, numpy and sentencepiece (no TensorFlow)
#   $CACHE/venv-tflite-py310/ the same on JetPack 6's Python 3.10, numpy < 2 (tflite-runtime is built
#                           against NumPy 1.x), and $CACHE/numpy2-py310/ numpy 2.2.6 to put in front
#                           of it: the NumPy a plain `pip install numpy` brings there, which the kit
#                           must name in one line
#                           (Python 3.8 and 3.10: python3.8 / python3.10 on the PATH, else pyenv's,
#                           else JETPACK5_PY / JETPACK6_PY)
#
# EGL/GLES for the GL delegate (llvmpipe) come from Debian: libegl1 libgles2 libegl-mesa0
# libgl1-mesa-dri, installed with apt-get when missing. Every step is skipped when its stamp
# exists and names the same pins (a changed pin list reinstalls that part); a registry that cannot
# be reached fails with a message that says which one.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../../.."
CACHE=${EDGE_CACHE:-.edge-cache}
PY=${PY:-python3.11}
KERAS3_PY=${KERAS3_PY:-.venv-keras3/bin/python}
JETPACK5_PY=${JETPACK5_PY:-}
JETPACK6_PY=${JETPACK6_PY:-}
# Pinned to the versions the tests were run with; --no-deps for mediapipe (its GUI and audio deps
# are not needed for inference).
LITERT_PINS="ai-edge-litert==2.3.0 backports.strenum==1.2.8 flatbuffers==25.12.19 ml_dtypes==0.5.4 numpy==1.26.4 protobuf==7.36.2 tqdm==4.70.1 typing_extensions==4.16.0"
MEDIAPIPE_PINS="mediapipe==0.10.21 absl-py==2.5.1 attrs==26.1.0 flatbuffers==25.12.19 numpy==1.26.4 protobuf==4.25.9"
LITERTLM_PINS="litert-lm-api==0.18.1 litert-lm-builder==0.18.1 litert-lm==0.18.1 litert-quantizer==0.11.0 ai-edge-litert==2.3.0 absl-py==2.5.1 backports.strenum==1.2.8 click==8.5.1 flatbuffers==25.12.19 immutabledict==4.3.1 ml_dtypes==0.7.0 numpy==2.4.6 prompt_toolkit==3.0.53 protobuf==7.36.2 questionary==2.1.1 scipy==1.17.1 tomli==2.5.0 tqdm==4.70.1 typing_extensions==4.16.0 wcwidth==0.9.4"
ONNX_PINS="tf2onnx==1.16.1 onnx==1.16.2 onnxruntime==1.23.2 onnxconverter-common==1.16.0 coloredlogs==15.0.1 humanfriendly==10.0 sympy==1.13.3 mpmath==1.3.0 polygraphy==0.53.6 onnx-graphsurgeon==0.6.1"
# tf2onnx 1.17.0 converts TF 2.21 graphs and takes any protobuf >= 3.20 (the Keras 3 lock has 7.x).
ONNX_KERAS3_PINS="tf2onnx==1.17.0 onnx==1.19.1 onnxruntime==1.23.2 onnxconverter-common==1.16.0 coloredlogs==15.0.1 humanfriendly==10.0 sympy==1.13.3 mpmath==1.3.0 polygraphy==0.53.6 onnx-graphsurgeon==0.6.1"
# onnxruntime-genai 0.18.0 needs onnxruntime >= 1.31 (Python >= 3.11), a venv of its own beside onnx-site's 1.23.2.
GENAI_PINS="onnxruntime-genai==0.18.0 onnxruntime==1.31.0 numpy==1.26.4"
# The kit on tflite-runtime, as export/jetson/README.md installs it on JetPack 5 (Python 3.8) and 6 (3.10);
# tests/edge/edge_kit_tflite_runtime.py checks that these satisfy the README's install lines.
KIT_PY38_PINS="tflite-runtime==2.14.0 numpy==1.24.4 sentencepiece==0.2.0"
KIT_PY310_PINS="tflite-runtime==2.14.0 numpy==1.26.4 sentencepiece==0.2.0"
NUMPY2_PINS="numpy==2.2.6"
MESA_PACKAGES="mesa-vulkan-drivers/bookworm-backports libdrm2/bookworm-backports libdrm-amdgpu1/bookworm-backports libvulkan1/bookworm"
GL_PACKAGES="libegl1 libgles2 libegl-mesa0 libgl1-mesa-dri"
mkdir -p "$CACHE"
CACHE=$(cd "$CACHE" && pwd)
export PIP_DISABLE_PIP_VERSION_CHECK=1

fail() { echo "error: $*" >&2; exit 1; }
pypi() {  # pypi WHAT COMMAND...: pip install with a clear message when PyPI is unreachable
  local what=$1; shift
  if ! "$@"; then
    fail "pip could not install $what: is PyPI reachable from here? make test-edge needs PyPI and Debian (deb.debian.org, bookworm and bookworm-backports)."
  fi
}

# --- EGL + GLES on llvmpipe for the GL delegate (system packages) ---------------------------
# libgl1-mesa-dri also brings libLLVM-15, which bookworm-backports' lavapipe links against.
if ! ldconfig -p | grep -q libGLESv2.so.2 || ! ldconfig -p | grep -q libEGL_mesa.so.0 \
   || ! ldconfig -p | grep -q libLLVM-15.so.1; then
  echo "edge bootstrap: apt-get install $GL_PACKAGES"
  # shellcheck disable=SC2086
  if ! { apt-get -qq update && DEBIAN_FRONTEND=noninteractive apt-get -qq install -y $GL_PACKAGES; }; then
    fail "apt-get install $GL_PACKAGES failed: is deb.debian.org reachable, and are you root?"
  fi
fi

# --- Mesa 25 lavapipe from bookworm-backports, with a private apt state ---------------------
if [ ! -f "$CACHE/mesa/.stamp" ]; then
  echo "edge bootstrap: Mesa lavapipe (bookworm-backports) -> $CACHE/mesa"
  apt_dir="$CACHE/apt"
  mkdir -p "$apt_dir/lists/partial" "$apt_dir/archives/partial" "$apt_dir/debs"
  cat > "$apt_dir/sources.list" <<SOURCES
deb http://deb.debian.org/debian bookworm main
deb http://deb.debian.org/debian bookworm-backports main
SOURCES
  APT_OPTS=(-o "Dir::Etc::sourcelist=$apt_dir/sources.list" -o "Dir::Etc::sourceparts=-"
            -o "Dir::State::Lists=$apt_dir/lists" -o "Dir::Cache::archives=$apt_dir/archives"
            -o "APT::Get::List-Cleanup=0" -o "Debug::NoLocking=1" -o "APT::Sandbox::User=root")
  if ! apt-get "${APT_OPTS[@]}" -qq update; then
    fail "apt-get update of bookworm + bookworm-backports failed: is deb.debian.org reachable from here?"
  fi
  rm -f "$apt_dir"/debs/*.deb
  # shellcheck disable=SC2086
  if ! (cd "$apt_dir/debs" && apt-get "${APT_OPTS[@]}" -qq download $MESA_PACKAGES); then
    fail "apt-get download of $MESA_PACKAGES failed: is deb.debian.org reachable from here?"
  fi
  rm -rf "$CACHE/mesa"
  mkdir -p "$CACHE/mesa"
  for deb in "$apt_dir"/debs/*.deb; do dpkg -x "$deb" "$CACHE/mesa"; done
  icd=$(ls "$CACHE"/mesa/usr/share/vulkan/icd.d/lvp_icd*.json | head -1)
  lib=$(ls "$CACHE"/mesa/usr/lib/x86_64-linux-gnu/libvulkan_lvp.so)
  sed -i "s#\"library_path\": *\"[^\"]*\"#\"library_path\": \"$lib\"#" "$icd"
  missing=$(LD_LIBRARY_PATH="$CACHE/mesa/usr/lib/x86_64-linux-gnu" ldd "$lib" | grep "not found" || true)
  if [ -n "$missing" ]; then
    fail "lavapipe ($lib) misses system libraries (install them with apt-get, e.g. libllvm15):
$missing"
  fi
  # The loader reads a relative library_path from the manifest's own folder: the cache can move.
  sed "s#\"library_path\": *\"[^\"]*\"#\"library_path\": \"usr/lib/x86_64-linux-gnu/libvulkan_lvp.so\"#" \
    "$icd" > "$CACHE/mesa/lvp_icd.json"
  touch "$CACHE/mesa/.stamp"
fi

current() {  # current STAMP PINS: the part was installed with exactly PINS
  [ -f "$1" ] && [ "$(cat "$1")" = "$2" ]
}

runtime_venv() {  # runtime_venv NAME PINS [PYTHON]: a venv of exactly PINS (--no-deps) under $CACHE/NAME
  local name=$1 pins=$2 python=${3:-$PY}
  current "$CACHE/$name/.stamp" "$pins" && return 0
  echo "edge bootstrap: $pins -> $CACHE/$name"
  rm -rf "$CACHE/$name"
  "$python" -m venv "$CACHE/$name"
  # shellcheck disable=SC2086
  pypi "$pins" "$CACHE/$name/bin/python" -m pip install --quiet --no-deps $pins
  echo "$pins" > "$CACHE/$name/.stamp"
}

# --- ai-edge-litert 2.3.0 -----------------------------------------------------------------
runtime_venv venv-litert "$LITERT_PINS"

# --- mediapipe 0.10.21 (the GL delegate), without its GUI dependencies ---------------------
runtime_venv venv-mediapipe "$MEDIAPIPE_PINS"

# --- the LiteRT Python: LiteRT-LM 0.18.1 (builder, Engine, litert-lm command line), LiteRT Quantizer ----
runtime_venv venv-litertlm "$LITERTLM_PINS"

# --- onnxruntime-genai 0.18.0 (the `--format genai` folders) ---------------------------------
runtime_venv venv-genai "$GENAI_PINS"

# --- tf2onnx + onnxruntime beside .venv's TensorFlow (tf2onnx pins protobuf~=3.20: --no-deps) -
if ! current "$CACHE/onnx-site/.stamp" "$ONNX_PINS"; then
  echo "edge bootstrap: $ONNX_PINS -> $CACHE/onnx-site"
  rm -rf "$CACHE/onnx-site"
  # shellcheck disable=SC2086
  pypi "$ONNX_PINS" "$PY" -m pip install --quiet --no-deps --target "$CACHE/onnx-site" $ONNX_PINS
  echo "$ONNX_PINS" > "$CACHE/onnx-site/.stamp"
fi
if [ -x "$KERAS3_PY" ] && ! current "$CACHE/onnx-site-py312/.stamp" "$ONNX_KERAS3_PINS"; then
  echo "edge bootstrap: $ONNX_KERAS3_PINS -> $CACHE/onnx-site-py312"
  rm -rf "$CACHE/onnx-site-py312"
  # shellcheck disable=SC2086
  pypi "$ONNX_KERAS3_PINS" "$KERAS3_PY" -m pip install --quiet --no-deps --target "$CACHE/onnx-site-py312" \
    $ONNX_KERAS3_PINS
  echo "$ONNX_KERAS3_PINS" > "$CACHE/onnx-site-py312/.stamp"
fi
# --- the Jetson kit on tflite-runtime 2.14: JetPack 5's Python 3.8 and JetPack 6's 3.10 ---------
jetpack_python() {  # jetpack_python X.Y GIVEN: GIVEN, else pythonX.Y on the PATH, else a pyenv X.Y install
  local version=$1 given=$2 candidate
  for candidate in $given "python$version" "$(pyenv root 2>/dev/null)"/versions/"$version".*/bin/"python$version"; do
    if "$candidate" -c 'import sys; sys.exit(sys.version_info[:2] != tuple(map(int, sys.argv[1].split("."))))' \
        "$version" >/dev/null 2>&1; then
      echo "$candidate"
      return 0
    fi
  done
  return 1
}
if ! current "$CACHE/venv-tflite-py38/.stamp" "$KIT_PY38_PINS" \
   || ! current "$CACHE/venv-tflite-py310/.stamp" "$KIT_PY310_PINS" \
   || ! current "$CACHE/numpy2-py310/.stamp" "$NUMPY2_PINS"; then
  py38=$(jetpack_python 3.8 "$JETPACK5_PY") || fail "no Python 3.8 (JetPack 5's) for the kit's tflite-runtime venv: \
install it (e.g. 'pyenv install 3.8') or set JETPACK5_PY=/path/to/python3.8."
  py310=$(jetpack_python 3.10 "$JETPACK6_PY") || fail "no Python 3.10 (JetPack 6's) for the kit's tflite-runtime \
venv: install it (e.g. 'pyenv install 3.10') or set JETPACK6_PY=/path/to/python3.10."
  runtime_venv venv-tflite-py38 "$KIT_PY38_PINS" "$py38"
  runtime_venv venv-tflite-py310 "$KIT_PY310_PINS" "$py310"
  if ! current "$CACHE/numpy2-py310/.stamp" "$NUMPY2_PINS"; then
    echo "edge bootstrap: $NUMPY2_PINS -> $CACHE/numpy2-py310"
    rm -rf "$CACHE/numpy2-py310"
    # shellcheck disable=SC2086
    pypi "$NUMPY2_PINS" "$CACHE/venv-tflite-py310/bin/python" -m pip install --quiet --no-deps \
      --target "$CACHE/numpy2-py310" $NUMPY2_PINS
    echo "$NUMPY2_PINS" > "$CACHE/numpy2-py310/.stamp"
  fi
fi
echo "edge bootstrap: ready in $CACHE"
