"""Runs in a Python that has `litert-lm-builder` / `litert-lm-api` 0.18.1: packs and runs `.litertlm` bundles.

Imports nothing of keras_posenc (nor TensorFlow): the TF 2.12 stack pins protobuf 4.25, and the
builder's generated protos need protobuf >= 6.31, so the exporter runs this file as a script
in the packaging venv (`keras_posenc.export.litertlm_bundle` finds it) with one JSON spec:

    python litertlm_runtime.py pack SPEC.json      # {"tflite", "spm", "out", "start_id", "stop_ids",
                                                   #  "pad_id", "max_num_tokens", "activation"}
    python litertlm_runtime.py generate SPEC.json  # {"bundle", "backend", "turns": [[text, ...]],
                                                   #  "max_new_tokens", "benchmark", "threads"}

`generate` prints one JSON line: `{"turns": [[text of each turn], ...], "benchmark": [...]}` (one
session per list of turns, greedy: top_k 1, no prompt template).
"""

import json
import os
import sys
import tempfile


def pack(spec):
    """Writes the bundle `spec["out"]`: LlmMetadata, the SentencePiece model, the prefill/decode model."""
    from google.protobuf import text_format
    from litert_lm_builder import litertlm_builder
    from litert_lm_builder.runtime.proto import llm_metadata_pb2

    metadata = llm_metadata_pb2.LlmMetadata()
    metadata.start_token.token_ids.ids.append(spec["start_id"])
    for stop in spec["stop_ids"]:
        metadata.stop_tokens.add().token_ids.ids.append(stop)
    metadata.pad_token.token_ids.ids.append(spec["pad_id"])
    metadata.suppress_tokens.ids.append(spec["pad_id"])  # CausalLM.generate never generates pad_id
    metadata.max_num_tokens = spec["max_num_tokens"]
    metadata.llm_model_type.generic_model.SetInParent()
    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, "llm_metadata.pbtxt")
        with open(path, "w") as f:
            f.write(text_format.MessageToString(metadata))
        builder = litertlm_builder.LitertLmFileBuilder()
        builder.add_system_metadata(litertlm_builder.Metadata(key="authors", value="keras_posenc",
                                                              dtype=litertlm_builder.DType.STRING))
        builder.add_llm_metadata(path)
        builder.add_sentencepiece_tokenizer(spec["spm"])
        builder.add_tflite_model(spec["tflite"], litertlm_builder.TfLiteModelType.PREFILL_DECODE,
                                 prefer_activation_type=spec.get("activation"))
        with open(spec["out"], "wb") as f:
            builder.build(f)
    return {"out": spec["out"], "bytes": os.path.getsize(spec["out"])}


def generate(spec):
    """Greedy text of each session's turns on the engine."""
    import litert_lm

    if spec["backend"] == "gpu":
        backend = litert_lm.Backend.GPU()
    else:
        backend = litert_lm.Backend.CPU(thread_count=spec.get("threads"))
    engine = litert_lm.Engine(spec["bundle"], backend=backend, enable_benchmark=bool(spec.get("benchmark")))
    sessions, benchmarks = [], []
    for turns in spec["turns"]:
        session = engine.create_session(apply_prompt_template=False, sampler_config=litert_lm.SamplerConfig(
            top_k=1, top_p=1.0, temperature=1.0, seed=0), max_output_tokens=spec["max_new_tokens"])
        texts = []
        for text in turns:
            session.run_prefill([text])
            texts.append("".join(session.run_decode().texts))
        sessions.append(texts)
        if spec.get("benchmark"):
            info = session.get_benchmark_info()
            benchmarks.append({name: getattr(info, name) for name in dir(info)
                               if not name.startswith("_") and isinstance(getattr(info, name),
                                                                          (int, float, list))})
        session.close()
    return {"turns": sessions, "benchmark": benchmarks}


def main(argv):
    command, spec_path = argv
    with open(spec_path) as f:
        spec = json.load(f)
    result = {"pack": pack, "generate": generate}[command](spec)
    sys.stdout.write(json.dumps(result) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
