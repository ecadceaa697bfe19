"""The training engine: the epoch loop every method runs on (`loop.Engine`) and what it is made of:
exact resume (`resume`), best-so-far selection and the progress bar (`callbacks`), tf.distribute
(`distribute`), mixed precision (`precision`), learning-rate schedules (`schedules`) and per-epoch
TensorBoard scalars (`tensorboard`). It imports nothing of the package above `errors` and `console`."""
