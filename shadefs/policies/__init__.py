"""Cache policies: one file per policy, registered here by one import line each."""
from .base import Importance, Policy, PolicyError, get_policy, policy_names, register  # noqa: F401
from . import static, lru, fifo  # noqa: F401,E401
from . import shade  # noqa: F401,E402
