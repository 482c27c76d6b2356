"""Shared by the meta-architecture tests (CPU and GPU): a tiny config, a hand-made batch, an
independent write-out of the reference's loss formulas."""

import torch
import torch.nn.functional as F

from configs.schema import Config
from data.batch import SSLBatch
from models.losses import KoLeoLoss
from models.ssl_meta_arch import SSLMetaArch

B, N_LOCAL, G, L, P = 3, 2, 16, 8, 4  # samples, local crops, global / local crop size, patch size


def tiny_cfg(**over) -> Config:
    cfg = Config()
    cfg.student.arch = "vit_tiny"
    cfg.student.patch_size = P
    cfg.student.drop_path_rate = over.pop("drop_path_rate", 0.0)
    cfg.crops.global_crops_size, cfg.crops.local_crops_size, cfg.crops.local_crops_number = (
        G,
        L,
        N_LOCAL,
    )
    for section in (cfg.dino, cfg.ibot):
        section.head_n_prototypes, section.head_hidden_dim, section.head_bottleneck_dim = 32, 24, 8
    for key, value in over.items():
        section, name = key.split("__")
        setattr(getattr(cfg, section), name, value)
    return cfg


def make_batch(n_local=N_LOCAL, extra_upperbound=4, seed=0):
    g = torch.Generator().manual_seed(seed)
    n_patches = (G // P) ** 2
    masks = torch.zeros(2 * B, n_patches, dtype=torch.bool)
    masks[0, [0, 3, 7]] = True
    masks[4, [5]] = True
    masks[2, [1, 2, 8, 9, 15]] = True
    counts = masks.sum(-1, keepdim=True).clamp(min=1)
    mask_indices = masks.flatten().nonzero().flatten()
    return SSLBatch(
        global_crops=torch.randn(2 * B, 3, G, G, generator=g),
        local_crops=torch.randn(n_local * B, 3, L, L, generator=g),
        masks=masks,
        mask_indices=mask_indices,
        masks_weight=(1.0 / counts).expand_as(masks)[masks],
        n_masked_patches=torch.tensor(mask_indices.numel()),
        upperbound=mask_indices.numel() + extra_upperbound,
        labels=torch.zeros(B, dtype=torch.long),
        corrupt_skipped=torch.tensor(0),
    )


def build(cfg, seed=0, perturb=True):
    """A model whose outputs differ clearly between images (at init every CLS token is nearly the
    same)."""
    torch.manual_seed(seed)
    model = SSLMetaArch(cfg)
    if perturb:
        with torch.no_grad():
            for name, p in model.student.named_parameters():
                p.add_(torch.randn_like(p) * (0.5 if "gamma" in name else 0.05))
        model.init_teacher_from_student()
    model.train()
    return model


def expected_terms(model, batch, teacher_temp):
    """The reference's forward_backward written out term by term, from the modules (center = 0, no
    drop-path)."""
    cfg = model.cfg
    g, loc, masks = batch.global_crops, batch.local_crops, batch.masks
    n_local = loc.shape[0] // B
    ibot_head = (
        model.student["ibot_head"] if "ibot_head" in model.student else model.student["dino_head"]
    )
    t_ibot_head = (
        model.teacher["ibot_head"] if "ibot_head" in model.teacher else model.teacher["dino_head"]
    )
    with torch.no_grad():
        t_out = model.teacher["backbone"].forward_features(g)
        t_probs = F.softmax(
            model.teacher["dino_head"](t_out["x_norm_clstoken"]) / teacher_temp, dim=-1
        )
        tA, tB = t_probs[:B], t_probs[B:]
        t_patch = F.softmax(t_ibot_head(t_out["x_norm_patchtokens"][masks]) / teacher_temp, dim=-1)
    s_g = model.student["backbone"].forward_features(g, masks)
    logp = lambda x, head: F.log_softmax(head(x) / 0.1, dim=-1)  # noqa: E731
    ce = lambda s, t: -(t * s).sum(-1).mean()  # noqa: E731
    cls = s_g["x_norm_clstoken"]
    sA, sB = logp(cls[:B], model.student["dino_head"]), logp(cls[B:], model.student["dino_head"])
    normaliser = 2 * 1 + max(2 * n_local, 1)
    w = cfg.dino.loss_weight
    local = torch.zeros(())
    if n_local:
        s_l = model.student["backbone"].forward_features(loc)["x_norm_clstoken"]
        for crop in logp(s_l, model.student["dino_head"]).chunk(n_local):
            local = local + ce(crop, tA) + ce(crop, tB)
    koleo = KoLeoLoss()
    s_patch = logp(s_g["x_norm_patchtokens"][masks], ibot_head)
    per_patch = -(t_patch * s_patch).sum(-1)
    counts = masks.sum(-1)
    image_of_patch = masks.nonzero()[:, 0]
    ibot = (per_patch / counts[image_of_patch]).sum() / masks.shape[0]
    return {
        "dino_local_crops_loss": w * local / normaliser,
        "dino_global_crops_loss": w * (ce(sA, tB) + ce(sB, tA)) / normaliser,
        "koleo_loss": cfg.dino.koleo_loss_weight * (koleo(cls[:B]) + koleo(cls[B:])),
        "ibot_loss": cfg.ibot.loss_weight * ibot,
        "_unswapped_global": w * (ce(sA, tA) + ce(sB, tB)) / normaliser,
    }
