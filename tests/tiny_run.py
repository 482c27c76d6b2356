"""The smallest real training run the end-to-end tests repeat (shared by tests/training and
tests/slurm): every feature on (multi-crop, iBOT masks, drop-path), 16 steps of 8 digits at 24 px.
Each folder adds its own schedule, logging and checkpoint periods."""

TINY_MODEL_AND_DATA = [
    "student.arch=vit_tiny",
    "student.drop_path_rate=0.2",
    "dino.head_n_prototypes=256",
    "ibot.head_n_prototypes=256",
    "dino.head_hidden_dim=64",
    "ibot.head_hidden_dim=64",
    "dino.head_bottleneck_dim=32",
    "ibot.head_bottleneck_dim=32",
    "crops.global_crops_size=16",
    "crops.local_crops_size=8",
    "crops.local_crops_number=2",
    "data.digits_image_size=24",
    "train.batch_size_per_gpu=8",
    "train.num_workers=0",
    "optim.epochs=4",
    "train.epoch_length=4",
    "optim.warmup_epochs=1",
    "teacher.warmup_teacher_temp_epochs=1",
    # the mask statistics prune every MLP weight at each logged step: cheap on a GPU, ~0.3-0.5 s per
    # logged step on two CPU cores (24 reference prunes);
    # tests/sparsity/test_pruned_entries_training.py turns them on to check them
    "sparsity.mask_stats=false",
]
