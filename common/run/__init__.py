"""A run's machinery: flags, the output folder and its lock, checkpoints and their resume, the
metrics log, the closing summary, the launch's thread and accelerate settings, the step's shared
tail."""
