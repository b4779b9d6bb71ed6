"""The training job's cold epoch over a mount, in the regime: ImageFolder + DataLoader with worker processes
and the loader that drops each file's pages on the same open (shadefs.testing.regime.pil_loader_dropping),
counted exactly: every image opened once per epoch, every open of the first epoch a miss, and with an NVMe
tier every open of the second a hit on it (python -m shadefs.bench imagefolder --epochs measures the same epochs)."""
import numpy as np
import pytest
from conftest import require
from mountutil import wait_for

torch = require("torch")
require("torchvision")
from PIL import Image  # noqa: E402
from torch.utils.data import DataLoader  # noqa: E402
from torchvision import transforms  # noqa: E402
from torchvision.datasets import ImageFolder  # noqa: E402

from shadefs.testing.regime import pil_loader_dropping  # noqa: E402

CLASSES, PER_CLASS = 3, 20


@pytest.fixture
def noise_tree(tmp_path):
    """3 classes x 20 random-noise RGB images, JPEG and PNG alternating, whose first pixel's red value is
    the image's index (PNG: exact) so that every decoded image can be told apart."""
    root = tmp_path / "src"
    rng = np.random.default_rng(5)
    for c in range(CLASSES):
        (root / f"class{c}").mkdir(parents=True)
        for i in range(PER_CLASS):
            px = rng.integers(0, 256, size=(48, 48, 3), dtype=np.uint8)
            ext = "png" if i % 2 else "jpg"
            Image.fromarray(px).save(root / f"class{c}" / f"{i:03d}.{ext}")
    return root


def epoch(root):
    """One shuffled epoch of a DataLoader (2 workers) decoding every image with the dropping loader;
    returns (images, labels) as tensors in the epoch's order."""
    ds = ImageFolder(str(root), loader=pil_loader_dropping, transform=transforms.PILToTensor())
    dl = DataLoader(ds, batch_size=8, shuffle=True, num_workers=2, generator=torch.Generator().manual_seed(1))
    xs, ys = zip(*dl)
    return torch.cat(xs), torch.cat(ys)


def test_a_cold_epoch_is_one_miss_per_image_and_decodes_what_the_source_decodes(noise_tree, mount):
    m = mount(noise_tree)  # the default mount: no tier
    n = CLASSES * PER_CLASS
    x, y = epoch(m.path)
    want_x, want_y = epoch(noise_tree)  # the same seed: the same order
    assert torch.equal(x, want_x) and torch.equal(y, want_y)
    s = m.stats()
    assert (s["opens"], s["misses"], s["hits"]["ram"], s["hits"]["disk"]) == (n, n, 0, 0)
    epoch(m.path)  # no tier, and the reader kept no page: the second epoch misses again
    s = m.stats()
    assert (s["opens"], s["misses"]) == (2 * n, 2 * n)


def test_with_an_nvme_tier_the_second_epoch_is_every_open_a_disk_hit(noise_tree, mount, tmp_path):
    m = mount(noise_tree, "--ram-cache", "0", "--disk-cache", str(tmp_path / "nvme"), "--disk-cache-size", "100%")
    n = CLASSES * PER_CLASS
    x1, _ = epoch(m.path)
    # each miss is written to the tier behind its reply: the epoch can end before the last writes do
    wait_for(lambda: m.stats()["tiers"]["disk"]["files"] == n, what="every image on the NVMe tier")
    s = m.stats()
    assert (s["opens"], s["misses"], s["hits"]["disk"]) == (n, n, 0)
    x2, _ = epoch(m.path)
    s = m.stats()
    assert (s["opens"], s["misses"], s["hits"]["disk"]) == (2 * n, n, n)
    assert torch.equal(x1, x2)
