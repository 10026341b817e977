"""The dev score of a translation run: BLEU at every checkpoint, and the best weights kept.

`train --task translate` translates the dev pairs (greedy, batched) at every
checkpoint step and at the end, scores them with sacrebleu, and keeps the
weights of the best BLEU (chrF breaks ties): those are the weights of
`model.keras`. The scores of every step are kept in
`checkpoints/dev_scores.json`, so a resumed run knows the best so far; if it
never beats it, the run's earlier `model.keras` stays the kept model.
"""

import json
import os
import time

from keras_posenc.app.translation import TranslationRun, corpus_scores, translate_sentences
from keras_posenc.backend import keras
from keras_posenc.files import write_json

__all__ = ["DEV_SCORES_FILE", "DevScoring"]

DEV_SCORES_FILE = "dev_scores.json"


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
        if self.scores_path:
            write_json(self.scores_path, {"history": self.history, "best": self.best}, indent=1)
        self.seconds += time.perf_counter() - start
        return entry

    def on_train_batch_end(self, batch, logs=None):
        if int(self.optimizer.iterations.numpy()) % self.every == 0:
            self.score()

    def keep_best(self, kept_model_path):
        """Scores the final step, then puts the best weights in the model.

        When the best was reached before a resume (its weights are not in
        memory), they are read from `kept_model_path`, the model the earlier
        run kept.

        Returns:
            The best entry.
        """
        self.score()
        if self.best_weights is not None:
            self.run.model.set_weights(self.best_weights)
        elif os.path.isfile(kept_model_path):
            earlier = keras.models.load_model(kept_model_path, compile=False)
            self.run.model.set_weights(earlier.get_weights())
        return self.best
