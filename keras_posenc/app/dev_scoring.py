"""The dev score of a translation run: BLEU at every checkpoint, and the best weights kept.

`train --task translate` translates the dev pairs (greedy, batched) at every
checkpoint step and at the end, scores them with sacrebleu, and keeps the
weights of the best BLEU (chrF breaks ties): those are the weights of
`model.keras`. The scores of every step are kept in
`checkpoints/dev_scores.json` and the best weights in
`checkpoints/dev_best_weights.npz` (written first), so a resumed run knows
the best so far and keeps its weights if it never beats it, also when the
earlier run was stopped before it wrote `model.keras`.
"""

import json
import os
import time

import numpy as np

from keras_posenc.app.translation import TranslationRun, corpus_scores, translate_sentences
from keras_posenc.backend import keras
from keras_posenc.files import save_npz, write_json

__all__ = ["DEV_BEST_WEIGHTS_FILE", "DEV_SCORES_FILE", "DevScoring"]

DEV_SCORES_FILE = "dev_scores.json"
# Beside DEV_SCORES_FILE: the weights of its "best" entry, in `model.get_weights()` order.
DEV_BEST_WEIGHTS_FILE = "dev_best_weights.npz"


class DevScoring(keras.callbacks.Callback):
    """Scores the dev pairs every `every` optimizer steps and remembers the best weights.

    Args:
        model: the `Seq2SeqTransformer` being trained.
        sp_model: bytes, its SentencePiece model.
        pairs: list of `(source, reference)` dev pairs.
        every: int, steps between scorings (the checkpoint interval).
        optimizer: the run's optimizer (its step count).
        scores_path: where the history is written (None: nowhere, a worker
            that is not the chief).
        batch_size: sentences per translation batch.

    Attributes:
        history: list of `{"step", "bleu", "chrf"}`.
        best: the best entry (None before the first scoring).
        seconds: time spent scoring (left out of the training throughput).
        signature: sacrebleu's BLEU signature.
    """

    def __init__(self, model, sp_model, pairs, every, optimizer, scores_path=None, batch_size=64):
        super().__init__()
        self.run = TranslationRun(model, sp_model)
        self.sources = [source for source, _ in pairs]
        self.references = [reference for _, reference in pairs]
        self.every, self.optimizer = every, optimizer
        self.scores_path, self.batch_size = scores_path, batch_size
        self.history, self.best, self.best_weights, self.seconds, self.signature = [], None, None, 0.0, None
        if scores_path and os.path.isfile(scores_path):  # a resumed run: the best so far
            with open(scores_path) as f:
                stored = json.load(f)
            self.history = list(stored["history"])
            self.best = stored["best"]

    def score(self):
        """Translates and scores the dev pairs now; keeps the weights if they are the best so far."""
        step = int(self.optimizer.iterations.numpy())
        if self.history and self.history[-1]["step"] == step:
            return self.history[-1]
        start = time.perf_counter()
        hypotheses, _ = translate_sentences(self.run, self.sources, beam_size=1, batch_size=self.batch_size)
        scores = corpus_scores(hypotheses, self.references)
        entry = {"step": step, "bleu": scores["bleu"], "chrf": scores["chrf"]}
        self.signature = scores["bleu_signature"]
        self.history.append(entry)
        if self.best is None or (entry["bleu"], entry["chrf"]) > (self.best["bleu"], self.best["chrf"]):
            self.best, self.best_weights = entry, self.run.model.get_weights()
            if self.scores_path:  # before the scores name it: a stop between the two keeps a true pair
                save_npz(self._weights_path(), {f"w{i}": w for i, w in enumerate(self.best_weights)})
        if self.scores_path:
            write_json(self.scores_path, {"history": self.history, "best": self.best}, indent=1)
        self.seconds += time.perf_counter() - start
        return entry

    def on_train_batch_end(self, batch, logs=None):
        if int(self.optimizer.iterations.numpy()) % self.every == 0:
            self.score()

    def _weights_path(self):
        return os.path.join(os.path.dirname(self.scores_path), DEV_BEST_WEIGHTS_FILE)

    def keep_best(self):
        """Scores the final step, then puts the best weights in the model.

        When the best was reached before a resume (its weights are not in
        memory), they are read from `DEV_BEST_WEIGHTS_FILE` beside the scores.

        Returns:
            The best entry.

        Raises:
            ValueError: the best entry's weights are neither in memory nor on disk.
        """
        self.score()
        weights = self.best_weights
        if weights is None:
            path = self._weights_path() if self.scores_path else None
            if path is None or not os.path.isfile(path):
                raise ValueError(f"the best dev score (step {self.best['step']}) has no saved weights "
                                 f"({path or 'a worker without files'}): resume from a run that wrote them.")
            with np.load(path) as stored:
                weights = [stored[f"w{i}"] for i in range(len(stored.files))]
        self.run.model.set_weights(weights)
        return self.best
