"""A ViT block's attention linears or MLP per crop batch, instead of once on one matrix of the tokens
of all crop batches (`models.vit_block.Block`'s list forward): what the step benchmark's
`attention-per-crop` and `mlp-per-crop` ablations and the block-rows probe time. An instance
attribute over the class's one-matrix method; the returned undo puts the class's back."""

from collections.abc import Callable

# branch -> (the block's one-matrix method, its method for one crop batch)
BRANCHES = {
    "attention": ("_attn_on_concat", "_attn_branch"),  # norm1, qkv, proj, ls1
    "mlp": ("_ffn_on_concat", "_ffn_branch"),  # norm2, fc1, fc2, ls2
}


def run_per_crop(block, branch: str) -> Callable[[], None]:
    """Run `block`'s `branch` ("attention" or "mlp") per crop batch; returns the undo."""
    on_one_matrix, per_crop_batch = BRANCHES[branch]
    one_batch = getattr(block, per_crop_batch)
    setattr(block, on_one_matrix, lambda xs: [one_batch(x) for x in xs])
    return lambda: block.__dict__.pop(on_one_matrix)
