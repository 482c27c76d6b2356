"""The run directory: one home for every rule about a run's files, used by every command for every
read and write.

A run directory (`train.py --output-dir`) is written by the trainer and the evaluation, and read by
the tables (`scripts/make_table.py`) and the Slurm launcher (`slurm/launch.py`). Its rules live
here, below everything that trains, evaluates or reports, and import nothing of the project:

- `run_dir`: `RunDir(path)`, one run's paths and readers in one object: what every other package
  uses, so that no command spells a run's file names itself (`tests/test_run_dir_object.py` holds
  it);
- `layout`: the names of its files and folders (config.yaml, metrics.jsonl, status.json,
  checkpoints/, eval/, ...) and the writers of its small records;
- `atomic`: every write goes to an exclusively created temporary file, then is renamed into place
  (never through a planted link; a kill leaves the old file or the new one);
- `json_files`: one bounded JSON reader, which turns any damaged or hostile file into "unreadable:
  why";
- `metrics`: metrics.jsonl, appended per logged step and truncated on resume;
- `compressed`: the committed runs' metrics.jsonl, log.txt and sparsity_masks.jsonl stored as `.xz`,
  read as if plain;
- `status`: status.json, the run's identity, and the one definition of "finished" (train.py's and
  the launcher's);
- `digests` (torch-free) and `torch_files`: SHA-256 beside every checkpoint and export, weights-only
  loading;
- `checkpoints`: the resumable checkpoints' rotation, and what happens to an unreadable one;
- `lock`: one writer at a time (an flock held by the trainer, or by an evaluation while it writes
  there);
- `guard`: what a writer checks before it writes (links, lost checkpoints, stray temporaries, a
  fresh start's set- aside of the previous run's results);
- `errors`: `CommandError`, the one exception base of every refusal a command reports in a line,
  with its exit code.

Everything but `torch_files` and `checkpoints` is torch-free: the tables and `slurm/launch.py
status` read run directories without importing torch.
"""
