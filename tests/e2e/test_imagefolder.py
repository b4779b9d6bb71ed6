"""An unmodified torchvision ImageFolder + DataLoader over a shadefs mount."""
import os

import numpy as np
import pytest
from conftest import require

torch = require("torch")
torchvision = require("torchvision")
from PIL import Image  # noqa: E402
from torch.utils.data import DataLoader  # noqa: E402
from torchvision import transforms  # noqa: E402
from torchvision.datasets import ImageFolder  # noqa: E402


@pytest.fixture
def png_tree(tmp_path):
    """3 classes x 40 grayscale 28x28 PNGs whose pixels encode (class, index)."""
    root = tmp_path / "src" / "train"
    rng = np.random.default_rng(3)
    for c, name in enumerate(["Bag", "Coat", "Dress"]):
        (root / name).mkdir(parents=True)
        for i in range(40):
            px = rng.integers(0, 256, size=(28, 28), dtype=np.uint8)
            px[0, 0], px[0, 1] = c, i
            Image.fromarray(px, mode="L").save(root / name / f"{i:05d}.png")
    return tmp_path / "src"


def load_all(root, workers):
    ds = ImageFolder(str(root), transform=transforms.Compose([transforms.Grayscale(1), transforms.PILToTensor()]))
    dl = DataLoader(ds, batch_size=16, shuffle=False, num_workers=workers)
    xs, ys = [], []
    for x, y in dl:
        xs.append(x)
        ys.append(y)
    return ds, torch.cat(xs), torch.cat(ys)


@pytest.mark.both_frontends
def test_every_image_decodes_with_the_right_label(png_tree, mount):
    m = mount(png_tree, "--ram-cache", "30%", "--policy", "lru")
    ds_src, x_src, y_src = load_all(png_tree / "train", 0)
    ds, x, y = load_all(os.path.join(m.path, "train"), 2)
    assert ds.classes == ["Bag", "Coat", "Dress"] == ds_src.classes
    assert len(ds) == 120
    assert torch.equal(x, x_src) and torch.equal(y, y_src)
    # the pixels we planted say which class folder each image came from
    assert torch.equal(x[:, 0, 0, 0].long(), y)
    s = m.stats()
    assert s["opens"] == 120 and s["misses"] == 120  # one open per sample, all cold


def test_an_empty_class_folder_keeps_the_labels_of_the_source(png_tree, mount):
    """ImageFolder(allow_empty=True) numbers classes by sorted folder name: an empty class folder that
    vanished from the mount would shift every later label by one."""
    train = png_tree / "train"
    (train / "Boot").mkdir()  # sorts between Bag and Coat, holds no image
    src = ImageFolder(str(train), allow_empty=True)
    m = mount(png_tree, "--ram-cache", "30%")
    over = ImageFolder(os.path.join(m.path, "train"), allow_empty=True)
    assert src.class_to_idx == {"Bag": 0, "Boot": 1, "Coat": 2, "Dress": 3}
    assert over.class_to_idx == src.class_to_idx
    assert [(os.path.relpath(p, os.path.join(m.path, "train")), y) for p, y in over.samples] == \
        [(os.path.relpath(p, str(train)), y) for p, y in src.samples]
    assert sorted({y for _, y in over.samples}) == [0, 2, 3]
