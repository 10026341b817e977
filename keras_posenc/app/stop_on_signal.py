"""Stopping a training run cleanly on SIGTERM or SIGINT.

`StopOnSignal` turns the first SIGTERM or SIGINT into a request that the
training loop (`train_steps.fit`) honours after its current step; `train`
then saves a checkpoint and raises `TrainingInterrupted`, which
`keras-posenc` turns into exit status 128 + the signal.

Example:

>>> with StopOnSignal() as stop:  # the loop reads `stop.received` after each step
...     print(stop.received)
None
"""

import signal
import threading

__all__ = ["StopOnSignal", "TrainingInterrupted"]


class TrainingInterrupted(Exception):
    """SIGTERM or SIGINT stopped training; the last step's checkpoint was saved first.

    Attributes:
        signum: int, the signal.
        step: int, the optimizer step of the saved checkpoint.
        checkpoint: str, its prefix (what `tf.train.Checkpoint.restore` takes).
    """

    def __init__(self, signum, step, checkpoint):
        self.signum, self.step, self.checkpoint = signum, step, checkpoint
        super().__init__(f"stopped by {signal.Signals(signum).name} at step {step}: saved the checkpoint "
                         f"{checkpoint}; continue with --resume.")


class StopOnSignal:
    """While active, SIGTERM and SIGINT ask the training loop to stop after its current step.

    The loop then saves a checkpoint and `train` raises `TrainingInterrupted`. A second signal of
    either kind acts at once (the previous handlers are put back and the signal raised again).
    A signal the process ignores (`nohup`, a shell's background job) stays ignored.
    Signal handlers exist only in the main thread; elsewhere this does nothing.

    Args:
        active: bool, whether to handle the signals at all (False: a context that does nothing,
            for a multi-worker run, whose final save would need every worker).

    Attributes:
        received: int or None, the first signal received.
    """

    SIGNALS = (signal.SIGTERM, signal.SIGINT)

    def __init__(self, active=True):
        self.active = active and threading.current_thread() is threading.main_thread()
        self.received = None
        self._previous = {}

    def __enter__(self):
        if self.active:
            self._previous = {signum: signal.signal(signum, self._handle) for signum in self.SIGNALS
                              if signal.getsignal(signum) is not signal.SIG_IGN}
        return self

    def __exit__(self, *exc):
        self._restore()

    def _restore(self):
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)
        self._previous = {}

    def _handle(self, signum, frame):
        if self.received is not None:
            self._restore()
            signal.raise_signal(signum)
            return
        self.received = signum
