"""The application built on the library: the `keras-posenc` command and what it runs.

- `train`: the trainer (`keras-posenc train` / `demo`), with its parts `train_config` (the settings),
  `train_strategy`, `checkpoints`, `train_steps` (the step functions and the loop), `train_logs` and
  `stop_on_signal`;
- `dataset`: the SentencePiece tokenizer and the tf.data pipelines, with the embedded corpora in `data/`;
- `ablation`: the position-encoding ablation (`keras-posenc ablate`);
- `diagnostics`: the probes of `keras-posenc inspect`;
- `text_generation`: `keras-posenc generate` (SentencePiece in, text out);
- `run_folder`: the files of a run folder (model, tokenizer, report, held-out split);
- `translation`, `translation_ablation`: `keras-posenc translate` and `ablate --task translate`;
- `cli`: the command line, its subcommands in `cli_train`, `cli_trained_run`, `cli_export` and
  `cli_ablate`, what they share in `cli_flags`.

The library (`keras_posenc.tables`, `positions`, `layers`, `models`, `export`) never imports this package.
"""
