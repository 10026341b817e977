"""WarmupSchedule: the Transformer learning-rate schedule, finite at step 0."""

import math

from keras_posenc.backend import dtype_name, keras, ops, widest_float
from keras_posenc.validation import check, check_positive_int, with_checks

__all__ = ["WarmupSchedule"]


@keras.utils.register_keras_serializable(package="keras_posenc")
class WarmupSchedule(keras.optimizers.schedules.LearningRateSchedule):
    """Linear warmup, then inverse square-root decay (section 5.3 of the paper).

    `lr(step) = scale * d_model**-0.5 * min(n**-0.5, n * warmup_steps**-1.5)`
    with `n = step + 1`.

    Why `step + 1`: Keras calls the schedule with `optimizer.iterations`, the
    number of updates already applied, which is 0 for the first update. The
    paper counts updates from 1. The common tutorial code evaluates
    `rsqrt(step)` at the raw step, which is infinite at step 0 (its `min` then
    silently gives a learning rate of exactly 0, wasting the first update)
    and which fails for the integer steps Keras passes. Here `step` may be an
    int or a float tensor; it is computed in float64 (float32 on JAX without
    `jax_enable_x64`) and returned as float32,
    so `lr(0)` is the paper's first-step value, the peak is at
    `step = warmup_steps - 1` and every value is finite and positive.

    `warmup_steps` is a hyperparameter to tune for the data, batch size and
    model. It is not tied to the positional encoding: the sinusoid periods
    range from 2*pi to 2*pi*10000 positions and have no relation to
    optimizer steps.

    Args:
        d_model: int >= 1, the model width (the `d_model**-0.5` factor).
        warmup_steps: int >= 1, steps of linear increase.
        scale: float > 0, a constant factor on the whole schedule.

    Call arguments:
        step: int or float scalar >= 0, `optimizer.iterations`.

    Example:

    >>> schedule = WarmupSchedule(d_model=512, warmup_steps=4000)
    >>> f"{float(schedule(0)):.4g}"  # finite at step 0: 512**-0.5 * 4000**-1.5
    '1.747e-07'
    >>> f"{float(schedule(3999)):.4g}"  # the peak: 512**-0.5 * 4000**-0.5
    '0.0006988'
    >>> optimizer = keras.optimizers.Adam(schedule, beta_1=0.9, beta_2=0.98, epsilon=1e-9)

    References:
        - [Vaswani et al., 2017](https://arxiv.org/abs/1706.03762), section 5.3.
    """

    def __init__(self, d_model, warmup_steps=4000, *, scale=1.0):
        super().__init__()
        check_positive_int("d_model", d_model)
        check_positive_int("warmup_steps", warmup_steps)
        if (isinstance(scale, bool) or not isinstance(scale, (int, float)) or not math.isfinite(scale)
                or scale <= 0):
            raise ValueError(f"`scale` must be a finite float > 0, got scale={scale!r}.")
        self.d_model = d_model
        self.warmup_steps = warmup_steps
        self.scale = float(scale)

    def __call__(self, step):
        step = ops.convert_to_tensor(step)
        dtype = dtype_name(step)
        if "int" not in dtype and "float" not in dtype:
            raise TypeError(f"`step` must be an int or float scalar, got dtype {dtype}.")
        step = ops.cast(step, widest_float())
        step = with_checks(step, check(step >= 0, "`step` must be >= 0, got step={}.", step))
        n = step + 1.0
        factor = self.scale * self.d_model ** -0.5
        lr = factor * ops.minimum(ops.rsqrt(n), n * float(self.warmup_steps) ** -1.5)
        return ops.cast(lr, "float32")

    def get_config(self):
        return {"d_model": self.d_model, "warmup_steps": self.warmup_steps, "scale": self.scale}
