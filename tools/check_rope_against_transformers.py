"""`RotaryEmbedding.from_hf_config` against transformers' own rotary classes, on real config.json values.

    python tools/check_rope_against_transformers.py            # from the package's environment
    python tools/check_rope_against_transformers.py --only deepseek

Builds (once) a virtual environment of its own under `.cache/rope-check/` (git-ignored by the
`.gitignore` it writes there) with the CPU build of torch and transformers 5.23, asks transformers
there for the inverse frequencies, attention factor, cos/sin and rotated queries/keys of every
config below (its `<Family>RotaryEmbedding` class, the family's `apply_rotary_pos_emb` or its
interleaved or complex variant, GPT-J's sinusoid table), then builds `RotaryEmbedding.from_hf_config`
here on the same dict and on the dict transformers saves back (`config.to_dict()`: transformers 5's
`rope_parameters`, nested per attention type for Gemma 3 and ModernBERT), and prints one row per
config, layout and attention type with the largest differences.

transformers computes the angles in float32 (`position_ids.float() * inv_freq`), the package in
float64: at position p a float32 angle is off by up to ~p * |f| * 2^-23, so the differences grow
with the position. A row passes when every difference stays under that bound (plus 1e-5);
a wrong layout or frequency misses it by orders of magnitude. Not part of CI (it needs torch);
the tests keep float64 golden values of the same formulas.

Config values are those of the public checkpoints' config.json (only the RoPE-related fields,
written out here: the check downloads nothing but the two packages).
"""

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CACHE = ROOT / ".cache" / "rope-check"
PACKAGES = ["torch==2.13.0", "transformers==5.23.*", "numpy"]

# Phi-3-vision-128k-instruct's config.json (transformers 4.38, the legacy "su" name).
PHI3_LONG = [
    1.0299999713897705, 1.0499999523162842, 1.0499999523162842, 1.0799999237060547, 1.2299998998641968,
    1.2299998998641968, 1.2999999523162842, 1.4499999284744263, 1.5999999046325684, 1.6499998569488525,
    1.8999998569488525, 2.859999895095825, 3.68999981880188, 5.419999599456787, 5.489999771118164,
    5.489999771118164, 9.09000015258789, 11.579999923706055, 15.65999984741211, 15.769999504089355,
    15.789999961853027, 18.360000610351562, 21.989999771118164, 23.079999923706055, 30.009998321533203,
    32.35000228881836, 32.590003967285156, 35.56000518798828, 39.95000457763672, 53.840003967285156,
    56.20000457763672, 57.95000457763672, 59.29000473022461, 59.77000427246094, 59.920005798339844,
    61.190006256103516, 61.96000671386719, 62.50000762939453, 63.3700065612793, 63.48000717163086,
    63.48000717163086, 63.66000747680664, 63.850006103515625, 64.08000946044922, 64.760009765625,
    64.80001068115234, 64.81001281738281, 64.81001281738281]
PHI3_SHORT = [
    1.05, 1.05, 1.05, 1.1, 1.1, 1.1, 1.2500000000000002, 1.2500000000000002, 1.4000000000000004,
    1.4500000000000004, 1.5500000000000005, 1.8500000000000008, 1.9000000000000008,
    *[2.000000000000001] * 19, 2.1000000000000005, 2.1000000000000005, 2.2, 2.3499999999999996,
    2.3499999999999996, 2.3499999999999996, 2.3499999999999996, 2.3999999999999995, 2.3999999999999995,
    2.6499999999999986, 2.6999999999999984,
    2.8999999999999977, 2.9499999999999975, 3.049999999999997, 3.049999999999997, 3.049999999999997]
_PHI3 = {"model_type": "phi3", "hidden_size": 3072, "num_attention_heads": 32, "num_key_value_heads": 32,
         "max_position_embeddings": 131072, "original_max_position_embeddings": 4096, "rope_theta": 10000.0}
_DEEPSEEK_YARN = {"beta_fast": 32, "beta_slow": 1, "factor": 40, "original_max_position_embeddings": 4096,
                  "type": "yarn"}
_LLAMA2 = {"model_type": "llama", "hidden_size": 4096, "num_attention_heads": 32, "num_key_value_heads": 32,
           "max_position_embeddings": 4096, "rope_theta": 10000.0}

# name -> (checkpoint, config fields, context length the positions are measured against)
CASES = {
    "llama3-8b": ("meta-llama/Meta-Llama-3-8B", {
        "model_type": "llama", "hidden_size": 4096, "num_attention_heads": 32, "num_key_value_heads": 8,
        "max_position_embeddings": 8192, "rope_theta": 500000.0, "rope_scaling": None}, 8192),
    "llama3.1-8b": ("meta-llama/Llama-3.1-8B", {
        "model_type": "llama", "hidden_size": 4096, "num_attention_heads": 32, "num_key_value_heads": 8,
        "max_position_embeddings": 131072, "rope_theta": 500000.0, "rope_scaling": {
            "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
            "original_max_position_embeddings": 8192, "rope_type": "llama3"}}, 8192),
    "llama3.2-1b": ("meta-llama/Llama-3.2-1B", {
        "model_type": "llama", "hidden_size": 2048, "num_attention_heads": 32, "num_key_value_heads": 8,
        "head_dim": 64, "max_position_embeddings": 131072, "rope_theta": 500000.0, "rope_scaling": {
            "factor": 32.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0,
            "original_max_position_embeddings": 8192, "rope_type": "llama3"}}, 8192),
    "llama2-linear": ("lmsys/vicuna-7b-v1.5-16k", {
        **_LLAMA2, "rope_scaling": {"factor": 4.0, "type": "linear"}}, 4096),
    "llama2-dynamic": ("Llama-2-7b with transformers' documented dynamic NTK example", {
        **_LLAMA2, "rope_scaling": {"type": "dynamic", "factor": 2.0}}, 4096),
    "mistral-7b-v0.1": ("mistralai/Mistral-7B-v0.1", {
        "model_type": "mistral", "hidden_size": 4096, "num_attention_heads": 32, "num_key_value_heads": 8,
        "max_position_embeddings": 32768, "rope_theta": 10000.0, "sliding_window": 4096}, 8192),
    "mistral-7b-v0.3": ("mistralai/Mistral-7B-v0.3", {
        "model_type": "mistral", "hidden_size": 4096, "num_attention_heads": 32, "num_key_value_heads": 8,
        "max_position_embeddings": 32768, "rope_theta": 1000000.0, "sliding_window": None}, 32768),
    "qwen2-7b": ("Qwen/Qwen2-7B", {
        "model_type": "qwen2", "hidden_size": 3584, "num_attention_heads": 28, "num_key_value_heads": 4,
        "max_position_embeddings": 131072, "rope_theta": 1000000.0}, 32768),
    "qwen2.5-7b-yarn": ("Qwen/Qwen2.5-7B-Instruct with its README's YaRN rope_scaling", {
        "model_type": "qwen2", "hidden_size": 3584, "num_attention_heads": 28, "num_key_value_heads": 4,
        "max_position_embeddings": 32768, "rope_theta": 1000000.0, "rope_scaling": {
            "factor": 4.0, "original_max_position_embeddings": 32768, "type": "yarn"}}, 32768),
    "qwen3-8b": ("Qwen/Qwen3-8B", {
        "model_type": "qwen3", "hidden_size": 4096, "num_attention_heads": 32, "num_key_value_heads": 8,
        "head_dim": 128, "max_position_embeddings": 40960, "rope_theta": 1000000, "rope_scaling": None},
        32768),
    "qwen3-8b-yarn": ("Qwen/Qwen3-8B with its README's YaRN rope_scaling", {
        "model_type": "qwen3", "hidden_size": 4096, "num_attention_heads": 32, "num_key_value_heads": 8,
        "head_dim": 128, "max_position_embeddings": 131072, "rope_theta": 1000000, "rope_scaling": {
            "rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768}}, 32768),
    "phi3-vision-128k-su": ("microsoft/Phi-3-vision-128k-instruct (legacy 'su')", {
        **_PHI3, "rope_scaling": {"long_factor": PHI3_LONG, "short_factor": PHI3_SHORT, "type": "su"}}, 4096),
    "phi3-128k-longrope": ("Phi-3-mini-128k layout (type longrope), the factor lists above", {
        **_PHI3, "rope_scaling": {"long_factor": PHI3_LONG, "short_factor": PHI3_SHORT, "type": "longrope"}},
        4096),
    "phi3-medium-128k-shape": ("Phi-3-medium-128k shape (5120 / 40 heads, 64 pairs; factors stretched)", {
        **_PHI3, "hidden_size": 5120, "num_attention_heads": 40, "num_key_value_heads": 10, "rope_scaling": {
            "long_factor": PHI3_LONG + PHI3_LONG[-16:], "short_factor": PHI3_SHORT + PHI3_SHORT[-16:],
            "type": "longrope"}}, 4096),
    "phi-2-partial": ("microsoft/phi-2", {
        "model_type": "phi", "hidden_size": 2560, "num_attention_heads": 32, "max_position_embeddings": 2048,
        "partial_rotary_factor": 0.4, "rope_theta": 10000.0}, 2048),
    "gemma2-9b": ("google/gemma-2-9b", {
        "model_type": "gemma2", "hidden_size": 3584, "num_attention_heads": 16, "num_key_value_heads": 8,
        "head_dim": 256, "max_position_embeddings": 8192, "rope_theta": 10000.0}, 8192),
    "gemma3-1b": ("google/gemma-3-1b-pt", {
        "model_type": "gemma3_text", "hidden_size": 1152, "num_attention_heads": 4, "num_key_value_heads": 1,
        "head_dim": 256, "max_position_embeddings": 32768, "rope_theta": 1000000,
        "rope_local_base_freq": 10000, "rope_scaling": None, "sliding_window": 512,
        "sliding_window_pattern": 6, "num_hidden_layers": 26},
        32768),
    "gemma3-4b": ("google/gemma-3-4b-pt (text_config)", {
        "model_type": "gemma3", "architectures": ["Gemma3ForConditionalGeneration"], "text_config": {
            "hidden_size": 2560, "intermediate_size": 10240, "model_type": "gemma3_text",
            "num_hidden_layers": 34, "rope_scaling": {"factor": 8.0, "rope_type": "linear"},
            "sliding_window": 1024}}, 32768),
    "deepseek-v2-lite": ("deepseek-ai/DeepSeek-V2-Lite", {
        "model_type": "deepseek_v2", "hidden_size": 2048, "num_attention_heads": 16, "qk_rope_head_dim": 64,
        "qk_nope_head_dim": 128, "v_head_dim": 128, "kv_lora_rank": 512, "q_lora_rank": None,
        "max_position_embeddings": 163840, "rope_theta": 10000, "rope_scaling": {
            **_DEEPSEEK_YARN, "mscale": 0.707, "mscale_all_dim": 0.707}}, 4096),
    "deepseek-v3": ("deepseek-ai/DeepSeek-V3", {
        "model_type": "deepseek_v3", "hidden_size": 7168, "num_attention_heads": 128, "qk_rope_head_dim": 64,
        "qk_nope_head_dim": 128, "v_head_dim": 128, "kv_lora_rank": 512, "q_lora_rank": 1536,
        "max_position_embeddings": 163840, "rope_theta": 10000, "rope_scaling": {
            **_DEEPSEEK_YARN, "mscale": 1.0, "mscale_all_dim": 1.0}}, 4096),
    "deepseek-v3-mscale-ratio": ("DeepSeek-V3 with mscale 1.0 / mscale_all_dim 0.707, not interleaved", {
        "model_type": "deepseek_v3", "hidden_size": 7168, "num_attention_heads": 128, "qk_rope_head_dim": 64,
        "qk_nope_head_dim": 128, "v_head_dim": 128, "kv_lora_rank": 512, "q_lora_rank": 1536,
        "rope_interleave": False, "max_position_embeddings": 163840, "rope_theta": 10000, "rope_scaling": {
            **_DEEPSEEK_YARN, "mscale": 1.0, "mscale_all_dim": 0.707}}, 4096),
    "gpt-oss-20b": ("openai/gpt-oss-20b (yarn, truncate false)", {
        "model_type": "gpt_oss", "hidden_size": 2880, "num_attention_heads": 64, "num_key_value_heads": 8,
        "head_dim": 64, "max_position_embeddings": 131072, "rope_theta": 150000, "rope_scaling": {
            "rope_type": "yarn", "factor": 32.0, "beta_fast": 32.0, "beta_slow": 1.0, "truncate": False,
            "original_max_position_embeddings": 4096}}, 4096),
    "pythia-160m": ("EleutherAI/pythia-160m", {
        "model_type": "gpt_neox", "hidden_size": 768, "num_attention_heads": 12,
        "max_position_embeddings": 2048, "rotary_pct": 0.25, "rotary_emb_base": 10000}, 2048),
    "gpt-neox-20b": ("EleutherAI/gpt-neox-20b", {
        "model_type": "gpt_neox", "hidden_size": 6144, "num_attention_heads": 64,
        "max_position_embeddings": 2048, "rotary_pct": 0.25, "rotary_emb_base": 10000}, 2048),
    "falcon-7b": ("tiiuae/falcon-7b", {
        "model_type": "falcon", "hidden_size": 4544, "num_attention_heads": 71, "alibi": False,
        "multi_query": True, "new_decoder_architecture": False, "parallel_attn": True}, 2048),
    "gpt-j-6b": ("EleutherAI/gpt-j-6b", {
        "model_type": "gptj", "n_embd": 4096, "n_head": 16, "rotary_dim": 64, "n_positions": 2048}, 2048),
    "glm-4-9b": ("THUDM/glm-4-9b-chat-hf", {
        "model_type": "glm", "hidden_size": 4096, "num_attention_heads": 32, "num_key_value_heads": 2,
        "head_dim": 128, "partial_rotary_factor": 0.5, "max_position_embeddings": 131072,
        "rope_theta": 10000.0}, 8192),
    "command-r": ("CohereForAI/c4ai-command-r-v01", {
        "model_type": "cohere", "hidden_size": 8192, "num_attention_heads": 64, "num_key_value_heads": 64,
        "max_position_embeddings": 8192, "rope_theta": 8000000.0}, 8192),
    "llama4-scout": ("meta-llama/Llama-4-Scout-17B-16E (text_config)", {
        "model_type": "llama4", "text_config": {
            "model_type": "llama4_text", "hidden_size": 5120, "num_attention_heads": 40,
            "num_key_value_heads": 8, "head_dim": 128, "max_position_embeddings": 10485760,
            "rope_theta": 500000.0, "rope_scaling": {
                "factor": 16.0, "high_freq_factor": 1.0, "low_freq_factor": 1.0,
                "original_max_position_embeddings": 8192, "rope_type": "llama3"}}}, 8192),
    "modernbert-base": ("answerdotai/ModernBERT-base", {
        "model_type": "modernbert", "hidden_size": 768, "num_attention_heads": 12,
        "max_position_embeddings": 8192, "global_rope_theta": 160000.0, "local_rope_theta": 10000.0,
        "global_attn_every_n_layers": 3, "num_hidden_layers": 22}, 8192),
}


# --------------------------------------------------------------------------- transformers' side


def _reference(names, out_path):
    """Runs in the check's own venv: transformers' values of every case, written as JSON."""
    import importlib

    import numpy as np
    import torch
    from transformers import AutoConfig
    from transformers.models.auto.configuration_auto import model_type_to_module_name

    torch.manual_seed(0)
    results = {}
    for name in names:
        _, fields, context = CASES[name]
        kwargs = {key: value for key, value in fields.items() if key != "model_type"}
        note = None
        try:
            top = AutoConfig.for_model(fields["model_type"], **kwargs)
        except KeyError as error:  # transformers 5.23's Phi-3 renames "su" after it fills in the lengths
            if (fields.get("rope_scaling") or {}).get("type") != "su":
                raise
            note = f"transformers raises on 'su' ({error}); reference: the same dict with 'longrope'"
            kwargs["rope_scaling"] = {**fields["rope_scaling"], "type": "longrope"}
            top = AutoConfig.for_model(fields["model_type"], **kwargs)
        config = top.get_text_config() if hasattr(top, "get_text_config") else top
        module_name = model_type_to_module_name(config.model_type)
        module = importlib.import_module(f"transformers.models.{module_name}.modeling_{module_name}")
        params = getattr(config, "rope_parameters", None) or {}
        types = [key for key in params if isinstance(params[key], dict)] or [None]
        saved = top.to_dict()
        heads = 2
        rng = np.random.default_rng(0)
        top_id = 2 * context
        id_sets = {"short": np.arange(16)[None],
                   "long": np.sort(np.concatenate([rng.integers(0, top_id, 15), [top_id - 1]]))[None]}
        entries = []
        for layer_type in types:
            for label, ids in id_sets.items():
                entry = _transformers_rope(module, config, layer_type, torch.tensor(ids), heads, rng)
                entry.update(layer_type=layer_type, ids=label, position_ids=ids.tolist())
                entries.append(entry)
        results[name] = {"saved": json.loads(json.dumps(saved, default=str)), "entries": entries,
                         "note": note}
    Path(out_path).write_text(json.dumps(results))


def _transformers_rope(module, config, layer_type, ids, heads, rng):
    import numpy as np
    import torch

    model_type = config.model_type
    if model_type in ("gptj", "codegen"):  # a sinusoid table, no rotary class
        head_dim = config.n_embd // config.n_head
        rot = config.rotary_dim or head_dim
        table = module.create_sinusoidal_positions(int(ids.max()) + 1, rot)
        sin, cos = torch.split(table[ids], rot // 2, dim=-1)
        inv_freq = 1.0 / (10000 ** (torch.arange(0, rot, 2, dtype=torch.int64) / rot))
        attention = 1.0
        rotate = "gptj"
    else:
        classes = [n for n in dir(module) if n.endswith("RotaryEmbedding") and "Vision" not in n
                   and not n.startswith("_")]
        rotary = getattr(module, classes[0])(config)
        x = torch.zeros(1)
        out = rotary(x, ids) if layer_type is None else rotary(x, ids, layer_type)
        prefix = "" if layer_type is None else f"{layer_type}_"
        inv_freq = getattr(rotary, f"{prefix}inv_freq")
        attention = getattr(rotary, f"{prefix}attention_scaling", getattr(rotary, "attention_scaling", 1.0))
        if torch.is_tensor(out):  # complex angles (DeepSeek-V2, Llama 4)
            cos, sin = out.real / attention, out.imag / attention
            rotate = "complex"
            freqs_cis = out
        else:
            full_cos, full_sin = out
            half = full_cos.shape[-1] // 2
            if model_type == "gpt_oss":  # one angle per pair already
                cos, sin = full_cos, full_sin
            elif torch.allclose(full_cos[..., :half], full_cos[..., half:]):
                cos, sin = full_cos[..., :half], full_sin[..., :half]
            else:  # repeat_interleave of the angles (Cohere)
                cos, sin = full_cos[..., ::2], full_sin[..., ::2]
            cos, sin = cos / attention, sin / attention
            rotate = "interleave-fn" if getattr(config, "rope_interleave", False) else "apply"
    rot = 2 * cos.shape[-1]
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    if model_type in ("gptj", "codegen"):
        head_dim = config.n_embd // config.n_head
    q = torch.tensor(rng.standard_normal([1, heads, ids.shape[1], head_dim]), dtype=torch.float32)
    k = torch.tensor(rng.standard_normal([1, heads, ids.shape[1], head_dim]), dtype=torch.float32)
    q_rot, k_rot = q[..., :rot], k[..., :rot]
    if rotate == "gptj":
        q_out, k_out = (module.apply_rotary_pos_emb(t.transpose(1, 2), sin, cos).transpose(1, 2)
                        for t in (q_rot, k_rot))
    elif rotate == "complex":
        apply = module.apply_rotary_emb
        if model_type == "deepseek_v2":
            q_out, k_out = apply(q_rot, k_rot, freqs_cis)
        else:  # Llama 4: [batch, length, heads, dim]
            q_out, k_out = (t.transpose(1, 2) for t in apply(q_rot.transpose(1, 2), k_rot.transpose(1, 2),
                                                            freqs_cis))
    elif rotate == "interleave-fn":
        q_out, k_out = module.apply_rotary_pos_emb_interleave(q_rot, k_rot, full_cos, full_sin)
    else:
        q_out, k_out = module.apply_rotary_pos_emb(q_rot, k_rot, full_cos, full_sin)
    q_out = torch.cat([q_out, q[..., rot:]], -1)
    k_out = torch.cat([k_out, k[..., rot:]], -1)
    as_list = lambda t: np.asarray(t, np.float64).tolist()  # noqa: E731
    return {"inv_freq": as_list(inv_freq.float()), "attention": float(attention), "cos": as_list(cos[0]),
            "sin": as_list(sin[0]), "q": as_list(q.transpose(1, 2)[0]), "k": as_list(k.transpose(1, 2)[0]),
            "q_out": as_list(q_out.transpose(1, 2)[0]), "k_out": as_list(k_out.transpose(1, 2)[0]),
            "deinterleaved": rotate == "interleave-fn"}


# --------------------------------------------------------------------------- the package's side


def _venv_python(python):
    venv = CACHE / "venv"
    executable = venv / "bin" / "python"
    stamp = venv / ".stamp"
    wanted = " ".join(PACKAGES)
    if stamp.exists() and stamp.read_text() == wanted:
        return executable
    CACHE.mkdir(parents=True, exist_ok=True)
    (CACHE / ".gitignore").write_text("*\n")
    if venv.exists():
        shutil.rmtree(venv)
    print(f"building {venv} ({wanted}) ...", flush=True)
    subprocess.run([python, "-m", "venv", str(venv)], check=True)
    subprocess.run([str(executable), "-m", "pip", "install", "-q", *PACKAGES], check=True)
    stamp.write_text(wanted)
    return executable


def _largest(ours, theirs, relative=False):
    """The largest |ours - theirs| (relative: divided by |theirs|); inf when the shapes differ."""
    import numpy as np

    ours, theirs = np.asarray(ours, np.float64), np.asarray(theirs, np.float64)
    if ours.shape != theirs.shape:
        return float("inf")
    difference = np.abs(ours - theirs)
    return float(np.max(difference / np.abs(theirs) if relative else difference))


def _compare(name, fields, saved, entries, options):
    import numpy as np

    from keras_posenc.layers import RotaryEmbedding
    from keras_posenc.layers.rotary_embedding import rotary_cos_sin

    rows = []
    for layout_name, config in (("config.json", fields), ("re-saved", saved)):
        for entry in entries:
            ids = np.asarray(entry["position_ids"], np.int64)
            try:
                layer = RotaryEmbedding.from_hf_config(config, layer_type=entry["layer_type"], **options)
            except ValueError as error:
                rows.append((name, layout_name, entry["layer_type"], entry["ids"], None, str(error)))
                continue
            head_dim = layer.head_dim
            length = int(ids.max()) + 1
            freqs = layer.frequencies(head_dim, length)
            cos, sin = (v.astype(np.float64) for v in rotary_cos_sin(ids[0], freqs))
            q, k = (np.asarray(entry[key], np.float32)[None] for key in ("q", "k"))
            q_out, k_out = (np.asarray(layer(t, position_ids=ids), np.float64)[0] for t in (q, k))
            if entry["deinterleaved"]:  # transformers' DeepSeek-V3 writes evens first, then odds
                width = layer.rotated_width(head_dim)
                order = np.concatenate([np.arange(0, width, 2), np.arange(1, width, 2),
                                        np.arange(width, head_dim)])
                q_out, k_out = q_out[..., order], k_out[..., order]
            ref_freq = np.asarray(entry["inv_freq"])
            errors = {
                "freq": _largest(freqs, ref_freq, relative=True),
                "attention": abs(layer.attention_factor - entry["attention"]),
                "cos/sin": max(_largest(cos, entry["cos"]), _largest(sin, entry["sin"])),
                "q/k": max(_largest(q_out, entry["q_out"]), _largest(k_out, entry["k_out"])),
            }
            scale = max(layer.attention_factor, 1.0) * float(np.max(np.abs(np.concatenate([q, k]))))
            bound = 8 * 2.0 ** -23 * float(ids.max()) * float(np.max(freqs)) * scale + 1e-5
            errors["bound"] = bound
            rows.append((name, layout_name, entry["layer_type"], entry["ids"], errors, None))
    return rows


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", default="", help="run the cases whose name contains this")
    parser.add_argument("--python", default=None, help="Python 3.11 for the check's venv (default: this one "
                        "if 3.11, else python3.11)")
    parser.add_argument("--layout", choices=("half", "interleave"), help="force the pairs (to see what a "
                        "wrong layout costs)")
    parser.add_argument("--reference", help=argparse.SUPPRESS)  # internal: run inside the venv
    parser.add_argument("--names", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.reference:
        _reference(args.names.split(","), args.reference)
        return 0
    names = [name for name in CASES if args.only in name]
    if not names:
        print(f"no case matches --only {args.only!r}; cases: {', '.join(CASES)}")
        return 2
    python = args.python or (sys.executable if sys.version_info[:2] == (3, 11)
                             else shutil.which("python3.11"))
    if python is None:
        print("needs a Python 3.11 (the torch CPU wheel): pass --python")
        return 2
    venv_python = _venv_python(python)
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    with tempfile.TemporaryDirectory() as folder:
        out = Path(folder) / "reference.json"
        env = {key: value for key, value in os.environ.items() if key != "PYTHONPATH"}
        subprocess.run([str(venv_python), __file__, "--reference", str(out), "--names", ",".join(names)],
                       check=True, env=env)
        reference = json.loads(out.read_text())
        version = subprocess.run([str(venv_python), "-c", "import torch, transformers; "
                                  "print(transformers.__version__, torch.__version__)"],
                                 capture_output=True, text=True, env=env).stdout.split()
    print(f"transformers {version[0]}, torch {version[1]}; angles float32 there, float64 here")
    header = (f"{'case':28} {'config':11} {'layer type':17} {'ids':5} {'freq rel':>9} {'attn':>8} "
              f"{'cos/sin':>9} {'q/k':>9} {'bound':>9}  verdict")
    print(header)
    print("-" * len(header))
    failures = 0
    for name in names:
        _, fields, _ = CASES[name]
        options = {"layout": args.layout} if args.layout else {}
        for case, layout, layer_type, ids, errors, error in _compare(name, fields, reference[name]["saved"],
                                                                     reference[name]["entries"], options):
            if errors is None:
                failures += 1
                print(f"{case:28} {layout:11} {str(layer_type):17} {ids:5} raised: {error}")
                continue
            ok = (errors["freq"] <= 1e-6 and errors["attention"] <= 1e-6
                  and max(errors["cos/sin"], errors["q/k"]) <= errors["bound"])
            failures += not ok
            print(f"{case:28} {layout:11} {str(layer_type):17} {ids:5} {errors['freq']:9.1e} "
                  f"{errors['attention']:8.1e} {errors['cos/sin']:9.1e} {errors['q/k']:9.1e} "
                  f"{errors['bound']:9.1e}  {'match' if ok else 'DIFFERS'}")
    for name in names:
        if reference[name]["note"]:
            print(f"note, {name}: {reference[name]['note']}")
    print(f"{failures} row(s) differ" if failures else "every row matches")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
