"""ops_transformer: fused CPU operators for MoE and Gated DeltaNet, callable from PyTorch.

    import ops_transformer as ot
    y = ot.ops.matmul(a, b)                    # every operator: torch.ops.ops_transformer.<name>
    ot.moe.SparseMoeBlock(...), ot.gdn.GatedDeltaNet(...)   # modules

Operator names and arguments follow torch_npu (npu_moe_* without the npu_ prefix) and fla."""
from ._lib import has_op, library_path, ops  # noqa: F401  (loads the extension)

try:
    from ._version import __version__
except ImportError:  # the source tree on PYTHONPATH: no generated _version.py
    from ._lib import source_tree_version

    __version__ = source_tree_version()
from .functional import *  # noqa: F401,F403
from . import functional  # noqa: F401
from .control import force_ref, max_isa, ISA  # noqa: F401
from . import ep, gdn, layers, moe, optim  # noqa: F401
