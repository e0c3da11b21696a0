"""peer_compile.py: run a PyTorch peer script (the shared bench/peer folder) with its
model under torch.compile, everything else unchanged.

    PYTHON bench/peer_compile.py PEER_DIR/ddp_convnet.py --undistributed ...

Needs PyTorch >= 2.2 (Module.compile, which compiles the module in place: parameter names,
state_dict and the optimizer see the same module as in eager mode) and, on a CPU, a C++
compiler and Python's headers (inductor compiles the generated kernels). The peer script
is imported under its own name, the model class's __init__ is wrapped to compile each new
model, and the script's main() runs with the remaining arguments. Only 1-process runs
(--undistributed): mp.spawn's workers import the script afresh and would train eager.
Compilation happens in the first steps, inside the timed loop: the figures include it,
as a user's run would (the recompile for the epoch's smaller last batch too).
"""
import importlib
import os
import sys

MODELS = {"ddp_convnet": "SmallConvNet", "gpt_bytes": "GPT", "resnet_fmnist": "SmallResNet"}


def main():
    if len(sys.argv) < 2 or not sys.argv[1].endswith(".py"):
        sys.exit("usage: peer_compile.py PEER_SCRIPT.py ARGS... (--undistributed)")
    script, args = sys.argv[1], sys.argv[2:]
    name = os.path.basename(script)[:-3]
    if name not in MODELS:
        sys.exit(f"peer_compile.py: expected one of {sorted(MODELS)}, found {name}")
    if "--undistributed" not in args:
        sys.exit("peer_compile.py: 1-process runs only (--undistributed): spawned workers "
                 "would import the script afresh and run eager")
    import torch
    if not hasattr(torch.nn.Module, "compile"):
        sys.exit(f"peer_compile.py: torch {torch.__version__} has no Module.compile (>= 2.2)")
    sys.path.insert(0, os.path.dirname(os.path.abspath(script)))
    mod = importlib.import_module(name)
    cls = getattr(mod, MODELS[name])
    init = cls.__init__

    def compiled_init(self, *a, **k):
        init(self, *a, **k)
        self.compile()

    cls.__init__ = compiled_init
    sys.argv = [script] + args
    print(f"peer_compile.py: {name}.{MODELS[name]} under torch.compile, torch "
          f"{torch.__version__}", flush=True)
    mod.main()


if __name__ == "__main__":
    main()
