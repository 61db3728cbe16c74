"""Benchmark: what starting posdebias costs before it does anything.

``posdebias --help`` (and every usage error) should feel instant: the package imports torch,
transformers and the evaluation machinery only when a command needs them. This prints, over
``--repeats`` fresh interpreters each, the wall time of

- ``python -c pass``: the interpreter alone, the floor;
- ``python -c "import posdebias"``: the package root;
- ``posdebias --help`` (as ``python -m posdebias --help``): the command line's top level;
- ``python -c "import posdebias.adapters.hf"``: what a Hugging Face run imports first (torch and
  transformers come later, when a model is loaded),

with the median, and whether torch or transformers was imported. Target: ``posdebias --help``
under 0.5 s on a 2-core machine.

    python perf/import_time.py
    python perf/import_time.py --repeats 20
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time

CASES = {
    "python -c pass": ["-c", "pass"],
    "import posdebias": ["-c", "import posdebias"],
    "posdebias --help": ["-m", "posdebias", "--help"],
    "import posdebias.adapters.hf": ["-c", "import posdebias.adapters.hf"],
}

HEAVY = ("torch", "transformers")

#: Runs one case in-process and prints the heavy libraries it imported (last stderr line).
_HEAVY_PROBE = """
import runpy, sys
try:
    {run}
except SystemExit:
    pass
print(",".join(name for name in {heavy!r} if name in sys.modules), file=sys.stderr)
"""


def _seconds(arguments: list[str]) -> float:
    start = time.perf_counter()
    subprocess.run([sys.executable, *arguments], check=True, capture_output=True)
    return time.perf_counter() - start


def _heavy(arguments: list[str]) -> str:
    """The heavy libraries a case imports (one more run that reports ``sys.modules``)."""
    if arguments[0] == "-m":
        argv = [arguments[1], *arguments[2:]]
        run = f"sys.argv = {argv!r}; runpy.run_module({arguments[1]!r}, run_name='__main__')"
    else:
        run = arguments[1]
    code = _HEAVY_PROBE.format(run=run, heavy=HEAVY)
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    return result.stderr.strip().splitlines()[-1] if result.stderr.strip() else ""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=10, help="fresh interpreters per case")
    args = parser.parse_args()
    print(f"{'case':<30} {'median s':>9} {'min s':>7} {'max s':>7}  heavy imports")
    for name, arguments in CASES.items():
        times = [_seconds(arguments) for _ in range(args.repeats)]
        heavy = ", ".join(_heavy(arguments)) or "none"
        print(
            f"{name:<30} {statistics.median(times):9.3f} {min(times):7.3f} {max(times):7.3f}"
            f"  {heavy}"
        )


if __name__ == "__main__":
    main()
