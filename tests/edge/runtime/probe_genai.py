"""Greedy sessions of an onnxruntime-genai model folder (`keras-posenc export --format genai`), in the
edge cache's venv-genai (onnxruntime-genai 0.18 on the CPU, no TensorFlow).

    python probe_genai.py SPEC.json

SPEC: {"folder": DIR, "sessions": [[text, ...], ...], "max_new_tokens": N}. Each session is one
`og.Generator`: its first turn is encoded with the tokenizer's special tokens (BOS in front, as
`keras-posenc generate` does), each later turn without them, appended to the same generator (a
second turn continues the cache). onnxruntime-genai 0.18 does not run a turn's last generated token
when the next turn is appended (its cache slot stays unwritten), so a later turn first rewinds the
generator by that token and appends it in front of the turn's ids (docs/onnxruntime-genai.md). A turn
generates up to N tokens, or until the generator is done (EOS, or `search.max_length`).

Prints one JSON line: {"prompt_ids": [[ids of each turn]], "turns": [[generated ids of each
turn]], "texts": [[decoded text of each turn]], "version": onnxruntime-genai's}.
"""

import json
import sys

import onnxruntime_genai as og


def session(model, tokenizer, turns, max_new_tokens):
    generator = og.Generator(model, og.GeneratorParams(model))
    prompt_ids, generated, texts = [], [], []
    for turn, text in enumerate(turns):
        tokenizer.update_options(add_special_tokens="true" if turn == 0 else "false")
        ids = [int(i) for i in tokenizer.encode(text)]
        held = []
        if turn and generated[-1]:  # the previous turn's last token: run with this turn (see above)
            sequence = [int(i) for i in generator.get_sequence(0)]
            generator.rewind_to(len(sequence) - 1)
            held = sequence[-1:]
        generator.append_tokens(held + ids)
        new = []
        while len(new) < max_new_tokens and not generator.is_done():
            generator.generate_next_token()
            new.append(int(generator.get_next_tokens()[0]))
        prompt_ids.append(ids)
        generated.append(new)
        texts.append(tokenizer.decode(new))
    return prompt_ids, generated, texts


def main(spec_path):
    with open(spec_path) as f:
        spec = json.load(f)
    model = og.Model(spec["folder"])
    tokenizer = og.Tokenizer(model)
    result = {"prompt_ids": [], "turns": [], "texts": [], "version": og.__version__}
    for turns in spec["sessions"]:
        prompt_ids, generated, texts = session(model, tokenizer, turns, spec["max_new_tokens"])
        result["prompt_ids"].append(prompt_ids)
        result["turns"].append(generated)
        result["texts"].append(texts)
    print(json.dumps(result))


if __name__ == "__main__":
    main(sys.argv[1])
