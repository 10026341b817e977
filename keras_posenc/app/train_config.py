"""The settings of a training run: `TrainConfig`, one field per flag of `keras-posenc train`.

Each field holds its default, its help text and its choices (`_option`), so
`TrainConfig` is the one place that defines a setting: `train.train` reads
it, the command line builds its flags from it, and `report.json` keeps it
(`dataclasses.asdict`). The config also makes the run's model
(`build_model`) and its `tf.data` pipeline (`dataset`) for the task.

Example:

>>> config = TrainConfig(task="translate", corpus_format="tsv", corpus="pairs.tsv")
>>> config.position, default_warmup_steps(config.steps)
('rope', 500)
"""

import dataclasses

from keras_posenc.app import dataset as data_lib
from keras_posenc.app import translation_data
from keras_posenc.app.train_strategy import JIT_COMPILE, STRATEGIES
from keras_posenc.layers.encoder import NAMED_POSITIONS, named_position
from keras_posenc.models import CausalLM
from keras_posenc.seq2seq import Seq2SeqTransformer
from keras_posenc.tables import TABLE_KINDS

__all__ = ["DEFAULT_POSITIONS", "TASKS", "TrainConfig", "default_warmup_steps"]

# lm: a causal LM (CausalLM); translate: an encoder-decoder translator (Seq2SeqTransformer) over pairs.
TASKS = ("lm", "translate")
# `position` when none is given: RoPE for the translator (3.2 test BLEU above sinusoidal at the
# benchmark's size and budget, benchmarks/RESULTS.md "Translation"), the sinusoidal table for the LM.
DEFAULT_POSITIONS = {"lm": "sinusoidal", "translate": "rope"}


def _option(default, group, help, *, flag=None, choices=None, type=None, const=None):
    """A config field and its command-line flag: the one place for its name, default and help.

    `cli_flags.add_config_flags` builds the flags of `keras-posenc train` from
    these fields: the flag is `--<name with dashes>` unless `flag` is given; a
    bool field is a switch that flips its default (`--norm-first`,
    `--no-bos`), a field with `const` a switch that sets it (`--quiet`
    sets `verbose` to 0); an int field takes a positive int unless `type`
    says otherwise.
    """
    metadata = {"group": group, "help": help, "flag": flag, "choices": choices, "type": type, "const": const}
    return dataclasses.field(default=default, metadata=metadata)


def default_warmup_steps(steps):
    """The warmup used when none is given: `min(4000, max(1, steps // 2))`.

    Half the run, at most the paper's 4000. The schedule peaks at
    `d_model**-0.5 * warmup**-0.5`, so a warmup of a small fraction of a short
    run gives a peak learning rate that Adam overshoots with; half the run
    keeps the peak moderate and still leaves warmup and decays.

    Args:
        steps: int, the run's total optimizer steps.

    Returns:
        int >= 1.

    Example:

    >>> default_warmup_steps(300), default_warmup_steps(1), default_warmup_steps(100_000)
    (150, 1, 4000)
    """
    return min(4000, max(1, steps // 2))


@dataclasses.dataclass
class TrainConfig:
    """Everything a training run needs. `corpus=None` is the embedded corpus.

    The fields are the flags of `keras-posenc train` (`--vocab-size` is
    `vocab_size`, `--format` is `corpus_format`, `--no-bos` is
    `add_bos=False`, `--quiet` is `verbose=0`); each field's metadata holds
    its help text and choices.

    Args:
        task: one of `TASKS`: `"lm"` trains `CausalLM`, `"translate"` a
            `Seq2SeqTransformer` on the pairs of a TSV corpus.
        corpus: str or None, the corpus file (None: `data.default_corpus_path()`).
        dev_corpus: str or None, translate: the TSV pairs whose BLEU picks the
            kept weights (None: the held-out split).
        dev_sentences: int, translate: how many dev pairs are scored.
        label_smoothing: float in [0, 1), translate: on the training loss.
        share_embeddings: bool, translate: one embedding for both sides and
            the softmax tied to it (default: separate tables and softmax).
        out: str, output folder.
        corpus_format: `"text"` or `"tsv"` (pairs, trained with
            `num_languages=2`; needs `corpus`: the embedded one is text).
        skip_bad_lines: bool, skip malformed TSV lines.
        vocab_size: int, SentencePiece vocabulary size.
        max_length: int, longest model input in tokens.
        add_bos: bool, start every sequence with `<s>`.
        add_eos: bool, end every sequence with `</s>`.
        eval_fraction: float, share of examples held out for evaluation.
        steps: int, total optimizer steps (a resumed run continues to it).
        batch_size: int, global batch size (split across replicas).
        num_layers: int, encoder layers.
        d_model: int, model width.
        num_heads: int, attention heads.
        dff: int, feed-forward width.
        dropout: float, dropout rate.
        norm_first: bool, pre-LN blocks.
        position: str, one of `encoder.NAMED_POSITIONS` (`"sinusoidal"`,
            `"learned"`, `"rope"`, `"rope-ntk"`, `"alibi"`, ...); None is
            the task's `DEFAULT_POSITIONS` entry (`"rope"` for translate,
            `"sinusoidal"` for lm).
        table: str, sinusoidal table storage (only for `"sinusoidal"`).
        warmup_steps: int or None, `WarmupSchedule` warmup; None derives it
            from `steps` (`default_warmup_steps`) or, on resume, takes the
            checkpoint's.
        lr_scale: float, factor on the schedule.
        seed: int, seed of the split, data order, initialization and dropout.
        checkpoint_every: int, steps between checkpoints.
        keep_checkpoints: int, how many checkpoints to keep.
        log_every: int, TensorBoard logging interval in steps.
        resume: bool, continue from the latest checkpoint in `out`.
        strategy: one of `STRATEGIES`.
        jit_compile: one of `JIT_COMPILE`: XLA-compile the train and eval
            steps (`"on"`, one replica only), not (`"off"`), or `"auto"`:
            on for one GPU, off on CPUs.
        verbose: int, 0 for no progress bar.

    Example:

    >>> config = TrainConfig(corpus_format="tsv", d_model=32).model_config(vocab_size=100)
    >>> config["d_model"], config["vocab_size"], config["num_languages"], config["table"]
    (32, 100, 2, 'full')
    """

    task: str = _option("lm", "data", "lm: a causal next-token LM; translate: an encoder-decoder translator "
                        "of the pairs of a --format tsv corpus", choices=TASKS)
    corpus: str = _option(None, "data", "corpus file (default: the embedded English corpus)")
    dev_corpus: str = _option(None, "data", "--task translate: TSV pairs whose BLEU picks the kept model "
                              "(default: the held-out split of --corpus)")
    dev_sentences: int = _option(500, "data", "--task translate: dev pairs translated (greedy) at each "
                                 "checkpoint, the first N")
    out: str = _option("runs/train", "data", "output folder")
    corpus_format: str = _option("text", "data", "text: one document or sentence per line; "
                                 "tsv: source<TAB>target", flag="--format", choices=data_lib.FORMATS)
    skip_bad_lines: bool = _option(False, "data", "skip TSV lines without exactly one tab")
    vocab_size: int = _option(2000, "data", "SentencePiece vocabulary size")
    add_bos: bool = _option(True, "data", "do not start sequences with <s>", flag="--no-bos")
    add_eos: bool = _option(True, "data", "do not end sequences with </s>", flag="--no-eos")
    eval_fraction: float = _option(0.05, "data", "share of examples held out for evaluation")
    max_length: int = _option(64, "model", "longest input sequence in tokens (independent of --vocab-size)")
    num_layers: int = _option(2, "model", "encoder layers (--task translate: encoder and decoder layers "
                              "each)")
    d_model: int = _option(64, "model", "model width")
    num_heads: int = _option(4, "model", "attention heads")
    dff: int = _option(256, "model", "feed-forward width")
    dropout: float = _option(0.1, "model", "dropout rate")
    norm_first: bool = _option(False, "model", "pre-LN blocks")
    label_smoothing: float = _option(0.1, "model", "--task translate: label smoothing of the training loss")
    share_embeddings: bool = _option(False, "model", "--task translate: one embedding for source and target "
                                     "and the softmax tied to it (Vaswani et al., section 3.4)")
    position: str = _option(None, "model", "position encoding (default: sinusoidal; --task translate: rope)",
                            choices=NAMED_POSITIONS)
    table: str = _option("full", "model", "sinusoidal table storage (only for --position sinusoidal)",
                         choices=TABLE_KINDS)
    steps: int = _option(1000, "training", "total optimizer steps (a resumed run continues to it)")
    batch_size: int = _option(32, "training", "global batch size (split across replicas)")
    warmup_steps: int = _option(None, "training", "learning-rate warmup steps (default: "
                                "min(4000, max(1, steps // 2)), so short runs leave warmup)")
    lr_scale: float = _option(1.0, "training", "factor on the warmup schedule")
    seed: int = _option(0, "training", "seed of the split, data order, initialization and dropout",
                        type=int)
    checkpoint_every: int = _option(100, "training", "steps between checkpoints")
    keep_checkpoints: int = _option(3, "training", "how many checkpoints to keep")
    log_every: int = _option(10, "training", "TensorBoard logging interval in steps")
    resume: bool = _option(False, "training", "continue from the latest checkpoint in --out")
    strategy: str = _option("default", "training", "tf.distribute strategy; multiworker reads TF_CONFIG",
                            choices=STRATEGIES)
    jit_compile: str = _option("auto", "training", "XLA-compile the train and eval steps (one compile per "
                               "bucket length); auto: on for one GPU, off on CPUs, where compiling costs "
                               "more than it saves", choices=JIT_COMPILE)
    verbose: int = _option(1, "training", "no progress bar", flag="--quiet", const=0)

    def __post_init__(self):
        if self.position is None:
            self.position = DEFAULT_POSITIONS.get(self.task, DEFAULT_POSITIONS["lm"])

    def model_config(self, vocab_size):
        """The model's keyword arguments; a checkpoint only fits this exact config.

        Args:
            vocab_size: int, the trained tokenizer's vocabulary size.

        Returns:
            dict: the `encoder_config` of `CausalLM` (`task="lm"`), or the
            keyword arguments of `Seq2SeqTransformer` (`task="translate"`).
        """
        position, position_config = named_position(self.position, self.max_length)
        if position == "sinusoidal":
            position_config["table"] = self.table
        config = {
            "num_layers": self.num_layers, "d_model": self.d_model, "num_heads": self.num_heads,
            "dff": self.dff, "vocab_size": vocab_size, "max_length": self.max_length, "dropout": self.dropout,
            "norm_first": self.norm_first, "pad_id": data_lib.PAD_ID, "position": position,
        }
        if self.task == "translate":
            return {**config, "position_config": position_config, "language_scale": True,
                    "share_embeddings": self.share_embeddings, "tie_output": self.share_embeddings,
                    "label_smoothing": self.label_smoothing, "bos_id": data_lib.BOS_ID,
                    "eos_id": data_lib.EOS_ID}
        config.update(position_config)
        if self.corpus_format == "tsv":
            config["num_languages"] = 2
        return config

    def build_model(self, vocab_size, name=None):
        """The run's model (not built): `CausalLM` or `Seq2SeqTransformer` of `model_config(vocab_size)`."""
        config = self.model_config(vocab_size)
        if self.task == "translate":
            return Seq2SeqTransformer(**config, name=name or "seq2seq_transformer")
        return CausalLM(config, name=name or "causal_lm")

    def dataset(self, examples, sp_model, **options):
        """The run's tf.data pipeline of `examples`: `lm_dataset` or `translation_dataset`."""
        if self.task == "translate":
            return translation_data.translation_dataset(examples, sp_model, max_length=self.max_length,
                                                        **options)
        return data_lib.lm_dataset(examples, sp_model, max_length=self.max_length, add_bos=self.add_bos,
                                   add_eos=self.add_eos, **options)
