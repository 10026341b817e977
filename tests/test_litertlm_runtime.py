"""`litertlm_runtime.py`, the script of the LiteRT Python, run here with stand-ins for LiteRT-LM's packages.

The script imports `litert_lm_builder` and `litert_lm` only inside its commands, which need
protobuf >= 6.31; here they are stand-ins in `sys.modules`. The builder's `LlmMetadata` is a message
of LiteRT-LM's own schema (the fields `pack` writes, with their names and numbers from
runtime/proto/llm_metadata.proto), made with this stack's protobuf, so the metadata file the builder
is given is the real text format; the builder and the engine record what they are asked.
tests/edge/edge_litertlm.py runs the script with the real packages on real bundles.
"""

import json
import sys
import types

import pytest

from keras_posenc.export import litertlm_runtime


def _llm_metadata_class():
    """LiteRT-LM's `litert.lm.proto.LlmMetadata`, with the fields `pack` writes."""
    from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

    field = descriptor_pb2.FieldDescriptorProto
    proto = descriptor_pb2.FileDescriptorProto(name="stand_in/llm_metadata.proto", package="litert.lm.proto",
                                               syntax="proto3")

    def message(name, *fields):
        added = proto.message_type.add(name=name)
        for field_name, number, label, kind in fields:
            if kind == field.TYPE_INT32:
                added.field.add(name=field_name, number=number, label=label, type=kind)
            else:
                added.field.add(name=field_name, number=number, label=label, type=field.TYPE_MESSAGE,
                                type_name=f".litert.lm.proto.{kind}")

    one, many = field.LABEL_OPTIONAL, field.LABEL_REPEATED
    message("TokenIds", ("ids", 1, many, field.TYPE_INT32))
    message("TokenUnion", ("token_ids", 1, one, "TokenIds"))
    message("GenericModel")
    message("LlmModelType", ("generic_model", 1, one, "GenericModel"))
    message("LlmMetadata", ("start_token", 1, one, "TokenUnion"), ("stop_tokens", 2, many, "TokenUnion"),
            ("max_num_tokens", 5, one, field.TYPE_INT32), ("llm_model_type", 6, one, "LlmModelType"),
            ("suppress_tokens", 9, one, "TokenIds"), ("pad_token", 13, one, "TokenUnion"))
    pool = descriptor_pool.DescriptorPool()
    pool.Add(proto)
    return message_factory.GetMessageClass(pool.FindMessageTypeByName("litert.lm.proto.LlmMetadata"))


def _modules(monkeypatch, **modules):
    for name, attributes in modules.items():
        module = types.ModuleType(name)
        module.__dict__.update(attributes)
        monkeypatch.setitem(sys.modules, name, module)


@pytest.fixture
def builders(monkeypatch):
    """`litert_lm_builder` in this process: each `LitertLmFileBuilder` records its calls (the metadata
    file's name and text as it is when given) and builds `BUILT`."""
    made = []

    class LitertLmFileBuilder:
        def __init__(self):
            self.calls = []
            made.append(self)

        def add_system_metadata(self, metadata):
            self.calls.append(("system_metadata", metadata.key, metadata.value, metadata.dtype))

        def add_llm_metadata(self, path):
            with open(path) as f:
                self.calls.append(("llm_metadata", path.rsplit("/", 1)[-1], f.read()))

        def add_sentencepiece_tokenizer(self, path):
            self.calls.append(("sentencepiece_tokenizer", path))

        def add_tflite_model(self, path, model_type, prefer_activation_type=None):
            self.calls.append(("tflite_model", path, model_type, prefer_activation_type))

        def build(self, stream):
            stream.write(b"BUILT")
            self.calls.append(("build",))

    builder = {"LitertLmFileBuilder": LitertLmFileBuilder, "Metadata": types.SimpleNamespace,
               "DType": types.SimpleNamespace(STRING="DType.STRING"),
               "TfLiteModelType": types.SimpleNamespace(PREFILL_DECODE="TfLiteModelType.PREFILL_DECODE")}
    metadata_pb2 = {"LlmMetadata": _llm_metadata_class()}
    # each package before its modules: `from package import module` reads the package's attribute
    for name, attributes in (("litert_lm_builder.litertlm_builder", builder),
                             ("litert_lm_builder.runtime.proto.llm_metadata_pb2", metadata_pb2),
                             ("litert_lm_builder.runtime.proto", {}), ("litert_lm_builder.runtime", {}),
                             ("litert_lm_builder", {})):
        _modules(monkeypatch, **{name: attributes})
    for name, module in list(sys.modules.items()):
        if name.startswith("litert_lm_builder."):
            parent, child = name.rsplit(".", 1)
            setattr(sys.modules[parent], child, module)
    return made


METADATA = """start_token {
  token_ids {
    ids: 2
  }
}
stop_tokens {
  token_ids {
    ids: 3
  }
}
stop_tokens {
  token_ids {
    ids: 9
  }
}
max_num_tokens: 48
llm_model_type {
  generic_model {
  }
}
suppress_tokens {
  ids: 7
}
pad_token {
  token_ids {
    ids: 7
  }
}
"""


def test_pack_builds_the_bundle_from_the_metadata_the_tokenizer_and_the_model(builders, tmp_path,
                                                                              monkeypatch):
    monkeypatch.chdir(tmp_path)
    spec = {"tflite": "/in/model.tflite", "spm": "/in/spm.model", "out": str(tmp_path / "out.litertlm"),
            "start_id": 2, "stop_ids": [3, 9], "pad_id": 7, "max_num_tokens": 48, "activation": "fp16"}
    assert litertlm_runtime.pack(spec) == {"out": spec["out"], "bytes": 5}
    assert (tmp_path / "out.litertlm").read_bytes() == b"BUILT"
    assert [path.name for path in tmp_path.iterdir()] == ["out.litertlm"]  # the metadata file is gone
    [builder] = builders
    assert builder.calls == [("system_metadata", "authors", "keras_posenc", "DType.STRING"),
                             ("llm_metadata", "llm_metadata.pbtxt", METADATA),
                             ("sentencepiece_tokenizer", "/in/spm.model"),
                             ("tflite_model", "/in/model.tflite", "TfLiteModelType.PREFILL_DECODE", "fp16"),
                             ("build",)]


def test_pack_without_an_activation_leaves_the_engine_its_own(builders, tmp_path):
    spec = {"tflite": "m.tflite", "spm": "s.model", "out": str(tmp_path / "b.litertlm"), "start_id": 2,
            "stop_ids": [], "pad_id": 0, "max_num_tokens": 8}
    litertlm_runtime.pack(spec)
    [builder] = builders
    assert builder.calls[3] == ("tflite_model", "m.tflite", "TfLiteModelType.PREFILL_DECODE", None)
    assert "stop_tokens" not in builder.calls[1][2] and "max_num_tokens: 8\n" in builder.calls[1][2]


@pytest.fixture
def engines(monkeypatch):
    """`litert_lm` in this process: an engine whose turn's text is `<TEXT>` in three pieces; each engine,
    session and call is recorded."""
    made = []

    class Session:
        def __init__(self, **options):
            self.options, self.calls = options, []

        def run_prefill(self, texts):
            self.calls.append(("prefill", texts))

        def run_decode(self):
            self.calls.append(("decode",))
            return types.SimpleNamespace(texts=["<", self.calls[-2][1][0].upper(), ">"])

        def get_benchmark_info(self):
            self.calls.append(("benchmark",))
            return types.SimpleNamespace(prefill_tokens=7, time_to_first_token=0.5, decode_speeds=[1.0, 2.0],
                                         name="not a number", _private=3, method=lambda: 1)

        def close(self):
            self.calls.append(("close",))

    class Engine:
        def __init__(self, path, **options):
            self.path, self.options, self.sessions = path, options, []
            made.append(self)

        def create_session(self, **options):
            self.sessions.append(Session(**options))
            return self.sessions[-1]

    backend = types.SimpleNamespace(CPU=lambda **options: ("CPU", options),
                                    GPU=lambda **options: ("GPU", options))
    _modules(monkeypatch, litert_lm={"Engine": Engine, "Backend": backend,
                                     "SamplerConfig": types.SimpleNamespace})
    return made


GREEDY = types.SimpleNamespace(top_k=1, top_p=1.0, temperature=1.0, seed=0)


def test_generate_runs_each_session_greedily_without_a_template(engines):
    spec = {"bundle": "/b.litertlm", "backend": "cpu", "turns": [["the cat"], ["a", "dog"]],
            "max_new_tokens": 5, "benchmark": False, "threads": None}
    assert litertlm_runtime.generate(spec) == {"turns": [["<THE CAT>"], ["<A>", "<DOG>"]], "benchmark": []}
    [engine] = engines
    assert (engine.path, engine.options) == ("/b.litertlm", {"backend": ("CPU", {"thread_count": None}),
                                                             "enable_benchmark": False})
    options = {"apply_prompt_template": False, "sampler_config": GREEDY, "max_output_tokens": 5}
    assert [session.options for session in engine.sessions] == [options, options]
    assert [session.calls for session in engine.sessions] == [
        [("prefill", ["the cat"]), ("decode",), ("close",)],
        [("prefill", ["a"]), ("decode",), ("prefill", ["dog"]), ("decode",), ("close",)]]


def test_generate_on_the_gpu_or_threads_with_each_session_s_benchmark(engines):
    spec = {"bundle": "b", "backend": "gpu", "turns": [["x"], ["y"]], "max_new_tokens": 2, "benchmark": True}
    benchmark = {"decode_speeds": [1.0, 2.0], "prefill_tokens": 7, "time_to_first_token": 0.5}
    assert litertlm_runtime.generate(spec) == {"turns": [["<X>"], ["<Y>"]], "benchmark": [benchmark] * 2}
    assert engines[0].options == {"backend": ("GPU", {}), "enable_benchmark": True}
    assert engines[0].sessions[0].calls == [("prefill", ["x"]), ("decode",), ("benchmark",), ("close",)]
    litertlm_runtime.generate({"bundle": "b", "backend": "cpu", "turns": [], "max_new_tokens": 2,
                               "threads": 3})
    assert engines[1].options == {"backend": ("CPU", {"thread_count": 3}), "enable_benchmark": False}


def test_main_runs_the_command_of_its_spec_and_prints_one_json_line(engines, tmp_path, capsys):
    path = tmp_path / "spec.json"
    path.write_text(json.dumps({"bundle": "b", "backend": "cpu", "turns": [["x"]], "max_new_tokens": 1}))
    assert litertlm_runtime.main(["generate", str(path)]) == 0
    assert capsys.readouterr().out == '{"turns": [["<X>"]], "benchmark": []}\n'
    with pytest.raises(KeyError):
        litertlm_runtime.main(["serve", str(path)])


def test_main_packs_and_prints_the_bundle_s_size(builders, tmp_path, capsys):
    path = tmp_path / "spec.json"
    out = str(tmp_path / "b.litertlm")
    path.write_text(json.dumps({"tflite": "m", "spm": "s", "out": out, "start_id": 2, "stop_ids": [3],
                                "pad_id": 0, "max_num_tokens": 8}))
    assert litertlm_runtime.main(["pack", str(path)]) == 0
    assert capsys.readouterr().out == json.dumps({"out": out, "bytes": 5}) + "\n"
