"""The training step the benchmarks' jobs share (a classifier over a DataLoader through the mount).

``from shadefs.testing.training import train_step`` (needs torch, imported on first use).
"""
from __future__ import annotations

__all__ = ["train_step"]


def train_step(model, opt, x, y, reporter=None):
    """One optimiser step of classifier ``model`` on the batch ``x`` (inputs) / ``y`` (class ids, shape
    ``(B,)``): per-sample cross-entropy, reported to ``reporter`` (a :class:`shadefs.hooks.ScoreReporter`
    scoring the batch's samples, or None), then the mean's gradient applied by ``opt``.

    Returns the per-sample losses, detached, shape ``(B,)``.
    """
    import torch.nn.functional as F

    losses = F.cross_entropy(model(x), y, reduction="none")
    if reporter is not None:
        reporter.report(losses.detach())
    opt.zero_grad(set_to_none=True)
    losses.mean().backward()
    opt.step()
    return losses.detach()
