"""The package sources of this checkout over a build's op library, for tests run by ctest.

``stage_package(sys.argv)``: when the first argument is a path to ``libreco_torch_ops.so``, links
``python/reco/*.py`` and that library into a temporary ``reco`` folder (removed at exit), puts it
first on ``sys.path`` and returns the arguments without the path; otherwise returns them as they
are, and ``import reco`` finds the installed package.
"""
import atexit
import os
import shutil
import tempfile


def stage_package(argv):
    if len(argv) < 2 or not argv[1].endswith(".so"):
        return argv
    import sys

    stage = tempfile.mkdtemp(prefix="reco-package-")
    atexit.register(shutil.rmtree, stage, True)
    src = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "python", "reco")
    os.makedirs(os.path.join(stage, "reco"))
    for name in os.listdir(src):
        if name.endswith(".py"):
            os.symlink(os.path.abspath(os.path.join(src, name)), os.path.join(stage, "reco", name))
    os.symlink(os.path.abspath(argv[1]), os.path.join(stage, "reco", "libreco_torch_ops.so"))
    sys.path.insert(0, stage)
    return argv[:1] + argv[2:]
