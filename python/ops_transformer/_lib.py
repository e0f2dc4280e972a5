"""Finds and loads the compiled extension (libot_torch.so) that registers torch.ops.ops_transformer.

Search order: the package folder itself (an installed package: `pip install python/`), then
$OT_BUILD_DIR, then the build folders of the checkout this package lives in (build/release, then
build/dev: a source tree on PYTHONPATH)."""
import os
import re
from pathlib import Path

import torch

LIB_NAME = "libot_torch.so"


def candidates():
    here = Path(__file__).resolve().parent
    out = [here / LIB_NAME]
    env = os.environ.get("OT_BUILD_DIR")
    if env:
        out.append(Path(env) / LIB_NAME)
    root = here.parent.parent
    for sub in ("release", "dev"):
        out.append(root / "build" / sub / LIB_NAME)
    return out


def load():
    for path in candidates():
        if path.is_file():
            torch.ops.load_library(str(path))
            return str(path)
    tried = ", ".join(str(p) for p in candidates())
    raise ImportError(
        f"ops_transformer: {LIB_NAME} not found (tried {tried}). Build it with "
        "`scripts/build.sh release` (or set OT_BUILD_DIR to the build folder), or install the package: "
        "`pip install --no-build-isolation python/`."
    )


def source_tree_version():
    """The version in CMakeLists.txt's project(VERSION ...), for a package run from the source tree
    (an installed one has _version.py, written from the same number)."""
    text = (Path(__file__).resolve().parent.parent.parent / "CMakeLists.txt").read_text()
    return re.search(r"project\(ops_transformer VERSION ([0-9.]+)", text).group(1)


library_path = load()
ops = torch.ops.ops_transformer


def has_op(name):
    """True when the loaded extension registers torch.ops.ops_transformer.<name>."""
    try:
        getattr(ops, name)
        return True
    except (AttributeError, RuntimeError):
        return False


def takes_script_objects(name):
    """True when an argument of torch.ops.ops_transformer.<name> is a torch.classes object (packed
    weights, expert stores, communicators)."""
    return any("torch.classes" in str(a.type) for a in getattr(ops, name).default._schema.arguments)


def fast_op(name):
    """The builtin behind torch.ops.ops_transformer.<name>.default, looked up once: calling it skips
    the OpOverloadPacket/OpOverload Python frames and attribute lookups of every call (decode paths
    call these thousands of times a second). Positional and keyword arguments as the schema.

    Ops that take torch.classes objects run with __torch_function__ dispatch off: torch 1.13 looks
    the attribute up on every non-tensor argument, and on a ScriptObject the failed lookup throws and
    catches a C++ exception (~9 us each: 18 of the 50 us of a one-token MoE layer). The arguments of
    these ops are the library's own packed objects and plain tensors, so no override is lost."""
    if not has_op(name):
        return None
    op = getattr(ops, name).default._op
    if not takes_script_objects(name):
        return op
    no_torch_function = torch._C.DisableTorchFunction

    def call(*args, **kwargs):
        with no_torch_function():
            return op(*args, **kwargs)

    call.__name__ = name
    return call
