#!/bin/sh
# peer-venv.sh: a virtual environment with the newest PyTorch CPU release from PyPI, so
# the benchmarks can run the PyTorch peer at the state of the art beside Debian's 1.13.
# For benchmarks only: nothing in the build, the tests or CI uses it, and dtrain does not
# depend on it.
#
#   bench/peer-venv.sh [DIR]      (default $DT_PEER_VENV, else /work/venv-peer)
#
# Creates DIR from Debian's /usr/bin/python3 (python3-venv) if it is not there, installs
# or upgrades torch from PyTorch's CPU wheel index (no CUDA libraries: about 200 MB), or,
# where that index cannot be reached, from PyPI (whose Linux wheel pulls CUDA's libraries
# too, some GB, unused on a CPU), and prints the version. torch.compile on CPU also needs a C++
# compiler (g++) and Python's headers (python3-dev): the last line says whether a tiny
# compiled function ran. Then run a peer with DIR/bin/python instead of /usr/bin/python3
# (bench/peer.sh does).
set -eu
dir=${1:-${DT_PEER_VENV:-/work/venv-peer}}
index=https://download.pytorch.org/whl/cpu
[ -x "$dir/bin/python" ] || /usr/bin/python3 -m venv "$dir"
"$dir/bin/python" -m pip install -q --upgrade pip
"$dir/bin/python" -m pip install -q --upgrade --retries 1 --timeout 15 --index-url "$index" torch ||
    { echo "peer-venv.sh: $index unreachable: torch from PyPI" >&2
      "$dir/bin/python" -m pip install -q --upgrade torch; }
# numpy is optional for torch but the peers' data readers and inductor use it
"$dir/bin/python" -m pip install -q --upgrade numpy
"$dir/bin/python" - <<'EOF'
import torch
print("torch", torch.__version__, "in", torch.__file__.rsplit("/", 2)[0])
try:
    f = torch.compile(lambda x: torch.relu(x) * 2.0)
    ok = bool((f(torch.ones(8)) == 2.0).all())
    print("torch.compile on CPU:", "runs" if ok else "WRONG RESULT")
except Exception as e:  # the reason goes to bench/RESULTS.md
    print("torch.compile on CPU fails:", type(e).__name__, str(e).splitlines()[0][:200])
EOF
