"""swap_linear_modules / swap_to_dense: selection (regex, glob, FQN dict, callables), shared
Parameters, round trips, optimizer state, state_dict keys, error cases, and a bit-exact resume
across the sparse -> dense switch."""

import copy

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from sparsity import (
    BlockSparseLinear,
    SemiSparseActivationLinear,
    SemiSparseLinear,
    set_sparse_backend,
    sparse_modules,
    swap_linear_modules,
    swap_linear_with_semi_sparse_linear,
    swap_semi_sparse_linear_with_linear,
    swap_to_dense,
)

MLP_PATTERN = r"blocks\.\d+\.mlp\.fc[12]"


class Mlp(nn.Module):
    def __init__(self, dim, hidden):
        super().__init__()
        self.fc1 = nn.Linear(dim, hidden)
        self.fc2 = nn.Linear(hidden, dim)

    def forward(self, x):
        return self.fc2(F.gelu(self.fc1(x)))


class Block(nn.Module):
    def __init__(self, dim, hidden):
        super().__init__()
        self.norm = nn.LayerNorm(dim)
        self.qkv = nn.Linear(dim, dim)
        self.mlp = Mlp(dim, hidden)

    def forward(self, x):
        x = x + self.qkv(self.norm(x))
        return x + self.mlp(self.norm(x))


class Tiny(nn.Module):
    def __init__(self, dim=16, hidden=32, depth=2):
        super().__init__()
        self.blocks = nn.ModuleList(Block(dim, hidden) for _ in range(depth))
        self.head = nn.Linear(dim, 4)

    def forward(self, x):
        for b in self.blocks:
            x = b(x)
        return self.head(x.mean(1))


def tiny(seed=0, **kw):
    torch.manual_seed(seed)
    return Tiny(**kw)


MLP_NAMES = ["blocks.0.mlp.fc1", "blocks.0.mlp.fc2", "blocks.1.mlp.fc1", "blocks.1.mlp.fc2"]


def test_regex_swap_shares_parameters_and_round_trips():
    model = tiny()
    x = torch.randn(3, 5, 16)
    y_dense = model(x)
    params = dict(model.named_parameters())
    keys = list(model.state_dict())
    modules = {n: model.get_submodule(n) for n in MLP_NAMES}
    names = swap_linear_modules(model, pattern=MLP_PATTERN, pruning="tile_greedy")
    assert names == MLP_NAMES
    assert all(
        model.get_submodule(n) is modules[n] for n in names
    )  # converted in place: same module objects
    for name in names:
        m = model.get_submodule(name)
        assert type(m) is SemiSparseLinear and m.backend == "dense" and m.pruning == "tile_greedy"
    assert all(p is params[n] for n, p in model.named_parameters())
    assert list(model.state_dict()) == keys
    assert not torch.equal(model(x), y_dense)  # pruned now
    assert sorted(sparse_modules(model)) == MLP_NAMES
    back = swap_to_dense(model)
    assert back == MLP_NAMES
    assert all(
        type(model.get_submodule(n)) is nn.Linear and model.get_submodule(n) is modules[n]
        for n in MLP_NAMES
    )
    assert all(p is params[n] for n, p in model.named_parameters())
    assert list(model.state_dict()) == keys
    assert torch.equal(model(x), y_dense)


def test_glob_dict_and_callable_selection():
    model = tiny()
    assert swap_linear_modules(model, pattern="glob:blocks.*.mlp.fc1") == [
        "blocks.0.mlp.fc1",
        "blocks.1.mlp.fc1",
    ]
    swap_to_dense(model)
    names = swap_linear_modules(
        model,
        {
            "blocks.0.mlp.fc2": SemiSparseActivationLinear,
            "blocks.1.mlp.fc2": lambda lin: SemiSparseLinear.from_dense(lin, pruning="rowwise"),
        },
    )
    assert names == ["blocks.0.mlp.fc2", "blocks.1.mlp.fc2"]
    assert type(model.blocks[0].mlp.fc2) is SemiSparseActivationLinear
    assert model.blocks[1].mlp.fc2.pruning == "rowwise"
    # regex is a full match: "fc" alone matches nothing, "head" matches exactly one
    with pytest.raises(ValueError, match="matches no nn.Linear"):
        swap_linear_modules(model, pattern="fc")
    assert swap_linear_modules(model, pattern="head", module_cls=SemiSparseActivationLinear) == [
        "head"
    ]


def test_options_reach_modules_and_already_sparse_are_skipped():
    model = tiny()
    swap_linear_modules(model, pattern=MLP_PATTERN, pruning="tile_optimal", masked_grad=True)
    assert all(model.get_submodule(n).masked_grad for n in MLP_NAMES)
    again = swap_linear_modules(model, pattern=r"blocks\.\d+\.(mlp\.fc[12]|qkv)", pruning="rowwise")
    assert again == ["blocks.0.qkv", "blocks.1.qkv"]  # MLPs were sparse already: left as they are
    assert model.blocks[0].mlp.fc1.pruning == "tile_optimal"
    assert set_sparse_backend(model, "dense") == list(sparse_modules(model))


def test_block_sparse_module_cls():
    model = tiny()
    names = swap_linear_modules(
        model, pattern=MLP_PATTERN, module_cls=BlockSparseLinear, density=0.5, block_size=8
    )
    assert names == MLP_NAMES
    m = model.blocks[0].mlp.fc1
    assert (
        isinstance(m, BlockSparseLinear)
        and m.block_mask.shape == (4, 2)
        and m.block_mask.sum() == 4
    )
    model(torch.randn(2, 3, 16)).sum().backward()
    assert swap_to_dense(model) == MLP_NAMES


def test_errors():
    model = tiny()
    with pytest.raises(ValueError, match="blocks.0.qkv"):  # lists Linear names
        swap_linear_modules(model, pattern=r"blocks\.\d+\.attn\.proj")
    with pytest.raises(ValueError, match="not nn.Linear modules"):
        swap_linear_modules(model, {"blocks.0.norm": SemiSparseLinear})
    with pytest.raises(ValueError, match="exactly one"):
        swap_linear_modules(model)
    with pytest.raises(ValueError, match="exactly one"):
        swap_linear_modules(model, {"head": SemiSparseLinear}, pattern="head")
    # shape error names the module and the shape, and nothing is swapped (head is (4, 16): fine; add
    # a bad one)
    model.blocks[1].mlp.fc2 = nn.Linear(32, 18)
    with pytest.raises(ValueError, match=r"blocks\.1\.mlp\.fc2.*\(18, 32\)"):
        swap_linear_modules(model, pattern=MLP_PATTERN)
    assert not sparse_modules(model)
    with pytest.raises(ValueError, match="unknown pruning method"):
        swap_linear_modules(model, pattern="head", pruning="magnitude")
    # a root nn.Linear converts in place; a callable factory would need a parent to hold the new
    # module
    root = nn.Linear(8, 8)
    assert swap_linear_modules(root, pattern="") == [""] and type(root) is SemiSparseLinear
    with pytest.raises(ValueError, match="root module"):
        swap_linear_modules(nn.Linear(8, 8), {"": lambda lin: SemiSparseLinear.from_dense(lin)})


def test_failed_swap_rolls_back_earlier_modules():
    model = tiny()
    model.blocks[1].mlp.fc2 = nn.Linear(
        30, 16
    )  # the last one matched fails (in_features not divisible by 4)
    originals = {n: model.get_submodule(n) for n in MLP_NAMES}
    with pytest.raises(ValueError, match=r"\(16, 30\)"):
        swap_linear_modules(model, pattern=MLP_PATTERN, pruning="soft_threshold")
    for n, m in originals.items():
        assert model.get_submodule(n) is m and type(m) is nn.Linear
        assert set(m.state_dict()) == {"weight", "bias"} and not hasattr(m, "pruning")


def test_torchao_aliases():
    model = tiny()
    swap_linear_with_semi_sparse_linear(model, {"blocks.0.mlp.fc1": SemiSparseLinear})
    assert type(model.blocks[0].mlp.fc1) is SemiSparseLinear
    # `current` = FQN of the sub-model inside a larger one; keys are full names
    swap_linear_with_semi_sparse_linear(
        model.blocks[1], {"blocks.1.mlp.fc2": SemiSparseLinear}, current="blocks.1"
    )
    assert type(model.blocks[1].mlp.fc2) is SemiSparseLinear
    assert swap_semi_sparse_linear_with_linear(model) == ["blocks.0.mlp.fc1", "blocks.1.mlp.fc2"]


def test_optimizer_state_untouched_by_swaps():
    model = tiny()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    x = torch.randn(4, 5, 16)

    def step():
        opt.zero_grad()
        model(x).square().mean().backward()
        opt.step()

    step()
    state_before = {id(p): {k: v.clone() for k, v in s.items()} for p, s in opt.state.items()}
    swap_linear_modules(model, pattern=MLP_PATTERN)
    assert {id(p) for p in opt.state} == set(state_before)
    for p, s in opt.state.items():
        assert all(torch.equal(v, state_before[id(p)][k]) for k, v in s.items())
    step()  # sparse step updates the same Parameters through the same optimizer
    swap_to_dense(model)
    step()
    assert all(int(s["step"]) == 3 for s in opt.state.values())


@pytest.mark.parametrize("pruning", ["tile_greedy", "soft_threshold"])
def test_resume_is_bit_exact_across_sparse_to_dense_switch(pruning):
    """Train 6 steps (sparse for the first 3) in one go, or 4 steps + checkpoint + restore into a
    fresh model and 2 more: the final parameters must be identical bit for bit."""
    data = [torch.randn(4, 5, 16, generator=torch.Generator().manual_seed(i)) for i in range(6)]
    switch = 3

    def new_run(seed_model):
        model = tiny(seed_model)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.05)
        return model, opt

    def train(model, opt, steps):
        for i in steps:
            if i < switch and not sparse_modules(model):
                swap_linear_modules(model, pattern=MLP_PATTERN, pruning=pruning)
            if i == switch:
                swap_to_dense(model)
            opt.zero_grad()
            model(data[i]).square().mean().backward()
            opt.step()

    model_a, opt_a = new_run(0)
    train(model_a, opt_a, range(6))

    model_b, opt_b = new_run(0)
    train(model_b, opt_b, range(2))
    ckpt = copy.deepcopy({"model": model_b.state_dict(), "opt": opt_b.state_dict()})
    if pruning == "soft_threshold":
        assert "blocks.0.mlp.fc1.soft_threshold_scale" in ckpt["model"]

    model_c, opt_c = new_run(1)  # different init: everything must come from the checkpoint
    swap_linear_modules(
        model_c, pattern=MLP_PATTERN, pruning=pruning
    )  # step 2 < switch: sparse, then load
    model_c.load_state_dict(ckpt["model"])
    opt_c.load_state_dict(ckpt["opt"])
    train(model_c, opt_c, range(2, 6))
    for (n, pa), pc in zip(model_a.named_parameters(), model_c.parameters()):
        assert torch.equal(pa, pc), n
