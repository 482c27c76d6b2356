"""DINOv2 student/teacher meta-architecture (the reference's
`dinov2/train/ssl_meta_arch.py::SSLMetaArch`).

`forward(batch, teacher_temp)` computes the reference's `forward_backward` losses and returns them;
it never calls backward (the trainer owns backward, clipping, the optimizer and the EMA step
`update_teacher`).

Loss terms, as they enter the total (nG = 2 global crops, nL local crops per sample):
- normaliser = n_global_terms + n_local_terms = nG * (nG - 1) + max(nL * nG, 1)   (= 2 + 16 = 18 for
  nL = 8);
- dino_local_crops_loss = dino.loss_weight * sum_{local j, teacher global i} CE(s_j, t_i) /
  normaliser;
- dino_global_crops_loss = dino.loss_weight * 2 * CE(s_global, swapped t_global) / normaliser, where
  the CE is the mean over all 2B global rows, i.e. (CE(s_A, t_B) + CE(s_B, t_A)) / 2: so the two
  cross-view terms are summed and divided by the normaliser like the local terms;
- koleo_loss = dino.koleo_loss_weight * (KoLeo(cls of crop A) + KoLeo(cls of crop B)) on the student
  backbone's final-norm CLS tokens of the global crops (pre-head);
- ibot_loss = ibot.loss_weight * forward_masked(...) * 2 * (1/2), forward_masked = -sum_i w_i CE_i /
  (2B) with w_i = 1 / #masked patches in patch i's image.
CE(s, t) = batch mean of -sum(t * log_softmax(s / 0.1)). The reference *logs* koleo_loss and
ibot_loss halved and the DINO terms without dino.loss_weight; here every returned term is the exact
summand of the total. Teacher targets: `train.centering` "centering" = softmax((t - center) / temp)
with the centers updated (EMA 0.9) after use; "sinkhorn_knopp" = 3 SK iterations. The teacher sees
the unmasked global crops; its CLS chunks are swapped so student crop A is matched to teacher crop B
and vice versa.
"""

import logging
from typing import TYPE_CHECKING

import torch
from torch import Tensor, nn

from .checkpoint_conversion import load_backbone_weights
from .heads import DINOHead, build_dino_head, build_ibot_head
from .losses import DINOLoss, KoLeoLoss, iBOTPatchLoss
from .param_groups import build_param_groups
from .vision_transformer import DinoVisionTransformer, build_backbone

if TYPE_CHECKING:  # the batch type only; models/ does not depend on the data pipeline
    from data.batch import SSLBatch

logger = logging.getLogger(__name__)

N_GLOBAL_CROPS = 2


def _ema_name(name: str) -> str:
    """Parameter name with wrappers removed, so a student module swapped for a subclass /
    parametrised / compiled one still matches its teacher counterpart (e.g.
    `mlp.fc1.parametrizations.weight.original` -> `mlp.fc1.weight`)."""
    name = name.replace("_orig_mod.", "")
    if ".parametrizations." in name:
        head, _, tail = name.partition(".parametrizations.")
        pname = tail.split(".")[0]
        name = f"{head}.{pname}"
    return name


class SSLMetaArch(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.cfg = cfg
        if cfg.train.centering not in ("centering", "sinkhorn_knopp"):
            raise ValueError(
                f"train.centering={cfg.train.centering!r} is not centering | sinkhorn_knopp"
            )
        self.do_dino = cfg.dino.loss_weight > 0
        self.do_koleo = self.do_dino and cfg.dino.koleo_loss_weight > 0
        self.do_ibot = cfg.ibot.loss_weight > 0
        self.ibot_separate_head = self.do_ibot and cfg.ibot.separate_head
        if not (self.do_dino or self.do_ibot):
            raise ValueError("dino.loss_weight and ibot.loss_weight are both 0: nothing to train")

        img_size = cfg.crops.global_crops_size
        student_backbone = build_backbone(cfg.student, img_size=img_size)
        teacher_backbone = build_backbone(cfg.student, img_size=img_size, drop_path_rate=0.0)
        embed_dim = student_backbone.embed_dim
        self.embed_dim = embed_dim
        if cfg.student.pretrained_weights:
            report = load_backbone_weights(student_backbone, cfg.student.pretrained_weights)
            logger.info(
                "pretrained backbone weights from %s (%s)", cfg.student.pretrained_weights, report
            )

        student, teacher = {"backbone": student_backbone}, {"backbone": teacher_backbone}
        student["dino_head"], teacher["dino_head"] = (
            build_dino_head(cfg, embed_dim),
            build_dino_head(cfg, embed_dim),
        )
        if self.ibot_separate_head:
            student["ibot_head"] = build_ibot_head(cfg, embed_dim)
            teacher["ibot_head"] = build_ibot_head(cfg, embed_dim)
        self.student = nn.ModuleDict(student)
        self.teacher = nn.ModuleDict(teacher)

        self.dino_loss = DINOLoss(cfg.dino.head_n_prototypes)
        ibot_out = (
            cfg.ibot.head_n_prototypes if self.ibot_separate_head else cfg.dino.head_n_prototypes
        )
        self.ibot_patch_loss = iBOTPatchLoss(ibot_out)
        self.koleo_loss = KoLeoLoss()

        self._ema_cache = (
            None  # (parameter fingerprint, student list, teacher list): see update_teacher
        )
        self.init_teacher_from_student()
        for p in self.teacher.parameters():
            p.requires_grad = False
        self.teacher.eval()

    # teacher
    # ----------------------------------------------------------------------------------------------
    @torch.no_grad()
    def init_teacher_from_student(self) -> None:
        """teacher <- student (same state-dict names; the teacher has no drop-path, which holds no
        state)."""
        for k in self.student.keys():
            s_params = dict(self._named_params(self.student[k]))
            for name, t in self._named_params(self.teacher[k]):
                t.copy_(s_params[name])
            s_bufs = {_ema_name(n): b for n, b in self.student[k].named_buffers()}
            for name, b in self.teacher[k].named_buffers():
                if _ema_name(name) in s_bufs:
                    b.copy_(s_bufs[_ema_name(name)])

    @staticmethod
    def _named_params(module: nn.Module):
        return [(_ema_name(n), p) for n, p in module.named_parameters()]

    def _ema_pairs(self):
        s_list, t_list = [], []
        for k in self.student.keys():
            s_params = dict(self._named_params(self.student[k]))
            t_named = self._named_params(self.teacher[k])
            missing = [n for n, _ in t_named if n not in s_params]
            if missing or len(s_params) != len(t_named):
                extra = sorted(set(s_params) - {n for n, _ in t_named})
                raise RuntimeError(
                    f"student/teacher '{k}' parameters do not match by name: teacher-only "
                    f"{missing[:5]}, "
                    f"student-only {extra[:5]}"
                )
            for name, t in t_named:
                s_list.append(s_params[name])
                t_list.append(t)
        return s_list, t_list

    @torch.no_grad()
    def update_teacher(self, momentum) -> None:
        """teacher <- momentum * teacher + (1 - momentum) * student, over parameters matched by
        name: one fused pass (`_foreach_lerp_`) over the parameter pairs, which are matched once and
        re-matched only when the student's parameter objects change."""
        fingerprint = tuple(map(id, self.student.parameters())) + tuple(
            map(id, self.teacher.parameters())
        )
        if self._ema_cache is None or self._ema_cache[0] != fingerprint:
            self._ema_cache = (fingerprint, *self._ema_pairs())
        _, s_list, t_list = self._ema_cache
        s_list = [s if s.dtype == t.dtype else s.to(t.dtype) for s, t in zip(s_list, t_list)]
        # a 0-d device tensor (a CUDA graph's input): never read on the host
        if isinstance(momentum, Tensor):
            torch._foreach_lerp_(t_list, s_list, [1.0 - momentum] * len(t_list))
        else:
            torch._foreach_lerp_(t_list, s_list, 1.0 - momentum)

    def train(self, mode: bool = True):
        super().train(mode)
        self.teacher.eval()
        return self

    def teacher_backbone_state_dict(self) -> dict[str, Tensor]:
        """The teacher backbone's weights in our (= reference non-chunked) names, detached, on their
        device."""
        return self._backbone_state_dict("teacher")

    def student_backbone_state_dict(self) -> dict[str, Tensor]:
        """The student backbone's, in the same names and form as the teacher's (its EMA
        counterpart's keys)."""
        return self._backbone_state_dict("student")

    def _backbone_state_dict(self, role: str) -> dict[str, Tensor]:
        state = {
            _ema_name(k): v.detach()
            for k, v in getattr(self, role)["backbone"].state_dict().items()
        }
        # the teacher's keys only: a 2:4 module's own state (S-STE's scale) is not exported
        if role == "student":
            teacher_keys = {_ema_name(k) for k in self.teacher["backbone"].state_dict()}
            state = {k: v for k, v in state.items() if k in teacher_keys}
        return state

    def get_params_groups(self):
        """Fused AdamW groups for the student (see `models.param_groups.build_param_groups`)."""
        return build_param_groups(
            self.student, self.cfg.optim.layerwise_decay, self.cfg.optim.patch_embed_lr_mult
        )

    # forward
    # ----------------------------------------------------------------------------------------------
    @torch.no_grad()
    def _teacher_targets(
        self, global_crops, mask_indices, valid, n_masked_tensor, upperbound, teacher_temp
    ):
        out = self.teacher["backbone"](global_crops, is_training=True)
        cls = out["x_norm_clstoken"].chunk(N_GLOBAL_CROPS)
        cls = torch.cat((cls[1], cls[0]))  # swapped: student crop A is matched to teacher crop B
        n_cls = cls.shape[0]
        ibot_probs = None
        if self.do_ibot:
            patches = out["x_norm_patchtokens"].flatten(0, 1).index_select(0, mask_indices)
            patches = _pad_rows(patches, upperbound)
            if self.ibot_separate_head:
                cls_after_head = self.teacher["dino_head"](cls)
                patches_after_head = self.teacher["ibot_head"](patches)
            else:
                after_head = self.teacher["dino_head"](torch.cat([cls, patches]))
                cls_after_head, patches_after_head = after_head[:n_cls], after_head[n_cls:]
        else:
            cls_after_head = self.teacher["dino_head"](cls)

        if self.cfg.train.centering == "centering":
            dino_probs = self.dino_loss.softmax_center_teacher(cls_after_head, teacher_temp)
            self.dino_loss.update_center(cls_after_head)
            if self.do_ibot:
                ibot_probs = self.ibot_patch_loss.softmax_center_teacher(
                    patches_after_head, teacher_temp
                )
                self.ibot_patch_loss.update_center(patches_after_head, valid)
        else:
            dino_probs = self.dino_loss.sinkhorn_knopp_teacher(cls_after_head, teacher_temp)
            if self.do_ibot:
                ibot_probs = self.ibot_patch_loss.sinkhorn_knopp_teacher(
                    patches_after_head,
                    teacher_temp,
                    n_masked_patches_tensor=n_masked_tensor,
                    valid=valid,
                )
        return dino_probs.reshape(N_GLOBAL_CROPS, -1, dino_probs.shape[-1]), ibot_probs

    def forward(self, batch: "SSLBatch", teacher_temp) -> tuple[Tensor, dict[str, Tensor]]:
        """Returns (total_loss, {dino_local_crops_loss, dino_global_crops_loss, koleo_loss,
        ibot_loss}); the terms are detached copies of the exact summands of `total_loss`. `batch` is
        a `data.SSLBatch` already on the model's device (`SSLLoader.to_device` / `SSLBatch.to`): it
        is not copied here. `teacher_temp`: a float, or a 0-d tensor on the device (a CUDA graph
        replays the step with the value written into it).

        The masked patches are handled at their fixed bound (`batch.upperbound` rows, the
        reference's head buffers) from the gather to the loss: the rows past
        `batch.n_masked_patches` are padding, which adds nothing (zero weight, out of the teacher's
        Sinkhorn-Knopp and center). So a batch whose `mask_indices` and `masks_weight` are padded to
        the bound gives the same losses as the unpadded one, with every shape fixed by the config:
        what a CUDA graph of the whole step needs (`training/step_graph.py`)."""
        device = self.student["backbone"].cls_token.device
        if isinstance(batch, dict) or batch.global_crops is None:
            raise TypeError(
                "forward takes a data.SSLBatch holding its crops (SSLLoader.to_device makes them)"
            )
        if batch.global_crops.device != device or batch.masks.device != device:
            raise ValueError(
                f"the batch is on {batch.global_crops.device}, the model on {device}: move it once "
                f"with "
                f"batch.to(device) (SSLLoader.to_device)"
            )
        global_crops, local_crops, masks = batch.global_crops, batch.local_crops, batch.masks
        mask_indices, masks_weight, n_masked_tensor = (
            batch.mask_indices,
            batch.masks_weight,
            batch.n_masked_patches,
        )
        upperbound = max(int(batch.upperbound), mask_indices.shape[0])
        valid = (
            torch.arange(upperbound, device=device) < n_masked_tensor
        )  # the real masked patches; on the device

        if global_crops.shape[0] % N_GLOBAL_CROPS:
            raise ValueError(
                f"global_crops holds {global_crops.shape[0]} images, not 2 crops per sample"
            )
        B = global_crops.shape[0] // N_GLOBAL_CROPS
        n_local = local_crops.shape[0] // B if local_crops.numel() else 0
        if n_local * B != (local_crops.shape[0] if local_crops.numel() else 0):
            raise ValueError(
                f"local_crops holds {local_crops.shape[0]} images, not a multiple of {B} samples"
            )
        normaliser = N_GLOBAL_CROPS * (N_GLOBAL_CROPS - 1) + max(n_local * N_GLOBAL_CROPS, 1)

        teacher_dino, teacher_ibot = self._teacher_targets(
            global_crops, mask_indices, valid, n_masked_tensor, upperbound, teacher_temp
        )

        # student: one list forward over [global crops with masks, local crops]; modules are called
        # (not their forward_features) so hooks and torch.compile wrappers apply
        if n_local:
            s_global, s_local = self.student["backbone"](
                [global_crops, local_crops], [masks, None], is_training=True
            )
        else:
            (s_global,) = self.student["backbone"]([global_crops], [masks], is_training=True)
            s_local = None
        global_cls = s_global["x_norm_clstoken"]
        head_inputs = [global_cls] + ([s_local["x_norm_clstoken"]] if n_local else [])
        masked_tokens = None
        if self.do_ibot:
            masked_tokens = (
                s_global["x_norm_patchtokens"].flatten(0, 1).index_select(0, mask_indices)
            )
            masked_tokens = _pad_rows(masked_tokens, upperbound)
            if not self.ibot_separate_head:
                head_inputs.append(masked_tokens)
        sizes = [t.shape[0] for t in head_inputs]
        head_out = self.student["dino_head"](torch.cat(head_inputs)).split(sizes)
        global_after_head = head_out[0]
        local_after_head = head_out[1] if n_local else None
        if self.do_ibot:
            if self.ibot_separate_head:
                masked_after_head = self.student["ibot_head"](masked_tokens)
            else:
                masked_after_head = head_out[-1]

        zero = global_cls.new_zeros((), dtype=torch.float32)
        terms = {
            k: zero
            for k in ("dino_local_crops_loss", "dino_global_crops_loss", "koleo_loss", "ibot_loss")
        }
        dino_w = self.cfg.dino.loss_weight
        if self.do_dino:
            if n_local:
                terms["dino_local_crops_loss"] = (
                    dino_w
                    * self.dino_loss(local_after_head.chunk(n_local), list(teacher_dino.unbind(0)))
                    / normaliser
                )
            terms["dino_global_crops_loss"] = (
                dino_w
                * self.dino_loss([global_after_head], [teacher_dino.flatten(0, 1)])
                * 2
                / normaliser
            )
            if self.do_koleo:
                terms["koleo_loss"] = self.cfg.dino.koleo_loss_weight * sum(
                    self.koleo_loss(p) for p in global_cls.chunk(N_GLOBAL_CROPS)
                )
        if self.do_ibot:
            ibot = self.ibot_patch_loss.forward_masked(
                masked_after_head,
                teacher_ibot,
                student_masks_flat=masks,
                masks_weight=_pad_rows(masks_weight, upperbound),  # padding weighs 0
            )
            terms["ibot_loss"] = self.cfg.ibot.loss_weight * ibot * 2 * (1.0 / N_GLOBAL_CROPS)
        total = sum(terms.values())
        return total, {k: v.detach() for k, v in terms.items()}


def _pad_rows(x: Tensor, rows: int) -> Tensor:
    """Zero rows appended up to `rows` (the reference's fixed-size `upperbound` buffers; static head
    shapes)."""
    if x.shape[0] >= rows:
        return x
    return torch.cat([x, x.new_zeros(rows - x.shape[0], *x.shape[1:])])


__all__ = ["SSLMetaArch", "DinoVisionTransformer", "DINOHead"]
