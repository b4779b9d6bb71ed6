"""Stand-ins for what the hooks read from a torchvision ImageFolder, shared by the hook unit tests."""

MOUNT = "/mnt/fake-shadefs"


class FakeDataset:
    """Just what the hooks read from an ImageFolder: ``samples`` (absolute path, class) and ``len``."""

    def __init__(self, n, root=MOUNT + "/train"):
        self.root = root
        self.samples = [(f"{root}/c{i % 3}/img{i:05d}.png", i % 3) for i in range(n)]

    def __len__(self):
        return len(self.samples)
