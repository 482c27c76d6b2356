"""The training engine behind `train.py`: schedules, checkpoints, metrics, distributed set-up, the
loop."""
